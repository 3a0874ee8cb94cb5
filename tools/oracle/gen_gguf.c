// Writes tests/data/ggml/all_types.gguf with ggml's own GGUF writer, and its sidecar
// all_types.expected. Usage: gen_gguf LIB_DIR OUT_DIR (tools/oracle/generate runs it).
//
// The GGUF holds one metadata key of every scalar value type, one array of every element type (and
// of strings), and one small 2-D tensor "t.<type>" of every type the golden vectors cover, filled
// with ggml's quantization of deterministic random floats. tests/test_oracle_gguf.cpp lists the same
// metadata; keep the two in step.
//
// all_types.expected, little-endian:
//   header: char magic[4] = "LGGX"; u32 version = 1; u32 n_tensors
//   tensor: u32 name_len; char name[name_len]; u32 ggml_type; u32 n_dims; i64 ne[n_dims];
//           u64 n_bytes; u8 data[n_bytes]            -- the tensor's bytes as ggml wrote them
//           u64 n_values; f32 dequantized[n_values]  -- ggml's to_float of those bytes
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml_oracle.h"
#include "rng.h"

// ---- the slice of ggml's and gguf's C API used here ---------------------------------------------

struct ggml_context;
struct ggml_tensor;
struct gguf_context;
struct ggml_init_params { size_t mem_size; void *mem_buffer; bool no_alloc; };
struct gguf_init_params { bool no_alloc; struct ggml_context **ctx; };
enum { GGUF_U8 = 0, GGUF_I8 = 1, GGUF_U16 = 2, GGUF_I16 = 3, GGUF_U32 = 4, GGUF_I32 = 5, GGUF_F32 = 6,
       GGUF_BOOL = 7, GGUF_U64 = 10, GGUF_I64 = 11, GGUF_F64 = 12 };

static struct {
  struct ggml_context *(*init)(struct ggml_init_params);
  void (*free)(struct ggml_context *);
  struct ggml_tensor *(*new_tensor)(struct ggml_context *, int type, int n_dims, const int64_t *ne);
  struct ggml_tensor *(*set_name)(struct ggml_tensor *, const char *);
  void *(*get_data)(const struct ggml_tensor *);
  size_t (*nbytes)(const struct ggml_tensor *);
} ggml;

static struct {
  struct gguf_context *(*init_empty)(void);
  struct gguf_context *(*init_from_file)(const char *path, struct gguf_init_params);
  void (*free)(struct gguf_context *);
  void (*set_u8)(struct gguf_context *, const char *, uint8_t);
  void (*set_i8)(struct gguf_context *, const char *, int8_t);
  void (*set_u16)(struct gguf_context *, const char *, uint16_t);
  void (*set_i16)(struct gguf_context *, const char *, int16_t);
  void (*set_u32)(struct gguf_context *, const char *, uint32_t);
  void (*set_i32)(struct gguf_context *, const char *, int32_t);
  void (*set_f32)(struct gguf_context *, const char *, float);
  void (*set_u64)(struct gguf_context *, const char *, uint64_t);
  void (*set_i64)(struct gguf_context *, const char *, int64_t);
  void (*set_f64)(struct gguf_context *, const char *, double);
  void (*set_bool)(struct gguf_context *, const char *, bool);
  void (*set_str)(struct gguf_context *, const char *, const char *);
  void (*set_arr_data)(struct gguf_context *, const char *, int type, const void *data, size_t n);
  void (*set_arr_str)(struct gguf_context *, const char *, const char **data, size_t n);
  void (*add_tensor)(struct gguf_context *, const struct ggml_tensor *);
  bool (*write_to_file)(const struct gguf_context *, const char *path, bool only_meta);
  int64_t (*get_n_kv)(const struct gguf_context *);
  int64_t (*get_n_tensors)(const struct gguf_context *);
} gguf;

static void load_api(void) {
  ggml.init = oracle_symbol("ggml_init");
  ggml.free = oracle_symbol("ggml_free");
  ggml.new_tensor = oracle_symbol("ggml_new_tensor");
  ggml.set_name = oracle_symbol("ggml_set_name");
  ggml.get_data = oracle_symbol("ggml_get_data");
  ggml.nbytes = oracle_symbol("ggml_nbytes");
  gguf.init_empty = oracle_symbol("gguf_init_empty");
  gguf.init_from_file = oracle_symbol("gguf_init_from_file");
  gguf.free = oracle_symbol("gguf_free");
  gguf.set_u8 = oracle_symbol("gguf_set_val_u8");
  gguf.set_i8 = oracle_symbol("gguf_set_val_i8");
  gguf.set_u16 = oracle_symbol("gguf_set_val_u16");
  gguf.set_i16 = oracle_symbol("gguf_set_val_i16");
  gguf.set_u32 = oracle_symbol("gguf_set_val_u32");
  gguf.set_i32 = oracle_symbol("gguf_set_val_i32");
  gguf.set_f32 = oracle_symbol("gguf_set_val_f32");
  gguf.set_u64 = oracle_symbol("gguf_set_val_u64");
  gguf.set_i64 = oracle_symbol("gguf_set_val_i64");
  gguf.set_f64 = oracle_symbol("gguf_set_val_f64");
  gguf.set_bool = oracle_symbol("gguf_set_val_bool");
  gguf.set_str = oracle_symbol("gguf_set_val_str");
  gguf.set_arr_data = oracle_symbol("gguf_set_arr_data");
  gguf.set_arr_str = oracle_symbol("gguf_set_arr_str");
  gguf.add_tensor = oracle_symbol("gguf_add_tensor");
  gguf.write_to_file = oracle_symbol("gguf_write_to_file");
  gguf.get_n_kv = oracle_symbol("gguf_get_n_kv");
  gguf.get_n_tensors = oracle_symbol("gguf_get_n_tensors");
}

// ---- metadata (tests/test_oracle_gguf.cpp expects exactly these) -------------------------------

enum { METADATA_KEY_COUNT = 28 };

static void set_metadata(struct gguf_context *ctx) {
  gguf.set_str(ctx, "general.architecture", "oracle");
  gguf.set_str(ctx, "general.name", "ggml oracle: every value type and tensor type");
  gguf.set_u8(ctx, "oracle.u8", 200);
  gguf.set_i8(ctx, "oracle.i8", -100);
  gguf.set_u16(ctx, "oracle.u16", 60000);
  gguf.set_i16(ctx, "oracle.i16", -30000);
  gguf.set_u32(ctx, "oracle.u32", 4000000000u);
  gguf.set_i32(ctx, "oracle.i32", -2000000000);
  gguf.set_f32(ctx, "oracle.f32", 3.14159274f);
  gguf.set_u64(ctx, "oracle.u64", 18000000000000000000ull);
  gguf.set_i64(ctx, "oracle.i64", -9000000000000000000ll);
  gguf.set_f64(ctx, "oracle.f64", 2.718281828459045);
  gguf.set_bool(ctx, "oracle.bool", true);
  gguf.set_str(ctx, "oracle.string", "héllo, ggml ✓");  // UTF-8
  gguf.set_str(ctx, "oracle.empty_string", "");

  static const uint8_t u8s[] = {0, 1, 255};
  static const int8_t i8s[] = {-128, 0, 127};
  static const uint16_t u16s[] = {0, 65535};
  static const int16_t i16s[] = {-32768, 32767, 1};
  static const uint32_t u32s[] = {0, 1, 4294967295u, 7};
  static const int32_t i32s[] = {-2147483647 - 1, 2147483647};
  static const float f32s[] = {0.5f, -1.25f, 1e-30f, 3.4e38f};
  static const bool bools[] = {true, false, true};
  static const uint64_t u64s[] = {0, 18446744073709551615ull};
  static const int64_t i64s[] = {-9223372036854775807ll - 1, 9223372036854775807ll, -1};
  static const double f64s[] = {1.0 / 3.0, -1e300};
  static const uint32_t nothing[1] = {0};
  static const char *strings[] = {"alpha", "", "ünïcöde", "a longer string, with spaces"};
  gguf.set_arr_data(ctx, "oracle.array.u8", GGUF_U8, u8s, 3);
  gguf.set_arr_data(ctx, "oracle.array.i8", GGUF_I8, i8s, 3);
  gguf.set_arr_data(ctx, "oracle.array.u16", GGUF_U16, u16s, 2);
  gguf.set_arr_data(ctx, "oracle.array.i16", GGUF_I16, i16s, 3);
  gguf.set_arr_data(ctx, "oracle.array.u32", GGUF_U32, u32s, 4);
  gguf.set_arr_data(ctx, "oracle.array.i32", GGUF_I32, i32s, 2);
  gguf.set_arr_data(ctx, "oracle.array.f32", GGUF_F32, f32s, 4);
  gguf.set_arr_data(ctx, "oracle.array.bool", GGUF_BOOL, bools, 3);
  gguf.set_arr_data(ctx, "oracle.array.u64", GGUF_U64, u64s, 2);
  gguf.set_arr_data(ctx, "oracle.array.i64", GGUF_I64, i64s, 3);
  gguf.set_arr_data(ctx, "oracle.array.f64", GGUF_F64, f64s, 2);
  gguf.set_arr_data(ctx, "oracle.array.empty", GGUF_U32, nothing, 0);
  gguf.set_arr_str(ctx, "oracle.array.string", strings, 4);
}

// ---- tensors ------------------------------------------------------------------------------------

struct sidecar { FILE *file; };

static void put(struct sidecar *s, const void *data, size_t n) {
  if (n && fwrite(data, 1, n, s->file) != n) oracle_die("write failed");
}
static void put_u32(struct sidecar *s, uint32_t v) { put(s, &v, 4); }
static void put_u64(struct sidecar *s, uint64_t v) { put(s, &v, 8); }

// Adds tensor "t.<type>" of shape {2 units, 3 rows} (a unit is the type's block, or 32 values for
// the float types) to both files.
static void add_tensor(struct ggml_context *ggml_ctx, struct gguf_context *gguf_ctx, struct sidecar *s,
                       int type) {
  const struct ggml_type_traits *t = oracle_traits(type);
  const int64_t unit = t->blck_size == 1 ? 32 : t->blck_size;
  const int64_t ne[2] = {2 * unit, 3}, n = ne[0] * ne[1];
  char name[64];
  snprintf(name, sizeof(name), "t.%s", t->type_name);

  struct ggml_tensor *tensor = ggml.new_tensor(ggml_ctx, type, 2, ne);
  ggml.set_name(tensor, name);
  const size_t n_bytes = ggml.nbytes(tensor);
  if (n_bytes != oracle_row_bytes(type, n)) oracle_die("%s: ggml_nbytes disagrees with the block size", name);

  float *values = malloc((size_t)n * sizeof(float));
  struct rng r = {0x5eed0000ull + (uint64_t)type};
  for (int64_t i = 0; i < n; ++i) values[i] = rng_gauss(&r);
  oracle_quantize(type, values, ggml.get_data(tensor), ne[1], ne[0]);
  oracle_validate(type, ggml.get_data(tensor), n_bytes);
  oracle_dequantize(type, ggml.get_data(tensor), values, n);
  if (!oracle_all_finite(values, n)) oracle_die("%s: ggml dequantized to a non-finite value", name);
  gguf.add_tensor(gguf_ctx, tensor);

  put_u32(s, (uint32_t)strlen(name));
  put(s, name, strlen(name));
  put_u32(s, (uint32_t)type);
  put_u32(s, 2);
  put(s, ne, sizeof(ne));
  put_u64(s, n_bytes);
  put(s, ggml.get_data(tensor), n_bytes);
  put_u64(s, (uint64_t)n);
  put(s, values, (size_t)n * sizeof(float));
  free(values);
}

// ggml must read back what it wrote: the same number of keys and tensors.
static void check_readable(const char *path) {
  struct gguf_context *ctx = gguf.init_from_file(path, (struct gguf_init_params){true, NULL});
  if (!ctx) oracle_die("ggml cannot read back %s", path);
  if (gguf.get_n_kv(ctx) != METADATA_KEY_COUNT || gguf.get_n_tensors(ctx) != kOracleTypeCount)
    oracle_die("%s: read back %lld keys and %lld tensors", path, (long long)gguf.get_n_kv(ctx),
               (long long)gguf.get_n_tensors(ctx));
  gguf.free(ctx);
}

int main(int argc, char **argv) {
  if (argc != 3) oracle_die("usage: gen_gguf LIB_DIR OUT_DIR");
  oracle_open(argv[1]);
  load_api();
  char gguf_path[4096], sidecar_path[4096];
  snprintf(gguf_path, sizeof(gguf_path), "%s/all_types.gguf", argv[2]);
  snprintf(sidecar_path, sizeof(sidecar_path), "%s/all_types.expected", argv[2]);

  struct ggml_context *ggml_ctx = ggml.init((struct ggml_init_params){4 << 20, NULL, false});
  struct gguf_context *gguf_ctx = gguf.init_empty();
  if (!ggml_ctx || !gguf_ctx) oracle_die("ggml_init or gguf_init_empty failed");
  set_metadata(gguf_ctx);

  struct sidecar s = {fopen(sidecar_path, "wb")};
  if (!s.file) oracle_die("cannot write %s", sidecar_path);
  put(&s, "LGGX", 4);
  put_u32(&s, 1);
  put_u32(&s, (uint32_t)kOracleTypeCount);
  for (int i = 0; i < kOracleTypeCount; ++i) add_tensor(ggml_ctx, gguf_ctx, &s, kOracleTypes[i]);
  if (fclose(s.file) != 0) oracle_die("cannot finish %s", sidecar_path);

  if (!gguf.write_to_file(gguf_ctx, gguf_path, false)) oracle_die("gguf_write_to_file(%s) failed", gguf_path);
  check_readable(gguf_path);
  gguf.free(gguf_ctx);
  ggml.free(ggml_ctx);
  printf("%d tensors, %d keys -> %s (+ all_types.expected)\n", kOracleTypeCount, METADATA_KEY_COUNT,
         gguf_path);
  return 0;
}
