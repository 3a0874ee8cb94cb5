#include "cuda/mtp_drafter.h"

#include <fmt/format.h>

#include "core/error.h"
#include "cuda/on_device.h"
#include "kv/format.h"

namespace lode::cuda {

GpuDrafter::GpuDrafter(CudaSession& session) : session_(session), sequence_(session.sequence()) {
  if (!session.has_mtp()) fail("--mtp: this GPU session was opened without the MTP block");
}

std::string GpuDrafter::describe() const {
  return fmt::format("MTP drafter on the GPU, its K/V cache {}",
                     kv::to_string(kv::mtp_format(session_.config().head_dim, session_.kv_format())));
}

void GpuDrafter::reset(int64_t position) {
  last_hidden_.clear();
  start_ = position, seen_ = 0, rows_ = 0;
}

void GpuDrafter::advance(std::span<const int32_t> tokens, std::span<const float> hidden) {
  const int64_t h = session_.config().hidden, n = int64_t(tokens.size());
  const engine::FollowedRows rows = engine::followed_rows(tokens, hidden, last_hidden_, followed(), h);
  if (n == 0) return;
  if (!rows.tokens.empty()) {  // committed rows are never drafted from: their K/V is all that is needed
    const OnDevice on(session_.device());  // (the engine's other calls go through cuda/pipeline.h, which does this)
    session_.mtp_append(sequence_, rows.tokens, rows.before, rows_, shift());
    rows_ += int64_t(rows.tokens.size());
  }
  last_hidden_.assign(hidden.end() - h, hidden.end());
  seen_ += n;
}

std::vector<int32_t> GpuDrafter::draft(int32_t pending, int64_t n, float min_p) {
  std::vector<int32_t> drafts;
  if (last_hidden_.empty()) return drafts;
  // The drafts' rows are written after the committed ones and written over by the next advance.
  const OnDevice on(session_.device());
  int32_t token = pending;
  for (int64_t i = 0; i < n && rows_ + i < session_.max_context(); ++i) {
    float probability = 1.0f;
    token = session_.mtp_draft(sequence_, token, i == 0 ? std::span<const float>(last_hidden_) : std::span<const float>(),
                               rows_ + i, shift(), min_p > 0 ? &probability : nullptr);
    if (probability < min_p) break;
    drafts.push_back(token);
  }
  return drafts;
}

}  // namespace lode::cuda
