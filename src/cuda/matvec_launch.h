// Between cuda/matvec.cpp (host C++, errors) and cuda/matvec_kernels.cu (the kernels): a plain
// description of one launch, so the .cu file needs neither fmt nor lode::Error.
#pragma once
#include <cstddef>
#include <cstdint>

#include "core/quant/types.h"

namespace lode::cuda {

// For a grouped product whose ids the next kernel reads too: after its own loads, the blocks of
// problem p ask L2 for their share of the matrix at table[ids[p % problems]] (bytes long), the
// weights the next kernel will read, so that they come from L2 rather than DRAM.
struct L2Ahead {
  const void* const* table = nullptr;
  int64_t bytes = 0;
  int64_t problems = 0;
};

// Where problem p of a launch reads its x and writes its y: x + input(p) * x_stride, input(p) =
// (p / x_run) % x_inputs (runs of x_run problems share one input, and the inputs start again after
// x_inputs: a verify window's rows times each row's experts), and y + p * y_stride.
struct ProblemIo {
  int64_t x_stride = 0;
  int32_t x_run = 1, x_inputs = 1 << 30;
  int64_t y_stride = 0;
#ifdef __CUDACC__
  __host__ __device__
#endif
  int64_t input(int64_t p) const {  // problem p's input (0 where all share one; the divisions only
    if (x_stride == 0) return 0;     // where there are runs or cycles)
    int32_t i = int32_t(p);
    if (x_run > 1) i /= x_run;
    if (i >= x_inputs) i %= x_inputs;
    return i;
  }
#ifdef __CUDACC__
  __host__ __device__
#endif
  int64_t x_at(int64_t p) const { return input(p) * x_stride; }
  // The inputs that n problems read (input(p) < this).
  int64_t inputs(int64_t n) const {
    if (x_stride == 0) return 1;
    const int64_t runs = (n + x_run - 1) / x_run;
    return runs < x_inputs ? runs : x_inputs;
  }
};

// A grouped product's problem that multiplies one expert's matrix with several inputs (a step's
// rows routed to the same expert: kernels::expert_groups makes them): the matrix at table[id], read
// once for `count` inputs (0: an empty group, nothing to do), input i the (row, slot) pair pairs[i],
// whose x is at x + (pair / x_run) * x_stride and whose y at y + pair * y_stride (ProblemIo's
// fields). Each input's products have the bits a problem of its own gives.
constexpr int kGroupInputs = 8;
struct ExpertGroup {
  int32_t id, count;
  int32_t pairs[kGroupInputs];
};

// n_problems products of the same shape in one launch. Problem p multiplies the matrix at
// table[ids[p]] (or w when table is null) with its x, into its y (io).
struct MatvecLaunch {
  GgmlType type;
  const void* w;
  const void* const* table;
  const int32_t* ids;
  int64_t rows, cols;
  size_t row_bytes;
  const float* x;
  ProblemIo io;
  float* y;
  int64_t n_problems;
  void* stream;
  int64_t swiglu_up = 0;  // > 0: x is a SwiGLU's gate, its up half this many floats further on
  bool q8_input = false;  // round x to 8 bits and multiply in integers, where the type has such a kernel
  L2Ahead ahead{};        // q8 grouped products: the next kernel's weights asked of L2
  // q8 grouped products: ids and the table were written before the kernel queued just before this
  // one, so they are read and the weights sent for before waiting for that kernel.
  bool ids_before_wait = false;
  // q8 grouped products: the problems are groups [n_problems] (device memory; ids unused), each an
  // expert's matrix with its inputs.
  const ExpertGroup* groups = nullptr;
  int32_t group_inputs = kGroupInputs;  // the most inputs a group has (at most kGroupInputs)
  // 8-bit products of several inputs of one matrix, grouped products, and a problem a pair where
  // pairs share inputs (rounds_inputs_first): device scratch of
  // rounded_bytes where each input is rounded once (round_inputs_kernel) before the product, whose
  // blocks copy the rounded inputs they take instead of each rounding them again.
  void* rounded = nullptr;
  size_t rounded_bytes = 0;
  // Grouped products: each group multiplied by group_parts matrices (an expert's gate and up): part
  // q's matrix at table[q * part_entries + id], its outputs q * n_problems pairs after part 0's.
  int32_t group_parts = 1;
  int64_t part_entries = 0;
};

// The scratch such a launch rounds its inputs into: `inputs` inputs of `cols` values for a matrix of
// `type` (per input never more than plan::rounded_input_bytes(cols), which the plan counts).
// Defined beside the kernels.
size_t rounded_inputs_bytes(GgmlType type, int64_t cols, size_t row_bytes, int64_t inputs);
// Whether launch_matvec rounds this launch's inputs once first (needs MatvecLaunch::rounded).
bool rounds_inputs_first(const MatvecLaunch& launch);

// The grid i-quants' codebooks, which their kernels read from device memory: uploaded once per
// process (the host tables live in core/quant/iq_grids.h; the kernels library does not link them).
struct IqGrids {
  const uint64_t *iq2xxs, *iq2xs, *iq2s;
  const uint32_t *iq3xxs, *iq3s;
  const uint64_t* iq1s;
  const uint8_t* ksigns;
};
const char* upload_iq_grids(const IqGrids& grids);  // null on success
// Queues the kernel; null on success, else the CUDA runtime's message.
const char* launch_matvec(const MatvecLaunch& launch);

// The 8-bit-activation kernels (matvec_q8_kernels.cu), which launch_matvec picks for q8_input.
#ifdef __CUDACC__
cudaError_t launch_matvec_q8(const MatvecLaunch& launch);
// Their tensor-core form for several inputs (matvec_q8_tile_kernels.cu): whether it takes this
// launch (whose inputs are then rounded in the plain layout), and the launch.
bool q8_tiles_take(const MatvecLaunch& launch);
cudaError_t launch_q8_tiles(const MatvecLaunch& launch);
#endif

}  // namespace lode::cuda
