// Dequantize throughput of every type lode can read, each beside ggml's own to_float on the very
// same bytes (ggml's CPU build from npm, loaded with dlopen). Results: docs/BENCHMARKS.md.
//
//   build/bench_dequant [--ggml-lib PATH] [Google Benchmark flags]
//
// --ggml-lib defaults to tools/oracle/.cache/package/bins/linux-x64/libggml-base.so (relative to the
// working directory: run from the repository root; tools/oracle/fetch puts it there). Without the
// library the ggml rows are skipped with a message.
//
// Per type: about 4 MiB of valid blocks (made by the type's own quantizer from normal(0, 1) values
// where lode has one, otherwise random bytes with sane scale fields), dequantized row by row
// (4096 values) into one reused row buffer, as a matrix multiply would use it; so the numbers are
// the decoder's speed with the blocks streamed from cache/memory, not the speed of writing floats.
// Before timing, lode's output is compared with ggml's over the whole data set ("bit-exact").
#include <benchmark/benchmark.h>
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/fp16.h"
#include "core/quant/blocks.h"
#include "core/quant/types.h"

namespace {

using namespace lode;
using namespace lode::quant;

constexpr size_t kTargetBytes = size_t(4) << 20;  // blocks per type
constexpr int64_t kPatternValues = 1 << 16;        // quantized once, then tiled up to kTargetBytes
constexpr int64_t kRowValues = 4096;               // one to_float call
constexpr const char* kDefaultGgmlLib = "tools/oracle/.cache/package/bins/linux-x64/libggml-base.so";

// --- test data ----------------------------------------------------------------------------------

struct Dataset {
  std::vector<uint8_t> bytes;
  int64_t n_values = 0;
  size_t row_bytes = 0;  // bytes of kRowValues values
};

// Where the fp16 scale fields of a block sit, for types whose data is made from random bytes:
// random scales could be NaN, infinite or subnormal, and subnormal arithmetic is slow.
struct Fp16Fields {
  GgmlType type;
  std::vector<size_t> offsets;
};

const std::vector<Fp16Fields>& fp16_fields() {
  static const std::vector<Fp16Fields> table = {
      {GgmlType::Q4_0, {offsetof(BlockQ4_0, d)}},
      {GgmlType::Q4_1, {offsetof(BlockQ4_1, d), offsetof(BlockQ4_1, m)}},
      {GgmlType::Q5_0, {offsetof(BlockQ5_0, d)}},
      {GgmlType::Q5_1, {offsetof(BlockQ5_1, d), offsetof(BlockQ5_1, m)}},
      {GgmlType::Q8_0, {offsetof(BlockQ8_0, d)}},
      {GgmlType::Q2_K, {offsetof(BlockQ2_K, d), offsetof(BlockQ2_K, dmin)}},
      {GgmlType::Q3_K, {offsetof(BlockQ3_K, d)}},
      {GgmlType::Q4_K, {offsetof(BlockQ4_K, d), offsetof(BlockQ4_K, dmin)}},
      {GgmlType::Q5_K, {offsetof(BlockQ5_K, d), offsetof(BlockQ5_K, dmin)}},
      {GgmlType::Q6_K, {offsetof(BlockQ6_K, d)}},
      {GgmlType::IQ2_XXS, {offsetof(BlockIQ2_XXS, d)}},
      {GgmlType::IQ2_XS, {offsetof(BlockIQ2_XS, d)}},
      {GgmlType::IQ2_S, {offsetof(BlockIQ2_S, d)}},
      {GgmlType::IQ3_XXS, {offsetof(BlockIQ3_XXS, d)}},
      {GgmlType::IQ3_S, {offsetof(BlockIQ3_S, d)}},
      {GgmlType::IQ1_S, {offsetof(BlockIQ1_S, d)}},
      {GgmlType::IQ4_NL, {offsetof(BlockIQ4_NL, d)}},
      {GgmlType::IQ4_XS, {offsetof(BlockIQ4_XS, d)}},
  };
  return table;
}

// A scale of either sign with magnitude in [2^-10, 2^-4): normal, finite, typical of real weights.
uint16_t sane_fp16_scale(std::mt19937& rng) {
  const float magnitude = std::ldexp(1.0f + float(rng() % 1024) / 1024.0f, -10 + int(rng() % 6));
  return fp32_to_fp16(rng() % 2 ? -magnitude : magnitude);
}

void put_u16(uint8_t* at, uint16_t v) { std::memcpy(at, &v, 2); }
uint16_t get_u16(const uint8_t* at) { uint16_t v; std::memcpy(&v, at, 2); return v; }

// Makes one random block sane. iq1_m spreads its fp16 scale over the top nibbles of its four
// 16-bit scale words; mxfp4's scale is an E8M0 exponent byte.
void sanitize_block(GgmlType type, uint8_t* block, std::mt19937& rng) {
  if (type == GgmlType::MXFP4) {
    block[offsetof(BlockMXFP4, e)] = uint8_t(118 + rng() % 10);
    return;
  }
  if (type == GgmlType::IQ1_M) {
    const uint16_t d = sane_fp16_scale(rng);
    uint8_t* words = block + offsetof(BlockIQ1_M, scales);
    for (int k = 0; k < 4; ++k) {
      const uint16_t w = get_u16(words + 2 * k);
      put_u16(words + 2 * k, uint16_t((w & 0x0fff) | ((d >> (4 * k)) & 0xf) << 12));
    }
    return;
  }
  for (const auto& f : fp16_fields()) {
    if (f.type != type) continue;
    for (size_t offset : f.offsets) put_u16(block + offset, sane_fp16_scale(rng));
    return;
  }
  fail("bench_dequant: no scale layout for {}; add its fp16 fields to fp16_fields()", traits(type).name);
}

std::vector<uint8_t> random_blocks(const TypeTraits& t, std::mt19937& rng) {
  std::vector<uint8_t> bytes(row_bytes(t.type, kPatternValues));
  for (auto& b : bytes) b = uint8_t(rng());
  for (size_t at = 0; at < bytes.size(); at += t.block_bytes) sanitize_block(t.type, &bytes[at], rng);
  return bytes;
}

// kPatternValues values' worth of blocks: quantized where lode can, random otherwise.
std::vector<uint8_t> pattern_blocks(const TypeTraits& t, std::mt19937& rng) {
  if (t.quantize) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> values(kPatternValues);
    for (float& v : values) v = normal(rng);
    std::vector<uint8_t> bytes(row_bytes(t.type, kPatternValues));
    try {
      t.quantize(values.data(), bytes.data(), kPatternValues);
      return bytes;
    } catch (const Error& e) {
      std::fprintf(stderr, "%s: quantizer unavailable (%s); using random blocks\n", t.name, e.what());
    }
  }
  if (t.block_size == 1) fail("bench_dequant: {} needs its quantizer to make data", t.name);
  return random_blocks(t, rng);
}

Dataset make_dataset(const TypeTraits& t, std::mt19937& rng) {
  const std::vector<uint8_t> pattern = pattern_blocks(t, rng);
  const size_t copies = std::max<size_t>(1, kTargetBytes / pattern.size());
  Dataset data;
  data.bytes.reserve(copies * pattern.size());
  for (size_t i = 0; i < copies; ++i) data.bytes.insert(data.bytes.end(), pattern.begin(), pattern.end());
  data.n_values = int64_t(copies) * kPatternValues;
  data.row_bytes = row_bytes(t.type, kRowValues);
  return data;
}

// --- ggml ---------------------------------------------------------------------------------------

// struct ggml_type_traits as libggml-base lays it out; checked against lode's table before use.
struct GgmlTypeTraits {
  const char* type_name;
  int64_t blck_size;
  int64_t blck_size_interleave;
  size_t type_size;
  bool is_quantized;
  DequantizeRow to_float;
  void* from_float_ref;
};

class GgmlOracle {
public:
  explicit GgmlOracle(const std::string& path) {
    handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle_) { why_absent_ = dlerror(); return; }
    get_traits_ = reinterpret_cast<GetTraits>(dlsym(handle_, "ggml_get_type_traits"));
    if (!get_traits_) why_absent_ = path + " has no ggml_get_type_traits";
  }
  bool loaded() const { return get_traits_ != nullptr; }
  const std::string& why_absent() const { return why_absent_; }

  // ggml's to_float for the type, or nullptr with *why set.
  DequantizeRow to_float(const TypeTraits& t, std::string* why) const {
    const GgmlTypeTraits* g = get_traits_(uint32_t(t.type));
    if (!g || !g->type_name || std::string_view(g->type_name) != t.name || g->blck_size != t.block_size ||
        g->type_size != t.block_bytes) {
      *why = "ggml's traits for this id do not match lode's table";
      return nullptr;
    }
    if (!g->to_float) *why = "ggml has no to_float for it";
    return g->to_float;
  }

private:
  using GetTraits = const GgmlTypeTraits* (*)(uint32_t);
  void* handle_ = nullptr;  // kept open for the life of the process
  GetTraits get_traits_ = nullptr;
  std::string why_absent_;
};

// --- timing -------------------------------------------------------------------------------------

void dequantize_rows(benchmark::State& state, DequantizeRow fn, const Dataset* data) {
  std::vector<float> row(kRowValues);
  const int64_t n_rows = data->n_values / kRowValues;
  for (auto _ : state) {
    const uint8_t* src = data->bytes.data();
    for (int64_t r = 0; r < n_rows; ++r, src += data->row_bytes) {
      fn(src, row.data(), kRowValues);
      benchmark::DoNotOptimize(row.data());
      benchmark::ClobberMemory();
    }
  }
  const auto iterations = int64_t(state.iterations());
  state.SetBytesProcessed(iterations * int64_t(data->bytes.size()));
  state.counters["values/s"] =
      benchmark::Counter(double(iterations) * double(data->n_values), benchmark::Counter::kIsRate);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<float> dequantize_all(DequantizeRow fn, const Dataset& data) {
  std::vector<float> out(data.n_values);
  fn(data.bytes.data(), out.data(), data.n_values);
  return out;
}

// --- summary ------------------------------------------------------------------------------------

struct Measured { double bytes_per_s = 0, values_per_s = 0; };

// What the summary table says about each timed type besides its speed.
struct TypeNotes {
  std::vector<std::string> order;             // table order
  std::map<std::string, std::string> exact;   // "yes" / "NO": lode's floats == ggml's, bit for bit
};

// The console output, then one markdown table of lode beside ggml (medians when repeated).
class SummaryReporter : public benchmark::ConsoleReporter {
public:
  explicit SummaryReporter(const TypeNotes* notes) : notes_(notes) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.error_occurred) continue;
      const bool repeated = run.repetitions > 1;
      if (run.run_type == Run::RT_Aggregate ? run.aggregate_name != "median" : repeated) continue;
      const std::string name = run.run_name.function_name;  // "<impl>/<type>"
      const size_t slash = name.find('/');
      Measured& m = results_[name.substr(slash + 1)][name.substr(0, slash)];
      m.bytes_per_s = run.counters.at("bytes_per_second").value;
      m.values_per_s = run.counters.at("values/s").value;
    }
  }

  void Finalize() override {
    ConsoleReporter::Finalize();
    std::printf("\n| type | lode GB/s | ggml GB/s | lode Gvalues/s | ggml Gvalues/s | lode / ggml | bit-exact |\n");
    std::printf("|---|---:|---:|---:|---:|---:|---|\n");
    for (const std::string& type : notes_->order) {
      if (!results_.count(type)) continue;  // filtered out
      const auto& impls = results_[type];
      const auto lode = impls.find("lode"), ggml = impls.find("ggml");
      auto cell = [&](auto it, double Measured::*field) {
        return it == impls.end() ? std::string("-") : fmt::format("{:.2f}", it->second.*field / 1e9);
      };
      const std::string ratio = lode != impls.end() && ggml != impls.end()
          ? fmt::format("{:.2f}", lode->second.bytes_per_s / ggml->second.bytes_per_s) : "-";
      const auto exact = notes_->exact.find(type);
      std::printf("| %s | %s | %s | %s | %s | %s | %s |\n", type.c_str(),
                  cell(lode, &Measured::bytes_per_s).c_str(), cell(ggml, &Measured::bytes_per_s).c_str(),
                  cell(lode, &Measured::values_per_s).c_str(), cell(ggml, &Measured::values_per_s).c_str(),
                  ratio.c_str(), exact == notes_->exact.end() ? "-" : exact->second.c_str());
    }
  }

private:
  const TypeNotes* notes_;
  std::map<std::string, std::map<std::string, Measured>> results_;  // type -> impl -> numbers
};

// --- main ---------------------------------------------------------------------------------------

// Removes "--ggml-lib PATH" / "--ggml-lib=PATH" from argv (Google Benchmark rejects unknown flags).
std::string take_ggml_lib_flag(int* argc, char** argv) {
  std::string path = kDefaultGgmlLib;
  int kept = 1;
  for (int i = 1; i < *argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--ggml-lib") {
      if (i + 1 >= *argc) fail("--ggml-lib needs a path to libggml-base.so");
      path = argv[++i];
    } else if (arg.starts_with("--ggml-lib=")) {
      path = std::string(arg.substr(std::strlen("--ggml-lib=")));
    } else {
      argv[kept++] = argv[i];
    }
  }
  *argc = kept;
  argv[kept] = nullptr;
  return path;
}

// True when lode's dequantizer for the type is written (pending ones throw lode::Error).
bool lode_can_dequantize(const TypeTraits& t) {
  if (!t.dequantize) return false;
  std::vector<uint8_t> zeros(t.block_bytes * size_t(kRowValues / t.block_size));
  std::vector<float> out(kRowValues);
  try {
    t.dequantize(zeros.data(), out.data(), kRowValues);
    return true;
  } catch (const Error&) {
    return false;
  }
}

void register_timing(const char* impl, const TypeTraits& t, DequantizeRow fn, const Dataset* data) {
  benchmark::RegisterBenchmark(fmt::format("{}/{}", impl, t.name).c_str(),
                               [fn, data](benchmark::State& state) { dequantize_rows(state, fn, data); });
}

int run(int argc, char** argv) {
  const std::string ggml_path = take_ggml_lib_flag(&argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;

  const GgmlOracle ggml(ggml_path);
  if (!ggml.loaded()) std::fprintf(stderr, "ggml rows skipped: %s\n", ggml.why_absent().c_str());

  std::mt19937 rng(20240601);
  std::vector<std::unique_ptr<Dataset>> datasets;
  TypeNotes notes;
  std::vector<std::string> missing;
  size_t count = 0;
  const TypeTraits* types = all_types(&count);
  for (size_t i = 0; i < count; ++i) {
    const TypeTraits& t = types[i];
    if (!t.dequantize) continue;
    if (!lode_can_dequantize(t)) { missing.push_back(t.name); continue; }
    datasets.push_back(std::make_unique<Dataset>(make_dataset(t, rng)));
    const Dataset* data = datasets.back().get();
    notes.order.push_back(t.name);
    register_timing("lode", t, t.dequantize, data);
    if (!ggml.loaded()) continue;
    std::string why;
    if (const DequantizeRow theirs = ggml.to_float(t, &why)) {
      const bool exact = same_bits(dequantize_all(t.dequantize, *data), dequantize_all(theirs, *data));
      notes.exact[t.name] = exact ? "yes" : "NO";
      register_timing("ggml", t, theirs, data);
    } else {
      std::fprintf(stderr, "%s: ggml row skipped: %s\n", t.name, why.c_str());
    }
  }
  if (!missing.empty())
    std::fprintf(stderr, "lode dequantizers still pending (not timed): %s\n", fmt::format("{}", fmt::join(missing, ", ")).c_str());

  SummaryReporter reporter(&notes);
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const lode::Error& e) {
    std::fprintf(stderr, "bench_dequant: %s\n", e.what());
    return 1;
  }
}
