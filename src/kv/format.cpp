#include "kv/format.h"

#include <fmt/format.h>

#include "core/error.h"

namespace lode::kv {

namespace {

constexpr int64_t kInt8Group = 64;   // values per int8 scale
constexpr int64_t kQ4Block = 32;     // values per q4_0 block
constexpr int64_t kQ4BlockBytes = 18;  // fp16 d + 16 bytes of nibbles

bool is_power_of_two(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

std::string valid_names() {
  std::string names;
  for (Format f : all_formats()) names += std::string(names.empty() ? "" : ", ") + to_string(f);
  return names + " (k8v8 = int8)";
}

// The side's rule for head_dim, or empty when it holds.
std::string store_problem(Store store, int64_t head_dim) {
  if (store == Store::i8 && head_dim % kInt8Group != 0)
    return fmt::format("int8 stores one scale per {} values and head_dim {} is not a multiple of {}", kInt8Group,
                       head_dim, kInt8Group);
  if (store == Store::q4r && (head_dim % kQ4Block != 0 || !is_power_of_two(head_dim)))
    return fmt::format("q4 stores blocks of {} values of the Hadamard-rotated head, which needs head_dim to be a "
                       "power of two and a multiple of {}; head_dim is {}",
                       kQ4Block, kQ4Block, head_dim);
  if (store == Store::q4 && head_dim % kQ4Block != 0)
    return fmt::format("q4 stores blocks of {} values and head_dim {} is not a multiple of {}", kQ4Block, head_dim,
                       kQ4Block);
  return {};
}

}  // namespace

Layout layout(Format format) {
  switch (format) {
    case Format::f32: return {Store::f32, Store::f32};
    case Format::f16: return {Store::f16, Store::f16};
    case Format::k8v8: return {Store::i8, Store::i8};
    case Format::k8v32: return {Store::i8, Store::f32};
    case Format::k32v8: return {Store::f32, Store::i8};
    case Format::q4: return {Store::q4r, Store::q4r};
    case Format::k8v4: return {Store::i8, Store::q4r};
    case Format::q4_unrotated: return {Store::q4, Store::q4};
  }
  fail("kv: unknown format {}", int(format));
}

const char* to_string(Format format) {
  switch (format) {
    case Format::f32: return "fp32";
    case Format::f16: return "fp16";
    case Format::k8v8: return "int8";
    case Format::k8v32: return "k8v32";
    case Format::k32v8: return "k32v8";
    case Format::q4: return "q4";
    case Format::k8v4: return "k8v4";
    case Format::q4_unrotated: return "q4-unrotated";
  }
  return "?";
}

const std::vector<Format>& all_formats() {
  static const std::vector<Format> formats = {Format::f32,   Format::f16, Format::k8v8, Format::k8v32,
                                              Format::k32v8, Format::q4,  Format::k8v4};
  return formats;
}

Format parse_format(std::string_view name) {
  if (name == "k8v8") return Format::k8v8;
  if (name == "q4-unrotated") return Format::q4_unrotated;
  for (Format f : all_formats())
    if (name == to_string(f)) return f;
  fail("unknown K/V cache format '{}': choose one of {}", name, valid_names());
}

Format choose_format(std::string_view flag, const char* env) {
  if (!flag.empty()) return parse_format(flag);
  if (env && *env) {
    try {
      return parse_format(env);
    } catch (const Error& e) {
      fail("LODE_KV: {}", e.what());
    }
  }
  return Format::f16;
}

int64_t row_bytes(Store store, int64_t heads, int64_t head_dim) {
  const int64_t values = heads * head_dim;
  switch (store) {
    case Store::f32: return values * 4;
    case Store::f16: return values * 2;
    case Store::i8: return values + values / kInt8Group * 2;
    case Store::q4r:
    case Store::q4: return values / kQ4Block * kQ4BlockBytes;
  }
  return 0;
}

int64_t cell_bytes(Format format, int64_t heads, int64_t head_dim) {
  const Layout l = layout(format);
  return row_bytes(l.k, heads, head_dim) + row_bytes(l.v, heads, head_dim);
}

std::string describe(Format format, int64_t attention_layers, int64_t heads, int64_t head_dim, int64_t positions) {
  const int64_t cell = cell_bytes(format, heads, head_dim);
  return fmt::format("{}, {} bytes per cell x {} attention layer{}: {:.1f} MiB for {} positions", to_string(format),
                     cell, attention_layers, attention_layers == 1 ? "" : "s",
                     double(cell * attention_layers * positions) / double(1 << 20), positions);
}

Format mtp_format(int64_t head_dim, Format fallback) {
  return unsupported_reason(Format::k8v8, head_dim).empty() ? Format::k8v8 : fallback;
}

std::string unsupported_reason(Format format, int64_t head_dim) {
  const Layout l = layout(format);
  std::string problem = store_problem(l.k, head_dim);
  if (problem.empty()) problem = store_problem(l.v, head_dim);
  if (problem.empty()) return {};
  std::string usable;
  for (Format f : all_formats())
    if (store_problem(layout(f).k, head_dim).empty() && store_problem(layout(f).v, head_dim).empty())
      usable += std::string(usable.empty() ? "" : ", ") + to_string(f);
  return fmt::format("--kv {} cannot hold this model's K/V: {}; use one of {}", to_string(format), problem, usable);
}

void check_head_dim(Format format, int64_t head_dim) {
  if (const std::string why = unsupported_reason(format, head_dim); !why.empty()) fail("{}", why);
}

}  // namespace lode::kv
