#include "cpu/state.h"

namespace lode::cpu {

SequenceState::SequenceState(const model::Qwen35MoeConfig& config, kv::Format kv_format)
    : kv(size_t(config.n_layers)), deltanet(size_t(config.n_layers)) {
  for (int64_t layer = 0; layer < config.n_layers; ++layer) {
    if (!config.block_is_recurrent(layer)) {
      kv[size_t(layer)] = KvCache(kv_format, config.n_kv_heads, config.head_dim);
      continue;
    }
    DeltaNetState& d = deltanet[size_t(layer)];
    d.conv.assign(size_t(config.conv_channels() * (config.ssm_conv_kernel - 1)), 0.0f);
    d.s.assign(size_t(config.ssm_dt_rank * config.ssm_state * config.ssm_state), 0.0f);
  }
}

int64_t SequenceCheckpoint::bytes() const {
  int64_t total = 0;
  for (const DeltaNetState& d : deltanet) total += int64_t((d.conv.size() + d.s.size()) * sizeof(float));
  return total;
}

}  // namespace lode::cpu
