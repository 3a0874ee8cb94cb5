// Matrix-vector products on 8-bit activations (MatvecLaunch::q8_input), for the types decode reads
// most: Q8_0, Q5_0, Q4_K, Q5_K, Q6_K. Each block first rounds its problem's x into shared memory, then
// lanes dot weight slices with it (cuda/q8_slices.cuh: the rounding, each type's slice, the bits the
// CPU miss path must match). The products are the CPU engine's Activations::q8 products up to float
// summation order.
//
// A row with fewer slices than a warp has lanes is shared by a group of lanes, several rows per
// warp. Q8_0 rows of 256 k values have their own kernel (matvec_q8_0_spans_kernel): the rows staged
// in shared memory, a lane's slice a span of 8 blocks.
//
// A plain matrix with several inputs (decode rows of several sequences, or of one sequence's
// positions) is read once for up to 8 of them (kInputs): a block rounds each input's x and dots
// every weight slice it holds with each, in the order a single input's launch does, so every
// input's products have the bits they have alone (on the H200, bench_cuda_matvec: the DeltaNet
// qkv product, Q8_0, 12.6 us for one input, 15.4 for two, 27.4 for eight; since stop 81 the Q8_0
// spans take two inputs at a time, each staged weight word read once for both). Such launches, grouped
// ones, and those of a problem per (row, expert) pair where several pairs share a row (a verify
// window's or a few sequences' experts) round each input once first (round_inputs_kernel, into
// MatvecLaunch::rounded), and their blocks copy the rounded inputs they take into shared memory:
// the same bytes a block's own rounding writes, without every block of the grid rounding them
// again (for the pairs, on the H200 with the 35B synth: a 2-token window 2.92 ms against 3.02, a
// step of 8 sequences 7.71 against 8.07). From 16 inputs of a plain matrix the tensor-core tiles
// take over (matvec_q8_tile_kernels.cu), with the same bits. Expert groups of up to 4 inputs whose
// rows are whole 16-byte pieces have their own kernel (matvec_q8_group_staged_kernel: each warp's
// rows staged once the group is known); other groups go through matvec_q8_kernel.
#include <cuda_fp16.h>
#include <algorithm>
#include <type_traits>
#include <utility>
#include <cuda_runtime.h>

#include "core/quant/blocks.h"
#include "core/quant/q8_0_spans.h"
#include "cuda/async_copy.cuh"
#include "cuda/kernel_math.cuh"
#include "cuda/matvec_launch.h"
#include "cuda/q8_slices.cuh"
#include "cuda/weight_types.h"

namespace lode::cuda {

namespace {

using namespace lode::quant;

using kernels::kWarp;

// Problem p's block's share of the matrix the next kernel reads for its ids, asked of L2 (L2Ahead):
// the problems that read one id (p % ahead.problems) split that matrix between their blocks.
__device__ __forceinline__ void ask_ahead(const L2Ahead& ahead, const int32_t* ids, int64_t p) {
  const int32_t id = ids[p % ahead.problems];
  if (id < 0) return;
  const int64_t shares = int64_t(gridDim.x) * (gridDim.y / ahead.problems);
  const int64_t share = (p / ahead.problems) * gridDim.x + blockIdx.x;
  const int64_t per = (ahead.bytes + 128 * shares - 1) / (128 * shares) * 128;
  const int64_t begin = share * per, end = min(ahead.bytes, begin + per);
  if (begin < end)
    kernels::prefetch_lines(static_cast<const uint8_t*>(ahead.table[id]) + begin, end - begin, int(threadIdx.x),
                            int(blockDim.x));
}

// The inputs of a plain matrix's block p .. p + kInputs - 1 that are problems (the last block's may
// be fewer).
template <int kInputs>
__device__ __forceinline__ int this_blocks_inputs(int64_t p, int64_t n_problems) {
  return kInputs == 1 ? 1 : int(min(int64_t(kInputs), n_problems - p));
}

// Each distinct input of a launch rounded once, into global memory: block i rounds input i (at
// x + i x_stride) into out + i words, the layout a product's block rounds it into shared memory.
template <XRounding R, bool kRowLayout>
__global__ void __launch_bounds__(256)
    round_inputs_kernel(const float* x, int64_t x_stride, int64_t cols, int64_t swiglu_up, size_t q_bytes, int4* out) {
  kernels::begin_after_inputs();
  const size_t words = rounded_x_words(q_bytes, cols);
  round_x<R, kRowLayout>(x + int64_t(blockIdx.x) * x_stride, cols, swiglu_up,
                         rounded_x_in(out + size_t(blockIdx.x) * words, q_bytes, cols));
}

// Block: each warp takes kRows row groups at once; a group of `lanes` lanes (a power of two up to
// 32) sums one row's slices: lane i of the group adds slices i, i + lanes, ... in order, then the
// group's sums meet in a butterfly (offsets lanes / 2 .. 1). A pass loads kSlices slices of each
// of its rows per lane into registers, all at once; the first pass's loads are issued before x is
// rounded (and, for a plain matrix or ids_before_wait, before the wait for the kernel before: an
// expert table's ids usually come from that kernel). A problem whose id is negative is skipped (its
// expert is computed elsewhere: the CPU miss path). Block (b, j) takes problem j; with kInputs > 1
// (plain matrices, or kGroups) problems j kInputs .. + kInputs - 1 (as many as there are), or with
// kGroups group j's pairs (ExpertGroup: an expert's matrix from the table), each weight slice dotted
// with every one's x.
template <GgmlType T, int kRows, int kSlices, int kInputs, bool kGroups = false>
__global__ void __launch_bounds__(256)
    matvec_q8_kernel(const uint8_t* w, const void* const* table, const int32_t* ids, int64_t rows, int64_t cols,
                     size_t row_bytes, const float* x, ProblemIo io, float* y, int lanes, int sets,
                     int64_t swiglu_up, L2Ahead ahead, bool ids_before_wait, int64_t n_problems,
                     const ExpertGroup* groups, const int4* rounded) {
  using S = Slice<T>;
  constexpr bool kRoundedFirst = kInputs > 1 || kGroups;  // (rounded: round_inputs_kernel's)
  extern __shared__ int4 shared_x[];
  const size_t x_words = rounded_x_words(size_t(cols), cols);
  RoundedX rx[kInputs];
#pragma unroll
  for (int i = 0; i < kInputs; ++i) rx[i] = rounded_x_in(shared_x + i * x_words, size_t(cols), cols);
  // Problems p .. p + kInputs - 1 (as many as there are), or with groups group p's inputs.
  const int64_t p = kGroups ? int64_t(blockIdx.y) : int64_t(blockIdx.y) * kInputs;
  int inputs = kGroups ? 0 : this_blocks_inputs<kInputs>(p, n_problems);
  const auto input_of = [&](int i) {
    return kGroups ? (io.x_stride == 0 ? 0 : int64_t(groups[p].pairs[i] / io.x_run)) : io.input(p + i);
  };
  const auto y_of = [&](int i) { return y + (kGroups ? int64_t(groups[p].pairs[i]) : p + i) * io.y_stride; };
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  const int group = lane / lanes, sub = lane % lanes, lane_groups = kWarp / lanes;
  const int n_slices = int(cols / S::kValues), per_pass = lanes * kSlices;
  // The warp's rows: `sets` sets one after another, each kRows row groups at once.
  const auto first_of = [&](int set) {
    return ((int64_t(blockIdx.x) * warps + warp) * sets + set) * kRows * lane_groups + group;  // rows first + k groups
  };
  const uint8_t* matrix = w;
  const auto row_at = [&](int64_t r) { return matrix + min(r, rows - 1) * row_bytes; };  // past the end: the last row
  typename S::Raw raw[kRows][kSlices];
  const auto load = [&](int set, int pass_begin) {
#pragma unroll
    for (int j = 0; j < kSlices; ++j) {
      const int s = pass_begin + sub + lanes * j;
      if (s >= n_slices) continue;
#pragma unroll
      for (int k = 0; k < kRows; ++k) raw[k][j] = S::load(row_at(first_of(set) + int64_t(k) * lane_groups), s);
    }
  };
  // The first pass in registers; every set's rows, whole, asked of L2 (later passes and sets find
  // them there).
  const auto start = [&] {
    load(0, 0);
    for (int set = 0; set < sets; ++set)
#pragma unroll
      for (int k = 0; k < kRows; ++k)
        kernels::prefetch_lines(row_at(first_of(set) + int64_t(k) * lane_groups), int64_t(row_bytes), sub, lanes);
  };
  // The problem's matrix from the table, its first pass sent for; false: computed elsewhere. Before
  // the wait the ids and table are read from L2 (written by a kernel that has finished, but this
  // multiprocessor's L1 may hold the lines from an earlier layer).
  const auto open = [&](bool before_wait) {
    if (kGroups) inputs = min(groups[p].count, kInputs);  // (a group has at most kInputs: one pair a row)
    const int32_t id = kGroups ? groups[p].id : before_wait ? __ldcg(ids + p) : ids[p];
    if (id < 0 || (kGroups && inputs == 0)) return false;
    matrix = before_wait ? reinterpret_cast<const uint8_t*>(__ldcg(reinterpret_cast<const unsigned long long*>(table) + id))
                         : static_cast<const uint8_t*>(table[id]);
    start();
    return true;
  };
  // A block whose problem is computed elsewhere still waits before it leaves: the kernels after
  // this one count on its grid finishing after the kernel before it.
  bool mine = true;
  if (!table)
    start();
  else if (ids_before_wait)
    mine = open(true);
  kernels::begin_after_inputs();
  if (table && !ids_before_wait) mine = open(false);
  if (!mine) return;
  if (ahead.table) ask_ahead(ahead, ids, p);
  if (kRoundedFirst || rounded) {  // (one input rounded first: pairs that share inputs, rounds_inputs_first)
    for (int i = 0; i < inputs; ++i) copy_rounded(shared_x + i * x_words, rounded + input_of(i) * x_words, x_words);
  } else {
    round_x<S::kRounding>(x + io.x_at(p), cols, swiglu_up, rx[0]);
  }
  __syncthreads();
  for (int set = 0; set < sets; ++set) {
    const int64_t first = first_of(set);
    float sum[kRows][kInputs];
#pragma unroll
    for (int k = 0; k < kRows; ++k)
#pragma unroll
      for (int i = 0; i < kInputs; ++i) sum[k][i] = 0.0f;
    for (int pass_begin = 0; pass_begin < n_slices; pass_begin += per_pass) {
      if (set > 0 || pass_begin > 0) load(set, pass_begin);
#pragma unroll
      for (int j = 0; j < kSlices; ++j) {
        const int s = pass_begin + sub + lanes * j;
        if (s >= n_slices) continue;
#pragma unroll
        for (int k = 0; k < kRows; ++k) {
          const typename S::Ready ready = S::ready(raw[k][j], s);  // (once for all the inputs)
#pragma unroll
          for (int i = 0; i < kInputs; ++i)
            if (kInputs == 1 || i < inputs) sum[k][i] = exact::add(sum[k][i], S::dot(ready, s, rx[i]));
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kRows; ++k)
#pragma unroll
      for (int i = 0; i < kInputs; ++i) {
        if (kInputs > 1 && i >= inputs) continue;  // (inputs is the block's: the shuffles stay whole)
        for (int offset = lanes / 2; offset > 0; offset /= 2)
          sum[k][i] = exact::add(sum[k][i], __shfl_xor_sync(0xffffffffu, sum[k][i], offset));
        const int64_t r = first + int64_t(k) * lane_groups;
        if (sub == 0 && r < rows) y_of(i)[r] = sum[k][i];
      }
  }
}

// Rows a warp works on at once: enough weight loads in flight per lane (about 8), while keeping at
// least two blocks of eight warps per multiprocessor.
int rows_in_flight(int64_t loads_per_lane, int64_t all_rows, int64_t rows_per_warp_step) {
  int rows = 1;
  while (rows < 4 && loads_per_lane * rows < 8 &&
         all_rows / (8 * rows_per_warp_step * rows * 2) >= kernels::multiprocessors())
    rows *= 2;
  return rows;
}

// `count` rows of row_bytes (a multiple of 16) from global to shared memory, 16 bytes a copy by
// the block's threads, as one group of copies; kOnce: streaming (a step reads each weight once).
template <bool kOnce = true>
__device__ __forceinline__ void stage_rows(uint8_t* to, const uint8_t* from, int count, size_t row_bytes) {
  const int64_t pieces = int64_t(count) * int64_t(row_bytes / 16);
  for (int64_t i = threadIdx.x; i < pieces; i += blockDim.x) copy_async<16, kOnce>(to + i * 16, from + i * 16, true);
  copies_sent();
}

// Products of very many rows (the lm head's 248,320), rows of whole 16-byte pieces: each block
// copies its rows into shared memory by cp.async before it waits for x, so every byte it reads is
// in flight at once without registers held for it, and a multiprocessor's blocks keep its loads
// going while one of them computes (on the H200, the 35B synth's Q6_K lm head: 461.0-461.5
// tokens/s against 455.6-458.3 for rows in registers, two sets of two a warp). Lanes, slices and
// sums as matvec_q8_kernel's: the same bits. Block (b, j) takes inputs j kInputs .. + kInputs - 1
// (those past the last problem: its x again, not stored); each staged slice is read once and
// dotted with every input's x (its unpacking shared by them), and each input's x of a slice is read
// once for the warp's rows (Slice::x_at). That last cut Q6_K's 8 inputs from 138 registers to 128,
// two blocks a multiprocessor instead of one: the lm head with 8 inputs (steps of 5 to 15
// sequences) 497-506 us against 801-804 on an H100 (bench_cuda_matvec, stop 67).
template <GgmlType T, int kRows, int kInputs>
__global__ void __launch_bounds__(256)
    matvec_q8_staged_kernel(const uint8_t* w, int64_t rows, int64_t cols, size_t row_bytes, const float* x,
                            ProblemIo io, float* y, int lanes, int64_t swiglu_up, int64_t n_problems,
                            const int4* rounded) {
  using S = Slice<T>;
  extern __shared__ int4 shared_rows[];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  const int group = lane / lanes, sub = lane % lanes, groups = kWarp / lanes;
  const int rows_per_block = warps * kRows * groups;
  const int64_t first = int64_t(blockIdx.x) * rows_per_block, p = int64_t(blockIdx.y) * kInputs;
  const auto problem = [&](int i) { return kInputs == 1 ? p : min(p + i, n_problems - 1); };
  uint8_t* const staged = reinterpret_cast<uint8_t*>(shared_rows);
  int4* const x_at = shared_rows + size_t(rows_per_block) * row_bytes / 16;  // input i's RoundedX: x_at + i x_words
  const size_t x_words = rounded_x_words(size_t(cols), cols);
  RoundedX rx[kInputs];
#pragma unroll
  for (int i = 0; i < kInputs; ++i) rx[i] = rounded_x_in(x_at + i * x_words, size_t(cols), cols);
  // (Several inputs' blocks read the rows once for each block of inputs, and ptxas 13.0 made the
  // evict-first copies of this kernel with several inputs an illegal instruction on the H200.)
  stage_rows<kInputs == 1>(staged, w + first * int64_t(row_bytes), int(min(int64_t(rows_per_block), rows - first)),
                           row_bytes);
  kernels::begin_after_inputs();
  if constexpr (kInputs > 1) {  // (rounded: round_inputs_kernel's)
    for (int i = 0; i < kInputs; ++i) copy_rounded(x_at + i * x_words, rounded + io.input(problem(i)) * x_words, x_words);
  } else {
    round_x<S::kRounding>(x + io.x_at(p), cols, swiglu_up, rx[0]);
  }
  copies_arrived();
  __syncthreads();
  // Rows past the end compute on whatever the shared memory holds and are not written.
  const int local = warp * kRows * groups + group, n_slices = int(cols / S::kValues);
  const uint8_t* const rows_at = staged + size_t(local) * row_bytes;
  float sum[kRows][kInputs];
#pragma unroll
  for (int k = 0; k < kRows; ++k)
#pragma unroll
    for (int i = 0; i < kInputs; ++i) sum[k][i] = 0.0f;
  for (int s = sub; s < n_slices; s += lanes) {
    typename S::Xs xs[kInputs];  // the slice's x, read once for the warp's rows
#pragma unroll
    for (int i = 0; i < kInputs; ++i) xs[i] = S::x_at(s, rx[i]);
#pragma unroll
    for (int k = 0; k < kRows; ++k) {
      const typename S::Ready ready =
          S::ready(S::template load<FromShared>(rows_at + size_t(k * groups) * row_bytes, s), s);
#pragma unroll
      for (int i = 0; i < kInputs; ++i) sum[k][i] = exact::add(sum[k][i], S::dot(ready, xs[i]));
    }
  }
#pragma unroll
  for (int k = 0; k < kRows; ++k)
#pragma unroll
    for (int i = 0; i < kInputs; ++i) {
      for (int offset = lanes / 2; offset > 0; offset /= 2)
        sum[k][i] = exact::add(sum[k][i], __shfl_xor_sync(0xffffffffu, sum[k][i], offset));
      const int64_t r = first + local + k * groups;
      if (sub == 0 && r < rows && (kInputs == 1 || p + i < n_problems)) y[(p + i) * io.y_stride + r] = sum[k][i];
    }
}

// Expert groups (MatvecLaunch::groups) of matrices whose rows are whole 16-byte pieces: block (b,
// slot, part) takes rows of expert group `slot` (ExpertGroup, as matvec_q8_kernel's), whose matrix
// is known only after the wait (the groups come from the kernel before), with the matrices of table
// + part part_entries, its outputs part slots pairs on. Each warp copies its own rows into shared
// memory by cp.async in two halves and computes on the first while the second is in flight, so a
// warp starts as soon as its own bytes are in, not the block's. A matrix that does not start on a
// 16-byte boundary is read in place. Lanes, slices and sums as matvec_q8_kernel's: the same bits.
// The warp's bookkeeping is kept small, since the kernel is bound by instruction issue, not by
// memory (docs/SERVER.md, "Where the group kernel's instructions go"): no divisions (the slot and
// part from the grid, lanes a power of two given as a shift), 32-bit offsets, code for one and for
// two inputs at a time (a group of 3 or 4 takes two passes over its staged rows, each input's slices
// in the same order), the butterflies unrolled, each input's output address made once, each slice's
// x read once for the warp's rows (stop 67: within the runs' spread of a read for each row). On an H100,
// bench_cuda_matvec "by group", against the form before (a runtime test an input, the unpacking
// redone for each): 16 rows' gate|up 65.0 us against 78.6, 64 rows' 155.5 against 201.8, 64 rows'
// down 119.0 against 145.3. Registers held to four blocks a multiprocessor (three: 67.3, 165.3 and
// 131.6 us).
template <GgmlType T, int kRows, int kInputs>
__global__ void __launch_bounds__(256, 4)
    matvec_q8_group_staged_kernel(const void* const* table, int rows, int cols, int row_bytes, ProblemIo io, float* y,
                                  int lane_shift, const ExpertGroup* groups, int64_t part_entries, const int4* rounded) {
  using S = Slice<T>;
  static_assert(kRows % 2 == 0, "a warp's rows come in two halves");
  constexpr int kHalf = kRows / 2;
  extern __shared__ int4 shared_rows[];
  const int lane = int(threadIdx.x) % kWarp, warp = int(threadIdx.x) / kWarp, warps = int(blockDim.x) / kWarp;
  const int lanes = 1 << lane_shift, group = lane >> lane_shift, sub = lane & (lanes - 1);
  const int lane_groups = kWarp >> lane_shift, rows_per_block = warps * kRows * lane_groups;
  const int first = int(blockIdx.x) * rows_per_block, p = int(blockIdx.y), part = int(blockIdx.z);
  const int block_rows = min(rows_per_block, rows - first);
  uint8_t* const staged = reinterpret_cast<uint8_t*>(shared_rows);
  int4* const x_at = shared_rows + rows_per_block * row_bytes / 16;  // input i's RoundedX: x_at + i x_words
  const int x_words = int(rounded_x_words(size_t(cols), cols));
  kernels::begin_after_inputs();
  const int inputs = min(groups[p].count, kInputs);  // (a group has at most kInputs: one pair a row)
  const int32_t id = groups[p].id;
  if (id < 0 || inputs == 0) return;  // an empty group
  const uint8_t* const matrix =
      static_cast<const uint8_t*>(table[part * part_entries + id]) + int64_t(first) * row_bytes;
  const bool in_place = reinterpret_cast<uintptr_t>(matrix) % 16 != 0;
  // The warp's rows: row groups k of lane_groups rows each, from `band` on; half h's row groups
  // [h kHalf, (h + 1) kHalf), one group of copies each.
  const int band = warp * kRows * lane_groups;
  if (!in_place) {
    const int row_pieces = row_bytes / 16;
    for (int h = 0; h < 2; ++h) {
      const int from = band + h * kHalf * lane_groups, count = min(kHalf * lane_groups, block_rows - from);
      const uint8_t* const src = matrix + from * row_bytes;
      uint8_t* const dst = staged + from * row_bytes;
      for (int i = lane; i < count * row_pieces; i += kWarp) copy_async<16>(dst + 16 * i, src + 16 * i, true);
      copies_sent();
    }
  }
  for (int i = 0; i < inputs; ++i) {
    const int input = io.x_stride == 0 ? 0 : groups[p].pairs[i] / io.x_run;
    copy_rounded(x_at + i * x_words, rounded + int64_t(input) * x_words, size_t(x_words));
  }
  __syncthreads();  // (the inputs; each warp waits for its own rows below)
  // Rows past the end compute on whatever the shared memory holds (in place: the last row again)
  // and are not written.
  const int local = band + group, n_slices = cols / S::kValues;
  // The warp's products with the group's inputs [i0, i0 + N) (N: 1 or 2, so that their sums and x
  // stay in registers; a group of 3 or 4 inputs takes two passes over the staged rows, each input's
  // slices in the same order), then each (row, input)'s butterfly and store. The first pass waits
  // for the warp's rows, half by half.
  const auto pass = [&](auto n, int i0, bool first_pass) {
    constexpr int N = decltype(n)::value;
    RoundedX rx[N];
#pragma unroll
    for (int i = 0; i < N; ++i) rx[i] = rounded_x_in(x_at + (i0 + i) * x_words, size_t(cols), cols);
    float sum[kRows][N];
#pragma unroll
    for (int k = 0; k < kRows; ++k)
#pragma unroll
      for (int i = 0; i < N; ++i) sum[k][i] = 0.0f;
    const auto products = [&](auto from, auto row_of, auto k0, auto k1) {
      using M = decltype(from);
      for (int s = sub; s < n_slices; s += lanes) {
        typename S::Xs xs[N];  // the slice's x, read once for the warp's rows
#pragma unroll
        for (int i = 0; i < N; ++i) xs[i] = S::x_at(s, rx[i]);
#pragma unroll
        for (int k = decltype(k0)::value; k < decltype(k1)::value; ++k) {
          const typename S::Ready ready = S::ready(S::template load<M>(row_of(local + k * lane_groups), s), s);
#pragma unroll
          for (int i = 0; i < N; ++i) sum[k][i] = exact::add(sum[k][i], S::dot(ready, xs[i]));
        }
      }
    };
    using First = std::integral_constant<int, 0>;
    using Middle = std::integral_constant<int, kHalf>;
    using End = std::integral_constant<int, kRows>;
    const auto shared_row = [&](int r) { return staged + r * row_bytes; };
    if (in_place) {
      products(FromGlobal{}, [&](int r) { return matrix + min(r, block_rows - 1) * row_bytes; }, First{}, End{});
    } else if (first_pass) {
      copies_arrived_but<1>();
      __syncwarp();
      products(FromShared{}, shared_row, First{}, Middle{});
      copies_arrived();
      __syncwarp();
      products(FromShared{}, shared_row, Middle{}, End{});
    } else {
      products(FromShared{}, shared_row, First{}, End{});
    }
#pragma unroll
    for (int i = 0; i < N; ++i) {
      float* const out = y + (int64_t(part) * gridDim.y + groups[p].pairs[i0 + i]) * io.y_stride + first + local;
#pragma unroll
      for (int k = 0; k < kRows; ++k) {
        float v = sum[k][i];
#pragma unroll
        for (int offset = kWarp / 2; offset > 0; offset /= 2)
          if (offset < lanes) v = exact::add(v, __shfl_xor_sync(0xffffffffu, v, offset));
        if (sub == 0 && first + local + k * lane_groups < rows) out[k * lane_groups] = v;
      }
    }
  };
  using One = std::integral_constant<int, 1>;
  using Two = std::integral_constant<int, 2>;
  if (kInputs == 1 || inputs == 1) return pass(One{}, 0, true);
  if constexpr (kInputs >= 2) {
    pass(Two{}, 0, true);
    if constexpr (kInputs >= 3) {
      if (inputs == 3) pass(One{}, 2, false);
      if (inputs == 4) pass(Two{}, 2, false);
    }
  }
}

// Q8_0 rows of 256 k values (quant::q8_0_in_spans): the block's rows are copied whole into shared
// memory by cp.async, before the wait for the kernel before when no table is involved (a grouped
// product's rows once its ids have come), so they are on their way while x is rounded and the
// kernel before finishes, without holding registers. A lane then dots spans of 8 blocks (272
// bytes, 17 words) with x staged in the row's own layout (round_x's kRowLayout, zeros at the
// scales): fully unrolled, each 4-byte part's block and each block's scale bytes are known at
// compile time (a part that starts in a block's last two quants ends in the next block's scale,
// which meets zeros). A span's 8 block terms are summed from 0 in order; lane i of the row's group
// of `lanes` adds spans i, i + lanes, ..., then the butterfly, as matvec_q8_kernel's slices.
constexpr int kSpanBytes = kQ8_0SpanBlocks * int(sizeof(BlockQ8_0)), kSpanWords = kSpanBytes / 16;
static_assert(kSpanBytes % 16 == 0);

// Part O (the 4 bytes at offset O of a span) added to its block's integer sum; a block's scale taken
// from the part it starts in.
template <int O>
__device__ __forceinline__ void span_part(int w, int x, int (&sums)[kQ8_0SpanBlocks],
                                          uint32_t (&halves)[kQ8_0SpanBlocks]) {
  constexpr int kBlock = int(sizeof(BlockQ8_0)), kAt = O / kBlock;
  sums[kAt] = __dp4a(w, x, sums[kAt]);
  if constexpr (O % kBlock == 0) halves[kAt] = uint32_t(w) & 0xffffu;             // the scale, then 2 quants
  if constexpr (O % kBlock == kBlock - 2) halves[kAt + 1] = uint32_t(w) >> 16;  // 2 quants, then the next scale
}

// A span's words of the weights (wv) against kN inputs' (xv[i]): each weight word read once and
// dotted with every input's, into that input's block sums.
template <int kN, int... C>
__device__ __forceinline__ void span_words(const int4* wv, const int4* const (&xv)[kN],
                                           int (&sums)[kN][kQ8_0SpanBlocks], uint32_t (&halves)[kQ8_0SpanBlocks],
                                           std::integer_sequence<int, C...>) {
  const auto word = [&](auto c) {
    constexpr int kC = decltype(c)::value;
    const int4 a = wv[kC];
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      const int4 b = xv[i][kC];
      span_part<16 * kC>(a.x, b.x, sums[i], halves);
      span_part<16 * kC + 4>(a.y, b.y, sums[i], halves);
      span_part<16 * kC + 8>(a.z, b.z, sums[i], halves);
      span_part<16 * kC + 12>(a.w, b.w, sums[i], halves);
    }
  };
  (word(std::integral_constant<int, C>{}), ...);
}

// Span `span` of row w dotted with kN inputs' x at once (the weights read once for all of them):
// each input's float, its 8 block terms summed from 0 in order, the bits it gets alone.
template <int kN>
__device__ __forceinline__ void q8_0_span_dots(const uint8_t* w, const RoundedX (&x)[kN], int span, float (&out)[kN]) {
  int sums[kN][kQ8_0SpanBlocks];
  uint32_t halves[kQ8_0SpanBlocks];
  const int4* xv[kN];
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    xv[i] = reinterpret_cast<const int4*>(x[i].q + kSpanBytes * span);
#pragma unroll
    for (int j = 0; j < kQ8_0SpanBlocks; ++j) sums[i][j] = 0;
  }
#pragma unroll
  for (int j = 0; j < kQ8_0SpanBlocks; ++j) halves[j] = 0;
  span_words<kN>(reinterpret_cast<const int4*>(w + kSpanBytes * span), xv, sums, halves,
                 std::make_integer_sequence<int, kSpanWords>{});
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kQ8_0SpanBlocks; ++j) {
      const float d = __half2float(__ushort_as_half(uint16_t(halves[j])));
      sum = exact::add(sum, exact::mul(exact::mul(d, x[i].d[kQ8_0SpanBlocks * span + j]), float(sums[i][j])));
    }
    out[i] = sum;
  }
}

// (With several inputs it takes 86-100 registers, two blocks a multiprocessor where its shared
// memory allows three: held to three, 80 registers, it spilled. One input's form: 60.)
template <int kInputs, bool kGroups = false>
__global__ void __launch_bounds__(256)
    matvec_q8_0_spans_kernel(const uint8_t* w, const void* const* table, const int32_t* ids, int64_t rows,
                             int64_t cols, size_t row_bytes, const float* x, ProblemIo io, float* y, int lanes,
                             int64_t swiglu_up, int64_t n_problems, const ExpertGroup* groups,
                             const int4* rounded) {
  constexpr bool kRoundedFirst = kInputs > 1 || kGroups;  // (rounded: round_inputs_kernel's)
  extern __shared__ int4 shared_rows[];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int group = lane / lanes, sub = lane % lanes, lane_groups = kWarp / lanes;
  const int rows_per_block = int(blockDim.x / kWarp) * lane_groups;
  const int64_t first = int64_t(blockIdx.x) * rows_per_block;
  const int64_t p = kGroups ? int64_t(blockIdx.y) : int64_t(blockIdx.y) * kInputs;  // (as matvec_q8_kernel's)
  uint8_t* const staged = reinterpret_cast<uint8_t*>(shared_rows);
  const size_t x_words = rounded_x_words(row_bytes, cols);
  int inputs = kGroups ? 0 : this_blocks_inputs<kInputs>(p, n_problems);
  const auto input_of = [&](int i) {
    return kGroups ? (io.x_stride == 0 ? 0 : int64_t(groups[p].pairs[i] / io.x_run)) : io.input(p + i);
  };
  const auto y_of = [&](int i) { return y + (kGroups ? int64_t(groups[p].pairs[i]) : p + i) * io.y_stride; };
  int4* const x_at = shared_rows + size_t(rows_per_block) * row_bytes / 16;  // input i's RoundedX: x_at + i x_words
  const auto stage = [&](const uint8_t* matrix) {
    stage_rows(staged, matrix + size_t(first) * row_bytes, int(min(int64_t(rows_per_block), rows - first)), row_bytes);
  };
  if (!table) stage(w);
  kernels::begin_after_inputs();
  if (table) {
    if (kGroups) inputs = min(groups[p].count, kInputs);  // (as matvec_q8_kernel's)
    const int32_t id = kGroups ? groups[p].id : ids[p];
    if (id < 0 || inputs == 0) return;  // computed elsewhere, as in matvec_q8_kernel, or an empty group
    stage(static_cast<const uint8_t*>(table[id]));
  }
  if (kRoundedFirst || rounded) {
    for (int i = 0; i < inputs; ++i) copy_rounded(x_at + i * x_words, rounded + input_of(i) * x_words, x_words);
  } else {
    round_x<XRounding::q8_0, true>(x + io.x_at(p), cols, swiglu_up, rounded_x_in(x_at, row_bytes, cols));
  }
  copies_arrived();
  __syncthreads();
  // Rows past the end compute on whatever the shared memory holds and are not written. The inputs
  // go two at a time, each staged weight word read once for both (the last of an odd count alone).
  const int local = warp * lane_groups + group, n_spans = int(cols / kQ8_0SpanValues);
  const uint8_t* row = staged + size_t(local) * row_bytes;
  const auto inputs_from = [&](int i0, auto n) {
    constexpr int kN = decltype(n)::value;
    RoundedX xs[kN];
    float sum[kN];
#pragma unroll
    for (int i = 0; i < kN; ++i) xs[i] = rounded_x_in(x_at + (i0 + i) * x_words, row_bytes, cols), sum[i] = 0.0f;
    for (int span = sub; span < n_spans; span += lanes) {
      float terms[kN];
      q8_0_span_dots<kN>(row, xs, span, terms);
#pragma unroll
      for (int i = 0; i < kN; ++i) sum[i] = exact::add(sum[i], terms[i]);
    }
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      for (int offset = lanes / 2; offset > 0; offset /= 2)
        sum[i] = exact::add(sum[i], __shfl_xor_sync(0xffffffffu, sum[i], offset));
      if (sub == 0 && first + local < rows) y_of(i0 + i)[first + local] = sum[i];
    }
  };
  int i = 0;
  if constexpr (kInputs > 1) {
#pragma unroll 1
    for (; i + 1 < inputs; i += 2) inputs_from(i, std::integral_constant<int, 2>{});
  }
  if (i < inputs) inputs_from(i, std::integral_constant<int, 1>{});
}

// Blocks in y: a group each (MatvecLaunch::groups), else one per kInputs problems.
unsigned problem_blocks(const MatvecLaunch& m, int inputs) {
  return unsigned(m.groups ? m.n_problems : (m.n_problems + inputs - 1) / inputs);
}

// The inputs round_inputs_kernel rounded for the launch's blocks to copy; null where each block
// rounds its own x.
const int4* rounded_of(const MatvecLaunch& m) {
  return rounds_inputs_first(m) ? static_cast<const int4*>(m.rounded) : nullptr;
}

template <int kInputs, bool kGroups = false>
cudaError_t launch_q8_0_spans(const MatvecLaunch& m) {
  const auto kernel = matvec_q8_0_spans_kernel<kInputs, kGroups>;
  const int lanes = lanes_for(m.cols / kQ8_0SpanValues);
  const int rows_per_block = (256 / kWarp) * (kWarp / lanes);
  const size_t shared = size_t(rows_per_block) * m.row_bytes + inputs_x_bytes(kInputs, m.row_bytes, m.cols);
  if constexpr (kInputs > 1) {  // long rows: fewer inputs a block, so their rounded x fit beside the rows
    if (shared > kernels::max_shared_per_block()) {
      if (kGroups) return cudaErrorInvalidConfiguration;  // a group's inputs go together
      return launch_q8_0_spans<kInputs / 2>(m);
    }
  }
  if (const cudaError_t err = kernels::allow_shared(kernel, shared)) return err;
  const dim3 grid(unsigned((m.rows + rows_per_block - 1) / rows_per_block), problem_blocks(m, kInputs));
  return kernels::launch_overlapped(kernel, grid, dim3(256), shared, m.stream, static_cast<const uint8_t*>(m.w), m.table,
                                    m.ids, m.rows, m.cols, m.row_bytes, m.x, m.io, m.y, lanes, m.swiglu_up,
                                    m.n_problems, m.groups, rounded_of(m));
}

constexpr int kThreads = 256;


// Sets a warp takes so that a launch of problems from an expert table (its experts a (row, slot)
// pair each) fits one wave of the kernel's blocks, at most kMaxTableSets: a verify window's or a
// few sequences' pairs had taken two waves or more, the second's blocks starting their loads only
// as the first's finished. On an H100 with the 35B synth (lode bench --window 2,3,4 --sequences
// 2,3,16, two rounds against the build before, stop 80): a window of 2 3.016 / 2.958 ms against
// 3.155 / 3.208, 2 sequences 2.955 / 2.975 against 3.152 / 3.176, 3 sequences 3.957 / 3.938 against
// 4.034 / 4.075, the rest even; one token's pairs fit one wave already (docs/MTP.md, stop 80).
constexpr int kMaxTableSets = 4;
template <class Kernel>
int sets_for_one_wave(Kernel kernel, size_t shared, int64_t blocks) {
  int per_multiprocessor = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_multiprocessor, kernel, kThreads, shared) != cudaSuccess ||
      per_multiprocessor < 1) {
    cudaGetLastError();  // (not sticky; one set, as before)
    return 1;
  }
  const int64_t wave = int64_t(per_multiprocessor) * kernels::multiprocessors();
  return int(std::clamp<int64_t>((blocks + wave - 1) / wave, 1, kMaxTableSets));
}

template <GgmlType T, int kRows, int kSlices, int kInputs = 1, bool kGroups = false>
cudaError_t launch_q8_rows(const MatvecLaunch& m, int lanes, int sets) {
  const auto kernel = matvec_q8_kernel<T, kRows, kSlices, kInputs, kGroups>;
  const size_t shared = inputs_x_bytes(kInputs, size_t(m.cols), m.cols);
  if constexpr (kInputs > 1) {
    if (shared > kernels::max_shared_per_block()) {
      if (kGroups) return cudaErrorInvalidConfiguration;  // a group's inputs go together
      return launch_q8_rows<T, kRows, kSlices, kInputs / 2>(m, lanes, sets);
    }
  }
  if (const cudaError_t err = kernels::allow_shared(kernel, shared)) return err;
  if (m.table && !m.groups && sets == 1) {  // a problem a pair: in one wave
    const int64_t rows_per_block = int64_t(kThreads / kWarp) * kRows * (kWarp / lanes);
    sets = sets_for_one_wave(kernel, shared, (m.rows + rows_per_block - 1) / rows_per_block * m.n_problems);
  }
  const int64_t rows_per_block = int64_t(kThreads / kWarp) * kRows * sets * (kWarp / lanes);
  const dim3 grid(unsigned((m.rows + rows_per_block - 1) / rows_per_block), problem_blocks(m, kInputs));
  return kernels::launch_overlapped(kernel, grid, dim3(kThreads), shared, m.stream, static_cast<const uint8_t*>(m.w),
                                    m.table, m.ids, m.rows, m.cols, m.row_bytes, m.x, m.io, m.y, lanes, sets,
                                    m.swiglu_up, m.ahead, m.ids_before_wait, m.n_problems, m.groups,
                                    rounded_of(m));
}

// The staged kernel's rows per block: four a warp (a warp per row where the rows are long).
constexpr int kStagedRowsPerWarp = 4;

size_t staged_shared_bytes(int rows_per_block, size_t row_bytes, int64_t cols, int inputs = 1) {
  return size_t(rows_per_block) * row_bytes + inputs_x_bytes(inputs, size_t(cols), cols);
}

template <GgmlType T, int kInputs>
cudaError_t launch_q8_staged(const MatvecLaunch& m, int lanes) {
  const auto kernel = matvec_q8_staged_kernel<T, kStagedRowsPerWarp, kInputs>;
  const int rows_per_block = (kThreads / kWarp) * kStagedRowsPerWarp * (kWarp / lanes);
  // (Several inputs may leave room for fewer than the three blocks a multiprocessor launch_q8 asks
  // of one input's staging.)
  const size_t shared = staged_shared_bytes(rows_per_block, m.row_bytes, m.cols, kInputs);
  if constexpr (kInputs > 1) {
    if (shared > kernels::max_shared_per_block()) return launch_q8_staged<T, kInputs / 2>(m, lanes);
  }
  if (const cudaError_t err = kernels::allow_shared(kernel, shared)) return err;
  const dim3 grid(unsigned((m.rows + rows_per_block - 1) / rows_per_block),
                  unsigned((m.n_problems + kInputs - 1) / kInputs));
  return kernels::launch_overlapped(kernel, grid, dim3(kThreads), shared, m.stream, static_cast<const uint8_t*>(m.w),
                                    m.rows, m.cols, m.row_bytes, m.x, m.io, m.y, lanes, m.swiglu_up, m.n_problems,
                                    static_cast<const int4*>(m.rounded));
}

template <GgmlType T, int kInputs>
cudaError_t launch_q8_group_staged(const MatvecLaunch& m, int lanes) {
  const auto kernel = matvec_q8_group_staged_kernel<T, kStagedRowsPerWarp, kInputs>;
  const int rows_per_block = (kThreads / kWarp) * kStagedRowsPerWarp * (kWarp / lanes);
  const size_t shared = staged_shared_bytes(rows_per_block, m.row_bytes, m.cols, kInputs);
  if (shared > kernels::max_shared_per_block()) return cudaErrorInvalidConfiguration;  // a group's inputs go together
  if (const cudaError_t err = kernels::allow_shared(kernel, shared)) return err;
  int lane_shift = 0;
  while ((1 << lane_shift) < lanes) ++lane_shift;
  const dim3 grid(unsigned((m.rows + rows_per_block - 1) / rows_per_block), unsigned(m.n_problems),
                  unsigned(m.group_parts));
  return kernels::launch_overlapped(kernel, grid, dim3(kThreads), shared, m.stream, m.table, int(m.rows), int(m.cols),
                                    int(m.row_bytes), m.io, m.y, lane_shift, m.groups, m.part_entries,
                                    static_cast<const int4*>(m.rounded));
}

// Two slices of each row per lane and pass where a lane has them and their registers stay within
// 32 words, else one. (Q4_K's gate|up rows in one pass, 64 words, measured slower on the H200:
// 435.3-436.3 tokens/s against 439.5-440.1.)
template <GgmlType T, int kRows, int kInputs = 1, bool kGroups = false>
cudaError_t launch_q8_slices(const MatvecLaunch& m, int lanes, int sets, int64_t slices_per_lane) {
  constexpr bool kTwoFit = kRows * 2 * sizeof(typename Slice<T>::Raw) <= 128;
  if constexpr (kTwoFit) {
    if (slices_per_lane >= 2) return launch_q8_rows<T, kRows, 2, kInputs, kGroups>(m, lanes, sets);
  }
  return launch_q8_rows<T, kRows, 1, kInputs, kGroups>(m, lanes, sets);
}

// Q6_K's slices need many registers: four rows at once halve the blocks a multiprocessor holds
// (the lm head measured 235 us against 204 us with rows one after another, on the H200).
template <GgmlType T>
constexpr int kMaxRowsAtOnce = T == GgmlType::Q6_K ? 2 : 4;

// Sets of rows a warp takes one after another in a block of matvec_q8_kernel's expert groups with 4
// or 8 inputs (since stop 62: groups of 8, under a VRAM budget, and rows the staged group kernel
// cannot copy): fewer blocks, each copying the group's rounded inputs into shared memory for 4
// times as many rows. Measured when every group took this path (H200, the 35B synth, lode bench
// --sequences, ms a step, one set against 4 and 8): 16 sequences 13.34 / 12.01 / 12.71, 64
// sequences 41.26 / 33.92 / 34.66; groups of 2 inputs unchanged by 4 sets, so they keep one.
constexpr int kGroupSets = 4;

// Several inputs of one plain matrix (decode rows of several sequences): a block rounds up to 8 of
// them and dots each weight slice it loads with every one, so the matrix is read once for all.
// Calls launch(std::integral_constant<int, K>) with K inputs a block: 1, 2, 4 or 8; always 1 for
// an expert table (the kernels' several inputs share one matrix: this is where that is kept), as
// many as its groups hold at most for groups (MatvecLaunch::group_inputs).
template <class Launch>
cudaError_t with_inputs(const MatvecLaunch& m, Launch&& launch) {
  if (m.groups) {
    if (m.group_inputs <= 1) return launch(std::integral_constant<int, 1>{});
    if (m.group_inputs == 2) return launch(std::integral_constant<int, 2>{});
    if (m.group_inputs <= 4) return launch(std::integral_constant<int, 4>{});
    return launch(std::integral_constant<int, kGroupInputs>{});
  }
  if (m.table || m.n_problems == 1) return launch(std::integral_constant<int, 1>{});
  if (m.n_problems == 2) return launch(std::integral_constant<int, 2>{});
  if (m.n_problems <= 4) return launch(std::integral_constant<int, 4>{});
  return launch(std::integral_constant<int, 8>{});
}

// Q8_0 rows the spans kernel takes, whose x is rounded in the row's own layout.
bool in_spans(GgmlType type, int64_t cols) { return type == GgmlType::Q8_0 && q8_0_in_spans(cols); }

// Expert groups the staged group kernel takes: rows of whole 16-byte pieces, not the spans kernel's,
// at most 4 inputs a group (with 8, under a VRAM budget, matvec_q8_kernel's groups were faster on an
// H100: 64 rows' gate 124-126 us against 150-153), a matrix's bytes counted in 32 bits.
bool group_staged(const MatvecLaunch& m) {
  return m.groups && m.group_inputs <= 4 && !in_spans(m.type, m.cols) && m.row_bytes % 16 == 0 &&
         m.rows * int64_t(m.row_bytes) < (int64_t(1) << 31);
}

template <GgmlType T>
cudaError_t launch_q8(const MatvecLaunch& m) {
  const int n_slices = int(m.cols / Slice<T>::kValues);
  const int lanes = lanes_for(n_slices);
  const int64_t slices_per_lane = (n_slices + lanes - 1) / lanes;
  // Staged in shared memory: a plain matrix of very many rows (the lm head) whose rows are whole
  // 16-byte pieces from a 16-byte boundary (cp.async's), and whose block's rows fit beside two other
  // blocks.
  if (!m.table && m.rows >= 65536 && m.row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(m.w) % 16 == 0 &&
      staged_shared_bytes((kThreads / kWarp) * kStagedRowsPerWarp * (kWarp / lanes), m.row_bytes, m.cols) <= 72 * 1024)
    return with_inputs(m, [&](auto k) { return launch_q8_staged<T, decltype(k)::value>(m, lanes); });
  // Groups the staged kernel takes: their rows staged once the group is known.
  if (group_staged(m))
    return with_inputs(m, [&](auto k) {
      if constexpr (decltype(k)::value <= 4) return launch_q8_group_staged<T, decltype(k)::value>(m, lanes);
      else return cudaErrorInvalidConfiguration;  // (not taken: group_staged)
    });
  // Other groups: as a single input's rows where groups are single, else as several inputs'.
  if (m.groups)
    return with_inputs(m, [&](auto k) {
      constexpr int kInputs = decltype(k)::value;
      if constexpr (kInputs == 1) {
        const int at_once = std::min(rows_in_flight(slices_per_lane, m.rows * m.n_problems, kWarp / lanes), kMaxRowsAtOnce<T>);
        if (at_once >= 4) return launch_q8_slices<T, 4, 1, true>(m, lanes, 1, slices_per_lane);
        if (at_once == 2) return launch_q8_slices<T, 2, 1, true>(m, lanes, 1, slices_per_lane);
        return launch_q8_slices<T, 1, 1, true>(m, lanes, 1, slices_per_lane);
      } else if constexpr (kInputs == 2) {
        return launch_q8_slices<T, 2, 2, true>(m, lanes, 1, slices_per_lane);
      } else {
        return launch_q8_rows<T, 1, 1, kInputs, true>(m, lanes, kGroupSets);
      }
    });
  // Several inputs of a plain matrix: one slice a pass, and fewer rows at once the more inputs (each
  // row's sums are kept for every input).
  if (!m.table && m.n_problems > 1)
    return with_inputs(m, [&](auto k) {
      constexpr int kInputs = decltype(k)::value;
      if constexpr (kInputs == 2) return launch_q8_slices<T, 2, 2>(m, lanes, 1, slices_per_lane);
      else return launch_q8_rows<T, 1, 1, kInputs>(m, lanes, 1);
    });
  const int64_t all_rows = m.rows * m.n_problems;
  const int at_once = std::min(rows_in_flight(slices_per_lane, all_rows, kWarp / lanes), kMaxRowsAtOnce<T>);
  // Other products of very many rows give each warp four rows in all, so x is rounded once per 32
  // rows rather than per 8.
  const int sets = all_rows >= 65536 ? std::max(1, 4 / at_once) : 1;
  switch (at_once) {
    case 1: return launch_q8_slices<T, 1>(m, lanes, sets, slices_per_lane);
    case 2: return launch_q8_slices<T, 2>(m, lanes, sets, slices_per_lane);
    default: return launch_q8_slices<T, 4>(m, lanes, sets, slices_per_lane);
  }
}

// The bytes of one input's rounded q (rounded_x_in's q_bytes) for the spans kernel, and the most
// for any launch of the type.
size_t rounded_q_bytes(GgmlType type, int64_t cols, size_t row_bytes) {
  return in_spans(type, cols) ? row_bytes : size_t(cols);
}

// round_inputs_kernel over the launch's inputs (ProblemIo::inputs), with its type's rounding.
cudaError_t round_inputs(const MatvecLaunch& m) {
  const int64_t inputs = m.io.inputs(m.n_problems);
  if (rounded_inputs_bytes(m.type, m.cols, m.row_bytes, inputs) > m.rounded_bytes) return cudaErrorInvalidValue;
  const bool row_layout = in_spans(m.type, m.cols) && !q8_tiles_take(m);  // the spans kernel's
  const size_t q_bytes = row_layout ? m.row_bytes : size_t(m.cols);
  const auto launch = [&](auto kernel) {
    return kernels::launch_overlapped(kernel, dim3(unsigned(inputs)), dim3(kThreads), 0, m.stream, m.x, m.io.x_stride,
                                      m.cols, m.swiglu_up, q_bytes, static_cast<int4*>(m.rounded));
  };
  if (row_layout) return launch(round_inputs_kernel<XRounding::q8_0, true>);
  cudaError_t err = cudaErrorInvalidValue;
  for_weight_type<WeightKernel::q8>(m.type, [&](auto t) {
    err = launch(round_inputs_kernel<Slice<decltype(t)::value>::kRounding, false>);
  });
  return err;
}

}  // namespace

size_t rounded_inputs_bytes(GgmlType type, int64_t cols, size_t row_bytes, int64_t inputs) {
  return size_t(inputs) * 16 * rounded_x_words(rounded_q_bytes(type, cols, row_bytes), cols);
}

bool rounds_inputs_first(const MatvecLaunch& m) {
  if (!m.q8_input || !read_by(m.type, WeightKernel::q8)) return false;
  if (m.groups || (!m.table && m.n_problems > 1)) return true;
  // A problem per (row, expert) pair, several pairs to a row (a verify window's or a few sequences'
  // experts): each row rounded once rather than by every block of each of its pairs.
  const int64_t inputs = m.io.inputs(m.n_problems);
  return m.table && inputs > 1 && inputs < m.n_problems;
}

namespace {

// The launch's kernel, its inputs rounded first where it reads them so.
cudaError_t launch_rounded(const MatvecLaunch& m) {
  if (q8_tiles_take(m)) return launch_q8_tiles(m);
  if (in_spans(m.type, m.cols)) {
    if (m.groups) return with_inputs(m, [&](auto k) { return launch_q8_0_spans<decltype(k)::value, true>(m); });
    return with_inputs(m, [&](auto k) { return launch_q8_0_spans<decltype(k)::value>(m); });
  }
  cudaError_t err = cudaErrorInvalidValue;
  for_weight_type<WeightKernel::q8>(m.type, [&](auto t) { err = launch_q8<decltype(t)::value>(m); });
  return err;
}

}  // namespace

cudaError_t launch_matvec_q8(const MatvecLaunch& m) {
  if (rounds_inputs_first(m))
    if (const cudaError_t err = round_inputs(m)) return err;
  if (m.group_parts > 1 && !group_staged(m)) {  // the other group kernels take a part a launch
    for (int32_t q = 0; q < m.group_parts; ++q) {
      MatvecLaunch part = m;
      part.table = m.table + q * m.part_entries, part.y = m.y + q * m.n_problems * m.io.y_stride;
      part.group_parts = 1;
      if (const cudaError_t err = launch_rounded(part)) return err;
    }
    return cudaSuccess;
  }
  return launch_rounded(m);
}

}  // namespace lode::cuda
