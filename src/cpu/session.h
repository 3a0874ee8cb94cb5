// The CPU reference engine's API for one sequence of qwen35moe.
//
//   gguf::Reader reader(path);
//   auto config = model::read_config(reader.metadata());
//   cpu::Session session(reader, config, {.threads = 4});
//   std::vector<float> last = session.prefill(prompt);            // [vocab]: last position
//   std::vector<float> all = session.prefill(more, 64, true);     // [n, vocab]: every position
//   std::vector<float> next = session.decode(token);              // [vocab]
//
// Activations are float32; weights are read straight from the file in their stored types. A
// prompt runs `chunk` tokens at a time through every layer (projections and experts batched over
// the chunk; the DeltaNet recurrence in its chunked form, see SessionOptions::deltanet_chunk);
// results agree whatever the chunk size (bit-identical with deltanet_chunk = 0).
// The Reader must outlive the Session. The MTP block, when present, runs beside it (cpu/mtp.h).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "cpu/compute.h"
#include "cpu/state.h"
#include "model/weights.h"
#include "gguf/reader.h"
#include "model/qwen35moe.h"

namespace lode::cpu {

struct SessionOptions {
  int threads = 0;           // OpenMP threads; 0: OpenMP's default
  int64_t max_context = 0;   // most positions this session may hold; 0: the model's context length
  // DeltaNet recurrence of a multi-token chunk: this many tokens at a time in the chunked (WY)
  // form; 0 runs it token by token (the recurrent form decoding uses), which makes chunked prefill
  // bit-identical to decoding. The two agree up to rounding (~1e-6 relative).
  int64_t deltanet_chunk = 64;
  // Activations::q8 rounds activations as llama.cpp's CPU path does (model/activations.h).
  model::Activations activations = model::Activations::f32;
  // How the attention layers' K/V cache is stored (kv/format.h). fp32 is the plain float math;
  // the commands default to fp16.
  kv::Format kv_format = kv::Format::f32;
};

class Session;

// One sequence's part of a batched step (Session::forward_batch): tokens to append, and how many
// of their last positions to return logits for (0, 1 or all).
struct BatchEntry {
  Session* session = nullptr;
  std::span<const int32_t> tokens;
  int64_t logit_rows = 1;
  std::vector<float> logits{};  // out: [logit_rows, vocab]
  // Also the final-normed hidden state of every row (what the lm head and the MTP block read).
  bool want_hidden = false;
  std::vector<float> hidden{};  // out: [tokens.size(), hidden]
  // The DeltaNet recurrence token by token, as decoding runs it: a speculative verify window's
  // rows then equal decode steps bit for bit (a prompt chunk otherwise takes the chunked form).
  bool as_decode = false;
};

class Session {
public:
  // Binds the weights (checked against the config) and starts an empty sequence.
  Session(const gguf::Reader& reader, const model::Qwen35MoeConfig& config,
          SessionOptions options = {});
  // Shares weights bound once between several sessions.
  Session(std::shared_ptr<const model::ModelWeights> weights, SessionOptions options = {});

  // Appends tokens to the sequence, `chunk` at a time (0 or more than the prompt: all at once).
  // Returns the logits of every new position [tokens.size(), vocab] row-major when all_logits,
  // else only the last position's [vocab]. Fails on an empty prompt, a token id outside the
  // vocabulary, or when the sequence would exceed max_context.
  std::vector<float> prefill(std::span<const int32_t> tokens, int64_t chunk = 64,
                             bool all_logits = false);
  // Appends one token; returns its logits [vocab].
  std::vector<float> decode(int32_t token);

  // Several sessions of the same weights and options advance together in one step: every entry's
  // tokens run as one chunk of its sequence, the projections and experts batched over all of them.
  // Each entry's logits equal, bit for bit, those of session.prefill(tokens, tokens.size()) run
  // alone (every row is computed independently of the others). Fails, changing nothing, on an
  // empty entry, a token outside the vocabulary, a full context, or sessions that do not share
  // weights and options.
  static void forward_batch(std::span<BatchEntry> entries);

  // Forgets the sequence (K/V caches and DeltaNet states back to empty).
  void reset();
  // The current position, to come back to later (prefix reuse: a conversation that continues from
  // a shared prefix rewinds to the checkpoint at the prefix's end instead of recomputing it).
  SequenceCheckpoint checkpoint() const;
  // Goes back to a checkpoint taken earlier in this same sequence (after it, no reset() in
  // between): the K/V caches are cut to its position and the DeltaNet states restored. Fails when
  // the checkpoint is ahead of the sequence or does not fit this model.
  void rewind(const SequenceCheckpoint& checkpoint);
  // Makes this sequence a copy of `other`'s up to one of its checkpoints (K/V caches cut there,
  // DeltaNet states from the checkpoint): a request that shares a prefix with a conversation held
  // by another session starts from it without disturbing that session. Fails unless both share
  // weights and the checkpoint lies within `other`.
  void copy_prefix(const Session& other, const SequenceCheckpoint& checkpoint);
  // Right after a step whose entry for this session was a verify window (as_decode, several
  // tokens): the sequence as it stood after the first `tokens` of them (1..n), nothing run again.
  // A cut window may be cut again, shorter. Fails after any other step.
  void cut_window(int64_t tokens);
  int64_t position() const { return state_.position; }
  int64_t max_context() const { return options_.max_context; }  // resolved: never 0
  kv::Format kv_format() const { return options_.kv_format; }
  int64_t kv_bytes() const;  // what the K/V caches hold now, in their format's bytes
  int64_t vocab() const { return weights_->config.vocab; }
  const model::Qwen35MoeConfig& config() const { return weights_->config; }
  const SequenceState& state() const { return state_; }
  const std::shared_ptr<const model::ModelWeights>& weights() const { return weights_; }
  const SessionOptions& options() const { return options_; }  // max_context resolved

private:
  // Fails unless `tokens` may be appended (non-empty, in the vocabulary, room left).
  void check_append(std::span<const int32_t> tokens) const;
  // Before a step: keeps the states before each token but the first of a verify window of `tokens`
  // (as_decode; 0: the step is none, and the last window can no longer be cut).
  void hold_window(int64_t tokens);

  std::shared_ptr<const model::ModelWeights> weights_;
  SessionOptions options_;
  SequenceState state_;
  // The last step's verify window: the DeltaNet states before each of its tokens but the first
  // (what cut_window goes back to). The buffers stay from window to window.
  struct Window {
    bool held = false;  // whether the last step was one
    int64_t start = 0;  // the position before it
    int64_t tokens = 0;
    std::vector<std::vector<DeltaNetState>> before;  // [layer][token - 1] (none for attention layers)
  } window_;
};

}  // namespace lode::cpu
