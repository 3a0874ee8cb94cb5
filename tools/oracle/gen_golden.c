// Writes tests/data/golden/<type>.bin: golden vectors made by ggml itself, in the format documented
// in tests/support/golden.h. Usage: gen_golden LIB_DIR OUT_DIR (tools/oracle/generate runs it).
//   kind 0: deterministic float inputs in several value ranges and block counts, quantized by ggml,
//           then dequantized by ggml.
//   kind 1: random block bytes whose scale fields are kept finite, dequantized by ggml; for the grid
//           i-quants one case also walks every grid index.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml_oracle.h"
#include "rng.h"

// ---- kind 0: value ranges ---------------------------------------------------------------------

static void fill_gauss(float *x, int64_t n, struct rng *r) {
  for (int64_t i = 0; i < n; ++i) x[i] = rng_gauss(r);
}
static void fill_uniform(float *x, int64_t n, struct rng *r) {
  for (int64_t i = 0; i < n; ++i) x[i] = rng_uniform(r, -1.0f, 1.0f);
}
static void fill_zeros(float *x, int64_t n, struct rng *r) {
  (void)r;
  memset(x, 0, (size_t)n * sizeof(float));
}
// Large but within fp16's range, so the f16 golden stays finite and fp16 scales do not overflow.
static void fill_huge(float *x, int64_t n, struct rng *r) {
  for (int64_t i = 0; i < n; ++i) x[i] = fmaxf(-65000.0f, fminf(65000.0f, 20000.0f * rng_gauss(r)));
}
// Small enough that the fp16 block scales of every type come out subnormal.
static void fill_tiny(float *x, int64_t n, struct rng *r) {
  for (int64_t i = 0; i < n; ++i) x[i] = 1e-3f * rng_gauss(r);
}
// Values that are themselves fp16 subnormals; most quantized scales underflow to zero.
static void fill_denormal(float *x, int64_t n, struct rng *r) {
  for (int64_t i = 0; i < n; ++i) x[i] = 1e-6f * rng_gauss(r);
}
static void fill_outliers(float *x, int64_t n, struct rng *r) {
  for (int64_t i = 0; i < n; ++i) {
    x[i] = 0.02f * rng_gauss(r);
    if (rng_int(r, 0, 31) == 0) x[i] = (rng_int(r, 0, 1) ? 1.0f : -1.0f) * rng_uniform(r, 4.0f, 16.0f);
  }
}
static void fill_constant(float *x, int64_t n, struct rng *r) {
  (void)r;
  for (int64_t i = 0; i < n; ++i) x[i] = 1.7f;
}
static void fill_alternating(float *x, int64_t n, struct rng *r) {
  for (int64_t i = 0; i < n; ++i) x[i] = (i % 2 ? -1.0f : 1.0f) * (0.25f + fabsf(rng_gauss(r)));
}
static void fill_positive(float *x, int64_t n, struct rng *r) {
  for (int64_t i = 0; i < n; ++i) x[i] = rng_uniform(r, 0.0f, 2.0f);
}
static void fill_sparse(float *x, int64_t n, struct rng *r) {
  for (int64_t i = 0; i < n; ++i) x[i] = rng_int(r, 0, 9) == 0 ? rng_gauss(r) : 0.0f;
}

// A value exactly halfway between two neighbours of a float format with `mantissa_bits` stored bits
// whose smallest normal exponent is `min_exponent` (or one float step either side of it), with an
// exponent drawn from [exponent_lo, exponent_hi]. Exercises round-to-nearest-even, subnormals, and
// overflow to infinity when exponent_hi passes the format's largest finite value.
static float near_tie(struct rng *r, int mantissa_bits, int min_exponent, int exponent_lo, int exponent_hi) {
  const int exponent = rng_int(r, exponent_lo, exponent_hi);
  const float x = ldexpf(1.0f + rng_unit(r), exponent);
  const int spacing = (exponent > min_exponent ? exponent : min_exponent) - mantissa_bits;
  float v = ldexpf(floorf(ldexpf(x, -spacing)) + 0.5f, spacing);
  const int nudge = rng_int(r, 0, 2);
  if (nudge == 1) v = nextafterf(v, INFINITY);
  if (nudge == 2) v = nextafterf(v, 0.0f);
  return rng_int(r, 0, 1) ? -v : v;
}
static void fill_ties_f16(float *x, int64_t n, struct rng *r) {
  for (int64_t i = 0; i < n; ++i) x[i] = near_tie(r, 10, -14, -26, 16);
}
static void fill_ties_bf16(float *x, int64_t n, struct rng *r) {
  for (int64_t i = 0; i < n; ++i) x[i] = near_tie(r, 7, -126, -134, 127);
}

struct value_range {
  const char *name;
  void (*fill)(float *x, int64_t n, struct rng *r);
  int only_type;  // -1: every type; else only this one (its golden holds infinities on purpose)
};

static const struct value_range kRanges[] = {
    {"gauss", fill_gauss, -1},         {"uniform", fill_uniform, -1},
    {"zeros", fill_zeros, -1},         {"huge", fill_huge, -1},
    {"tiny", fill_tiny, -1},           {"denormal", fill_denormal, -1},
    {"outliers", fill_outliers, -1},   {"constant", fill_constant, -1},
    {"altsign", fill_alternating, -1}, {"positive", fill_positive, -1},
    {"sparse", fill_sparse, -1},       {"ties+inf", fill_ties_f16, T_F16},
    {"ties+inf", fill_ties_bf16, T_BF16},
};
static const int kRangeCount = sizeof(kRanges) / sizeof(kRanges[0]);

// ---- kind 1: random blocks with finite scales --------------------------------------------------

enum scale_class { SCALES_UNIT, SCALES_ANY, SCALES_SUBNORMAL, SCALES_LARGE, SCALE_CLASS_COUNT };
static const char *const kScaleClassNames[] = {"unit", "any", "subnormal", "large"};

// A finite float bit pattern with `exponent_bits` exponent bits and `mantissa_bits` mantissa bits.
static uint32_t random_float_bits(struct rng *r, enum scale_class c, int exponent_bits, int mantissa_bits) {
  const int max_finite = (1 << exponent_bits) - 2, bias = (1 << (exponent_bits - 1)) - 1;
  int exponent = 0;
  switch (c) {
    case SCALES_UNIT: exponent = rng_int(r, bias - 3, bias + 2); break;
    case SCALES_ANY: exponent = rng_int(r, 0, max_finite); break;
    case SCALES_SUBNORMAL: exponent = 0; break;
    default: exponent = rng_int(r, max_finite - 3, max_finite); break;
  }
  const uint32_t mantissa = (uint32_t)rng_next(r) & ((1u << mantissa_bits) - 1);
  const uint32_t sign = (uint32_t)rng_int(r, 0, 1) << (exponent_bits + mantissa_bits);
  return sign | ((uint32_t)exponent << mantissa_bits) | mantissa;
}
static uint16_t random_fp16(struct rng *r, enum scale_class c) {
  return (uint16_t)random_float_bits(r, c, 5, 10);
}

// MXFP4's shared exponent (e8m0, 2^(e-127)); kept <= 252 so every value of the block stays finite.
static uint8_t random_e8m0(struct rng *r, enum scale_class c) {
  switch (c) {
    case SCALES_UNIT: return (uint8_t)rng_int(r, 120, 135);
    case SCALES_ANY: return (uint8_t)rng_int(r, 0, 252);
    case SCALES_SUBNORMAL: return (uint8_t)rng_int(r, 0, 2);  // 0 and 1 take ggml's special path
    default: return (uint8_t)rng_int(r, 240, 252);
  }
}

static void put_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

// Offsets of the fp16 scale fields inside one block; returns their count.
static int fp16_field_offsets(int type, int offsets[2]) {
  switch (type) {
    case T_Q4_1: case T_Q5_1: case T_Q4_K: case T_Q5_K: offsets[0] = 0; offsets[1] = 2; return 2;
    case T_Q2_K: offsets[0] = 80; offsets[1] = 82; return 2;  // d, dmin after scales[16], qs[64]
    case T_Q3_K: offsets[0] = 108; return 1;                  // d after hmask, qs, scales
    case T_Q6_K: offsets[0] = 208; return 1;                  // d after ql, qh, scales
    case T_IQ1_M: case T_MXFP4: return 0;                     // handled by the caller
    default: offsets[0] = 0; return 1;                        // d first
  }
}

// IQ1_M has no d field: its fp16 scale is spread over the top nibbles of the four u16 scale words.
static void set_iq1_m_scale(uint8_t *block, uint16_t scale) {
  uint8_t *words = block + 48;  // after qs[32], qh[16]
  for (int k = 0; k < 4; ++k) {
    const uint16_t w = get_u16(words + 2 * k);
    put_u16(words + 2 * k, (uint16_t)((w & 0x0fff) | (((scale >> (4 * k)) & 0xf) << 12)));
  }
}

// Random bytes for one block (for f32/f16/bf16: one value) with every scale field finite.
static void random_block(int type, uint8_t *block, size_t block_bytes, enum scale_class c, struct rng *r) {
  for (size_t i = 0; i < block_bytes; ++i) block[i] = (uint8_t)rng_next(r);
  if (type == T_F32) {
    const uint32_t bits = random_float_bits(r, c, 8, 23);
    memcpy(block, &bits, 4);
  } else if (type == T_BF16) {
    put_u16(block, (uint16_t)random_float_bits(r, c, 8, 7));
  } else if (type == T_IQ1_M) {
    set_iq1_m_scale(block, random_fp16(r, c));
  } else if (type == T_MXFP4) {
    block[0] = random_e8m0(r, c);
  } else {
    int offsets[2];
    const int n = fp16_field_offsets(type, offsets);
    for (int i = 0; i < n; ++i) put_u16(block + offsets[i], random_fp16(r, c));
  }
}

// The grid i-quants: how many grid entries, how many grid indices one block holds, and how to
// store index `value` into slot `slot` of a block (layouts as ggml's block_iq* structs).
struct grid_layout { int type, grid_size, slots; void (*set)(uint8_t *block, int slot, int value); };

static void set_iq2_xxs(uint8_t *b, int s, int v) { b[2 + 8 * (s / 4) + s % 4] = (uint8_t)v; }
static void set_iq2_xs(uint8_t *b, int s, int v) {
  put_u16(b + 2 + 2 * s, (uint16_t)((get_u16(b + 2 + 2 * s) & ~0x1ffu) | (unsigned)v));
}
static void set_iq2_s(uint8_t *b, int s, int v) {
  b[2 + s] = (uint8_t)v;
  uint8_t *qh = b + 66 + s / 4;
  const int shift = 2 * (s % 4);
  *qh = (uint8_t)((*qh & ~(3 << shift)) | ((v >> 8) << shift));
}
static void set_iq3_xxs(uint8_t *b, int s, int v) { b[2 + s] = (uint8_t)v; }
static void set_iq3_s(uint8_t *b, int s, int v) {
  b[2 + s] = (uint8_t)v;
  uint8_t *qh = b + 66 + s / 8;
  *qh = (uint8_t)((*qh & ~(1 << (s % 8))) | ((v >> 8) << (s % 8)));
}
static void set_iq1_s(uint8_t *b, int s, int v) {
  b[2 + s] = (uint8_t)v;
  uint8_t *qh = b + 34 + 2 * (s / 4);
  const int shift = 3 * (s % 4);
  put_u16(qh, (uint16_t)((get_u16(qh) & ~(7u << shift)) | ((unsigned)(v >> 8) << shift)));
}
static void set_iq1_m(uint8_t *b, int s, int v) {
  b[s] = (uint8_t)v;
  uint8_t *qh = b + 32 + s / 2;
  const int shift = 4 * (s % 2);
  *qh = (uint8_t)((*qh & ~(7 << shift)) | ((v >> 8) << shift));
}

static const struct grid_layout kGrids[] = {
    {T_IQ2_XXS, 256, 32, set_iq2_xxs}, {T_IQ2_XS, 512, 32, set_iq2_xs}, {T_IQ2_S, 1024, 32, set_iq2_s},
    {T_IQ3_XXS, 256, 64, set_iq3_xxs}, {T_IQ3_S, 512, 64, set_iq3_s},   {T_IQ1_S, 2048, 32, set_iq1_s},
    {T_IQ1_M, 2048, 32, set_iq1_m},
};

static const struct grid_layout *grid_of(int type) {
  for (size_t i = 0; i < sizeof(kGrids) / sizeof(kGrids[0]); ++i)
    if (kGrids[i].type == type) return &kGrids[i];
  return NULL;
}

// ---- writing ------------------------------------------------------------------------------------

struct golden_writer { FILE *file; int type; uint32_t n_cases; };

static void write_or_die(struct golden_writer *w, const void *data, size_t n) {
  if (n && fwrite(data, 1, n, w->file) != n) oracle_die("write failed");
}
static void write_u32(struct golden_writer *w, uint32_t v) { write_or_die(w, &v, 4); }

// Dequantizes `bytes` with ggml and appends one case. input is NULL for kind 1.
static void write_case(struct golden_writer *w, const char *label, const float *input, const uint8_t *bytes,
                       int64_t n, bool infinities_expected) {
  const size_t n_bytes = oracle_row_bytes(w->type, n);
  float *dequantized = malloc((size_t)n * sizeof(float));
  oracle_dequantize(w->type, bytes, dequantized, n);
  if (!infinities_expected) {
    oracle_validate(w->type, bytes, n_bytes);
    if (!oracle_all_finite(dequantized, n))
      oracle_die("%s %s: ggml dequantized to a non-finite value", oracle_traits(w->type)->type_name, label);
  }
  char padded[32] = {0};
  if (strlen(label) >= sizeof(padded)) oracle_die("label too long: %s", label);
  strcpy(padded, label);
  write_u32(w, input ? 0 : 1);
  write_u32(w, (uint32_t)n);
  write_or_die(w, padded, sizeof(padded));
  if (input) write_or_die(w, input, (size_t)n * sizeof(float));
  write_or_die(w, bytes, n_bytes);
  write_or_die(w, dequantized, (size_t)n * sizeof(float));
  free(dequantized);
  ++w->n_cases;
}

// Values per "block" of a case: the type's block, or 32 for the float types (whose block is 1).
static int64_t unit_of(int type) {
  const int64_t block = oracle_traits(type)->blck_size;
  return block == 1 ? 32 : block;
}

static void write_kind0_cases(struct golden_writer *w, uint64_t seed) {
  // Super-blocks of 256 are big: fewer of them keep the files small.
  static const int kSmallCounts[] = {1, 2, 5}, kSuperCounts[] = {1, 2, 3};
  const int64_t unit = unit_of(w->type);
  const int *counts = unit == 256 ? kSuperCounts : kSmallCounts;
  for (int k = 0; k < kRangeCount; ++k) {
    if (kRanges[k].only_type >= 0 && kRanges[k].only_type != w->type) continue;
    for (int c = 0; c < 3; ++c) {
      const int64_t n = counts[c] * unit;
      struct rng r = {seed ^ ((uint64_t)k << 32) ^ (uint64_t)counts[c]};
      float *input = malloc((size_t)n * sizeof(float));
      uint8_t *bytes = malloc(oracle_row_bytes(w->type, n));
      kRanges[k].fill(input, n, &r);
      oracle_quantize(w->type, input, bytes, 1, n);
      char label[64];
      snprintf(label, sizeof(label), "%s/%dblk", kRanges[k].name, counts[c]);
      write_case(w, label, input, bytes, n, kRanges[k].only_type >= 0);
      free(input);
      free(bytes);
    }
  }
}

static void write_random_case(struct golden_writer *w, enum scale_class c, int64_t n_blocks, bool sweep,
                              uint64_t seed) {
  const struct ggml_type_traits *t = oracle_traits(w->type);
  const int64_t per_block = t->blck_size == 1 ? 1 : t->blck_size;
  const int64_t n = n_blocks * per_block;
  uint8_t *bytes = malloc(oracle_row_bytes(w->type, n));
  struct rng r = {seed};
  const struct grid_layout *grid = sweep ? grid_of(w->type) : NULL;
  for (int64_t b = 0; b < n_blocks; ++b) {
    uint8_t *block = bytes + b * t->type_size;
    random_block(w->type, block, t->type_size, c, &r);
    if (grid)  // walk the grid: index i lands in slot i of the flattened block sequence
      for (int s = 0; s < grid->slots; ++s)
        grid->set(block, s, (int)((b * grid->slots + s) % grid->grid_size));
  }
  char label[64];
  snprintf(label, sizeof(label), "%s-%s/%lldblk", grid ? "grid" : "rand", kScaleClassNames[c],
           (long long)(t->blck_size == 1 ? n / 32 : n_blocks));
  write_case(w, label, NULL, bytes, n, false);
  free(bytes);
}

static void write_kind1_cases(struct golden_writer *w, uint64_t seed) {
  const int64_t block = oracle_traits(w->type)->blck_size;
  const int64_t n_blocks = block == 1 ? 512 : block == 256 ? 4 : 16;
  for (int c = 0; c < SCALE_CLASS_COUNT; ++c)
    write_random_case(w, (enum scale_class)c, n_blocks, false, seed ^ (0xabcull << 40) ^ (uint64_t)c);
  const struct grid_layout *grid = grid_of(w->type);
  if (grid) {
    const int64_t sweep_blocks = (grid->grid_size + grid->slots - 1) / grid->slots;
    write_random_case(w, SCALES_UNIT, sweep_blocks, true, seed ^ (0xdefull << 40));
  }
}

static void write_golden_file(const char *out_dir, int type) {
  const char *name = oracle_traits(type)->type_name;
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s.bin", out_dir, name);
  struct golden_writer w = {fopen(path, "wb"), type, 0};
  if (!w.file) oracle_die("cannot write %s", path);
  write_or_die(&w, "LGLD", 4);
  write_u32(&w, 1);  // version
  write_u32(&w, (uint32_t)type);
  write_u32(&w, 0);  // n_cases, patched below
  const uint64_t seed = 0x6c6f6465ull * 1000003ull + (uint64_t)type;
  write_kind0_cases(&w, seed);
  write_kind1_cases(&w, seed);
  if (fseek(w.file, 12, SEEK_SET) != 0) oracle_die("cannot seek in %s", path);
  write_u32(&w, w.n_cases);
  if (fclose(w.file) != 0) oracle_die("cannot finish %s", path);
  printf("%-8s %3u cases -> %s\n", name, w.n_cases, path);
}

int main(int argc, char **argv) {
  if (argc != 3) oracle_die("usage: gen_golden LIB_DIR OUT_DIR");
  oracle_open(argv[1]);
  for (int i = 0; i < kOracleTypeCount; ++i) write_golden_file(argv[2], kOracleTypes[i]);
  return 0;
}
