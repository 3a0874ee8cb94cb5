// The CUDA backend's first pieces (issue 7) against the CPU engine: quantized matrix-vector
// products for every type with a kernel, and the VRAM accountant's budget. Skip without a GPU.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "core/quant/blocks.h"
#include "core/quant/types.h"
#include "cpu/matmul.h"
#include "cpu/q8_twin.h"
#include "support/gpu.h"
#include "support/naive_math.h"
#include "support/random.h"

#ifdef LODE_HAVE_CUDA
#include "cuda/expert_products.h"
#include "cuda/matvec.h"
#include "cuda/vram.h"

namespace {

using lode::GgmlType;

using lode::test::normal_floats;

// Types lode reads but does not write (MXFP4, the grid i-quants): random codes, with every block
// scale set to a modest finite value.
void random_blocks(GgmlType type, std::vector<uint8_t>& w, std::mt19937& rng) {
  const auto& traits = lode::traits(type);
  for (uint8_t& byte : w) byte = uint8_t(rng());
  for (size_t b = 0; b < w.size(); b += traits.block_bytes) {
    if (type == GgmlType::MXFP4) {
      w[b] = uint8_t(124 + rng() % 8);  // E8M0 exponent near 2^0
    } else if (type == GgmlType::IQ1_M) {
      // The fp16 scale 0x2c00 (1/16) spread over the top nibbles of the four scale words.
      const uint8_t nibbles[4] = {0x0, 0x0, 0xc, 0x2};
      for (int word = 0; word < 4; ++word) {
        uint8_t& high = w[b + 48 + 2 * word + 1];
        high = uint8_t((high & 0x0f) | (nibbles[word] << 4));
      }
    } else {  // the fp16 d leads the block
      const uint16_t d = lode::fp32_to_fp16(0.01f);
      std::memcpy(&w[b], &d, 2);
    }
  }
}

// Scratch where a product of `tokens` inputs rounds each once (MatvecInput::rounded), set in `input`.
lode::cuda::DeviceBuffer rounded_scratch(lode::cuda::VramAccountant& vram, GgmlType type, int64_t cols,
                                         int64_t tokens, lode::cuda::MatvecInput& input) {
  const size_t bytes = lode::cuda::rounded_inputs_bytes(type, cols, lode::row_bytes(type, cols), tokens);
  lode::cuda::DeviceBuffer scratch(vram, bytes, lode::cuda::VramUse::scratch, "rounded x");
  input.rounded = scratch.data(), input.rounded_bytes = bytes;
  return scratch;
}

// A host vector's bytes in a new device buffer.
template <class T>
lode::cuda::DeviceBuffer on_device(lode::cuda::VramAccountant& vram, const std::vector<T>& host, const char* what) {
  lode::cuda::DeviceBuffer buffer(vram, host.size() * sizeof(T), lode::cuda::VramUse::scratch, what);
  lode::cuda::copy_to_device(buffer.data(), host.data(), host.size() * sizeof(T));
  return buffer;
}

// `count` experts of rows x cols quantized as `type` (each row from a shifted start of one set of
// values, so the experts differ), on the host and in VRAM behind a device table of their addresses.
struct ExpertsOnDevice {
  size_t row_bytes = 0, matrix_bytes = 0;
  std::vector<uint8_t> host;
  lode::cuda::DeviceBuffer experts, table;
  const uint8_t* matrix(int32_t id) const { return host.data() + size_t(id) * matrix_bytes; }
  const void* const* device_table() const { return table.as<const void*>(); }
};

// `offset` bytes into the device buffer (a matrix off a 16-byte boundary: where the staged kernels
// read in place).
ExpertsOnDevice experts_on_device(lode::cuda::VramAccountant& vram, GgmlType type, int64_t rows, int64_t cols,
                                  int64_t count, std::mt19937& rng, size_t offset = 0) {
  const auto& traits = lode::traits(type);
  ExpertsOnDevice e;
  e.row_bytes = lode::row_bytes(type, cols), e.matrix_bytes = e.row_bytes * size_t(rows);
  e.host.resize(e.matrix_bytes * size_t(count));
  const auto values = normal_floats(size_t(rows * cols), rng);
  for (int64_t r = 0; r < rows * count; ++r)
    traits.quantize(values.data() + (r * 7 % rows) * cols, e.host.data() + r * e.row_bytes, cols);
  e.experts = lode::cuda::DeviceBuffer(vram, offset + e.host.size(), lode::cuda::VramUse::experts, "experts");
  lode::cuda::copy_to_device(e.experts.as<uint8_t>() + offset, e.host.data(), e.host.size());
  std::vector<const void*> table;
  for (int64_t x = 0; x < count; ++x) table.push_back(e.experts.as<uint8_t>() + offset + x * e.matrix_bytes);
  e.table = on_device(vram, table, "table");
  return e;
}

// The product W x on the GPU: W (host bytes, rows x cols of `type`) uploaded, x already on the
// device ([tokens][cols]); y [tokens][rows] back on the host.
std::vector<float> gpu_product(lode::cuda::VramAccountant& vram, GgmlType type, const std::vector<uint8_t>& w,
                               int64_t rows, int64_t cols, const float* dx, int64_t tokens,
                               lode::cuda::MatvecInput input = {}) {
  lode::cuda::DeviceBuffer dw(vram, w.size(), lode::cuda::VramUse::weights, "w");
  lode::cuda::DeviceBuffer dy(vram, size_t(rows * tokens) * 4, lode::cuda::VramUse::scratch, "y");
  const lode::cuda::DeviceBuffer rounded = rounded_scratch(vram, type, cols, tokens, input);
  lode::cuda::copy_to_device(dw.data(), w.data(), w.size());
  lode::cuda::matvec(type, dw.data(), rows, cols, lode::row_bytes(type, cols), dx, dy.as<float>(), tokens, nullptr,
                     input);
  lode::cuda::synchronize();
  std::vector<float> y(size_t(rows * tokens));
  lode::cuda::copy_to_host(y.data(), dy.data(), y.size() * 4);
  return y;
}

// Each input's products as the host twin computes them for that input alone (so as a launch of one
// input computes them), bit for bit: rows `rows` of `cols` of `type` (bytes w), inputs [tokens][cols].
// y has room for one more input, which must stay as it was (no block stores past the last input).
void expect_each_inputs_twin(lode::cuda::VramAccountant& vram, GgmlType type, const std::vector<uint8_t>& w,
                             int64_t rows, int64_t cols, const std::vector<float>& x, int64_t tokens) {
  constexpr float kUnwritten = -777.0f;
  const size_t row_bytes = lode::row_bytes(type, cols);
  lode::cuda::DeviceBuffer dx(vram, size_t(tokens * cols) * 4, lode::cuda::VramUse::scratch, "x");
  lode::cuda::DeviceBuffer dw(vram, w.size(), lode::cuda::VramUse::weights, "w");
  lode::cuda::DeviceBuffer dy(vram, size_t((tokens + 1) * rows) * 4, lode::cuda::VramUse::scratch, "y");
  lode::cuda::copy_to_device(dx.data(), x.data(), size_t(tokens * cols) * 4);
  lode::cuda::copy_to_device(dw.data(), w.data(), w.size());
  std::vector<float> got(size_t((tokens + 1) * rows), kUnwritten);
  lode::cuda::copy_to_device(dy.data(), got.data(), got.size() * 4);
  lode::cuda::MatvecInput input{.q8 = true};
  const lode::cuda::DeviceBuffer scratch = rounded_scratch(vram, type, cols, tokens, input);
  lode::cuda::matvec(type, dw.data(), rows, cols, row_bytes, dx.as<float>(), dy.as<float>(), tokens, nullptr, input);
  lode::cuda::synchronize();
  lode::cuda::copy_to_host(got.data(), dy.data(), got.size() * 4);
  lode::cpu::q8twin::RoundedBuffer rounded(cols);
  for (int64_t t = 0; t < tokens; ++t) {
    lode::cpu::q8twin::round(type, x.data() + t * cols, nullptr, cols, rounded.x());
    std::vector<float> twin(static_cast<size_t>(rows));
    lode::cpu::q8twin::rows(type, w.data(), row_bytes, rows, cols, rounded.x(), twin.data());
    EXPECT_EQ(std::vector<float>(got.begin() + t * rows, got.begin() + (t + 1) * rows), twin) << "input " << t;
  }
  EXPECT_EQ(std::vector<float>(got.end() - rows, got.end()), std::vector<float>(size_t(rows), kUnwritten))
      << "stores past the last input";
}

// The same for each count of inputs (x holds the most).
void expect_each_inputs_twin(lode::cuda::VramAccountant& vram, GgmlType type, const std::vector<uint8_t>& w,
                             int64_t rows, int64_t cols, const std::vector<float>& x,
                             std::initializer_list<int64_t> counts) {
  for (const int64_t tokens : counts) {
    SCOPED_TRACE(std::to_string(tokens) + " inputs");
    expect_each_inputs_twin(vram, type, w, rows, cols, x, tokens);
  }
}

// The same product on the GPU and on the CPU (which reads every type exactly as ggml does): equal
// up to float summation order.
TEST(CudaMatvec, EveryKernelTypeMatchesTheCpu) {
  LODE_REQUIRE_GPU();
  lode::cuda::VramAccountant vram;
  std::mt19937 rng(11);
  const int64_t rows = 67, cols = 512, tokens = 3;
  const auto values = normal_floats(size_t(rows * cols), rng);
  const auto x = normal_floats(size_t(tokens * cols), rng);
  lode::cuda::DeviceBuffer dx(vram, x.size() * 4, lode::cuda::VramUse::scratch, "x");
  lode::cuda::copy_to_device(dx.data(), x.data(), x.size() * 4);
  for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q5_0,
                        GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS,
                        GgmlType::MXFP4, GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S, GgmlType::IQ3_XXS,
                        GgmlType::IQ3_S, GgmlType::IQ1_S, GgmlType::IQ1_M}) {
    const auto& traits = lode::traits(type);
    SCOPED_TRACE(traits.name);
    ASSERT_TRUE(lode::cuda::has_matvec(type));
    const size_t row_bytes = lode::row_bytes(type, cols);
    std::vector<uint8_t> w(row_bytes * size_t(rows));
    if (traits.quantize) {
      for (int64_t r = 0; r < rows; ++r) traits.quantize(values.data() + r * cols, w.data() + r * row_bytes, cols);
    } else {
      random_blocks(type, w, rng);
    }
    std::vector<float> want(size_t(tokens * rows));
    lode::cpu::matmul({&traits, w.data(), cols, rows, row_bytes}, x.data(), want.data(), tokens, {.threads = 1});
    EXPECT_LE(lode::test::relative_error(gpu_product(vram, type, w, rows, cols, dx.as<float>(), tokens), want), 2e-6);
  }
}

// The integer kernels (MatvecInput::q8) against the CPU's Activations::q8 products: x rounded to 8
// bits exactly as the CPU rounds it, then the same sums up to float order (the GPU's are integer
// per slice, scaled once; the CPU's are float dots of the dequantized row), and bit for bit the
// host twin's (cpu/q8_twin.h, which the CPU miss path computes experts with). Rows of 512 values
// (a group of lanes per row) and of 2048 (a warp per row); Q8_0 rows of 160 (the slice kernel), of
// 4096 (16 spans: two rows a warp) and 16,384 (64 spans, the longest the span kernel takes) and
// 16,640 (the slice kernel again); 67
// rows, so the last block is ragged.
TEST(CudaMatvec, IntegerKernelsMatchTheCpusQ8Products) {
  LODE_REQUIRE_GPU();
  lode::cuda::VramAccountant vram;
  std::mt19937 rng(13);
  const int64_t rows = 67, tokens = 3;
  for (const int64_t cols : {int64_t(160), int64_t(512), int64_t(2048), int64_t(4096), int64_t(16384), int64_t(16640)}) {
    const auto values = normal_floats(size_t(rows * cols), rng);
    auto x = normal_floats(size_t(tokens * cols), rng);
    x[5] = 0.0f;
    std::fill_n(x.begin() + cols, 256, 0.0f);  // an all-zero block of the second token
    lode::cuda::DeviceBuffer dx(vram, x.size() * 4, lode::cuda::VramUse::scratch, "x");
    lode::cuda::copy_to_device(dx.data(), x.data(), x.size() * 4);
    for (GgmlType type : {GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
      if (cols % 256 != 0 && type != GgmlType::Q8_0) continue;  // K-quant rows are whole super-blocks
      if (cols > 4096 && type != GgmlType::Q8_0) continue;      // the long rows are Q8_0's kernel boundary
      const auto& traits = lode::traits(type);
      SCOPED_TRACE(std::string(traits.name) + ", " + std::to_string(cols) + " columns");
      ASSERT_TRUE(lode::cuda::has_q8_matvec(type));
      const size_t row_bytes = lode::row_bytes(type, cols);
      std::vector<uint8_t> w(row_bytes * size_t(rows));
      for (int64_t r = 0; r < rows; ++r) traits.quantize(values.data() + r * cols, w.data() + r * row_bytes, cols);
      std::vector<float> want(size_t(tokens * rows));
      lode::cpu::matmul({&traits, w.data(), cols, rows, row_bytes}, x.data(), want.data(), tokens,
                        {.threads = 1, .activations = lode::model::Activations::q8});
      const auto got = gpu_product(vram, type, w, rows, cols, dx.as<float>(), tokens, {.q8 = true});
      EXPECT_LE(lode::test::relative_error(got, want), 2e-6);
      expect_each_inputs_twin(vram, type, w, rows, cols, x, tokens);
      // And the rounding is real: the float32 products differ by more than float order.
      std::vector<float> exact(want.size());
      lode::cpu::matmul({&traits, w.data(), cols, rows, row_bytes}, x.data(), exact.data(), tokens, {.threads = 1});
      EXPECT_GT(lode::test::relative_error(got, exact), 1e-4);
    }
  }
}

// A product of 65,536 rows, as for the lm head: the integer kernels give each warp several sets of
// rows one after another (Q6_K rows of 210 bytes: for one input two rows at a time, two sets), or
// stage each block's rows in shared memory (Q4_K: rows of whole 16-byte pieces); the host twin's
// bits either way, for one input and for five (a block's eight, three of them past the end).
TEST(CudaMatvec, IntegerKernelsCoverManyRowsPerWarp) {
  LODE_REQUIRE_GPU();
  lode::cuda::VramAccountant vram;
  std::mt19937 rng(14);
  const int64_t rows = 65536 + 37, cols = 256;
  for (const GgmlType type : {GgmlType::Q6_K, GgmlType::Q4_K}) {
    const auto& traits = lode::traits(type);
    SCOPED_TRACE(traits.name);
    const size_t row_bytes = lode::row_bytes(type, cols);
    const auto values = normal_floats(size_t(rows * cols), rng);
    const auto x = normal_floats(size_t(5 * cols), rng);
    std::vector<uint8_t> w(row_bytes * size_t(rows));
    for (int64_t r = 0; r < rows; ++r) traits.quantize(values.data() + r * cols, w.data() + r * row_bytes, cols);
    std::vector<float> want(static_cast<size_t>(rows));
    lode::cpu::matmul({&traits, w.data(), cols, rows, row_bytes}, x.data(), want.data(), 1,
                      {.threads = 2, .activations = lode::model::Activations::q8});
    lode::cuda::DeviceBuffer dx(vram, x.size() * 4, lode::cuda::VramUse::scratch, "x");
    lode::cuda::copy_to_device(dx.data(), x.data(), x.size() * 4);
    const auto got = gpu_product(vram, type, w, rows, cols, dx.as<float>(), 1, {.q8 = true});
    EXPECT_LE(lode::test::relative_error(got, want), 2e-6);
    expect_each_inputs_twin(vram, type, w, rows, cols, x, {1, 5});
  }
}

// Several inputs of one plain matrix (decode rows of several sequences) in one launch: 2, 3, 8 and 9
// inputs (one block's 2, 4 and 8, two blocks' worth, and from 16 the tensor-core tiles': whole
// and partial tiles of 8 inputs, several blocks of inputs) give each input the bits it gets alone,
// for every kernel form: Q8_0 rows of 256 values and more (spans), shorter Q8_0 and Q5_0 rows (whose
// rounded x are not whole 16-byte words: 32, 96 and 160 values) and the K-quants (rows in
// registers); Q8_0 rows of 2,048 and 4,096 values from 16 inputs (the staged kernel: a warp's one
// or two spans); and rows so long that a block takes fewer inputs (Q4_K, 21,504 values: eight
// inputs' x would not fit in shared memory).
TEST(CudaMatvec, SeveralInputsOfOneMatrixGetTheBitsOfOne) {
  LODE_REQUIRE_GPU();
  lode::cuda::VramAccountant vram;
  std::mt19937 rng(17);
  const int64_t rows = 203;
  for (const int64_t cols : {int64_t(32), int64_t(96), int64_t(160), int64_t(2048), int64_t(4096), int64_t(21504)}) {
    for (GgmlType type : {GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
      if (cols % 256 != 0 && type != GgmlType::Q8_0 && type != GgmlType::Q5_0) continue;
      // (4,096: Q8_0's rows of 16 spans, the staged kernel's second form)
      if (cols > 2048 && type != GgmlType::Q4_K && !(cols == 4096 && type == GgmlType::Q8_0)) continue;
      if (cols == 4096 && type == GgmlType::Q4_K) continue;
      const auto& traits = lode::traits(type);
      const size_t row_bytes = lode::row_bytes(type, cols);
      std::vector<uint8_t> w(row_bytes * size_t(rows));
      const auto values = normal_floats(size_t(rows * cols), rng);
      for (int64_t r = 0; r < rows; ++r) traits.quantize(values.data() + r * cols, w.data() + r * row_bytes, cols);
      const auto x = normal_floats(size_t(40 * cols), rng);
      SCOPED_TRACE(std::string(traits.name) + ", " + std::to_string(cols) + " columns");
      expect_each_inputs_twin(vram, type, w, rows, cols, x, {2, 3, 8, 9, 16, 17, 40});
    }
  }
}

// The lm head's own shape with several inputs: Q6_K rows of 2,048 values (1,680 bytes, staged in
// shared memory; from 16 inputs two tiles of 8 inputs a block, from 32 four), 65,573 of them,
// random codes with a modest scale in every block.
TEST(CudaMatvec, SeveralInputsOfTheLmHeadGetTheBitsOfOne) {
  LODE_REQUIRE_GPU();
  lode::cuda::VramAccountant vram;
  std::mt19937 rng(18);
  const int64_t rows = 65536 + 37, cols = 2048;
  const GgmlType type = GgmlType::Q6_K;
  std::vector<uint8_t> w(lode::row_bytes(type, cols) * size_t(rows));
  for (uint8_t& byte : w) byte = uint8_t(rng());
  const uint16_t d = lode::fp32_to_fp16(0.01f);
  for (size_t b = 0; b < w.size(); b += sizeof(lode::quant::BlockQ6_K))
    std::memcpy(&w[b + offsetof(lode::quant::BlockQ6_K, d)], &d, 2);
  expect_each_inputs_twin(vram, type, w, rows, cols, normal_floats(size_t(40 * cols), rng), {2, 5, 11, 17, 40});
}

// Q8_0 rows of 8 and 16 spans with as many rows as a step's DeltaNet input product (the staged
// kernel then takes 2, 4 or 8 tiles of 8 inputs a block: 24, 33, 40 and 64 inputs here, the last
// block's inputs partial at 33 and 40; the rows' last tile partial) give each input the bits it
// gets alone.
TEST(CudaMatvec, SeveralInputsOfManyQ8_0RowsGetTheBitsOfOne) {
  LODE_REQUIRE_GPU();
  lode::cuda::VramAccountant vram;
  std::mt19937 rng(19);
  const int64_t rows = 4243;
  const GgmlType type = GgmlType::Q8_0;
  for (const int64_t cols : {int64_t(2048), int64_t(4096)}) {
    const size_t row_bytes = lode::row_bytes(type, cols);
    std::vector<uint8_t> w(row_bytes * size_t(rows));
    const auto values = normal_floats(size_t(rows * cols), rng);
    for (int64_t r = 0; r < rows; ++r) lode::traits(type).quantize(values.data() + r * cols, w.data() + r * row_bytes, cols);
    SCOPED_TRACE(std::to_string(cols) + " columns");
    expect_each_inputs_twin(vram, type, w, rows, cols, normal_floats(size_t(64 * cols), rng), {24, 33, 40, 64});
  }
}

// The MoE's form: experts picked through a device-side table, one launch for all of them, with
// one shared input (gate/up) or one input per expert (down); float32 and 8-bit x (the latter
// against the CPU's Activations::q8 products).
TEST(CudaMatvec, GroupedProductsReadTheirExpertsThroughTheTable) {
  LODE_REQUIRE_GPU();
  lode::cuda::VramAccountant vram;
  std::mt19937 rng(12);
  const int64_t rows = 40, cols = 256, n_experts = 5;
  const GgmlType type = GgmlType::Q4_K;
  const auto& traits = lode::traits(type);
  const size_t row_bytes = lode::row_bytes(type, cols), matrix_bytes = row_bytes * size_t(rows);
  std::vector<uint8_t> experts(matrix_bytes * n_experts);
  const auto values = normal_floats(size_t(rows * cols * n_experts), rng);
  for (int64_t r = 0; r < rows * n_experts; ++r)
    traits.quantize(values.data() + r * cols, experts.data() + r * row_bytes, cols);
  lode::cuda::DeviceBuffer dexperts(vram, experts.size(), lode::cuda::VramUse::experts, "experts");
  lode::cuda::copy_to_device(dexperts.data(), experts.data(), experts.size());
  std::vector<const void*> table;
  for (int64_t e = 0; e < n_experts; ++e) table.push_back(dexperts.as<uint8_t>() + e * matrix_bytes);
  const std::vector<int32_t> ids = {3, 0, 3, 4};
  lode::cuda::DeviceBuffer dtable(vram, table.size() * sizeof(void*), lode::cuda::VramUse::scratch, "table");
  lode::cuda::DeviceBuffer dids(vram, ids.size() * 4, lode::cuda::VramUse::scratch, "ids");
  lode::cuda::copy_to_device(dtable.data(), table.data(), table.size() * sizeof(void*));
  lode::cuda::copy_to_device(dids.data(), ids.data(), ids.size() * 4);
  const auto x = normal_floats(size_t(cols) * ids.size(), rng);
  lode::cuda::DeviceBuffer dx(vram, x.size() * 4, lode::cuda::VramUse::scratch, "x");
  lode::cuda::DeviceBuffer dy(vram, size_t(rows) * ids.size() * 4, lode::cuda::VramUse::scratch, "y");
  lode::cuda::copy_to_device(dx.data(), x.data(), x.size() * 4);
  for (const bool q8 : {false, true}) {
    for (int64_t x_stride : {int64_t(0), cols}) {
      SCOPED_TRACE("x_stride " + std::to_string(x_stride) + (q8 ? ", 8-bit x" : ", float32 x"));
      lode::cuda::grouped_matvec(type, dtable.as<const void*>(), dids.as<int32_t>(), int64_t(ids.size()), rows, cols,
                                 row_bytes, dx.as<float>(), x_stride, dy.as<float>(), nullptr, {.q8 = q8});
      lode::cuda::synchronize();
      std::vector<float> got(size_t(rows) * ids.size());
      lode::cuda::copy_to_host(got.data(), dy.data(), got.size() * 4);
      for (size_t p = 0; p < ids.size(); ++p) {
        std::vector<float> want(static_cast<size_t>(rows));
        const lode::model::MatrixView expert{&traits, experts.data() + size_t(ids[p]) * matrix_bytes, cols, rows, row_bytes};
        lode::cpu::matmul(expert, x.data() + p * size_t(x_stride), want.data(), 1,
                          {.threads = 1, .activations = q8 ? lode::model::Activations::q8 : lode::model::Activations::f32});
        for (int64_t r = 0; r < rows; ++r)
          EXPECT_NEAR(got[p * size_t(rows) + size_t(r)], want[size_t(r)], 1e-4f * (1 + std::fabs(want[size_t(r)])))
              << "problem " << p << " row " << r;
      }
    }
  }
}

// The grouped 8-bit products bit for bit the host twin's (the CPU miss path computes absent
// experts with it, so the tokens must not depend on where an expert ran), with the ids read after
// the wait (gate|up) or before it (down), and the L2 asked for the next matrix. An expert computed
// elsewhere (id -1) leaves its rows of y as they were. The 35B-A3B's shapes (gate|up: 512 rows of
// 2048; down: 2048 rows of 512, the SwiGLU of gate and up as x) and small ragged ones, every
// K-quant and Q5_0.
TEST(CudaMatvec, GroupedIntegerProductsAreTheTwinsBits) {
  LODE_REQUIRE_GPU();
  lode::cuda::VramAccountant vram;
  std::mt19937 rng(15);
  struct Shape {
    int64_t rows, cols;
    bool swiglu;
  };
  const std::vector<int32_t> ids = {3, -1, 0, 3, 5};
  const int64_t n_experts = 6;
  constexpr float kUnwritten = -777.0f;
  for (const Shape shape : {Shape{512, 2048, false}, Shape{2048, 512, true}, Shape{67, 256, false}}) {
    for (GgmlType type : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q5_0}) {
      const int64_t rows = shape.rows, cols = shape.cols, n = int64_t(ids.size());
      SCOPED_TRACE(std::string(lode::traits(type).name) + " " + std::to_string(rows) + " x " + std::to_string(cols));
      const ExpertsOnDevice experts = experts_on_device(vram, type, rows, cols, n_experts, rng);
      const size_t row_bytes = experts.row_bytes, matrix_bytes = experts.matrix_bytes;
      // x per problem; for the SwiGLU shape each problem's gate then up (cols each).
      const int64_t x_stride = shape.swiglu ? 2 * cols : cols;
      const auto x = normal_floats(size_t(n * x_stride), rng);
      const lode::cuda::DeviceBuffer dids = on_device(vram, ids, "ids"), dx = on_device(vram, x, "x");
      lode::cuda::DeviceBuffer dy(vram, size_t(rows * n) * 4, lode::cuda::VramUse::scratch, "y");
      // The twin's products, problem by problem.
      std::vector<std::vector<float>> want(ids.size());
      lode::cpu::q8twin::RoundedBuffer rounded(cols);
      for (size_t p = 0; p < ids.size(); ++p) {
        if (ids[p] < 0) continue;
        const float* xp = x.data() + p * size_t(x_stride);
        lode::cpu::q8twin::round(type, xp, shape.swiglu ? xp + cols : nullptr, cols, rounded.x());
        want[p].resize(size_t(rows));
        lode::cpu::q8twin::rows(type, experts.matrix(ids[p]), row_bytes, rows, cols, rounded.x(), want[p].data());
      }
      for (const bool ids_before_wait : {false, true}) {
        SCOPED_TRACE(ids_before_wait ? "ids read before the wait" : "ids read after the wait");
        const std::vector<float> sentinel(size_t(rows * n), kUnwritten);
        lode::cuda::copy_to_device(dy.data(), sentinel.data(), sentinel.size() * 4);
        lode::cuda::MatvecInput input{.swiglu_up = shape.swiglu ? cols : 0, .q8 = true};
        input.ahead = {experts.device_table(), int64_t(matrix_bytes), n};
        input.ids_before_wait = ids_before_wait;
        lode::cuda::grouped_matvec(type, experts.device_table(), dids.as<int32_t>(), n, rows, cols, row_bytes,
                                   dx.as<float>(), x_stride, dy.as<float>(), nullptr, input);
        lode::cuda::synchronize();
        std::vector<float> got(size_t(rows * n));
        lode::cuda::copy_to_host(got.data(), dy.data(), got.size() * 4);
        for (size_t p = 0; p < ids.size(); ++p) {
          const std::vector<float> mine(got.begin() + int64_t(p) * rows, got.begin() + int64_t(p + 1) * rows);
          if (ids[p] < 0)
            EXPECT_EQ(mine, std::vector<float>(size_t(rows), kUnwritten)) << "problem " << p << " is not this launch's";
          else
            EXPECT_EQ(mine, want[p]) << "problem " << p;
        }
      }
    }
  }
}

// A problem a (row, expert) pair where the pairs of a row share its x (a verify window's experts:
// x_run k slots a row, x_inputs T rows): each row is rounded once into the scratch first and the
// blocks copy it (rounds_inputs_first), with the host twin's bits for every pair; an expert computed
// elsewhere (id -1) leaves its rows alone; without the scratch the launch is refused, saying so.
// Every type with grouped integer kernels, Q8_0 in its spans layout included.
TEST(CudaMatvec, PairsThatShareARowsInputRoundItOnceWithTheTwinsBits) {
  LODE_REQUIRE_GPU();
  lode::cuda::VramAccountant vram;
  std::mt19937 rng(23);
  constexpr int32_t kSlots = 3, kRows = 2;
  const std::vector<int32_t> ids = {3, 0, 5, 3, -1, 1};  // row 0's three experts, then row 1's
  const int64_t n_experts = 6, rows = 512, cols = 2048, n = int64_t(ids.size());
  constexpr float kUnwritten = -777.0f;
  for (GgmlType type : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q5_0, GgmlType::Q8_0}) {
    SCOPED_TRACE(lode::traits(type).name);
    const ExpertsOnDevice experts = experts_on_device(vram, type, rows, cols, n_experts, rng);
    const auto x = normal_floats(size_t(kRows * cols), rng);
    const lode::cuda::DeviceBuffer dids = on_device(vram, ids, "ids"), dx = on_device(vram, x, "x");
    lode::cuda::DeviceBuffer dy = on_device(vram, std::vector<float>(size_t(rows * n), kUnwritten), "y");
    lode::cuda::MatvecInput input{.q8 = true};
    input.x_run = kSlots, input.x_inputs = kRows;
    const auto launch = [&] {
      lode::cuda::grouped_matvec(type, experts.device_table(), dids.as<int32_t>(), n, rows, cols, experts.row_bytes,
                                 dx.as<float>(), cols, dy.as<float>(), nullptr, input);
    };
    EXPECT_THROW(launch(), lode::Error);  // no scratch to round the rows into
    const lode::cuda::DeviceBuffer scratch = rounded_scratch(vram, type, cols, kRows, input);
    launch();
    lode::cuda::synchronize();
    std::vector<float> got(size_t(rows * n));
    lode::cuda::copy_to_host(got.data(), dy.data(), got.size() * 4);
    lode::cpu::q8twin::RoundedBuffer rounded(cols);
    for (int64_t p = 0; p < n; ++p) {
      const std::vector<float> mine(got.begin() + p * rows, got.begin() + (p + 1) * rows);
      if (ids[size_t(p)] < 0) {
        EXPECT_EQ(mine, std::vector<float>(size_t(rows), kUnwritten)) << "problem " << p << " is not this launch's";
        continue;
      }
      lode::cpu::q8twin::round(type, x.data() + (p / kSlots) * cols, nullptr, cols, rounded.x());
      std::vector<float> want(static_cast<size_t>(rows));
      lode::cpu::q8twin::rows(type, experts.matrix(ids[size_t(p)]), experts.row_bytes, rows, cols, rounded.x(),
                              want.data());
      EXPECT_EQ(mine, want) << "problem " << p;
    }
  }
}

// Products by expert groups (kernels::expert_groups's: a step's pairs by expert, up to `cap` a
// group, the groups after the last empty) bit for bit the host twin's for every pair, x shared by a
// row's slots.
struct GroupShape {
  int64_t rows, cols;
  bool swiglu;  // x is the SwiGLU of a gate and an up half
};
// A step's rows, the experts each row picks and the experts there are.
struct GroupStep {
  int64_t rows = 13, slots = 4, experts = 5;
};
void check_expert_groups(lode::cuda::VramAccountant& vram, GgmlType type, GroupShape shape, int32_t cap,
                         size_t offset, int32_t parts, std::mt19937& rng, GroupStep step = {}) {
  const int64_t step_rows = step.rows, slots = step.slots, n_experts = step.experts, pairs = step_rows * slots;
  const int64_t rows = shape.rows, cols = shape.cols;
  SCOPED_TRACE(std::string(lode::traits(type).name) + " " + std::to_string(rows) + " x " + std::to_string(cols) +
               ", at most " + std::to_string(cap) + " a group, matrices " + std::to_string(offset) +
               " bytes off, " + std::to_string(parts) + " parts, " + std::to_string(pairs) + " pairs");
  std::vector<int32_t> route(static_cast<size_t>(pairs));
  for (size_t p = 0; p < route.size(); ++p) route[p] = p < 11 ? 0 : int32_t(1 + rng() % (n_experts - 1));
  std::vector<lode::cuda::ExpertGroup> groups;
  for (int32_t e = 0; e < n_experts; ++e)
    for (int32_t p = 0; p < pairs; ++p) {
      if (route[size_t(p)] != e) continue;
      if (groups.empty() || groups.back().id != e || groups.back().count == cap) groups.push_back({e, 0, {}});
      groups.back().pairs[groups.back().count++] = p;
    }
  int32_t most = 0;
  for (const auto& g : groups) most = std::max(most, g.count);
  groups.resize(size_t(pairs), lode::cuda::ExpertGroup{0, 0, {}});
  const ExpertsOnDevice experts = experts_on_device(vram, type, rows, cols, parts * n_experts, rng, offset);
  const size_t row_bytes = experts.row_bytes;
  const int64_t x_stride = shape.swiglu ? 2 * cols : cols;
  const auto x = normal_floats(size_t(step_rows * x_stride), rng);
  const lode::cuda::DeviceBuffer dgroups = on_device(vram, groups, "groups"), dx = on_device(vram, x, "x");
  lode::cuda::DeviceBuffer dy(vram, size_t(rows * pairs * parts) * 4, lode::cuda::VramUse::scratch, "y");
  lode::cuda::MatvecInput input{.swiglu_up = shape.swiglu ? cols : 0, .q8 = true};
  input.x_run = int32_t(slots), input.groups = dgroups.as<lode::cuda::ExpertGroup>(), input.group_inputs = most;
  input.group_parts = parts, input.part_entries = n_experts;
  const lode::cuda::DeviceBuffer scratch = rounded_scratch(vram, type, cols, step_rows, input);
  lode::cuda::grouped_matvec(type, experts.device_table(), nullptr, pairs, rows, cols, row_bytes, dx.as<float>(),
                             x_stride, dy.as<float>(), nullptr, input);
  lode::cuda::synchronize();
  std::vector<float> got(size_t(rows * pairs * parts));
  lode::cuda::copy_to_host(got.data(), dy.data(), got.size() * 4);
  lode::cpu::q8twin::RoundedBuffer rounded(cols);
  for (int64_t q = 0; q < parts; ++q)
    for (int64_t p = 0; p < pairs; ++p) {
      const float* xp = x.data() + (p / slots) * x_stride;
      lode::cpu::q8twin::round(type, xp, shape.swiglu ? xp + cols : nullptr, cols, rounded.x());
      std::vector<float> want(static_cast<size_t>(rows));
      lode::cpu::q8twin::rows(type, experts.matrix(int32_t(q * n_experts) + route[size_t(p)]), row_bytes, rows, cols,
                              rounded.x(), want.data());
      const auto at = got.begin() + (q * pairs + p) * rows;
      EXPECT_EQ(std::vector<float>(at, at + rows), want) << "part " << q << ", pair " << p;
    }
}

// Groups of 1 to 8 pairs (the caps a step uses: 4 with every expert in VRAM, 8 under a budget, 1
// where no expert has two), the 35B-A3B's gate|up and down shapes and a ragged small one, for every
// type with grouped integer kernels; gate and up in one launch (two parts); matrices off a 16-byte
// boundary for the types whose loads allow it (read in place rather than staged).
TEST(CudaMatvec, ExpertGroupsGetTheTwinsBitsForEveryPair) {
  LODE_REQUIRE_GPU();
  lode::cuda::VramAccountant vram;
  std::mt19937 rng(19);
  const GroupShape shapes[] = {{512, 2048, false}, {2048, 512, true}, {67, 256, false}};
  for (const int32_t cap : {lode::cuda::kGroupInputs, 4, 1})
    for (const GroupShape shape : shapes)
      for (GgmlType type : {GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::Q5_0})
        check_expert_groups(vram, type, shape, cap, 0, cap == 4 ? 2 : 1, rng);
  for (GgmlType type : {GgmlType::Q6_K, GgmlType::Q5_0})
    for (const GroupShape shape : shapes) check_expert_groups(vram, type, shape, 4, 2, 1, rng);
  // A step of many rows (512 pairs over 64 experts, groups of 1 to 4 pairs), as a step of 64
  // sequences makes them.
  const GroupStep many{64, 8, 64};
  check_expert_groups(vram, GgmlType::Q4_K, shapes[0], 4, 0, 2, rng, many);
  check_expert_groups(vram, GgmlType::Q5_K, shapes[1], 4, 0, 1, rng, many);
}

// v rounded to tf32 as cvt.rna does (to nearest, ties away from zero): how the prompt pass hands
// x to the expert products.
float tf32_rounded(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits = (bits + 0x1000u) & ~0x1fffu;
  std::memcpy(&v, &bits, 4);
  return v;
}

struct ExpertShape {
  GgmlType type;
  int64_t parts, part_rows, cols;
};

// counts: the rows routed to each expert in turn (tiles cut at kExpertTileRows).
void check_expert_products(lode::cuda::VramAccountant& vram, const ExpertShape& shape, std::mt19937& rng,
                           const std::vector<int32_t>& counts = {0, 1, 64, 65, 128, 129, 300}) {
  const auto& traits = lode::traits(shape.type);
  const int64_t parts = shape.parts, part_rows = shape.part_rows, cols = shape.cols, n = parts * part_rows;
  const int64_t ldy = n + 8;
  SCOPED_TRACE(std::string(traits.name) + " " + std::to_string(n) + " x " + std::to_string(cols));
  ASSERT_TRUE(lode::cuda::has_expert_products(shape.type, cols));
  std::vector<lode::cuda::ExpertTile> tiles;
  int32_t total = 0, used = 0;
  for (int32_t c : counts) {
    for (int32_t r = 0; r < c; r += int32_t(lode::cuda::kExpertTileRows))
      tiles.push_back({used, total + r, std::min(int32_t(lode::cuda::kExpertTileRows), c - r), 0});
    total += c, used += c > 0;
  }
  const size_t row_bytes = lode::row_bytes(shape.type, cols), matrix_bytes = row_bytes * size_t(part_rows);
  const int64_t matrices = parts * used;
  std::vector<uint8_t> w(matrix_bytes * size_t(matrices));
  if (traits.quantize) {
    const auto values = normal_floats(size_t(matrices * part_rows * cols), rng);
    for (int64_t r = 0; r < matrices * part_rows; ++r)
      traits.quantize(values.data() + r * cols, w.data() + r * row_bytes, cols);
  } else {
    random_blocks(shape.type, w, rng);
  }
  std::vector<float> values(size_t(matrices * part_rows * cols));
  for (int64_t r = 0; r < matrices * part_rows; ++r)
    traits.dequantize(w.data() + r * row_bytes, values.data() + r * cols, cols);
  std::vector<float> x = normal_floats(size_t(total * cols), rng);
  for (float& v : x) v = tf32_rounded(v);
  lode::cuda::DeviceBuffer dx(vram, x.size() * 4, lode::cuda::VramUse::scratch, "x");
  lode::cuda::DeviceBuffer dy(vram, size_t(total * ldy) * 4, lode::cuda::VramUse::scratch, "y");
  lode::cuda::DeviceBuffer dtiles(vram, tiles.size() * sizeof(tiles[0]), lode::cuda::VramUse::scratch, "tiles");
  lode::cuda::DeviceBuffer dw(vram, w.size(), lode::cuda::VramUse::experts, "experts");
  std::vector<const void*> table;  // matrix parts * j + p: part p of expert j
  for (int64_t m = 0; m < matrices; ++m) table.push_back(dw.as<uint8_t>() + m * matrix_bytes);
  lode::cuda::DeviceBuffer dtable(vram, table.size() * sizeof(void*), lode::cuda::VramUse::scratch, "table");
  lode::cuda::copy_to_device(dx.data(), x.data(), x.size() * 4);
  lode::cuda::copy_to_device(dtiles.data(), tiles.data(), tiles.size() * sizeof(tiles[0]));
  lode::cuda::copy_to_device(dw.data(), w.data(), w.size());
  lode::cuda::copy_to_device(dtable.data(), table.data(), table.size() * sizeof(void*));
  // y starts as a sentinel: what the products do not write (columns past n) must keep it.
  constexpr float kUnwritten = 12345.0f;
  const auto tile_rows = [&](size_t begin, size_t end) {
    lode::cuda::TileRows rows{int32_t(lode::cuda::kExpertTileRows), 0};
    for (size_t i = begin; i < end; ++i)
      rows.fewest = std::min(rows.fewest, tiles[i].rows), rows.most = std::max(rows.most, tiles[i].rows);
    return rows;
  };
  using Forms = lode::cuda::ExpertTileForms;
  const auto run = [&](std::vector<size_t> splits, Forms forms = Forms::by_rows) {
    const std::vector<float> sentinel(size_t(total * ldy), kUnwritten);
    lode::cuda::copy_to_device(dy.data(), sentinel.data(), sentinel.size() * 4);
    splits.insert(splits.begin(), 0), splits.push_back(tiles.size());
    for (size_t s = 0; s + 1 < splits.size(); ++s) {
      const char* err = lode::cuda::expert_products(
          shape.type, dtiles.as<lode::cuda::ExpertTile>() + splits[s], int64_t(splits[s + 1] - splits[s]),
          tile_rows(splits[s], splits[s + 1]), dtable.as<const void*>(), parts, part_rows, cols, row_bytes,
          dx.as<float>(), cols, dy.as<float>(), ldy, nullptr, forms);
      EXPECT_EQ(err, nullptr) << err;
    }
    lode::cuda::synchronize();
    std::vector<float> y(size_t(total * ldy));
    lode::cuda::copy_to_host(y.data(), dy.data(), y.size() * 4);
    return y;
  };
  const std::vector<float> y = run({});
  int64_t row = 0, j = 0;
  for (int64_t r = 0; r < total; ++r)
    for (int64_t col = n; col < ldy; ++col)
      ASSERT_EQ(y[size_t(r * ldy + col)], kUnwritten) << "row " << r << " column " << col << " past n";
  for (int32_t c : counts) {
    for (int32_t r = 0; r < c; ++r, ++row)
      for (int64_t col = 0; col < n; ++col) {
        const float* wr = values.data() + ((parts * j + col / part_rows) * part_rows + col % part_rows) * cols;
        const float* xr = x.data() + row * cols;
        double want = 0, magnitude = 0;
        for (int64_t i = 0; i < cols; ++i) want += double(xr[i]) * wr[i], magnitude += std::fabs(double(xr[i]) * wr[i]);
        ASSERT_NEAR(y[size_t(row * ldy + col)], want, 6e-4 * magnitude + 1e-6) << "row " << row << " column " << col;
      }
    j += c > 0;
  }
  EXPECT_EQ(run({1, 3}), y);
  // Each form of the kernel gives a row the same bits (the small one takes tiles of up to 32 rows).
  EXPECT_EQ(run({}, Forms::large), y);
  if (std::all_of(tiles.begin(), tiles.end(), [](const auto& t) { return t.rows <= 32; }))
    EXPECT_EQ(run({}, Forms::small), y);
}

// The prompt's expert products on tensor cores, read from the stored bytes through a table of
// matrices, against float64 sums of the CPU's dequantized values, x rounded to tf32 beforehand (as
// the prompt pass gives it): within tf32's rounding of the weights (2^-11) of the sum of |x w|.
// Experts with no rows, one, half a tile (128 rows), half and one, a full tile, a tile and one,
// several tiles (x rows run in groups of 32 and passes of 64). Every type as (gate, up)
// pairs of 72 rows (144 output columns: a partial second tile of 128) of 512 values (two stages of
// a k-quant's blocks; Q6_K's and the 32-value blocks' stages start off 16-byte boundaries); and
// the 35B-A3B's shapes, Q4_K gate|up of 2 x 512 rows of 2048 values, Q5_K down of 2048 rows of
// 512; Q8_0 (the codes kernel's third type) also in rows of 320 values, 340 bytes apart, so that
// its steps start 0, 4, 8 and 12 bytes into a 16-byte line. A tile's values do not depend on the
// launch: the tiles in two launches give the same bits as in one, and the codes kernel's forms for
// few and many rows give the same bits (tiles of a short prompt's few rows each, and launches with
// tiles on both sides of the small form's 32).
TEST(CudaMatvec, ExpertProductsOnTensorCoresMatchTheCpu) {
  LODE_REQUIRE_GPU();
  lode::cuda::VramAccountant vram;
  std::mt19937 rng(13);
  for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q5_0,
                        GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS,
                        GgmlType::MXFP4})
    check_expert_products(vram, {type, 2, 72, 512}, rng);
  check_expert_products(vram, {GgmlType::Q4_K, 2, 512, 2048}, rng);
  check_expert_products(vram, {GgmlType::Q5_K, 1, 2048, 512}, rng);
  check_expert_products(vram, {GgmlType::Q8_0, 2, 72, 320}, rng);
  // A short prompt's experts: tiles of a few rows, each form and both together in one launch.
  const std::vector<int32_t> few = {1, 5, 8, 9, 17, 31, 32, 0, 2};
  check_expert_products(vram, {GgmlType::Q8_0, 1, 256, 2048}, rng, few);
  check_expert_products(vram, {GgmlType::Q8_0, 2, 72, 320}, rng, few);
  for (const GgmlType type : {GgmlType::Q4_K, GgmlType::Q5_K})
    check_expert_products(vram, {type, 2, 72, 512}, rng, few);
  check_expert_products(vram, {GgmlType::Q4_K, 2, 512, 2048}, rng, few);
  check_expert_products(vram, {GgmlType::Q5_K, 1, 2048, 512}, rng, {3, 40, 7, 33, 12});
}

TEST(CudaMatvec, TypesWithoutAKernelAreRefusedClearly) {
  LODE_REQUIRE_GPU();
  EXPECT_FALSE(lode::cuda::has_matvec(GgmlType::TQ2_0));
  try {
    lode::cuda::matvec(GgmlType::TQ2_0, nullptr, 1, 256, 66, nullptr, nullptr, 1);
    FAIL() << "no error";
  } catch (const lode::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no kernel for tq2_0"), std::string::npos) << e.what();
  }
}

// Several inputs of one matrix are rounded once into scratch the caller gives: without it, or with
// too little, the launch is refused saying how much it needs.
TEST(CudaMatvec, SeveralInputsWithoutRoomToRoundThemAreRefused) {
  LODE_REQUIRE_GPU();
  const int64_t cols = 2048;
  const size_t need = lode::cuda::rounded_inputs_bytes(GgmlType::Q4_K, cols, lode::row_bytes(GgmlType::Q4_K, cols), 3);
  for (const size_t given : {size_t(0), need - 16}) {
    lode::cuda::MatvecInput input{.q8 = true};
    input.rounded = given ? reinterpret_cast<void*>(uintptr_t(256)) : nullptr, input.rounded_bytes = given;
    try {
      lode::cuda::matvec(GgmlType::Q4_K, nullptr, 8, cols, lode::row_bytes(GgmlType::Q4_K, cols), nullptr, nullptr, 3,
                         nullptr, input);
      FAIL() << "no error";
    } catch (const lode::Error& e) {
      const std::string text = e.what();
      EXPECT_NE(text.find(fmt::format("into {} bytes of scratch", need)), std::string::npos) << text;
      EXPECT_NE(text.find(fmt::format("and {} were given", given)), std::string::npos) << text;
    }
  }
}

TEST(CudaVram, TheBudgetIsKeptAndShortfallsAreNamed) {
  LODE_REQUIRE_GPU();
  lode::cuda::VramAccountant vram(size_t(64) << 20);
  EXPECT_EQ(vram.budget(), size_t(64) << 20);
  {
    lode::cuda::DeviceBuffer weights(vram, size_t(48) << 20, lode::cuda::VramUse::weights, "blk.0 experts");
    EXPECT_EQ(vram.held(lode::cuda::VramUse::weights), size_t(48) << 20);
    try {
      lode::cuda::DeviceBuffer kv(vram, size_t(32) << 20, lode::cuda::VramUse::kv, "K/V cache");
      FAIL() << "over the budget, no error";
    } catch (const lode::Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("K/V cache (kv) needs 32.0 MiB"), std::string::npos) << m;
      EXPECT_NE(m.find("short by 16.0 MiB"), std::string::npos) << m;
      EXPECT_NE(m.find("weights 48.0 MiB"), std::string::npos) << m;
    }
    EXPECT_EQ(vram.held(), size_t(48) << 20);
  }
  EXPECT_EQ(vram.held(), 0u);
  EXPECT_EQ(vram.peak(), size_t(48) << 20);
}

}  // namespace

#else

TEST(CudaMatvec, NeedsACudaBuild) { LODE_REQUIRE_GPU(); }

#endif
