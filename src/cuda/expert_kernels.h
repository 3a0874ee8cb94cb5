// The expert tier's kernels. set_experts: new entries for the (layer, expert) tables and residency
// flags, queued on the step's stream between steps, so a swap takes effect for the kernels after
// it and for none before. miss_dispatch / miss_gather: the CPU miss path's two ends inside a decode
// step (cuda/miss_path.h). No CUDA types here.
#pragma once
#include <cstdint>

#include "cuda/matvec_launch.h"

namespace lode::cuda::kernels {

struct ExpertEntry {
  int64_t index = 0;     // layer * n_experts + expert
  const void* gate = nullptr;
  const void* up = nullptr;
  const void* down = nullptr;
  uint8_t resident = 0;  // 1: the pointers are its VRAM slot's; 0: its pinned host bytes
};
constexpr int kMaxExpertEntries = 16;
struct ExpertEntries {  // passed by value: the launch keeps its own copy
  int count = 0;
  ExpertEntry at[kMaxExpertEntries];
};

// tables: [layer][gate | up | down][n_experts] pointers; flags: [layer][n_experts].
const char* set_experts(const void** tables, uint8_t* flags, int64_t n_experts, const ExpertEntries& entries,
                        void* stream);

// The CPU miss path's mailbox, in pinned host memory mapped into the device: a decode step's
// dispatch kernel writes a request (the layer, the experts the CPU computes and the rows of the
// step that chose each, the rows' MoE inputs) and its sequence number; the host answers with the
// (expert, row) pairs' outputs, expert after expert and each one's rows ascending, and the same
// number in `done`. Before that, at the start of each layer of a one-token step, the hint kernel
// posts the experts the CPU will likely compute (routed from the layer's input, before its mixer),
// so that the host can read their bytes into its caches while the GPU runs the mixer.
constexpr int kMaxMissExperts = 64;  // experts a request may hold (a step of many rows: about 40 of
                                     // 60 absent ones a layer balance the CPU with PCIe at 16 rows)
constexpr int kMaxMissTokenExperts = 32;  // experts a token may route (the one-token kernels: a warp)
constexpr int kMaxMissRows = 64;     // rows of a step the CPU miss path serves (a bit each in `rows`)
constexpr int kMaxMissPairs = 64;    // (expert, row) pairs a request may hold
// The split table's last m (link.share): a layer of a step of several rows may have as many absent
// experts as the router takes (kMaxRoutedExperts), and the CPU's share goes on growing with them.
constexpr int kMaxMissShares = 512;
struct MissMailbox {
  uint32_t request = 0, done = 0;  // sequence numbers (accessed as volatile / atomic)
  uint32_t timed_out = 0;          // set by the gather kernel when the host did not answer
  int32_t layer = 0, count = 0;
  int32_t hinted = 0;              // of the request's experts, how many were hinted (they lead)
  int32_t grouped = 0;             // 1: from a step grouped by expert (miss_dispatch_rows), 0: one token's
  int32_t expert[kMaxMissExperts] = {};
  uint64_t rows[kMaxMissExperts] = {};  // expert i's rows: bit r, row r of the step
  uint32_t hint = 0;               // the hint's sequence number
  int32_t hint_layer = 0, hint_count = 0;
  int32_t hint_expert[kMaxMissExperts] = {};
};

// What the kernels need: the mailbox and its x [kMaxMissRows][hidden] and y [kMaxMissPairs][hidden]
// (device addresses of the mapped memory), and device memory of their own.
struct MissLink {
  MissMailbox* box = nullptr;
  float* x = nullptr;
  const float* y = nullptr;
  uint32_t* sequence = nullptr;  // the last request's number
  int32_t* pending = nullptr;    // [1 + kMaxMissPairs]: this layer's CPU pairs, then where each one's output goes
  const int32_t* share = nullptr;  // [1 + kMaxMissShares]: of m absent experts, how many the CPU computes
  uint32_t* hint_sequence = nullptr;  // the last hint's number
  int32_t* hinted = nullptr;  // [2][1 + kMaxMissExperts]: by the layer's parity, its hint's count and experts
  // [3] ns: the last request's time; the sums over requests of the time from each request to its
  // gather (the GPU's own share) and of the gather's wait for the host's answer.
  uint64_t* clock = nullptr;
  int hidden = 0;
  bool cpu_takes_all = false;  // --miss-path cpu: a step of several rows gives the CPU all the pairs it holds
};

// Before `layer`'s router, from k experts routed for it from an earlier h (predicted ids [k], as
// router_topk writes them): those absent from VRAM, as many as link.share gives the CPU of that
// many, become the layer's hint (device words by the layer's parity, so that the next layer's hint
// can be written while this layer's dispatch reads; and a posted message for the host).
const char* miss_hint(const MissLink& link, const int32_t* predicted, int k, const uint8_t* resident, int layer,
                      void* stream);

// Where a decode step stages the absent experts the GPU computes itself (buffers idle during
// decode steps: the prompt pass's staging), and the table of the k chosen experts the step's
// expert products then read: one copy kernel moves all of a layer's staged bytes with every load
// in flight, where products reading host memory in place would wait on PCIe twice (gate and up,
// then down) with few loads in flight.
struct MissStage {
  uint8_t* gate_up = nullptr;  // the j-th chosen expert's gate at j * gate_up_stride, its up at + up_at
  uint8_t* down = nullptr;     // its down at j * down_stride
  size_t gate_up_stride = 0, up_at = 0, down_stride = 0;
  size_t gate_bytes = 0, up_bytes = 0, down_bytes = 0;  // one expert's matrices
  const void** table = nullptr;  // [3k]: the chosen experts' gate at j, up at k + j, down at 2k + j
  int32_t* ids = nullptr;        // [2k]: j, then k + j; -1 where the CPU computes the expert
  int32_t* copies = nullptr;     // [1 + k]: how many chosen experts to stage, then which (j)
};

// After the router of `layer`: of the k chosen experts (ids [2k]: gate ids, then up ids) those
// absent from VRAM (resident [n_experts] flags) go to the CPU as link.share says, the hinted ones
// first; their ids become -1 (the expert products skip them), x [hidden] goes to the mailbox, and
// the request is posted. With a stage (stage.table not null): the stage's table and ids for the
// step's products, each chosen expert through its VRAM slot (table: the layer's [3 n_experts]
// pointers) or its place in the stage, and the list of those to stage (miss_stage copies them).
const char* miss_dispatch(const MissLink& link, int32_t* ids, int k, const uint8_t* resident, int layer,
                          const float* x, const void* const* table, int n_experts, const MissStage& stage,
                          void* stream);
// A step of several rows (rows, at most kMaxMissRows; ids [rows k]: row r's experts at r k, as
// moe_route_window writes them), after kernels::expert_groups: of the m distinct experts the rows
// chose that are absent from VRAM, the CPU takes experts with link.share[m] (pairs, a product each)
// of work (those of one row first; at most kMaxMissExperts experts and kMaxMissPairs pairs, all it
// can hold with cpu_takes_all); their groups get id -1 (the grouped
// products skip them), the rows they read go to the mailbox (x [rows][hidden]), and the request is
// posted. Each pair's output goes to y at its pair's place (r k + slot), by miss_gather. With
// `absent_groups` (expert_groups' count of the groups that read an absent expert over PCIe): less
// the groups handed to the CPU.
const char* miss_dispatch_rows(const MissLink& link, const int32_t* ids, int rows, int k, const uint8_t* resident,
                               int layer, const float* x, int n_experts, ExpertGroup* groups, int n_groups,
                               void* stream, unsigned* absent_groups = nullptr);
// Copies the experts miss_dispatch listed from their host bytes (table) into the stage.
const char* miss_stage(const MissStage& stage, const int32_t* ids, int k, const void* const* table, int n_experts,
                       void* stream);
// Before the expert sum: waits for the host's answer (at most `timeout_ns`, then marks the mailbox
// timed out) and copies its outputs into y [pairs][hidden] at their places (hidden a multiple of 4;
// `pairs`: the step's, which bounds the request's).
const char* miss_gather(const MissLink& link, float* y, int pairs, uint64_t timeout_ns, void* stream);

}  // namespace lode::cuda::kernels
