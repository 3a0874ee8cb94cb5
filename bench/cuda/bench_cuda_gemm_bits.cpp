// Whether a row of a cuBLAS product gets the same bits whatever the product's row count
// (docs/PERFORMANCE.md, "Tried and dropped, stop 69"): for each of the 35B's dense matrix shapes
// in the prompt path's maths (TF32; the router in float32), Y = X W^T over 4,096 random rows, then
// over 1, 7, 64, 100, 256 and 1,024 of those rows from row 0 and from row 64, each compared bit for
// bit with the big product's rows. Three ways:
// - cuBLAS's own choice (cublasGemmEx, what the prompt path uses);
// - each cuBLASLt algorithm that keeps a sum in one piece (split-K 1, no reduction) among the
//   heuristic's first choices for 256, 1,024 and 4,096 rows, kept for every row count;
// - the heuristic's first such algorithm for each row count (compared with the 4,096-row one's).
// Prints how many of the 12 smaller products differ, and microseconds at 64, 256, 1,024 and 4,096
// rows (median_event_ms: the median of 20 runs after 3).
//
//   build/bench_cuda_gemm_bits
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <vector>

#include "cuda/roofline.h"
#include "cuda/vram.h"

namespace {

#define CHECK(call)                                                                  \
  do {                                                                               \
    if (int status_ = int(call); status_ != 0) {                                     \
      std::fprintf(stderr, "%s:%d: %s gave %d\n", __FILE__, __LINE__, #call, status_); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

constexpr int kRows = 4096, kFirstRows[] = {0, 64}, kFewerRows[] = {1, 7, 64, 100, 256, 1024};
constexpr int kTimedRows[] = {64, 256, 1024, 4096};
constexpr size_t kWorkspaceBytes = size_t(32) << 20;

struct Shape {
  const char* name;
  int n, k;
  bool float32;
};
constexpr Shape kShapes[] = {
    {"DeltaNet qkv, attention q|gate", 8192, 2048, false}, {"DeltaNet z", 4096, 2048, false},
    {"DeltaNet b, alpha", 32, 2048, false},               {"DeltaNet and attention out", 2048, 4096, false},
    {"attention k, v; shared gate, up", 512, 2048, false}, {"shared expert down", 2048, 512, false},
    {"router and shared gate logit", 257, 2048, true},
};

struct Context {
  cublasHandle_t blas = nullptr;
  cublasLtHandle_t lt = nullptr;
  void* workspace = nullptr;
  const float *w = nullptr, *x = nullptr;
  float *all = nullptr, *some = nullptr;
};

// A product of `rows` rows from x into y: one of the three ways.
using Product = std::function<void(int rows, const float* x, float* y)>;

// Y^T [n, rows] = op_T(W^T as stored [k, n]) X^T [k, rows] in cuBLASLt's column-major terms.
struct LtProduct {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t w = nullptr, x = nullptr, y = nullptr;
  LtProduct(const Shape& s, int rows) {
    CHECK(cublasLtMatmulDescCreate(&op, s.float32 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_TF32, CUDA_R_32F));
    const cublasOperation_t t = CUBLAS_OP_T, plain = CUBLAS_OP_N;
    CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
    CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &plain, sizeof plain));
    CHECK(cublasLtMatrixLayoutCreate(&w, CUDA_R_32F, s.k, s.n, s.k));
    CHECK(cublasLtMatrixLayoutCreate(&x, CUDA_R_32F, s.k, rows, s.k));
    CHECK(cublasLtMatrixLayoutCreate(&y, CUDA_R_32F, s.n, rows, s.n));
  }
  ~LtProduct() {
    cublasLtMatrixLayoutDestroy(y), cublasLtMatrixLayoutDestroy(x), cublasLtMatrixLayoutDestroy(w);
    cublasLtMatmulDescDestroy(op);
  }
};

// The heuristic's first `most` algorithms for `rows` rows that keep each sum in one piece.
std::vector<cublasLtMatmulAlgo_t> unsplit(const Context& c, const Shape& s, int rows, int most) {
  const LtProduct p(s, rows);
  cublasLtMatmulPreference_t preference = nullptr;
  CHECK(cublasLtMatmulPreferenceCreate(&preference));
  const uint64_t workspace = kWorkspaceBytes;
  const uint32_t whole_sums = CUBLASLT_REDUCTION_SCHEME_NONE;
  CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                             sizeof workspace));
  CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &whole_sums,
                                             sizeof whole_sums));
  std::vector<cublasLtMatmulHeuristicResult_t> results(16);
  int found = 0;
  cublasLtMatmulAlgoGetHeuristic(c.lt, p.op, p.w, p.x, p.y, p.y, preference, int(results.size()), results.data(),
                                 &found);
  cublasLtMatmulPreferenceDestroy(preference);
  std::vector<cublasLtMatmulAlgo_t> algos;
  for (int i = 0; i < found && int(algos.size()) < most; ++i) {
    uint32_t splits = 1;
    size_t written = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&results[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof splits,
                                         &written);
    if (splits == 1) algos.push_back(results[i].algo);
  }
  return algos;
}

// Whether cuBLASLt takes `algo` for this shape at 1 and at kRows rows (it was chosen for another count).
bool takes(const Context& c, const Shape& s, const cublasLtMatmulAlgo_t& algo) {
  for (const int rows : {1, kRows}) {
    const LtProduct p(s, rows);
    cublasLtMatmulHeuristicResult_t result{};
    if (cublasLtMatmulAlgoCheck(c.lt, p.op, p.w, p.x, p.y, p.y, &algo, &result) != CUBLAS_STATUS_SUCCESS ||
        result.workspaceSize > kWorkspaceBytes)
      return false;
  }
  return true;
}

void run_lt(const Context& c, const Shape& s, const cublasLtMatmulAlgo_t& algo, int rows, const float* x, float* y) {
  const LtProduct p(s, rows);
  const float one = 1.0f, zero = 0.0f;
  CHECK(cublasLtMatmul(c.lt, p.op, &one, c.w, p.w, x, p.x, &zero, y, p.y, y, p.y, &algo, c.workspace,
                       kWorkspaceBytes, nullptr));
}

void run_cublas(const Context& c, const Shape& s, int rows, const float* x, float* y) {
  const float one = 1.0f, zero = 0.0f;
  CHECK(cublasGemmEx(c.blas, CUBLAS_OP_T, CUBLAS_OP_N, s.n, rows, s.k, &one, c.w, CUDA_R_32F, s.k, x, CUDA_R_32F, s.k,
                     &zero, y, CUDA_R_32F, s.n, s.float32 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_TF32,
                     CUBLAS_GEMM_DEFAULT));
}

std::vector<float> fetch(const float* y, size_t floats) {
  std::vector<float> host(floats);
  lode::cuda::copy_to_host(host.data(), y, floats * sizeof(float));
  return host;
}

// How many of the smaller products give other bits than the 4,096-row product, each by `product`.
int differing(const Context& c, const Shape& s, const Product& product) {
  product(kRows, c.x, c.all);
  const std::vector<float> want = fetch(c.all, size_t(kRows) * s.n);
  int differ = 0;
  for (const int first : kFirstRows)
    for (const int rows : kFewerRows) {
      product(rows, c.x + size_t(first) * s.k, c.some);
      const std::vector<float> got = fetch(c.some, size_t(rows) * s.n);
      differ += std::memcmp(got.data(), want.data() + size_t(first) * s.n, got.size() * sizeof(float)) != 0;
    }
  return differ;
}

void print_times(const Context& c, const Product& product) {
  for (const int rows : kTimedRows)
    std::printf(" %d:%.1f", rows,
                1000.0 * lode::cuda::median_event_ms([&] { product(rows, c.x, c.all); }, 3, 20));
  std::printf("\n");
}

// One of an algorithm's settings, read as its own integer type.
template <class T>
long long setting(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attribute) {
  T value{};
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, attribute, &value, sizeof value, &written);
  return static_cast<long long>(value);
}

void describe(const cublasLtMatmulAlgo_t& algo) {
  std::printf("id %lld tile %lld stages %lld swizzle %lld cluster %lld", setting<int32_t>(algo, CUBLASLT_ALGO_CONFIG_ID),
              setting<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
              setting<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID),
              setting<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING),
              setting<uint16_t>(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID));
}

void study(const Context& c, const Shape& s) {
  std::printf("== %s: %d x %d, %s\n", s.name, s.n, s.k, s.float32 ? "float32" : "TF32");
  const Product own = [&](int rows, const float* x, float* y) { run_cublas(c, s, rows, x, y); };
  std::printf("  cuBLAS's own choice: %d of 12 differ; us", differing(c, s, own));
  print_times(c, own);
  std::vector<cublasLtMatmulAlgo_t> pinned;
  for (const int rows : {256, 1024, 4096})
    for (const cublasLtMatmulAlgo_t& algo : unsplit(c, s, rows, 4)) {
      bool seen = false;
      for (const cublasLtMatmulAlgo_t& p : pinned) seen = seen || std::memcmp(&p, &algo, sizeof algo) == 0;
      if (!seen && takes(c, s, algo)) pinned.push_back(algo);
    }
  for (const cublasLtMatmulAlgo_t& algo : pinned) {
    const Product fixed = [&](int rows, const float* x, float* y) { run_lt(c, s, algo, rows, x, y); };
    std::printf("  pinned ");
    describe(algo);
    std::printf(": %d of 12 differ; us", differing(c, s, fixed));
    print_times(c, fixed);
  }
  std::map<int, cublasLtMatmulAlgo_t> first_for;  // chosen before the timed runs, not inside them
  const Product per_rows = [&](int rows, const float* x, float* y) {
    if (!first_for.count(rows)) {
      const std::vector<cublasLtMatmulAlgo_t> first = unsplit(c, s, rows, 1);
      if (first.empty()) {
        std::fprintf(stderr, "no unsplit algorithm for %d rows\n", rows);
        std::exit(1);
      }
      first_for[rows] = first.front();
    }
    run_lt(c, s, first_for[rows], rows, x, y);
  };
  for (const int rows : kTimedRows) per_rows(rows, c.x, c.all);
  std::printf("  the first unsplit choice for each row count: %d of 12 differ; us", differing(c, s, per_rows));
  print_times(c, per_rows);
}

std::vector<float> random_floats(size_t n, unsigned seed, float scale) {
  std::vector<float> v(n);
  for (float& f : v) seed = seed * 1664525u + 1013904223u, f = scale * (float(seed >> 8) / float(1 << 24) - 0.5f);
  return v;
}

}  // namespace

int main() {
  lode::cuda::VramAccountant vram;
  const auto buffer = [&](size_t floats) {
    return lode::cuda::DeviceBuffer(vram, floats * sizeof(float), lode::cuda::VramUse::scratch, "bench");
  };
  const auto upload = [&](lode::cuda::DeviceBuffer& b, const std::vector<float>& host) {
    lode::cuda::copy_to_device(b.data(), host.data(), host.size() * sizeof(float));
    return b.as<float>();
  };
  lode::cuda::DeviceBuffer w = buffer(size_t(8192) * 4096), x = buffer(size_t(kRows + 64) * 4096),
                           all = buffer(size_t(kRows) * 8192), some = buffer(size_t(kRows) * 8192),
                           workspace(vram, kWorkspaceBytes, lode::cuda::VramUse::scratch, "bench");
  Context c;
  CHECK(cublasCreate(&c.blas));
  CHECK(cublasLtCreate(&c.lt));
  c.workspace = workspace.data();
  c.w = upload(w, random_floats(size_t(8192) * 4096, 1, 0.1f));
  c.x = upload(x, random_floats(size_t(kRows + 64) * 4096, 2, 4.0f));
  c.all = all.as<float>(), c.some = some.as<float>();
  for (const Shape& s : kShapes) study(c, s);
  return 0;
}
