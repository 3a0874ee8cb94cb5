// The kernels only the prompt path needs (a chunk of tokens per call; the products themselves go
// through cuda/gemm.h). Each mirrors a step of the CPU engine; all pointers are device memory;
// each returns null when queued, else the CUDA runtime's message. No CUDA types here.
#pragma once
#include <cstdint>

#include "cuda/kv_format.h"

namespace lode::cuda::kernels {

// DeltaNet's causal conv for a chunk, all tokens at once: out[t][c] = silu(sum_k w[c][k] x[t - keep + k])
// over the inputs `in` [n_tokens][channels] and, before the chunk, the state [channels][keep]
// (keep = kernel - 1), which then takes the chunk's last inputs. `in` and `out` must differ.
const char* deltanet_conv_rows(const float* in, float* out, float* state, const float* w, int channels, int kernel,
                               int n_tokens, void* stream);

// One sequence's rows for deltanet_scan: its state [hv][dk][dv]; its n_tokens rows of qkv
// [n_tokens][channels] after deltanet_prepare, b and alpha [n_tokens][hv]; o [n_tokens][hv * dv].
struct ScanRows {
  float* state;
  const float* qkv;
  const float* b;
  const float* alpha;
  float* o;
  int n_tokens;
};
// The delta rule over each of `count` sequences' tokens in order, from and back into its state: per
// token and value head s, S *= g, S += k (beta (v - S^T k))^T, o_s = S^T q (before the gated
// norm). Several sequences go together (up to 16 a launch: a pass of several prompts), each computed
// as it would be alone; a lone sequence has a kernel of its own (the same block code). dk: a
// multiple of 4, at most 256.
const char* deltanet_scan(const ScanRows* sequences, int count, int channels, const float* a, const float* dt_bias,
                          int hk, int hv, int dk, int dv, void* stream);
// o = o * rsqrt(mean(o^2) + eps) * norm_w * silu(z), per row of dv (rows = n_tokens * hv).
const char* gated_norm_rows(float* o, const float* z, const float* norm_w, int rows, int dv, float eps, void* stream);

// Positions [0, n_positions) of a layer's paged K/V cache as float32 rows [n_positions][row_values]
// (the values the decode step reads, in the stored domain: rotated for q4), for the prompt's
// attention products.
const char* kv_to_rows(KvView kv, int64_t n_positions, int64_t row_values, float* k_out, float* v_out, void* stream);
// x <- H·x (kv::hadamard, bit for bit) for n_vectors vectors of n values: attention's output
// rotated back when the values are stored rotated.
const char* hadamard_rows(float* x, int64_t n_vectors, int n, void* stream);

// Causal softmax of attention scores s [heads][n_queries][n_keys] (times `scale`) in place: query t
// sees keys [0, first_query + t]; the rest become 0.
const char* causal_softmax(float* s, int heads, int n_queries, int64_t n_keys, int64_t first_query, float scale,
                           void* stream);
// out[t][h * head_dim + d] *= sigmoid(qg[t][h][head_dim + d]): attention's output gate, n_tokens rows.
const char* attention_gate(float* out, const float* qg, int n_tokens, int n_heads, int head_dim, void* stream);

// Sorts the (token, slot) assignments of ids [n_tokens][2k] (the first k of each row: experts) by
// expert, stable: sorted[r] = t * k + j, slot_of[t * k + j] = r, expert_of[r] = the expert; counts and
// first: per expert. One block; hist: scratch of 32 * n_experts ints.
const char* group_by_expert(const int32_t* ids, int n_tokens, int k, int n_experts, int32_t* sorted,
                            int32_t* slot_of, int32_t* expert_of, int32_t* counts, int32_t* first, int32_t* hist,
                            void* stream);
// out[r] = x[sorted[r] / k], rows of n; `tf32`: rounded to tf32 (the tensor cores' expert products
// read them so: cuda/expert_products.h).
const char* gather_rows(const float* x, const int32_t* sorted, int k, int rows, int n, bool tf32, float* out,
                        void* stream);
// out[r][i] = silu(gate[r * ld + i]) * up[r * ld + i] for i < ff; `tf32`: rounded to tf32, as
// gather_rows.
const char* swiglu_rows(const float* gate, const float* up, int64_t ld, int rows, int ff, bool tf32, float* out,
                        void* stream);
// out[t] = sum_j weights[t][j] * y[slot_of[t * k + j]] (slot order) + sigmoid(shared_logit[t]) *
// shared[t] when shared is not null; rows of hidden.
const char* moe_combine_rows(const float* y, const int32_t* slot_of, const float* weights, int k, const float* shared,
                             const float* shared_logit, int n_tokens, int hidden, float* out, void* stream);

}  // namespace lode::cuda::kernels
