#include "cuda/matvec.h"

#include <algorithm>
#include <mutex>

#include "core/error.h"
#include "core/quant/iq_grids.h"
#include "cuda/matvec_launch.h"
#include "cuda/weight_types.h"

namespace lode::cuda {

bool has_matvec(GgmlType type) { return read_by(type, WeightKernel::dot); }
bool has_q8_matvec(GgmlType type) { return read_by(type, WeightKernel::q8); }

namespace {

void run(const MatvecLaunch& m) {
  if (!has_matvec(m.type))
    fail("the CUDA backend has no kernel for {} weights yet; requantize the model (lode quantize --recipe "
         "ud-q4_k_xl) or run it on the CPU", traits(m.type).name);
  if (!cuda_weight_type(m.type)->plain && m.cols % 32 != 0) fail("cuda matvec: {} rows of {} values are not whole blocks", traits(m.type).name, m.cols);
  if (m.rows <= 0 || m.n_problems <= 0) return;
  if (m.n_problems > 65535) fail("cuda matvec: {} products in one launch; at most 65535", m.n_problems);
  if (cuda_weight_type(m.type)->grids) {
    static std::once_flag uploaded;
    static const char* upload_error = nullptr;
    std::call_once(uploaded, [] {
      using namespace lode::quant;
      upload_error = upload_iq_grids({iq2xxs_grid, iq2xs_grid, iq2s_grid, iq3xxs_grid, iq3s_grid, iq1s_grid, ksigns_iq2xs});
    });
    if (upload_error) fail("CUDA: uploading the i-quant codebooks: {}", upload_error);
  }
  if (rounds_inputs_first(m)) {
    const size_t need = rounded_inputs_bytes(m.type, m.cols, m.row_bytes, m.io.inputs(m.n_problems));
    if (!m.rounded || m.rounded_bytes < need)
      fail("cuda matvec: {} inputs of {} x {} {} weights are rounded to 8 bits once, into {} bytes of scratch "
           "(MatvecInput::rounded), and {} were given", m.io.inputs(m.n_problems), m.rows, m.cols,
           traits(m.type).name, need, m.rounded ? m.rounded_bytes : 0);
  }
  if (const char* err = launch_matvec(m))
    fail("CUDA: matvec on {} weights ({} x {}): {}", traits(m.type).name, m.rows, m.cols, err);
}

ProblemIo problem_io(int64_t x_stride, int64_t rows, const MatvecInput& input) {
  if (input.x_run < 1 || input.x_inputs < 0) fail("cuda matvec: runs of {} problems over {} inputs", input.x_run, input.x_inputs);
  return {input.x_inputs == 1 ? 0 : x_stride, input.x_run, input.x_inputs > 0 ? input.x_inputs : ProblemIo{}.x_inputs,
          input.y_stride > 0 ? input.y_stride : rows};
}

}  // namespace

void matvec(GgmlType type, const void* w, int64_t rows, int64_t cols, size_t row_bytes, const float* x, float* y,
            int64_t n_tokens, void* stream, MatvecInput input) {
  MatvecLaunch m{type, w, nullptr, nullptr, rows, cols, row_bytes, x, problem_io(cols, rows, input), y, n_tokens, stream,
                 input.swiglu_up, input.q8};
  m.rounded = input.rounded, m.rounded_bytes = input.rounded_bytes;
  run(m);
}

void grouped_matvec(GgmlType type, const void* const* table, const int32_t* ids, int64_t n_problems, int64_t rows,
                    int64_t cols, size_t row_bytes, const float* x, int64_t x_stride, float* y, void* stream,
                    MatvecInput input) {
  if (input.groups && !(input.q8 && has_q8_matvec(type)))
    fail("cuda matvec: products by expert groups need 8-bit activations and {} has no such kernel", traits(type).name);
  ProblemIo io = problem_io(x_stride, rows, input);
  if (input.groups) io.x_inputs = ProblemIo{}.x_inputs;  // (pairs, not problems, index the inputs)
  if (input.group_parts < 1 || (input.group_parts > 1 && (!input.groups || input.part_entries < 1)))
    fail("cuda matvec: {} parts of {} table entries each need expert groups", input.group_parts, input.part_entries);
  if (int64_t(input.group_parts) * n_problems > 65535)
    fail("cuda matvec: {} parts of {} groups in one launch; at most 65535", input.group_parts, n_problems);
  MatvecLaunch m{type, nullptr, table, ids, rows, cols, row_bytes, x, io, y, n_problems, stream, input.swiglu_up,
                 input.q8, input.ahead, input.ids_before_wait, input.groups,
                 std::clamp(input.group_inputs, 1, kGroupInputs), input.rounded, input.rounded_bytes};
  m.group_parts = input.group_parts, m.part_entries = input.part_entries;
  run(m);
}

}  // namespace lode::cuda
