// Several GPUs of one host (docs/SCALE.md): the model's layers cut into contiguous shares as
// plan/gpu_split.h cuts them, each share a CudaSession of its own on its GPU over
// model::layer_share's weights, holding its layers' trunk, K/V pages, DeltaNet states and the
// experts the split gives it: its own layers', and in VRAM beside its session's, those of other
// GPUs' layers that it has room for, which their GPU reads there in place (every expert stays in
// host RAM, as on one GPU); the last share also the lm head. A step or a prompt chunk runs share by
// share: each share hands its rows (h and their normed rows, CudaSession::hand_over) to the next
// (HandOverBy). Every layer's arithmetic is the one-GPU session's and the rows cross unchanged, so
// the tokens do not depend on the split. With one share the pipeline is that session, called
// straight through: `--gpus 0` is the one-GPU path. A GPU may hold several shares (tests hand rows
// over that way on one GPU). Every call runs each share with its GPU current (cuda/on_device.h).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cuda/session.h"
#include "cuda/vram.h"
#include "gguf/reader.h"
#include "model/weights.h"
#include "plan/gpu_split.h"

namespace lode::cuda {

class NcclGroup;

// How rows cross from one GPU to the next: peer copies (cudaMemcpyPeerAsync; also between shares
// on one GPU), or an NCCL send and receive (distinct GPUs only). To be measured against each other
// on several GPUs (lode bench --hand-over), the loser then removed.
enum class HandOverBy { peer_copy, nccl };

class CudaPipeline {
 public:
  // One share: the session, on its device (CudaSessionOptions::device).
  explicit CudaPipeline(std::unique_ptr<CudaSession> session);
  // The layers cut over `gpus` (CUDA device indices, in order; one may repeat) for
  // options.vram_budget on each (0: each GPU's free memory less a margin, split evenly between
  // the shares it holds): fails (lode::Error) as plan::split_over_gpus does, naming the GPU left
  // short. With options.mtp the last share holds the MTP block. options.device is not used.
  CudaPipeline(const gguf::Reader& reader, std::shared_ptr<const model::ModelWeights> weights,
               const CudaSessionOptions& options, std::vector<int> gpus, HandOverBy by = HandOverBy::peer_copy);
  ~CudaPipeline();
  CudaPipeline(const CudaPipeline&) = delete;
  CudaPipeline& operator=(const CudaPipeline&) = delete;

  size_t shares() const { return shares_.size(); }
  CudaSession& share(size_t i) { return *shares_[i].session; }
  const CudaSession& share(size_t i) const { return *shares_[i].session; }
  int device_of(size_t i) const { return shares_[i].device; }
  // Each share's first layer, and one past its last.
  int64_t first_layer(size_t i) const { return shares_[i].first_layer; }
  int64_t end_layer(size_t i) const { return shares_[i].end_layer; }
  // Experts one GPU holds for another's layers (the split's spare room; read in place there).
  int64_t lent_experts() const { return lent_; }
  // The share that holds the MTP block (CudaSessionOptions::mtp): the last, beside the lm head and
  // the last layer's hidden states it drafts from. Fails where it was opened without the block.
  CudaSession& drafting();

  // As CudaSession's, share by share; the outputs come from the last share.
  std::vector<float> prefill(std::span<const int32_t> tokens, bool all_logits = false,
                             std::vector<float>* hidden = nullptr);
  // As CudaSession's: several sequences' prompt pieces in one pass, share by share (each share
  // checks and maps every piece first, as prefill does a prompt).
  std::vector<CudaSession::PieceOutput> prefill_pieces(std::span<const CudaSession::Piece> pieces);
  bool pieces_fit(std::span<const int64_t> lengths) const { return front().pieces_fit(lengths); }
  int32_t decode_greedy(int32_t token);
  CudaSession::Window decode_window(std::span<const int32_t> tokens, bool greedy_only = false, bool want_hidden = false,
                                    const CudaSession::WindowDrafts* drafts = nullptr);
  CudaSession::Window decode_rows(std::span<const CudaSession::Row> rows, bool greedy_only = false,
                                  bool want_hidden = false, bool top = false);
  void use_sequence(int64_t sequence);
  void cut_window(int64_t tokens);
  void ready_steps(const CudaSession::StepsAhead& ahead);  // every share's (the block's on the last)
  void reset();
  bool reserve_kv(int64_t positions);

  // Every share's snapshot of the current sequence (CudaSession::save), restored together; a failure
  // after the first share leaves the sequence empty in every share.
  using Snapshot = std::vector<CudaSession::Snapshot>;
  Snapshot save() const;
  void restore(const Snapshot& snapshot);

  // Every share's kept prefix of the current sequence (CudaSession::keep), resumed together.
  struct Prefix {
    std::vector<std::shared_ptr<const CudaSession::Prefix>> shares;
    const CudaPipeline* pipeline = nullptr;
    int64_t positions() const;
    int64_t host_bytes() const;
  };
  std::shared_ptr<const Prefix> keep();
  // Fails for another pipeline's prefix, changing nothing; a failure after the first share leaves
  // the sequence empty in every share.
  void resume(const Prefix& prefix);

  const model::Qwen35MoeConfig& config() const { return config_; }  // the whole model's
  int64_t position() const { return front().position(); }
  int64_t max_context() const { return front().max_context(); }
  int64_t sequences() const { return front().sequences(); }
  int64_t step_rows() const { return front().step_rows(); }
  int64_t window_rows() const { return front().window_rows(); }
  int64_t vocab() const { return front().vocab(); }
  KvFormat kv_format() const { return front().kv_format(); }
  int64_t kv_pool_positions() const { return front().kv_pool_positions(); }
  int64_t kv_free_pages() const;  // the fewest any share has
  int64_t kv_bytes() const;       // all shares'
  int64_t prompt_chunk() const { return front().prompt_chunk(); }
  // As CudaSession's, every share's layers (the lm head on the last, the embedding row on the first).
  CudaSession::StepBytes decode_bytes(int64_t depth) const;
  double prompt_flops(int64_t first, int64_t n) const;
  void fill_with_random_cells(int64_t depth);  // every share's attention layers
  // The shares' memory plans together (plan::together), with the experts they hold for each other.
  plan::MemoryPlan plan() const;
  // The shares' expert tiers together (counts summed; the first share's host tier and miss path).
  ExpertStats expert_stats() const;
  // Lines for logs: each share's GPU, layers and memory plan.
  std::string describe() const;

 private:
  struct Share {
    int device = 0;
    int64_t first_layer = 0, end_layer = 0;
    std::unique_ptr<CudaSession> session;
    DeviceBuffer lent;  // other shares' experts it holds (released before the session's memory)
  };
  const CudaSession& front() const { return *shares_.front().session; }
  CudaSession& back() { return *shares_.back().session; }
  // Runs call(session) on every share in order, each on its GPU, handing the first `rows` rows of
  // a step (prompt false) or a prompt chunk on between them; returns the last share's result.
  // When a share fails after others ran, every share forgets the sequences (empty: the current
  // one) and it fails saying so.
  template <class Call>
  auto through(bool prompt, int64_t rows, std::span<const int64_t> sequences, Call&& call);
  void reset_sequences(std::span<const int64_t> sequences);
  void forget_after_failure(size_t failed);
  // Runs call(session) on every share, each on its GPU.
  template <class Call>
  void each(Call&& call);

  void hand_in(size_t g, bool prompt, int64_t rows);  // share g - 1's rows to share g
  void make_shares(const gguf::Reader& reader, const model::ModelWeights& weights, const CudaSessionOptions& options,
                   const std::vector<int>& gpus, const std::vector<size_t>& budgets, const plan::GpuSplit& split);
  void release_shares();
  void lend_experts(const model::ModelWeights& weights, const plan::GpuSplit& split);
  size_t share_of(int64_t layer) const;

  model::Qwen35MoeConfig config_;
  std::vector<Share> shares_;
  std::unique_ptr<NcclGroup> nccl_;  // with HandOverBy::nccl
  int64_t lent_ = 0;
};

}  // namespace lode::cuda
