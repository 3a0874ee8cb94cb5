#include "cuda/pipeline.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "core/error.h"
#include "cuda/errors.h"
#include "cuda/nccl.h"
#include "cuda/on_device.h"
#include "cuda/prompt_pass.h"
#include "cuda/vram.h"
#include "plan/memory_plan.h"

namespace lode::cuda {
namespace {

void check_gpus(const std::vector<int>& gpus) {
  if (gpus.empty()) fail("--gpus: name at least one GPU (device indices: 0,1,...)");
  int count = 0;
  if (const cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess || count == 0)
    fail_no_gpu(err != cudaSuccess ? cudaGetErrorString(err) : "no device");
  for (int g : gpus)
    if (g < 0 || g >= count) fail("--gpus: there is no GPU {}; this machine shows {} (0 to {})", g, count, count - 1);
}

// Each share's budget: `asked`, or its GPU's free memory less a margin, split evenly between the
// shares that GPU holds.
std::vector<size_t> budgets_for(const std::vector<int>& gpus, size_t asked) {
  std::map<int, size_t> shares_on;
  for (int g : gpus) ++shares_on[g];
  std::vector<size_t> out;
  for (int g : gpus) {
    if (asked > 0) {
      out.push_back(asked);
      continue;
    }
    const OnDevice on(g);
    size_t free = 0, total = 0;
    check_cuda(cudaMemGetInfo(&free, &total), "reading free device memory");
    out.push_back(plan::default_budget(free, total) / shares_on[g]);
  }
  return out;
}

// Every GPU of the pipeline lets the others read its memory where they can (NVLink or PCIe peer
// to peer): the hand-over's copies then go straight between them, not through the host, and a GPU
// can read the experts another holds for it. The pairs (reader, holder) that can.
std::set<std::pair<int, int>> enable_peer_access(const std::vector<int>& gpus) {
  std::set<std::pair<int, int>> can_read;
  for (int from : gpus)
    for (int to : gpus) {
      if (from == to) {
        can_read.insert({from, to});
        continue;
      }
      int can = 0;
      check_cuda(cudaDeviceCanAccessPeer(&can, from, to), "asking for peer access between GPUs");
      if (!can || can_read.count({from, to})) continue;
      const OnDevice on(from);
      const cudaError_t err = cudaDeviceEnablePeerAccess(to, 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
      else check_cuda(err, fmt::format("letting GPU {} read GPU {}'s memory", from, to));
      can_read.insert({from, to});
    }
  return can_read;
}

}  // namespace

CudaPipeline::CudaPipeline(std::unique_ptr<CudaSession> session) : config_(session->config()) {
  const int device = session->device();
  shares_.push_back({device, 0, config_.n_layers, std::move(session), {}});
}

CudaPipeline::CudaPipeline(const gguf::Reader& reader, std::shared_ptr<const model::ModelWeights> weights,
                           const CudaSessionOptions& options, std::vector<int> gpus, HandOverBy by)
    : config_(weights->config) {
  check_gpus(gpus);
  if (by == HandOverBy::nccl && gpus.size() > 1) nccl_ = std::make_unique<NcclGroup>(gpus);
  if (gpus.size() == 1) {
    CudaSessionOptions one = options;
    one.device = gpus.front();
    const OnDevice on(one.device);
    shares_.push_back(
        {one.device, 0, config_.n_layers, std::make_unique<CudaSession>(reader, std::move(weights), one), {}});
    return;
  }
  const std::set<std::pair<int, int>> can_read = enable_peer_access(gpus);
  const std::vector<size_t> budgets = budgets_for(gpus, options.vram_budget);
  std::vector<uint8_t> reachable;  // [reader][holder]: where a GPU can read the experts another holds for it
  for (int reader : gpus)
    for (int holder : gpus) reachable.push_back(can_read.count({reader, holder}) ? 1 : 0);
  const plan::GpuSplit split =
      plan::split_over_gpus(*weights, plan_options(options, 0), budgets, options.expert_scores, reachable);
  try {
    make_shares(reader, *weights, options, gpus, budgets, split);
    lend_experts(*weights, split);
  } catch (...) {
    release_shares();
    throw;
  }
  for (const Share& share : shares_)
    if (share.session->prompt_chunk() != front().prompt_chunk())
      fail("cuda pipeline: the GPUs' shares took prompt chunks of {} and {} tokens (a bug: the split gives one chunk "
           "to all)", front().prompt_chunk(), share.session->prompt_chunk());
}

void CudaPipeline::make_shares(const gguf::Reader& reader, const model::ModelWeights& weights,
                               const CudaSessionOptions& options, const std::vector<int>& gpus,
                               const std::vector<size_t>& budgets, const plan::GpuSplit& split) {
  const int64_t n_experts = config_.n_experts;
  for (size_t g = 0; g < gpus.size(); ++g) {
    const plan::GpuShare& at = split.gpus[g];
    CudaSessionOptions o = options;
    o.device = gpus[g];
    o.vram_budget = budgets[g];
    if (o.prompt_chunk > 1) o.prompt_chunk = split.prompt_chunk;  // one chunk for all: it is part of the arithmetic
    o.hand_in = g > 0;
    o.mtp = options.mtp && g + 1 == gpus.size();  // the MTP block beside the lm head (plan::share_options)
    if (g + 1 < gpus.size()) o.next_norm = weights.layers[size_t(at.end_layer)].attn_norm;
    // Exactly the experts the split gives it of its own layers (the split weighed options.expert_scores).
    o.expert_scores.assign(size_t((at.end_layer - at.first_layer) * n_experts), 0.0);
    o.max_resident_experts = 0;
    for (int64_t i = at.first_layer * n_experts; i < at.end_layer * n_experts; ++i)
      if (split.owner[size_t(i)] == int32_t(g))
        o.expert_scores[size_t(i - at.first_layer * n_experts)] = 1.0, ++o.max_resident_experts;
    auto share = std::make_shared<const model::ModelWeights>(model::layer_share(weights, at.first_layer, at.end_layer));
    const OnDevice on(o.device);
    shares_.push_back(
        {o.device, at.first_layer, at.end_layer, std::make_unique<CudaSession>(reader, std::move(share), o), {}});
  }
}

CudaPipeline::~CudaPipeline() { release_shares(); }

// Each session released on its own GPU, the last share first (from the destructor too: nothing
// here may throw).
void CudaPipeline::release_shares() {
  while (!shares_.empty()) {
    try {
      const OnDevice on(shares_.back().device);
      shares_.pop_back();
    } catch (const Error&) {  // (no device could be selected: released as things stand)
      shares_.pop_back();
    }
  }
}

CudaSession& CudaPipeline::drafting() {
  CudaSession& last = back();
  if (!last.has_mtp()) fail("--mtp: this model's GPUs were opened without the MTP block");
  return last;
}

template <class Call>
void CudaPipeline::each(Call&& call) {
  for (Share& share : shares_) {
    const OnDevice on(share.device);
    call(*share.session);
  }
}

void CudaPipeline::hand_in(size_t g, bool prompt, int64_t rows) {
  if (g == 0) return;
  const CudaSession& before = *shares_[g - 1].session;
  CudaSession& after = *shares_[g].session;
  if (!nccl_) return after.receive(before.hand_over(prompt), shares_[g - 1].device, rows, prompt);
  const CudaSession::HandOver from = before.hand_over(prompt), to = after.receiving(rows, prompt);
  nccl_->copy(int(g - 1), before.stream(), int(g), after.stream(), {{from.h, to.h}, {from.normed, to.normed}},
              size_t(rows * config_.hidden) * sizeof(float));
}

template <class Call>
auto CudaPipeline::through(bool prompt, int64_t rows, std::span<const int64_t> sequences, Call&& call) {
  const size_t last = shares_.size() - 1;
  size_t g = 0;
  try {
    for (; g < last; ++g) {
      const OnDevice on(shares_[g].device);
      hand_in(g, prompt, rows);
      call(*shares_[g].session);
    }
    const OnDevice on(shares_[last].device);
    hand_in(last, prompt, rows);
    return call(*shares_[last].session);
  } catch (const Error& e) {
    // A share that fails leaves its sequences as they were, as one session does; if shares before
    // it ran, theirs are ahead, so every share forgets them.
    if (g == 0) throw;
    try {
      reset_sequences(sequences);
    } catch (const Error&) {  // (the first failure is the one to report)
    }
    fail("{} (the layers spread over {} GPUs: the step's sequences were reset)", e.what(), shares_.size());
  }
}

// After the `failed`-th share (counting from 1) failed to restore or resume the current sequence:
// with shares before it changed, every share forgets it (best effort: the first error is the one
// to report); the failed share left itself as one session would.
void CudaPipeline::forget_after_failure(size_t failed) {
  if (failed <= 1) return;
  try {
    reset_sequences({});
  } catch (const Error&) {
  }
}

void CudaPipeline::reset_sequences(std::span<const int64_t> sequences) {
  const int64_t current = front().sequence();
  each([&](CudaSession& s) {
    for (int64_t q : sequences) s.use_sequence(q), s.reset();
    if (sequences.empty()) s.reset();
    s.use_sequence(current);
  });
}

std::vector<float> CudaPipeline::prefill(std::span<const int32_t> tokens, bool all_logits, std::vector<float>* hidden) {
  if (shares_.size() == 1) return through(false, 0, {}, [&](CudaSession& s) { return s.prefill(tokens, all_logits, hidden); });
  if (tokens.empty()) fail("cuda session: prefill needs at least one token");
  // The whole prompt checked and its K/V pages mapped in every share first, as one session does.
  each([&](CudaSession& s) { s.prepare_prompt(tokens); });
  std::vector<float> logits, rows_hidden;
  if (hidden) hidden->clear();
  const auto keep_hidden = [&] {
    if (hidden) hidden->insert(hidden->end(), rows_hidden.begin(), rows_hidden.end());
  };
  const size_t chunk = size_t(back().prompt_chunk());
  if (tokens.size() > 1 && chunk > 0) {  // chunk by chunk, as one session runs such a prompt
    for (size_t at = 0; at < tokens.size(); at += chunk) {
      const std::span<const int32_t> part = tokens.subspan(at, std::min(chunk, tokens.size() - at));
      const bool last = at + part.size() == tokens.size();
      const std::vector<float> out = through(true, int64_t(part.size()), {}, [&](CudaSession& s) {
        return s.prefill_chunk(part, all_logits, last, hidden ? &rows_hidden : nullptr);
      });
      logits.insert(logits.end(), out.begin(), out.end());
      keep_hidden();
    }
    return logits;
  }
  for (size_t i = 0; i < tokens.size(); ++i) {  // token by token
    const std::vector<float> out = through(false, 1, {}, [&](CudaSession& s) {
      return s.prefill(tokens.subspan(i, 1), false, hidden ? &rows_hidden : nullptr);
    });
    if (all_logits || i + 1 == tokens.size()) logits.insert(logits.end(), out.begin(), out.end());
    keep_hidden();
  }
  return logits;
}

std::vector<CudaSession::PieceOutput> CudaPipeline::prefill_pieces(std::span<const CudaSession::Piece> pieces) {
  std::vector<int64_t> sequences, lengths;
  for (const CudaSession::Piece& p : pieces) sequences.push_back(p.sequence), lengths.push_back(int64_t(p.tokens.size()));
  if (!pieces_fit(lengths)) {  // the first share refuses them, saying why
    const OnDevice on(shares_.front().device);
    return shares_.front().session->prefill_pieces(pieces);
  }
  // Every share's pages mapped before the first share runs; the first share refuses a bad piece
  // before any share maps one (the shares hold the same positions).
  if (shares_.size() > 1) each([&](CudaSession& s) { s.prepare_pieces(pieces); });
  return through(true, prompt_row_starts(lengths).back(), sequences,
                 [&](CudaSession& s) { return s.prefill_pieces(pieces); });
}

int32_t CudaPipeline::decode_greedy(int32_t token) {
  return through(false, 1, {}, [&](CudaSession& s) { return s.decode_greedy(token); });
}

CudaSession::Window CudaPipeline::decode_window(std::span<const int32_t> tokens, bool greedy_only, bool want_hidden,
                                                const CudaSession::WindowDrafts* drafts) {
  return through(false, int64_t(tokens.size()), {},  // (shares that hand their rows on draw no drafts)
                 [&](CudaSession& s) { return s.decode_window(tokens, greedy_only, want_hidden, drafts); });
}

CudaSession::Window CudaPipeline::decode_rows(std::span<const CudaSession::Row> rows, bool greedy_only,
                                              bool want_hidden, bool top) {
  std::vector<int64_t> sequences;
  for (const CudaSession::Row& row : rows) sequences.push_back(row.sequence);
  return through(false, int64_t(rows.size()), sequences,
                 [&](CudaSession& s) { return s.decode_rows(rows, greedy_only, want_hidden, top); });
}

void CudaPipeline::use_sequence(int64_t sequence) {
  each([&](CudaSession& s) { s.use_sequence(sequence); });
}

void CudaPipeline::cut_window(int64_t tokens) {
  each([&](CudaSession& s) { s.cut_window(tokens); });
}

void CudaPipeline::ready_steps(const CudaSession::StepsAhead& ahead) {
  each([&](CudaSession& s) { s.ready_steps(ahead); });
}

void CudaPipeline::reset() {
  each([](CudaSession& s) { s.reset(); });
}

// The shares' pools are alike and take the same calls, so they answer alike.
bool CudaPipeline::reserve_kv(int64_t positions) {
  std::vector<bool> answers;
  each([&](CudaSession& s) { answers.push_back(s.reserve_kv(positions)); });
  if (std::adjacent_find(answers.begin(), answers.end(), std::not_equal_to<>()) != answers.end())
    fail("cuda pipeline: the GPUs' K/V pools answered a promise of {} positions differently (a bug)", positions);
  return answers.front();
}

CudaPipeline::Snapshot CudaPipeline::save() const {
  Snapshot snapshot;
  for (const Share& share : shares_) {
    const OnDevice on(share.device);
    snapshot.push_back(share.session->save());
  }
  return snapshot;
}

void CudaPipeline::restore(const Snapshot& snapshot) {
  if (snapshot.size() != shares_.size())
    fail("cuda pipeline: a snapshot of {} shares of the layers for a model in {}", snapshot.size(), shares_.size());
  size_t g = 0;
  try {
    each([&](CudaSession& s) { s.restore(snapshot[g++]); });
  } catch (const Error&) {
    forget_after_failure(g);
    throw;
  }
}

int64_t CudaPipeline::Prefix::positions() const { return shares.front()->positions(); }

int64_t CudaPipeline::Prefix::host_bytes() const {
  int64_t n = 0;
  for (const auto& share : shares) n += share->host_bytes();
  return n;
}

std::shared_ptr<const CudaPipeline::Prefix> CudaPipeline::keep() {
  auto prefix = std::make_shared<Prefix>();
  prefix->pipeline = this;
  each([&](CudaSession& s) { prefix->shares.push_back(s.keep()); });
  return prefix;
}

void CudaPipeline::resume(const Prefix& prefix) {
  if (prefix.pipeline != this || prefix.shares.size() != shares_.size())
    fail("cuda pipeline: a prefix kept by another model cannot be resumed here");
  size_t g = 0;
  try {
    each([&](CudaSession& s) { s.resume(*prefix.shares[g++]); });
  } catch (const Error&) {
    forget_after_failure(g);
    throw;
  }
}

size_t CudaPipeline::share_of(int64_t layer) const {
  for (size_t g = 0; g < shares_.size(); ++g)
    if (layer >= shares_[g].first_layer && layer < shares_[g].end_layer) return g;
  fail("cuda pipeline: no share holds layer {}", layer);
}

// The experts the split lends: each GPU holds, in VRAM of its own beside its session's, the
// experts of other GPUs' layers it was given room for (GpuSplit::owner: only where the GPU that
// runs their layer can read its memory), copied in once; that GPU reads them there in place.
void CudaPipeline::lend_experts(const model::ModelWeights& weights, const plan::GpuSplit& split) {
  const int64_t n_experts = config_.n_experts;
  std::vector<std::vector<CudaSession::LentExpert>> to(shares_.size());  // by the share whose layer it is
  for (size_t h = 0; h < shares_.size(); ++h) {
    std::vector<int64_t> held;  // [layer][expert] indices GPU h holds for other shares
    for (int64_t i = 0; i < int64_t(split.owner.size()); ++i) {
      const size_t g = share_of(i / n_experts);
      if (split.owner[size_t(i)] == int32_t(h) && g != h) held.push_back(i);
    }
    if (held.empty()) continue;
    const OnDevice on(shares_[h].device);
    shares_[h].lent = DeviceBuffer(shares_[h].session->vram(), held.size() * split.slot_bytes, VramUse::experts,
                                   "experts held for another GPU's layers");
    for (size_t s = 0; s < held.size(); ++s) {
      const int64_t layer = held[s] / n_experts, expert = held[s] % n_experts;
      const size_t g = share_of(layer);
      CudaSession::LentExpert e{.layer = layer - shares_[g].first_layer, .expert = expert};
      uint8_t* at = shares_[h].lent.as<uint8_t>() + s * split.slot_bytes;  // gate, up, down, as in a slot
      const model::MoeWeights& moe = weights.layers[size_t(layer)].moe;
      size_t p = 0;
      for (const model::ExpertStack* stack : {&moe.gate, &moe.up, &moe.down}) {
        const model::MatrixView m = stack->expert(expert);
        const size_t bytes = size_t(m.rows) * m.row_bytes;
        copy_mapped_to_device(at, m.data, bytes);
        e.projections[p++] = at;
        at += bytes;
      }
      to[g].push_back(e);
    }
    lent_ += int64_t(held.size());
  }
  for (size_t g = 0; g < shares_.size(); ++g) {
    if (to[g].empty()) continue;
    const OnDevice on(shares_[g].device);
    shares_[g].session->lend_experts(to[g]);
  }
}

int64_t CudaPipeline::kv_free_pages() const {
  int64_t fewest = front().kv_free_pages();
  for (const Share& share : shares_) fewest = std::min(fewest, share.session->kv_free_pages());
  return fewest;
}

int64_t CudaPipeline::kv_bytes() const {
  int64_t n = 0;
  for (const Share& share : shares_) n += share.session->kv_bytes();
  return n;
}

CudaSession::StepBytes CudaPipeline::decode_bytes(int64_t depth) const {
  CudaSession::StepBytes all;
  for (const Share& share : shares_) {
    const CudaSession::StepBytes s = share.session->decode_bytes(depth);
    all.weights += s.weights, all.state += s.state;
  }
  return all;
}

double CudaPipeline::prompt_flops(int64_t first, int64_t n) const {
  double all = 0;
  for (const Share& share : shares_) all += share.session->prompt_flops(first, n);
  return all;
}

void CudaPipeline::fill_with_random_cells(int64_t depth) {
  each([&](CudaSession& s) { s.fill_with_random_cells(depth); });
}

plan::MemoryPlan CudaPipeline::plan() const {
  std::vector<plan::MemoryPlan> plans;
  for (const Share& share : shares_) plans.push_back(share.session->plan());
  plan::MemoryPlan all = plan::together(plans);
  for (const Share& share : shares_) all.expert_slots += share.lent.bytes();
  all.experts_resident += lent_;  // (the experts GPUs hold for each other's layers)
  if (all.all_resident()) all.host_pinned = 0;
  return all;
}

ExpertStats CudaPipeline::expert_stats() const {
  ExpertStats all;
  for (const Share& share : shares_) {
    const OnDevice on(share.device);
    const ExpertStats s = share.session->expert_stats();
    all.resident += s.resident, all.total += s.total, all.routed += s.routed, all.missed += s.missed;
    all.decode_miss_bytes += s.decode_miss_bytes, all.cpu_experts += s.cpu_experts;
    all.cpu_hinted_experts += s.cpu_hinted_experts, all.cpu_expert_bytes += s.cpu_expert_bytes;
    all.cpu_read_ahead_bytes += s.cpu_read_ahead_bytes, all.cpu_seconds += s.cpu_seconds;
    all.gpu_share_seconds += s.gpu_share_seconds, all.host_wait_seconds += s.host_wait_seconds;
    all.prompt_miss_bytes += s.prompt_miss_bytes, all.swaps += s.swaps;
    if (all.host_tier.empty()) all.host_tier = s.host_tier, all.miss_path = s.miss_path;
  }
  return all;
}

std::string CudaPipeline::describe() const {
  if (shares_.size() == 1) return plan::summary(front().plan());
  std::string out;
  for (const Share& share : shares_)
    out += fmt::format("{}GPU {}: layers {}-{}: {}{}", out.empty() ? "" : "\n", share.device, share.first_layer,
                       share.end_layer - 1, plan::summary(share.session->plan()),
                       share.lent.bytes() ? fmt::format("; and {:.1f} MiB of experts of other GPUs' layers",
                                                        double(share.lent.bytes()) / double(1 << 20))
                                          : std::string());
  return out;
}

}  // namespace lode::cuda
