// The GPU's K/V cache formats (issue 8) against the host reference (kv/codec.h) and the CPU engine:
// - the bytes the GPU writes (codes and scales) equal kv::encode_row's through a scrambled page
//   table, for rows chosen to reach every rule's corners (zero groups, magnitudes beyond fp16's
//   range and below its smallest subnormal, q4_0's sign ties), and what the prompt pass reads
//   back is kv::decode_row's floats, as its output rotation is kv::hadamard's, to the bit;
// - decode attention over cells written in each format equals a double-precision host attention
//   over the same decoded cells (the rotation of q and of the output included);
// - a model run in each format on the GPU (prompt chunks and token by token) against the CPU
//   engine in the same format;
// - a saved sequence (cells in the format's bytes) continues bit for bit after a restore.
// Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <tuple>
#include <random>
#include <vector>

#include "support/fixtures.h"
#include "support/gpu.h"
#include "test_gguf_helpers.h"

#ifdef LODE_HAVE_CUDA
#include "core/error.h"
#include "cpu/session.h"
#include "cuda/engine.h"
#include "cuda/forward_kernels.h"
#include "cuda/kv_cache.h"
#include "cuda/prompt_kernels.h"
#include "cuda/session.h"
#include "cuda/vram.h"
#include "gguf/reader.h"
#include "kv/codec.h"
#include "kv/format.h"
#include "model/synth.h"

namespace {

using lode::kv::Format;
using lode::kv::Store;
namespace cuda = lode::cuda;
namespace kv = lode::kv;
namespace engine = lode::engine;

std::vector<Format> every_format() {
  std::vector<Format> all = kv::all_formats();
  all.push_back(Format::q4_unrotated);
  return all;
}

// Row p (heads * head_dim values) of a test sequence: each position takes one of eight shapes.
std::vector<float> test_row(int64_t p, int64_t values, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> row(static_cast<size_t>(values));
  for (size_t i = 0; i < row.size(); ++i) {
    const float x = normal(rng);
    switch (p % 8) {
      case 0: row[i] = x; break;
      case 1: row[i] = 0.0f; break;                                  // all zero: scales 0
      case 2: row[i] = x * 1e30f; break;                             // beyond fp16: scales held / inf
      case 3: row[i] = x * 1e-30f; break;                            // below fp16's subnormals
      case 4: row[i] = i < row.size() / 2 ? 0.0f : x * 1e3f; break;  // zero groups beside large ones
      case 5: row[i] = (i % 3 == 0 ? -1.0f : 1.0f) * 0.5f; break;    // equal magnitudes: q4's first-index tie
      case 6: row[i] = x * 1e-5f; break;                             // fp16 subnormal scales
      default: row[i] = std::round(x * 8.0f) / 8.0f; break;          // values on exact halves of steps
    }
  }
  return row;
}

// One sequence's cache with every page mapped (in `order`: the pages are handed out so as the
// sequence first writes from position 0), for kernels that write its cells directly.
struct DeviceCache {
  DeviceCache(Format format, int64_t heads, int64_t head_dim, int64_t positions, std::vector<int32_t> order)
      : cache(vram, format, 1, heads, head_dim, positions, std::move(order)) {
    cache.prepare_write(0, 0, positions);
  }
  cuda::VramAccountant vram;
  cuda::KvCache cache;
};

// The bytes of one side of logical position p, read back from the device.
std::vector<uint8_t> stored_row(void* store, const std::vector<int32_t>& order, int64_t p, int64_t row_bytes) {
  std::vector<uint8_t> bytes(static_cast<size_t>(row_bytes));
  const int64_t physical = int64_t(order[size_t(p / cuda::kKvPagePositions)]) * cuda::kKvPagePositions +
                           p % cuda::kKvPagePositions;
  cuda::copy_to_host(bytes.data(), static_cast<uint8_t*>(store) + physical * row_bytes, bytes.size());
  return bytes;
}

// Writes rows [0, n) (K from k_rows, V from v_rows) in two kv_write calls (two first positions).
void write_rows(const cuda::KvView& view, cuda::VramAccountant& vram, const std::vector<float>& k_rows,
                const std::vector<float>& v_rows, int64_t n, int heads, int head_dim) {
  cuda::DeviceBuffer k(vram, k_rows.size() * 4, cuda::VramUse::scratch, "k rows");
  cuda::DeviceBuffer v(vram, v_rows.size() * 4, cuda::VramUse::scratch, "v rows");
  cuda::copy_to_device(k.data(), k_rows.data(), k_rows.size() * 4);
  cuda::copy_to_device(v.data(), v_rows.data(), v_rows.size() * 4);
  const int64_t split = n * 3 / 5, row = int64_t(heads) * head_dim;
  ASSERT_EQ(lode::cuda::kernels::kv_write(view, k.as<float>(), v.as<float>(), 0, int(split), heads, head_dim, nullptr),
            nullptr);
  ASSERT_EQ(lode::cuda::kernels::kv_write(view, k.as<float>() + split * row, v.as<float>() + split * row, split,
                                          int(n - split), heads, head_dim, nullptr),
            nullptr);
  cuda::synchronize();
}

TEST(CudaKv, WritesEqualTheHostCodecBitForBit) {
  LODE_REQUIRE_GPU();
  const std::vector<int32_t> order = {3, 1, 0, 2};
  const int64_t n = 4 * cuda::kKvPagePositions, heads = 2;
  for (const int64_t head_dim : {int64_t(256), int64_t(128)})
    for (Format format : every_format()) {
      SCOPED_TRACE(std::string(kv::to_string(format)) + ", head_dim " + std::to_string(head_dim));
      std::mt19937 rng{uint32_t(head_dim)};
      std::vector<float> k_rows, v_rows;
      for (int64_t p = 0; p < n; ++p) {
        const auto k = test_row(p, heads * head_dim, rng), v = test_row(p + 3, heads * head_dim, rng);
        k_rows.insert(k_rows.end(), k.begin(), k.end());
        v_rows.insert(v_rows.end(), v.begin(), v.end());
      }
      DeviceCache device(format, heads, head_dim, n, order);
      const cuda::KvView view = device.cache.layer(0);
      write_rows(view, device.vram, k_rows, v_rows, n, int(heads), int(head_dim));
      const kv::Layout layout = kv::layout(format);
      // What the prompt pass reads back (kv_to_rows): kv::decode_row of the host's bytes, to the bit.
      const int64_t row_values = heads * head_dim;
      cuda::DeviceBuffer k_back(device.vram, size_t(n * row_values) * 4, cuda::VramUse::scratch, "K rows");
      cuda::DeviceBuffer v_back(device.vram, size_t(n * row_values) * 4, cuda::VramUse::scratch, "V rows");
      ASSERT_EQ(cuda::kernels::kv_to_rows(view, n, row_values, k_back.as<float>(), v_back.as<float>(), nullptr), nullptr);
      cuda::synchronize();
      std::vector<float> k_read(size_t(n * row_values)), v_read(k_read.size());
      cuda::copy_to_host(k_read.data(), k_back.data(), k_read.size() * 4);
      cuda::copy_to_host(v_read.data(), v_back.data(), v_read.size() * 4);
      int mismatched = 0;
      for (int64_t p = 0; p < n && mismatched < 3; ++p)
        for (const bool is_k : {true, false}) {
          const Store store = is_k ? layout.k : layout.v;
          std::vector<uint8_t> want(static_cast<size_t>(kv::row_bytes(store, heads, head_dim)));
          kv::encode_row(store, (is_k ? k_rows : v_rows).data() + p * heads * head_dim, heads, head_dim, want.data());
          const auto got = stored_row(is_k ? view.k : view.v, order, p, int64_t(want.size()));
          if (got != want) {
            size_t at = 0;
            while (got[at] == want[at]) ++at;
            ADD_FAILURE() << (is_k ? "K" : "V") << " row of position " << p << " (shape " << p % 8
                          << ") differs first at byte " << at << ": GPU " << int(got[at]) << ", host " << int(want[at]);
            ++mismatched;
          }
          std::vector<float> decoded(static_cast<size_t>(row_values));
          kv::decode_row(store, want.data(), heads, head_dim, decoded.data());
          const float* read = (is_k ? k_read : v_read).data() + p * row_values;
          // NaN (0 times an fp16 infinity) has another bit pattern on each processor: NaN equals NaN here.
          const auto same = [](float a, float b) { return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 4) == 0; };
          if (!std::equal(decoded.begin(), decoded.end(), read, same)) {
            ADD_FAILURE() << (is_k ? "K" : "V") << " row of position " << p << " reads back other values";
            ++mismatched;
          }
        }
    }
}

// The rotation the prompt pass applies to attention's output for rotated values: kv::hadamard's
// bits, for the head sizes the formats allow.
TEST(CudaKv, HadamardRowsEqualTheHostToTheBit) {
  LODE_REQUIRE_GPU();
  cuda::VramAccountant vram;
  for (const int n : {32, 64, 128, 256, 512}) {
    std::mt19937 rng{uint32_t(n)};
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(7 * n));
    for (float& v : x) v = normal(rng) * 100.0f;
    cuda::DeviceBuffer device(vram, x.size() * 4, cuda::VramUse::scratch, "rows");
    cuda::copy_to_device(device.data(), x.data(), x.size() * 4);
    ASSERT_EQ(cuda::kernels::hadamard_rows(device.as<float>(), 7, n, nullptr), nullptr);
    cuda::synchronize();
    std::vector<float> got(x.size());
    cuda::copy_to_host(got.data(), device.data(), got.size() * 4);
    for (int r = 0; r < 7; ++r) kv::hadamard(x.data() + r * n, n);
    EXPECT_EQ(std::memcmp(got.data(), x.data(), x.size() * 4), 0) << "n = " << n;
  }
  std::vector<float> unused(24);
  cuda::DeviceBuffer device(vram, unused.size() * 4, cuda::VramUse::scratch, "rows");
  EXPECT_NE(cuda::kernels::hadamard_rows(device.as<float>(), 1, 24, nullptr), nullptr);  // not a power of two
}

// softmax(q K^T / sqrt(d)) V per head in double over the decoded cells (the stored domain: q rotated
// when K is, the output rotated back when V is), times sigmoid(gate).
std::vector<float> host_attention(Format format, const std::vector<std::vector<uint8_t>>& k_rows,
                                  const std::vector<std::vector<uint8_t>>& v_rows, const std::vector<float>& qg,
                                  int n_heads, int n_kv_heads, int head_dim, int64_t n_keys) {
  const kv::Layout layout = kv::layout(format);
  std::vector<float> out(static_cast<size_t>(n_heads * head_dim)), key(size_t(head_dim), 0.0f), value = key;
  for (int h = 0; h < n_heads; ++h) {
    const int kvh = h / (n_heads / n_kv_heads);
    std::vector<float> q(qg.begin() + 2 * h * head_dim, qg.begin() + (2 * h + 1) * head_dim);
    if (kv::is_rotated(layout.k)) kv::hadamard(q.data(), head_dim);
    std::vector<double> scores(static_cast<size_t>(n_keys)), o(size_t(head_dim), 0.0);
    double big = -INFINITY, total = 0;
    for (int64_t j = 0; j < n_keys; ++j) {
      kv::decode_head(layout.k, k_rows[size_t(j)].data(), n_kv_heads, head_dim, kvh, key.data());
      double s = 0;
      for (int d = 0; d < head_dim; ++d) s += double(q[size_t(d)]) * key[size_t(d)];
      scores[size_t(j)] = s / std::sqrt(double(head_dim));
      big = std::max(big, scores[size_t(j)]);
    }
    for (int64_t j = 0; j < n_keys; ++j) {
      const double p = std::exp(scores[size_t(j)] - big);
      total += p;
      kv::decode_head(layout.v, v_rows[size_t(j)].data(), n_kv_heads, head_dim, kvh, value.data());
      for (int d = 0; d < head_dim; ++d) o[size_t(d)] += p * value[size_t(d)];
    }
    std::vector<float> merged(static_cast<size_t>(head_dim));
    for (int d = 0; d < head_dim; ++d) merged[size_t(d)] = float(o[size_t(d)] / total);
    if (kv::is_rotated(layout.v)) kv::hadamard(merged.data(), head_dim);
    for (int d = 0; d < head_dim; ++d) {
      const double gate = qg[size_t((2 * h + 1) * head_dim + d)];
      out[size_t(h * head_dim + d)] = float(merged[size_t(d)] / (1.0 + std::exp(-gate)));
    }
  }
  return out;
}

// The decode step's attention (split-K, merged) over cells written by the GPU, at several positions,
// against host_attention over the same bytes. Geometries: the test's first (2 query heads per KV
// head), the 35B's (8 per KV head, 256 dims: the tensor-core kernel's full group, partial tiles,
// one key), and 128 dims with 16 per KV head (two blocks per KV head) and magnitudes far from 1
// (the kernel scales q and the weights by powers of two to keep fp16 in range); then the 35B's
// again with 1,100 value rows of zeros (zero scales) between nonzero ones; and the 35B's in one
// split of 2,600 keys over 41 scrambled pages (41 tiles of 16 keys a warp of the tensor-core
// kernel). Every prefix of `order` a geometry takes is a permutation of its pages. The tensor-core
// kernel's two layouts both run: splits of at most 64 keys on shared tiles (300 keys in 8 splits,
// 101, 41 and 1 key, 700 and 64 at 128 dims) and longer ones a tile a warp (1,500 in 4, 2,600 in 1).
TEST(CudaKv, DecodeAttentionEqualsTheHostOverTheSameCells) {
  LODE_REQUIRE_GPU();
  struct Geometry {
    int n_heads, n_kv_heads, head_dim, splits;
    int64_t n;
    std::vector<int64_t> positions;
    float k_scale, v_scale, q_scale;
    int64_t zero_values_from = 0, zero_values_to = 0;  // value rows [from, to) all zero: zero scales
  };
  const std::vector<Geometry> geometries = {{4, 2, 256, 8, 300, {299, 40}, 1.0f, 1.0f, 1.0f},
                                            {16, 2, 256, 4, 1500, {1499, 100, 0}, 1.0f, 1.0f, 1.0f},
                                            {32, 2, 128, 16, 700, {699, 63}, 8.0f, 0.002f, 0.5f},
                                            {16, 2, 256, 4, 1500, {1499}, 1.0f, 1.0f, 1.0f, 200, 1300},
                                            {16, 2, 256, 1, 2600, {2599, 2100}, 1.0f, 1.0f, 1.0f}};
  const std::vector<int32_t> order = {4,  2,  0,  3,  1,  9,  7,  5,  6,  8,  10, 11, 13, 12, 14, 15, 16, 18, 17, 19, 20,
                                      23, 21, 22, 30, 25, 27, 24, 29, 26, 28, 31, 33, 32, 35, 34, 37, 36, 39, 38, 40};
  for (const Geometry& geo : geometries)
    for (Format format : every_format()) {
      const auto [n_heads, n_kv_heads, head_dim, splits] = std::tie(geo.n_heads, geo.n_kv_heads, geo.head_dim, geo.splits);
      const int64_t n = geo.n, row = int64_t(n_kv_heads) * head_dim;
      SCOPED_TRACE(std::string(kv::to_string(format)) + " head_dim " + std::to_string(head_dim) + " heads " +
                   std::to_string(n_heads));
      std::mt19937 rng(7);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> k_rows(size_t(n * row)), v_rows(size_t(n * row)), qg(size_t(2 * n_heads * head_dim));
      for (float& x : k_rows) x = geo.k_scale * normal(rng);
      for (float& x : v_rows) x = geo.v_scale * normal(rng);
      for (float& x : qg) x = geo.q_scale * normal(rng);
      std::fill(v_rows.begin() + geo.zero_values_from * row, v_rows.begin() + geo.zero_values_to * row, 0.0f);
      const std::vector<int32_t> pages(order.begin(), order.begin() + (n + 63) / 64);
      DeviceCache device(format, n_kv_heads, head_dim, n, pages);
      const cuda::KvView view = device.cache.layer(0);
      write_rows(view, device.vram, k_rows, v_rows, n, n_kv_heads, head_dim);
      std::vector<std::vector<uint8_t>> k_bytes, v_bytes;
      const kv::Layout layout = kv::layout(format);
      for (int64_t p = 0; p < n; ++p) {
        k_bytes.push_back(stored_row(view.k, pages, p, kv::row_bytes(layout.k, n_kv_heads, head_dim)));
        v_bytes.push_back(stored_row(view.v, pages, p, kv::row_bytes(layout.v, n_kv_heads, head_dim)));
      }
      // attention_prepare rotates q for rotated keys; here q goes in as the decode kernel reads it.
      std::vector<float> q_in = qg;
      if (kv::is_rotated(layout.k))
        for (int h = 0; h < n_heads; ++h) kv::hadamard(q_in.data() + 2 * h * head_dim, head_dim);
      cuda::DeviceBuffer q(device.vram, q_in.size() * 4, cuda::VramUse::scratch, "qg");
      cuda::DeviceBuffer position(device.vram, 8, cuda::VramUse::scratch, "position");
      cuda::DeviceBuffer partials(device.vram, size_t(n_heads * splits * (head_dim + 2)) * 4, cuda::VramUse::scratch,
                                  "partials");
      cuda::DeviceBuffer out(device.vram, size_t(n_heads * head_dim) * 4, cuda::VramUse::scratch, "out");
      cuda::copy_to_device(q.data(), q_in.data(), q_in.size() * 4);
      for (const int64_t last : geo.positions) {
        cuda::copy_to_device(position.data(), &last, 8);
        ASSERT_EQ(cuda::kernels::attention_decode(q.as<float>(), view, position.as<int64_t>(), n_heads, n_kv_heads,
                                                  head_dim, splits, partials.as<float>(), out.as<float>(), nullptr),
                  nullptr);
        cuda::synchronize();
        std::vector<float> got(size_t(n_heads * head_dim));
        cuda::copy_to_host(got.data(), out.data(), got.size() * 4);
        const auto want = host_attention(format, k_bytes, v_bytes, qg, n_heads, n_kv_heads, head_dim, last + 1);
        const double err = lode::test::relative_l2(got, want);
        std::printf("[ cuda ] %s decode attention, %d heads of %d dims over %lld cells: relative L2 %.3g vs the host\n",
                    kv::to_string(format), n_heads, head_dim, static_cast<long long>(last + 1), err);
        EXPECT_LE(err, 1e-5);
      }
    }
}

int argmax(const std::vector<float>& v) { return int(std::max_element(v.begin(), v.end()) - v.begin()); }

// A synthesized tiny model (q8_0 weights) in a temporary directory, and token ids spread over its
// vocabulary.
struct TinyModel {
  explicit TinyModel(uint64_t seed) : reader(written(dir, seed)), config(lode::model::read_config(reader.metadata())) {}
  static std::filesystem::path written(const lode::test::TempDir& dir, uint64_t seed) {
    lode::model::SynthOptions synth;
    synth.preset = "tiny";
    synth.recipe = "q8_0";
    synth.seed = seed;
    lode::model::write_synth(dir / "m.gguf", synth);
    return dir / "m.gguf";
  }
  std::vector<int32_t> tokens(int n, int step, int offset) const {
    std::vector<int32_t> ids;
    for (int i = 0; i < n; ++i) ids.push_back(int32_t((int64_t(i) * step + offset) % config.vocab));
    return ids;
  }
  const lode::test::TempDir dir;
  const lode::gguf::Reader reader;
  const lode::model::Qwen35MoeConfig config;
};

// A tiny model in every format: the GPU (prompt in chunks of 8 through the prompt pass, and token
// by token through the decode step; float32 products; scrambled pages) against the CPU engine in
// the same format. The engines compute k and v in different float orders, so a value on a code's
// rounding boundary may land on either side; the bar is therefore a quarter of what the format
// itself moves the logits (CPU, format against fp32 cells), plus float32 rounding, and the greedy
// continuations must be equal.
TEST(CudaKv, EveryFormatMatchesTheCpuEngine) {
  LODE_REQUIRE_GPU();
  const TinyModel model(21);
  const auto& [reader, config] = std::tie(model.reader, model.config);
  const std::vector<int32_t> prompt = model.tokens(100, 2477, 5);
  const auto cpu_logits = [&](Format format) {
    lode::cpu::Session cpu(reader, config, {.threads = 2, .deltanet_chunk = 0, .kv_format = format});
    return cpu.prefill(prompt, 64, true);
  };
  const auto greedy = [&](auto& session, std::vector<float> last) {
    std::vector<int> tokens;
    for (int step = 0; step < 8; ++step) {
      tokens.push_back(argmax(last));
      last = session.decode(tokens.back());
    }
    return tokens;
  };
  const std::vector<float> fp32 = cpu_logits(Format::f32);
  for (Format format : every_format()) {
    SCOPED_TRACE(kv::to_string(format));
    lode::cpu::Session cpu(reader, config, {.threads = 2, .deltanet_chunk = 0, .kv_format = format});
    const std::vector<float> want = cpu.prefill(prompt, 64, true);
    const auto want_greedy = greedy(cpu, std::vector<float>(want.end() - config.vocab, want.end()));
    const double format_effect = lode::test::relative_l2(want, fp32), bar = 1e-4 + 0.25 * format_effect;
    for (const int64_t chunk : {int64_t(8), int64_t(0)}) {
      cuda::CudaSession gpu(reader, config,
                            {.max_context = 128, .prompt_chunk = chunk, .prompt_math = cuda::PromptMath::fp32,
                             .activations = lode::model::Activations::f32, .kv_format = format,
                             .kv_page_order = {1, 0}});
      const std::vector<float> got = gpu.prefill(prompt, true);
      const double err = lode::test::relative_l2(got, want);
      std::printf("[ cuda ] %-12s %s: relative L2 %.3g vs the CPU in the same format (the format vs fp32 cells: %.3g)\n",
                  kv::to_string(format), chunk ? "chunks of 8  " : "token by token", err, format_effect);
      EXPECT_LE(err, bar);
      EXPECT_EQ(greedy(gpu, std::vector<float>(got.end() - config.vocab, got.end())), want_greedy);
    }
  }
}

// A sequence saved (cells in the format's bytes, DeltaNet states) continues bit for bit as it would
// have, restored into the same session or into another one whose pages lie in another order; a
// snapshot is refused by a cache of another format or a context too short for it.
TEST(CudaKv, ASavedSequenceContinuesAsItWouldHave) {
  LODE_REQUIRE_GPU();
  const TinyModel model(22);
  const auto& [reader, config] = std::tie(model.reader, model.config);
  const std::vector<int32_t> prompt = model.tokens(70, 331, 9);  // two pages
  const std::vector<int32_t> next = {5, 77, 300, 12, 9};
  const auto continue_with = [&](cuda::CudaSession& session) {
    std::vector<float> all;
    for (int32_t t : next) {
      const auto logits = session.decode(t);
      all.insert(all.end(), logits.begin(), logits.end());
    }
    return all;
  };
  for (Format format : {Format::f16, Format::k8v4}) {
    SCOPED_TRACE(kv::to_string(format));
    const cuda::CudaSessionOptions options{.max_context = 128, .prompt_chunk = 16, .kv_format = format};
    cuda::CudaSession a(reader, config, {.max_context = 128, .prompt_chunk = 16, .kv_format = format,
                                         .kv_page_order = {1, 0}});
    a.prefill(prompt);
    const cuda::CudaSession::Snapshot snapshot = a.save();
    EXPECT_EQ(snapshot.positions, 70);
    EXPECT_EQ(int64_t(snapshot.cells.size()),
              70 * config.n_full_attention_layers() * kv::cell_bytes(format, config.n_kv_heads, config.head_dim));
    const auto first = continue_with(a);
    a.restore(snapshot);
    EXPECT_EQ(a.position(), 70);
    EXPECT_EQ(continue_with(a), first);
    cuda::CudaSession b(reader, config, options);  // pages in order
    b.restore(snapshot);
    EXPECT_EQ(continue_with(b), first);
    cuda::CudaSession other_format(reader, config, {.max_context = 128, .kv_format = Format::f32});
    EXPECT_THROW(other_format.restore(snapshot), lode::Error);
    cuda::CudaSession short_context(reader, config, {.max_context = 64, .kv_format = format});
    EXPECT_THROW(short_context.restore(snapshot), lode::Error);
  }
}

// The CUDA engine behind engine/engine.h: its one sequence, its checkpoints (the session's kept
// prefixes) rewinding bit for bit, its K/V bytes, and clear refusals of what it cannot do yet.
TEST(CudaKv, TheEngineInterfaceRewindsThroughKeptPrefixes) {
  LODE_REQUIRE_GPU();
  const TinyModel model(23);
  const std::vector<int32_t> prompt = model.tokens(40, 331, 9);
  auto gpu = std::make_shared<cuda::CudaModel>(std::make_unique<cuda::CudaSession>(
      model.reader, model.config, cuda::CudaSessionOptions{.max_context = 128, .prompt_chunk = 16,
                                                           .kv_format = Format::k8v4}));
  const auto sequence = gpu->open_sequence();
  EXPECT_THROW(gpu->open_sequence(), lode::Error);
  engine::prefill(*sequence, prompt, 0);
  EXPECT_EQ(sequence->kv_bytes(), 40 * model.config.n_full_attention_layers() *
                                      kv::cell_bytes(Format::k8v4, model.config.n_kv_heads, model.config.head_dim));
  const auto checkpoint = sequence->checkpoint();
  const std::vector<float> first = engine::decode(*sequence, 77);
  engine::decode(*sequence, 5);
  sequence->rewind(*checkpoint);
  EXPECT_EQ(sequence->position(), 40);
  EXPECT_EQ(engine::decode(*sequence, 77), first);
  const int32_t token = 3;
  engine::StepRow two[] = {{sequence.get(), std::span(&token, 1), 1, {}}, {sequence.get(), std::span(&token, 1), 1, {}}};
  EXPECT_THROW(gpu->step(two), lode::Error);
  EXPECT_EQ(gpu->info().backend, "cuda");
}

}  // namespace

#else
TEST(CudaKv, NeedsACudaBuild) { LODE_REQUIRE_GPU(); }
#endif
