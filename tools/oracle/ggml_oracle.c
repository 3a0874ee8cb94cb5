// Loading ggml's CPU build and calling its quantizers and dequantizers (see ggml_oracle.h).
#include "ggml_oracle.h"

#include <dlfcn.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const int kOracleTypes[] = {
    T_F32, T_F16, T_BF16, T_Q4_0, T_Q4_1, T_Q5_0, T_Q5_1, T_Q8_0,
    T_Q2_K, T_Q3_K, T_Q4_K, T_Q5_K, T_Q6_K,
    T_IQ4_NL, T_IQ4_XS, T_IQ3_XXS, T_IQ3_S, T_IQ2_XXS, T_IQ2_XS, T_IQ2_S, T_IQ1_S, T_IQ1_M,
    T_MXFP4,
};
const int kOracleTypeCount = sizeof(kOracleTypes) / sizeof(kOracleTypes[0]);

static void *library;
static const struct ggml_type_traits *(*get_type_traits)(int type);
static size_t (*quantize_chunk)(int type, const float *src, void *dst, int64_t start, int64_t n_rows,
                                int64_t n_per_row, const float *imatrix);
static void (*quantize_init)(int type);
static bool (*quantize_requires_imatrix)(int type);
static bool (*validate_row_data)(int type, const void *data, size_t n_bytes);

void oracle_die(const char *format, ...) {
  va_list args;
  va_start(args, format);
  fputs("oracle: ", stderr);
  vfprintf(stderr, format, args);
  fputc('\n', stderr);
  va_end(args);
  exit(1);
}

void *oracle_symbol(const char *name) {
  void *symbol = dlsym(library, name);
  if (!symbol) oracle_die("libggml-base.so exports no %s: is this the npm build the notes describe?", name);
  return symbol;
}

// Block sizes and names every ggml since the k-quants agrees on; a mismatch means the traits
// struct declared in ggml_oracle.h does not match this build.
static void check_abi(void) {
  static const struct { int type; const char *name; int64_t block; size_t bytes; } known[] = {
      {T_F16, "f16", 1, 2}, {T_Q4_0, "q4_0", 32, 18}, {T_Q8_0, "q8_0", 32, 34},
      {T_Q4_K, "q4_K", 256, 144}, {T_IQ1_M, "iq1_m", 256, 56}, {T_MXFP4, "mxfp4", 32, 17},
  };
  for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); ++i) {
    const struct ggml_type_traits *t = get_type_traits(known[i].type);
    if (!t->type_name || strcmp(t->type_name, known[i].name) != 0 || t->blck_size != known[i].block ||
        t->type_size != known[i].bytes)
      oracle_die("ggml_type_traits of type %d do not match the declared ABI", known[i].type);
  }
}

void oracle_open(const char *lib_dir) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/libggml-base.so", lib_dir);
  library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!library) oracle_die("cannot load %s: %s (run tools/oracle/fetch)", path, dlerror());
  get_type_traits = oracle_symbol("ggml_get_type_traits");
  quantize_chunk = oracle_symbol("ggml_quantize_chunk");
  quantize_init = oracle_symbol("ggml_quantize_init");
  quantize_requires_imatrix = oracle_symbol("ggml_quantize_requires_imatrix");
  validate_row_data = oracle_symbol("ggml_validate_row_data");
  check_abi();
}

const struct ggml_type_traits *oracle_traits(int type) { return get_type_traits(type); }

size_t oracle_row_bytes(int type, int64_t n) {
  const struct ggml_type_traits *t = get_type_traits(type);
  if (n % t->blck_size != 0) oracle_die("%lld values are not whole %s blocks", (long long)n, t->type_name);
  return (size_t)(n / t->blck_size) * t->type_size;
}

// Fills a stretch of the stack below the caller with `pattern`, so that a callee reading
// uninitialized locals sees a known value.
__attribute__((noinline)) static void dirty_stack(uint8_t pattern) {
  uint8_t scratch[1 << 16];
  memset(scratch, pattern, sizeof(scratch));
  __asm__ volatile("" : : "r"(scratch) : "memory");
}

// ggml's iq4_nl reference quantizer packs an uninitialized scratch array into the nibbles of a
// block whose values are all (near) zero; its scale is 0, so the nibbles only pick the sign of the
// zeros it dequantizes to. Store the nibbles it would write were that scratch zeroed.
static void canonicalize_zero_blocks(int type, const float *src, uint8_t *dst, int64_t n) {
  if (type != T_IQ4_NL) return;
  for (int64_t b = 0; b < n / 32; ++b) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = fmaxf(amax, fabsf(src[32 * b + j]));
    if (amax < 1e-15f) memset(dst + 18 * b + 2, 0, 16);
  }
}

static void quantize_once(int type, const float *src, uint8_t *dst, int64_t n_rows, int64_t n_per_row,
                          uint8_t dirt) {
  const struct ggml_type_traits *t = get_type_traits(type);
  const size_t row_bytes = oracle_row_bytes(type, n_per_row);
  memset(dst, dirt, row_bytes * (size_t)n_rows);
  quantize_init(type);  // the i-quant searches need their grid maps built first
  dirty_stack(dirt);
  if (t->from_float_ref && !quantize_requires_imatrix(type)) {
    for (int64_t r = 0; r < n_rows; ++r)
      t->from_float_ref(src + r * n_per_row, dst + r * row_bytes, n_per_row);
  } else {
    // No reference quantizer (f32, iq2_xxs, iq2_xs, iq1_s, iq1_m): ggml_quantize_chunk, with
    // neutral importance weights for the quantized types.
    float *ones = NULL;
    if (t->is_quantized) {
      ones = malloc((size_t)n_per_row * sizeof(float));
      for (int64_t i = 0; i < n_per_row; ++i) ones[i] = 1.0f;
    }
    quantize_chunk(type, src, dst, 0, n_rows, n_per_row, ones);
    free(ones);
  }
  canonicalize_zero_blocks(type, src, dst, n_rows * n_per_row);
}

void oracle_quantize(int type, const float *src, void *dst, int64_t n_rows, int64_t n_per_row) {
  // Quantize twice over different garbage: the golden bytes must not depend on memory ggml did not
  // write.
  const size_t n_bytes = oracle_row_bytes(type, n_per_row) * (size_t)n_rows;
  uint8_t *again = malloc(n_bytes);
  quantize_once(type, src, dst, n_rows, n_per_row, 0x00);
  quantize_once(type, src, again, n_rows, n_per_row, 0xa5);
  if (memcmp(dst, again, n_bytes) != 0)
    oracle_die("ggml's %s quantizer output depends on uninitialized memory: canonicalize it (see "
               "canonicalize_zero_blocks)", get_type_traits(type)->type_name);
  free(again);
}

void oracle_dequantize(int type, const void *src, float *dst, int64_t n) {
  const struct ggml_type_traits *t = get_type_traits(type);
  if (type == T_F32) {
    memcpy(dst, src, (size_t)n * sizeof(float));
    return;
  }
  if (!t->to_float) oracle_die("ggml has no to_float for %s", t->type_name);
  t->to_float(src, dst, n);
}

bool oracle_all_finite(const float *x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!isfinite(x[i])) return false;
  return true;
}

void oracle_validate(int type, const void *data, size_t n_bytes) {
  if (!validate_row_data(type, data, n_bytes))
    oracle_die("ggml_validate_row_data rejects %zu bytes of %s", n_bytes, get_type_traits(type)->type_name);
}
