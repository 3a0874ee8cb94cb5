// The slice of ggml's C API the oracle generators call, reached through dlopen of the npm build's
// libggml-base.so. No ggml headers ship with that build, so the few types and signatures used here
// are declared by hand from the ABI notes (shared/notes/llama-cpp-oracle.md); oracle_open() checks
// them against known block sizes before anything is trusted.
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// ggml's enum ggml_type values of every type the golden vectors cover (GGUF stores these numbers).
enum {
  T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8,
  T_Q2_K = 10, T_Q3_K = 11, T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14,
  T_IQ2_XXS = 16, T_IQ2_XS = 17, T_IQ3_XXS = 18, T_IQ1_S = 19, T_IQ4_NL = 20, T_IQ3_S = 21,
  T_IQ2_S = 22, T_IQ4_XS = 23, T_IQ1_M = 29, T_BF16 = 30, T_MXFP4 = 39,
};

// Every covered type, in the order files are written.
extern const int kOracleTypes[];
extern const int kOracleTypeCount;

// struct ggml_type_traits of this build (56 bytes).
typedef void (*ggml_to_float_fn)(const void *src, float *dst, int64_t n);
typedef void (*ggml_from_float_fn)(const float *src, void *dst, int64_t n);
struct ggml_type_traits {
  const char *type_name;
  int64_t blck_size;
  int64_t blck_size_interleave;
  size_t type_size;
  bool is_quantized;
  ggml_to_float_fn to_float;
  ggml_from_float_fn from_float_ref;
};

// Loads libggml-base.so from lib_dir and checks the declared ABI; exits with a message on failure.
void oracle_open(const char *lib_dir);
// Any exported symbol of libggml-base.so; exits when it is missing.
void *oracle_symbol(const char *name);

const struct ggml_type_traits *oracle_traits(int type);
// Bytes of n values (n a whole number of blocks).
size_t oracle_row_bytes(int type, int64_t n);
// ggml's quantization of n_rows rows of n_per_row floats: the reference quantizer (from_float_ref)
// when the type has one and needs no importance matrix, else ggml_quantize_chunk with an all-ones
// importance matrix.
void oracle_quantize(int type, const float *src, void *dst, int64_t n_rows, int64_t n_per_row);
// ggml's to_float of n values (f32, which has none, is copied as is).
void oracle_dequantize(int type, const void *src, float *dst, int64_t n);
bool oracle_all_finite(const float *x, int64_t n);
// Exits when ggml_validate_row_data rejects the bytes.
void oracle_validate(int type, const void *data, size_t n_bytes);

_Noreturn void oracle_die(const char *format, ...);
