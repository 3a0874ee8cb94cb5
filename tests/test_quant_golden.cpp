// lode's row converters against golden vectors made by ggml itself (tools/oracle/gen_golden.c,
// tests/data/golden/<type>.bin, format in support/golden.h):
//   (a) every dequantizer reproduces ggml's floats bit for bit, on ggml-quantized data and on random
//       blocks that reach every code path;
//   (b) the exact quantizers (f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1) write ggml's bytes;
//   (c) the search quantizers (q4_K q5_K q6_K iq4_nl iq4_xs) lose no more than ggml's reference
//       quantizers: round-trip RMSE <= 1.02 x ggml's, over all inputs and per value range.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/quant/types.h"
#include "support/golden.h"

using lode::TypeTraits;
using lode::test::GoldenCase;
using lode::test::GoldenFile;

namespace {

const char* const kGoldenTypes[] = {
    "f32",   "f16",     "bf16",   "q4_0",  "q4_1",  "q5_0",   "q5_1",   "q8_0",
    "q2_K",  "q3_K",    "q4_K",   "q5_K",  "q6_K",  "iq4_nl", "iq4_xs", "iq3_xxs",
    "iq3_s", "iq2_xxs", "iq2_xs", "iq2_s", "iq1_s", "iq1_m",  "mxfp4",
};
const char* const kExactQuantizers[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"};
const char* const kSearchQuantizers[] = {"q4_K", "q5_K", "q6_K", "iq4_nl", "iq4_xs"};
constexpr double kMaxRmseRatio = 1.02;

// The golden file of a type, checked to be about that type.
struct Golden {
  GoldenFile file;
  const TypeTraits* traits = nullptr;
};

Golden load(const std::string& name) {
  Golden g{lode::test::load_golden(name), nullptr};
  g.traits = lode::find_type(g.file.ggml_type);
  if (!g.traits || name != g.traits->name)
    lode::fail("golden/{}.bin holds ggml type {}, not {}", name, g.file.ggml_type, name);
  if (g.file.cases.empty()) lode::fail("golden/{}.bin has no cases", name);
  return g;
}

std::string describe(const GoldenCase& c) {
  return fmt::format("case '{}' (kind {}, {} values)", c.label, c.kind, c.n_values);
}

// The value range a kind-0 case was drawn from: its label up to the '/' ("gauss/2blk" -> "gauss").
std::string value_range(const GoldenCase& c) { return c.label.substr(0, c.label.find('/')); }

// Runs a converter, turning a lode::Error (a converter not written yet, say) into a test failure
// that names the case. Callers stop at the first one: the rest would only repeat it.
template <class F>
bool run_converter(const GoldenCase& c, const char* what, F&& f) {
  try {
    f();
    return true;
  } catch (const lode::Error& e) {
    ADD_FAILURE() << what << " of " << describe(c) << " threw: " << e.what();
    return false;
  }
}

// Index of the first value whose float bit pattern differs, or -1.
int64_t first_bit_mismatch(const std::vector<float>& ours, const std::vector<float>& ggml) {
  for (size_t i = 0; i < ours.size(); ++i)
    if (std::bit_cast<uint32_t>(ours[i]) != std::bit_cast<uint32_t>(ggml[i])) return int64_t(i);
  return -1;
}

int64_t count_bit_mismatches(const std::vector<float>& ours, const std::vector<float>& ggml) {
  int64_t n = 0;
  for (size_t i = 0; i < ours.size(); ++i)
    n += std::bit_cast<uint32_t>(ours[i]) != std::bit_cast<uint32_t>(ggml[i]);
  return n;
}

std::string name_of_param(const testing::TestParamInfo<const char*>& info) { return info.param; }

// --- (a) dequantizers, bit for bit ------------------------------------------------------------

class GoldenDequantize : public testing::TestWithParam<const char*> {};

TEST_P(GoldenDequantize, MatchesGgmlBitForBit) {
  const Golden g = load(GetParam());
  ASSERT_NE(g.traits->dequantize, nullptr) << "lode has no dequantizer for " << GetParam();
  int64_t values_checked = 0;
  for (const GoldenCase& c : g.file.cases) {
    std::vector<float> ours(c.n_values);
    if (!run_converter(c, "dequantize",
                       [&] { g.traits->dequantize(c.bytes.data(), ours.data(), c.n_values); }))
      return;
    values_checked += c.n_values;
    const int64_t i = first_bit_mismatch(ours, c.dequantized);
    if (i < 0) continue;
    ADD_FAILURE() << GetParam() << " " << describe(c) << ": " << count_bit_mismatches(ours, c.dequantized)
                  << " values differ; first at index " << i << " (block " << i / g.traits->block_size
                  << "): lode " << fmt::format("{} (0x{:08x})", ours[i], std::bit_cast<uint32_t>(ours[i]))
                  << ", ggml "
                  << fmt::format("{} (0x{:08x})", c.dequantized[i],
                                 std::bit_cast<uint32_t>(c.dequantized[i]));
  }
  RecordProperty("values_checked", std::to_string(values_checked));
}

INSTANTIATE_TEST_SUITE_P(AllTypes, GoldenDequantize, testing::ValuesIn(kGoldenTypes), name_of_param);

// --- (b) exact quantizers, byte for byte --------------------------------------------------------

class GoldenExactQuantize : public testing::TestWithParam<const char*> {};

TEST_P(GoldenExactQuantize, WritesGgmlBytes) {
  const Golden g = load(GetParam());
  ASSERT_NE(g.traits->quantize, nullptr) << "lode has no quantizer for " << GetParam();
  int cases = 0;
  for (const GoldenCase& c : g.file.cases) {
    if (c.kind != 0) continue;
    ++cases;
    std::vector<uint8_t> ours(c.bytes.size(), 0xcd);
    if (!run_converter(c, "quantize", [&] { g.traits->quantize(c.input.data(), ours.data(), c.n_values); }))
      return;
    const auto [mine, theirs] = std::mismatch(ours.begin(), ours.end(), c.bytes.begin());
    if (mine == ours.end()) continue;
    const size_t at = size_t(mine - ours.begin());
    ADD_FAILURE() << GetParam() << " " << describe(c) << ": first differing byte " << at << " (block "
                  << at / g.traits->block_bytes << ", byte " << at % g.traits->block_bytes << "): lode 0x"
                  << fmt::format("{:02x}", *mine) << ", ggml 0x" << fmt::format("{:02x}", *theirs);
  }
  EXPECT_GT(cases, 0) << "no ggml-quantized cases in golden/" << GetParam() << ".bin";
}

INSTANTIATE_TEST_SUITE_P(ExactTypes, GoldenExactQuantize, testing::ValuesIn(kExactQuantizers), name_of_param);

// --- (c) search quantizers, no worse than ggml -------------------------------------------------

struct RoundTripError {
  double lode_squares = 0, ggml_squares = 0;
  int64_t n = 0;
  double lode_rmse() const { return std::sqrt(lode_squares / double(n)); }
  double ggml_rmse() const { return std::sqrt(ggml_squares / double(n)); }
};

// Adds one case: lode quantizes and dequantizes its input; ggml's round trip is in the golden file.
// Returns false (after reporting) when a converter fails or lode's blocks do not dequantize to
// finite values.
bool add_round_trip(const TypeTraits& t, const GoldenCase& c, RoundTripError& error) {
  std::vector<uint8_t> bytes(c.bytes.size());
  std::vector<float> ours(c.n_values);
  if (!run_converter(c, "quantize", [&] { t.quantize(c.input.data(), bytes.data(), c.n_values); }))
    return false;
  if (!run_converter(c, "dequantize", [&] { t.dequantize(bytes.data(), ours.data(), c.n_values); }))
    return false;
  for (uint32_t i = 0; i < c.n_values; ++i) {
    if (!std::isfinite(ours[i])) {
      ADD_FAILURE() << t.name << " " << describe(c) << ": lode's blocks dequantize to " << ours[i]
                    << " at index " << i << " (block " << i / t.block_size << ")";
      return false;
    }
    const double lode_diff = double(ours[i]) - double(c.input[i]);
    const double ggml_diff = double(c.dequantized[i]) - double(c.input[i]);
    error.lode_squares += lode_diff * lode_diff;
    error.ggml_squares += ggml_diff * ggml_diff;
  }
  error.n += c.n_values;
  return true;
}

void expect_no_worse(const char* type, const std::string& scope, const RoundTripError& e) {
  const double ours = e.lode_rmse(), ggml = e.ggml_rmse();
  std::printf("  %-7s %-10s %6lld values  RMSE lode %.6e  ggml %.6e  ratio %s\n", type, scope.c_str(),
              static_cast<long long>(e.n), ours, ggml,
              ggml > 0 ? fmt::format("{:.4f}", ours / ggml).c_str() : "-");
  if (ggml == 0)
    EXPECT_EQ(ours, 0.0) << type << " " << scope << ": ggml reproduces these inputs exactly, lode does not";
  else
    EXPECT_LE(ours, kMaxRmseRatio * ggml)
        << type << " " << scope << ": RMSE " << ours << " vs ggml's " << ggml;
}

class GoldenSearchQuantize : public testing::TestWithParam<const char*> {};

TEST_P(GoldenSearchQuantize, RoundTripNoWorseThanGgml) {
  const Golden g = load(GetParam());
  ASSERT_NE(g.traits->quantize, nullptr) << "lode has no quantizer for " << GetParam();
  ASSERT_NE(g.traits->dequantize, nullptr) << "lode has no dequantizer for " << GetParam();
  RoundTripError all;
  std::map<std::string, RoundTripError> by_range;
  for (const GoldenCase& c : g.file.cases) {
    if (c.kind != 0) continue;
    RoundTripError one;
    if (!add_round_trip(*g.traits, c, one)) return;
    for (RoundTripError* e : {&all, &by_range[value_range(c)]}) {
      e->lode_squares += one.lode_squares;
      e->ggml_squares += one.ggml_squares;
      e->n += one.n;
    }
  }
  ASSERT_GT(all.n, 0) << "no ggml-quantized cases in golden/" << GetParam() << ".bin";
  expect_no_worse(GetParam(), "all", all);
  for (const auto& [range, e] : by_range) expect_no_worse(GetParam(), range, e);
  RecordProperty("rmse_lode", fmt::format("{:.6e}", all.lode_rmse()));
  RecordProperty("rmse_ggml", fmt::format("{:.6e}", all.ggml_rmse()));
}

INSTANTIATE_TEST_SUITE_P(SearchTypes, GoldenSearchQuantize, testing::ValuesIn(kSearchQuantizers),
                         name_of_param);

// --- the golden files themselves ----------------------------------------------------------------

// Guards against a truncated or partial regeneration: every file has both kinds of case, finite
// inputs, and every value range the generator draws from.
TEST(GoldenFiles, CoverBothKindsAndEveryValueRange) {
  const char* const ranges[] = {"gauss",    "uniform",  "zeros",   "huge",     "tiny",  "denormal",
                                "outliers", "constant", "altsign", "positive", "sparse"};
  for (const char* name : kGoldenTypes) {
    const Golden g = load(name);
    std::map<std::string, int> seen;
    int random_cases = 0;
    for (const GoldenCase& c : g.file.cases) {
      if (c.kind == 1) {
        ++random_cases;
        continue;
      }
      ++seen[value_range(c)];
      for (float x : c.input) ASSERT_TRUE(std::isfinite(x)) << name << " " << describe(c);
    }
    EXPECT_GE(random_cases, 4) << name;
    for (const char* r : ranges) EXPECT_GE(seen[r], 2) << name << ": value range " << r;
  }
}

}  // namespace
