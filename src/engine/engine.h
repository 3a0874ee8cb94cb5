// The engine interface: what generation, perplexity, kv-quality and the server need of a model,
// whichever backend runs it. cpu/engine.h and cuda/engine.h implement it; only the CLI's backend
// factory (cli/backend.h) names one of them.
//
//   std::shared_ptr<engine::Model> model = ...;               // a model loaded on a device
//   std::unique_ptr<engine::Sequence> a = model->open_sequence(), b = model->open_sequence();
//   std::vector<float> logits = engine::prefill(*a, prompt, 64);   // [vocab]: the last position
//   engine::StepRow rows[] = {{a.get(), std::span(&next_a, 1)}, {b.get(), prompt_chunk, 0}};
//   model->step(rows);                                        // both advance in one step
//
// A sequence is one text's position, K/V cache and DeltaNet states. Every row of a step is computed
// as it would be alone: a sequence's logits never depend on what ran beside it.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kv/format.h"
#include "model/qwen35moe.h"
#include "sample/sampler.h"

namespace lode::engine {

class Model;

// A sequence's state at a position, to go back to (rewind) or to start another sequence from
// (copy_prefix). The K/V cache is cut back to it; the DeltaNet states, which cannot be cut, are
// held by the checkpoint. Immutable once taken, so it may be shared.
class Checkpoint {
 public:
  virtual ~Checkpoint() = default;
  virtual int64_t position() const = 0;
  virtual int64_t bytes() const = 0;  // the host memory it holds (device memory it shares is not counted)
};

// Draft tokens for one sequence from its model's MTP block (speculative decoding:
// engine/speculative.h, GenerateOptions::mtp). It follows the tokens the sequence commits (advance) and drafts from there
// without changing what it holds. What it drafts never changes the output, only how many tokens
// one verify step accepts.
class Drafter {
 public:
  virtual ~Drafter() = default;
  // The sequence took `tokens` at its next positions; hidden [tokens.size()][hidden] is the main
  // model's final-normed state after each (StepRow::want_hidden).
  virtual void advance(std::span<const int32_t> tokens, std::span<const float> hidden) = 0;
  // Up to n tokens to follow `pending` (sampled, not yet run); fewer where the block's confidence
  // falls below min_p.
  virtual std::vector<int32_t> draft(int32_t pending, int64_t n, float min_p) = 0;
  // Forget what it followed and follow on from the sequence at `position` (0: an empty one).
  virtual void reset(int64_t position) = 0;
  // The sequence position up to which it has followed: the sequence's own, while generation alone
  // moves the sequence.
  virtual int64_t followed() const = 0;
  virtual std::string describe() const = 0;  // for the run log
};

// The MTP block's rows for tokens a drafter follows (Drafter::advance): token i pairs with the
// main model's state before it, `last_hidden` (the state at the last position followed) and then
// hidden's rows; with no last state (the first position followed), the first token has none, and
// no row. `followed`: the drafter's position before these tokens.
struct FollowedRows {
  std::span<const int32_t> tokens;  // the tokens that have a row
  std::vector<float> before;        // [tokens][width]: the state each pairs with
  int64_t first = 0;                // the first one's position
};
FollowedRows followed_rows(std::span<const int32_t> tokens, std::span<const float> hidden,
                           std::span<const float> last_hidden, int64_t followed, int64_t width);

// What a sequence's coming decode steps will be (Sequence::ready_steps): steps of up to `tokens`
// tokens each (verify windows: 1 + drafts), giving greedy tokens, top candidates (one-token
// steps; windows then give logits) or logits; with `drafts`, its drafter's steps too.
struct StepsAhead {
  int64_t tokens = 1;
  enum class Output { greedy, top, logits } output = Output::greedy;
  bool drafts = false;
};

class Sequence {
 public:
  virtual ~Sequence() = default;
  virtual Model& model() const = 0;
  virtual int64_t position() const = 0;
  virtual int64_t max_context() const = 0;
  virtual int64_t kv_bytes() const = 0;  // what its K/V cache holds now
  virtual void reset() = 0;              // empty again
  // A checkpoint at the current position. Fails where the backend cannot take one (saying so).
  virtual std::shared_ptr<const Checkpoint> checkpoint() const = 0;
  // Back to a checkpoint of this sequence's text (taken by it, or by the sequence a prefix was
  // copied from). Fails when it is ahead of the sequence or not this backend's.
  virtual void rewind(const Checkpoint& checkpoint) = 0;
  // This sequence becomes `other`'s prefix up to one of `other`'s checkpoints; `other` is left as
  // it was. Fails unless both are sequences of the same model.
  virtual void copy_prefix(const Sequence& other, const Checkpoint& checkpoint) = 0;
  // Promises room for `positions` positions of K/V (the prompt and the most tokens the sequence
  // may generate), replacing its promise (0 lets it go): false, changing nothing, when the device
  // cannot promise it now beside the other sequences (a pool they share: the GPU's with --kv-positions).
  // A sequence that writes past its promise may find the pool full. Backends that give every
  // sequence its whole context always promise.
  virtual bool reserve(int64_t positions) { return positions <= max_context(); }
  // Its drafter, made on first use. Fails, saying why, when the model has no MTP block or the
  // backend cannot draft yet.
  virtual Drafter& drafter();
  // Readies what the sequence's coming decode steps need (StepsAhead), so that the first of each
  // kind costs what the rest do (the GPU captures their graphs and loads their kernels now).
  // Changes nothing the sequence holds. Returns whether there was anything to ready (by default
  // not: the CPU engine has nothing to prepare).
  virtual bool ready_steps(const StepsAhead& ahead) { return (void)ahead, false; }
  // Whether cut_window works (so that a verify step needs no checkpoint before it).
  virtual bool cuts_windows() const { return false; }
  // Right after a step whose row for this sequence ran n tokens as decode steps (StepRow::as_decode):
  // the sequence as it stood after the first `tokens` of them (1..n: a verify window's first token
  // is the model's own choice, never cut), nothing run again (the engines keep a window's DeltaNet
  // states before each token but its first). Fails where cuts_windows() is false.
  virtual void cut_window(int64_t tokens);
};

// One row of a step: tokens appended to a sequence, and the logits of its last logit_rows
// positions (0, 1 or all of them) back in `logits`, [logit_rows][vocab].
struct StepRow {
  Sequence* sequence = nullptr;
  std::span<const int32_t> tokens;
  int64_t logit_rows = 1;
  std::vector<float> logits{};  // out
  bool want_hidden = false;   // also the final-normed hidden state of every row
  std::vector<float> hidden{};  // out: [tokens.size()][hidden]
  // Every row as a decode step computes it, bit for bit (a speculative verify window): no prompt
  // shortcuts such as the chunked DeltaNet form.
  bool as_decode = false;
  // Only the greedy tokens of the logit rows are wanted (sample::greedy of each row's logits): the
  // backend fills `greedy`, one token per logit row, and leaves `logits` empty (the GPU chooses
  // them where the logits are and copies 4 bytes a row). Needs a logit row. Fails as
  // sample::greedy does.
  bool greedy_only = false;
  std::vector<int32_t> greedy{};  // out, with greedy_only: [logit_rows]
  // Only the last position's top candidates are wanted (sample::top_candidates of its logits,
  // sample::kTopCandidates of them: what a sampler that takes_top() needs): the backend fills `top`
  // and leaves `logits` empty (the GPU finds them where the logits are and copies 64 pairs, not the
  // vocabulary's floats). Needs logit_rows 1. Fails as sample::top_candidates does.
  bool top_only = false;
  // With top_only: ids (ascending, at most sample::kTopAsideMost: Sampler::top_aside) whose logits
  // come back apart in top.aside and take no part in top.best or top.finite.
  std::span<const int32_t> top_aside{};
  sample::TopCandidates top{};  // out, with top_only
};

// What Model::draft_together asks of one sequence's drafter: up to n tokens to follow `pending`,
// as Drafter::draft gives them.
struct DraftAsk {
  Drafter* drafter = nullptr;
  int32_t pending = 0;
  int64_t n = 0;
  float min_p = 0.0f;
};

// The asks' drafters as a backend's own drafter type D, or none where one of them is not a D.
template <class D>
std::vector<D*> drafters_as(std::span<const DraftAsk> asks) {
  std::vector<D*> drafters;
  for (const DraftAsk& a : asks) {
    D* drafter = dynamic_cast<D*>(a.drafter);
    if (!drafter) return {};
    drafters.push_back(drafter);
  }
  return drafters;
}
// Of those asks, the ones that draft (any wanted, and their drafter ready: a state to pair the
// pending token with), by index.
template <class D, class Ready>
std::vector<size_t> drafting(std::span<D* const> drafters, std::span<const DraftAsk> asks, Ready&& ready) {
  std::vector<size_t> live;
  for (size_t i = 0; i < drafters.size(); ++i)
    if (asks[i].n > 0 && ready(*drafters[i])) live.push_back(i);
  return live;
}

// What a server's status shows of an engine.
struct EngineInfo {
  std::string backend;  // "cpu" or "cuda"
  int threads = 0;      // CPU threads that compute the model (0: it runs on a device)
  kv::Format kv_format = kv::Format::f32;  // its sequences' K/V caches
  // Positions of K/V its sequences share (a pool: the GPU's with --kv-positions); 0: each sequence
  // its whole context. One sequence is promised at most this many.
  int64_t kv_pool_positions = 0;
  int64_t kv_page_positions = 1;  // the pool's pages: promises are whole pages
  std::vector<int> gpus;          // the GPUs holding the model's layers, in order (none on the CPU)
};

// A model loaded on a device. Sequences keep their model alive.
class Model : public std::enable_shared_from_this<Model> {
 public:
  virtual ~Model() = default;
  virtual const model::Qwen35MoeConfig& config() const = 0;
  int64_t vocab() const { return config().vocab; }
  // A new, empty sequence. Fails, saying why, when the device holds no more.
  virtual std::unique_ptr<Sequence> open_sequence() = 0;
  // Runs every row in one step; a sequence appears at most once. Fails, changing nothing, on an
  // empty row, a token outside the vocabulary, a full context or a sequence of another model.
  virtual void step(std::span<StepRow> rows) = 0;
  // Prompts are cut into chunks by the backend itself (the GPU's prompt pass): a row may hold a
  // whole prompt, and a caller's chunk size does not apply.
  virtual bool chunks_prompts() const { return false; }
  // A line for the run log about what the engine did beyond the tokens (the GPU's expert tier:
  // hit rate, bytes over PCIe, swaps); empty when there is nothing to say.
  virtual std::string activity() const { return {}; }
  virtual EngineInfo info() const = 0;
  // Positions of a shared K/V pool (EngineInfo::kv_pool_positions) on pages nothing holds now;
  // 0 without a pool. Safe to call from any thread.
  virtual int64_t kv_pool_free_positions() const { return 0; }
  // Drafts for several sequences at once, each ask's as its drafter's draft() gives them (n 0:
  // none). By default one drafter after another; the CPU and GPU engines draft for all of them in
  // steps of the MTP block over a row of each.
  virtual std::vector<std::vector<int32_t>> draft_together(std::span<const DraftAsk> asks);
};

// Called after each chunk of a prefill with its tokens and their final-normed hidden states.
using ChunkStates = std::function<void(std::span<const int32_t> tokens, std::span<const float> hidden)>;

// Appends tokens to one sequence, `chunk` at a time (0, or more than there are: all at once; the
// backend's own chunks where it chunks prompts). Returns the logits of every new position
// [tokens.size()][vocab] when all_logits, else the last position's [vocab]. With on_chunk, each
// chunk's hidden states go to it (the MTP drafter follows a prompt so).
std::vector<float> prefill(Sequence& sequence, std::span<const int32_t> tokens, int64_t chunk,
                           bool all_logits = false, const ChunkStates& on_chunk = {});
// Appends one token; its logits [vocab].
std::vector<float> decode(Sequence& sequence, int32_t token);
// Appends one token; the greedy token to follow it (StepRow::greedy_only).
int32_t decode_greedy(Sequence& sequence, int32_t token);
// Appends one token; the top candidates to follow it (StepRow::top_only), `aside` set aside.
sample::TopCandidates decode_top(Sequence& sequence, int32_t token, std::span<const int32_t> aside = {});
// The top-candidate rows a backend gives from a row's logits (its fallback where it has no
// faster way): `top` filled, `logits` emptied.
void top_from_logits(StepRow& row);
// Likewise the greedy token of each of a row's logit rows: `greedy` filled, `logits` emptied.
void greedy_from_logits(StepRow& row);

}  // namespace lode::engine
