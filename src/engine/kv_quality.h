// How far each K/V cache format moves a model from a reference cache, fp32 by default (`lode
// kv-quality`, docs/KV.md): one sequence per format (on either engine) runs the same text
// teacher-forced, chunk by chunk in lockstep, and every next-token distribution is compared with
// the reference sequence's; then each continues greedily on its own and the continuations are
// compared. When not every format's sequence fits at once (a large model on the GPU), the formats
// go in passes, each beside a fresh reference sequence.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "engine/generate.h"
#include "kv/format.h"

namespace lode::engine {

struct KvQualityOptions {
  kv::Format reference = kv::Format::f32;  // the first row, which the others are compared with
  std::vector<kv::Format> formats;
  int64_t chunk = 64;               // prompt positions per forward call
  int64_t greedy_tokens = 256;      // greedy continuation after the text
  int64_t formats_per_pass = 0;     // formats run beside one reference sequence; 0: all at once
  int64_t scored_positions = 0;     // score only the text's last this many positions (0: all); the
                                    // rest is run teacher-forced without its logits
};

// Opens an empty sequence whose K/V cache is in `format`, with room for max_context positions.
using OpenSequence = std::function<std::unique_ptr<Sequence>(kv::Format format, int64_t max_context)>;

struct KvQualityRow {
  kv::Format format = kv::Format::f32;
  int64_t positions = 0;     // next-token distributions compared (every position but the last)
  double kl_sum = 0;         // sum over positions of KL(reference || this format), nats
  int64_t top1_same = 0;     // positions whose most likely token is the reference's
  double nll_sum = 0;        // -log p(the text's next token), nats
  int64_t greedy_same = 0;   // greedy tokens equal to the reference's, up to the first that differs
  int64_t greedy_tokens = 0;

  double mean_kl() const { return positions ? kl_sum / double(positions) : 0.0; }
  double top1_agreement() const { return positions ? double(top1_same) / double(positions) : 0.0; }
  double perplexity() const;
};

// Called after each chunk of the text: (positions done, positions in all).
using KvQualityProgress = std::function<void(int64_t done, int64_t total)>;

// Runs `tokens` (at least 2) through a sequence per format; the first row is the reference against
// itself. Progress counts positions over all passes.
std::vector<KvQualityRow> compare_kv_formats(const OpenSequence& open, std::span<const int32_t> tokens,
                                             const KvQualityOptions& options, const KvQualityProgress& progress = {});

// KL(p || q) of the distributions softmax(p_logits) and softmax(q_logits), in double precision.
double kl_divergence(std::span<const float> p_logits, std::span<const float> q_logits);

}  // namespace lode::engine
