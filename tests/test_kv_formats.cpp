// The K/V cache formats (../shared/spec/kv-formats.md): names and selection, bytes per cell, the
// reference codecs byte for byte (int8 group rule, q4_0 of the Hadamard-rotated head), and the CPU
// engine's gated attention in every format against a naive double-precision reference over the
// same dequantized K/V.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "core/quant/dequant.h"
#include "cpu/attention.h"
#include "cpu/kv_cache.h"
#include "cpu/engine.h"
#include "cpu/session.h"
#include "engine/kv_quality.h"
#include "gguf/reader.h"
#include "kv/codec.h"
#include "kv/format.h"
#include "support/naive_math.h"
#include "support/paths.h"
#include "support/random.h"

namespace lode::test {
namespace {

using kv::Format;
using kv::Store;

// A format's name as gtest takes it (no '-').
std::string test_name(Format format) {
  std::string name = kv::to_string(format);
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

// --- names, selection, sizes -------------------------------------------------------------------

TEST(KvFormats, BytesPerCellForQwen36Geometry) {
  // Qwen3.6-35B-A3B: 2 KV heads of 256 values per attention layer.
  const std::vector<std::pair<Format, int64_t>> want = {{Format::f32, 4096},  {Format::f16, 2048},
                                                        {Format::k8v8, 1056}, {Format::k8v32, 2576},
                                                        {Format::k32v8, 2576}, {Format::q4, 576},
                                                        {Format::k8v4, 816}};
  for (const auto& [format, bytes] : want) EXPECT_EQ(kv::cell_bytes(format, 2, 256), bytes) << kv::to_string(format);
}

TEST(KvFormats, NamesParseAndTheFlagWinsOverTheEnvironment) {
  for (Format f : kv::all_formats()) EXPECT_EQ(kv::parse_format(kv::to_string(f)), f);
  EXPECT_EQ(kv::parse_format("k8v8"), Format::k8v8);
  EXPECT_STREQ(kv::to_string(Format::k8v8), "int8");
  EXPECT_EQ(kv::parse_format("q4-unrotated"), Format::q4_unrotated);  // a debug format: not offered
  EXPECT_EQ(std::count(kv::all_formats().begin(), kv::all_formats().end(), Format::q4_unrotated), 0);
  try {
    kv::parse_format("int4");
    ADD_FAILURE() << "int4 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp32, fp16, int8, k8v32, k32v8, q4, k8v4"), std::string::npos) << e.what();
  }
  EXPECT_EQ(kv::choose_format("", nullptr), Format::f16);  // the default
  EXPECT_EQ(kv::choose_format("", ""), Format::f16);
  EXPECT_EQ(kv::choose_format("", "q4"), Format::q4);
  EXPECT_EQ(kv::choose_format("int8", "q4"), Format::k8v8);
  try {
    kv::choose_format("", "bogus");
    ADD_FAILURE() << "LODE_KV=bogus was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("LODE_KV"), std::string::npos) << e.what();
  }
}

TEST(KvFormats, HeadSizesAFormatCannotHoldAreRefusedNamingTheOnesThatCan) {
  EXPECT_EQ(kv::unsupported_reason(Format::k8v8, 128), "");
  EXPECT_EQ(kv::unsupported_reason(Format::q4, 32), "");
  const std::string int8_96 = kv::unsupported_reason(Format::k8v8, 96);
  EXPECT_NE(int8_96.find("multiple of 64"), std::string::npos) << int8_96;
  EXPECT_NE(int8_96.find("use one of fp32, fp16"), std::string::npos) << int8_96;
  const std::string q4_96 = kv::unsupported_reason(Format::q4, 96);
  EXPECT_NE(q4_96.find("power of two"), std::string::npos) << q4_96;
  EXPECT_NE(kv::unsupported_reason(Format::k8v4, 32).find("multiple of 64"), std::string::npos);  // its K side
  EXPECT_THROW(cpu::KvCache(Format::k32v8, 2, 96), Error);
}


// --- codecs ------------------------------------------------------------------------------------

TEST(KvCodec, Int8GroupRuleRoundsHalfToEvenAgainstTheStoredScale) {
  // amax = 127/128 makes the scale exactly 1/128 in fp16, so x / scale lands on exact halves.
  std::vector<float> x(64, 0.0f);
  const float s = 1.0f / 128.0f;
  x[0] = 127 * s;
  x[1] = 2.5f * s;
  x[2] = 3.5f * s;
  x[3] = -2.5f * s;
  x[4] = -0.5f * s;
  x[5] = 1.49f * s;
  std::vector<int8_t> codes(64);
  uint16_t scale = 0;
  kv::quantize_int8_group(x.data(), codes.data(), &scale);
  EXPECT_EQ(fp16_to_fp32(scale), s);
  EXPECT_EQ(codes[0], 127);
  EXPECT_EQ(codes[1], 2);
  EXPECT_EQ(codes[2], 4);
  EXPECT_EQ(codes[3], -2);
  EXPECT_EQ(codes[4], 0);
  EXPECT_EQ(codes[5], 1);
  EXPECT_EQ(codes[6], 0);
}

TEST(KvCodec, Int8ScaleIsTheRoundedFp16OfAmaxOver127) {
  // 1/127 is not an fp16: the codes are against the rounded scale, so the largest value's code is
  // round(amax / fp16(amax / 127)), which need not be 127 but never exceeds it.
  std::vector<float> x(64);
  std::mt19937 rng(7);
  x = normal_floats(64, rng, 3.0f);
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  std::vector<int8_t> codes(64);
  uint16_t scale = 0;
  kv::quantize_int8_group(x.data(), codes.data(), &scale);
  EXPECT_EQ(scale, fp32_to_fp16(amax / 127.0f));
  for (int i = 0; i < 64; ++i) {
    EXPECT_LE(std::abs(int(codes[i])), 127);
    EXPECT_LE(std::fabs(codes[i] * fp16_to_fp32(scale) - x[i]), fp16_to_fp32(scale) * 0.5f + 1e-6f) << i;
  }
}

TEST(KvCodec, Int8ZeroTinyAndHugeGroupsStayFinite) {
  std::vector<int8_t> codes(64, 5);
  uint16_t scale = 1;
  const std::vector<float> zeros(64, 0.0f);
  kv::quantize_int8_group(zeros.data(), codes.data(), &scale);
  EXPECT_EQ(scale, 0);
  for (int8_t c : codes) EXPECT_EQ(c, 0);

  const std::vector<float> tiny(64, 1e-9f);  // amax / 127 underflows fp16
  kv::quantize_int8_group(tiny.data(), codes.data(), &scale);
  EXPECT_EQ(scale, 0);
  for (int8_t c : codes) EXPECT_EQ(c, 0);

  std::vector<float> huge(64, -3e9f);
  huge[1] = 1e10f;
  kv::quantize_int8_group(huge.data(), codes.data(), &scale);
  EXPECT_EQ(fp16_to_fp32(scale), 65504.0f);  // held at fp16's largest finite value
  EXPECT_EQ(codes[0], -127);
  EXPECT_EQ(codes[1], 127);
}

TEST(KvCodec, HadamardIsOrthonormalAndItsOwnInverse) {
  std::vector<float> e(256, 0.0f);
  e[0] = 1.0f;
  kv::hadamard(e.data(), 256);
  for (float v : e) EXPECT_EQ(v, 1.0f / 16.0f);
  std::mt19937 rng(3);
  const std::vector<float> x = normal_floats(256, rng);
  std::vector<float> y = x;
  kv::hadamard(y.data(), 256);
  double nx = 0, ny = 0;
  for (int i = 0; i < 256; ++i) nx += double(x[i]) * x[i], ny += double(y[i]) * y[i];
  EXPECT_NEAR(ny / nx, 1.0, 1e-6);
  kv::hadamard(y.data(), 256);
  for (int i = 0; i < 256; ++i) EXPECT_NEAR(y[i], x[i], 1e-5f) << i;
}

TEST(KvCodec, RowsAreLaidOutAsTheSpecSays) {
  const int64_t heads = 2, hd = 128, values = heads * hd;
  std::mt19937 rng(11);
  const std::vector<float> x = normal_floats(size_t(values), rng, 2.0f);

  // i8: every code first, then one fp16 scale per 64 values, in value order.
  std::vector<uint8_t> row(size_t(kv::row_bytes(Store::i8, heads, hd)));
  ASSERT_EQ(row.size(), size_t(values + values / 64 * 2));
  kv::encode_row(Store::i8, x.data(), heads, hd, row.data());
  for (int64_t g = 0; g < values / 64; ++g) {
    int8_t codes[64];
    uint16_t scale = 0, stored = 0;
    kv::quantize_int8_group(x.data() + g * 64, codes, &scale);
    std::memcpy(&stored, row.data() + values + 2 * g, 2);
    EXPECT_EQ(stored, scale) << g;
    EXPECT_EQ(std::memcmp(codes, row.data() + g * 64, 64), 0) << g;
  }

  // q4r: per head, ggml q4_0 blocks of the rotated head.
  row.assign(size_t(kv::row_bytes(Store::q4r, heads, hd)), 0);
  ASSERT_EQ(row.size(), size_t(values / 32 * 18));
  kv::encode_row(Store::q4r, x.data(), heads, hd, row.data());
  for (int64_t h = 0; h < heads; ++h) {
    std::vector<float> rotated(x.begin() + h * hd, x.begin() + (h + 1) * hd);
    kv::hadamard(rotated.data(), hd);
    std::vector<uint8_t> blocks(size_t(hd / 32 * 18));
    quant::quantize_row_q4_0(rotated.data(), blocks.data(), hd);
    EXPECT_EQ(std::memcmp(blocks.data(), row.data() + h * blocks.size(), blocks.size()), 0) << h;
    std::vector<float> decoded(static_cast<size_t>(hd)), want(static_cast<size_t>(hd));
    kv::decode_head(Store::q4r, row.data(), heads, hd, h, decoded.data());
    quant::dequantize_row_q4_0(blocks.data(), want.data(), hd);
    EXPECT_EQ(decoded, want);  // the decoded values stay rotated
  }
}

// Relative L2 error of each store's round trip on Gaussian rows (rotated stores rotated back).
TEST(KvCodec, RoundTripErrorPerStore) {
  const int64_t heads = 2, hd = 256, values = heads * hd;
  std::mt19937 rng(5);
  std::vector<float> x = normal_floats(size_t(values), rng);
  x[17] = 40.0f;  // an outlier, as K rows have: rotation spreads it over the block
  const std::vector<std::pair<Store, double>> bound = {
      {Store::f32, 0.0}, {Store::f16, 1e-3}, {Store::i8, 2e-2}, {Store::q4r, 0.15}};
  for (const auto& [store, limit] : bound) {
    std::vector<uint8_t> row(size_t(kv::row_bytes(store, heads, hd)));
    kv::encode_row(store, x.data(), heads, hd, row.data());
    std::vector<float> y(static_cast<size_t>(values));
    kv::decode_row(store, row.data(), heads, hd, y.data());
    if (kv::is_rotated(store))
      for (int64_t h = 0; h < heads; ++h) kv::hadamard(y.data() + h * hd, hd);
    double err = 0, norm = 0;
    for (int64_t i = 0; i < values; ++i) err += double(y[i] - x[i]) * (y[i] - x[i]), norm += double(x[i]) * x[i];
    EXPECT_LE(std::sqrt(err / norm), limit) << int(store);
    if (store == Store::f32) EXPECT_EQ(y, x);
  }
}

// --- the CPU engine's attention, in every format -------------------------------------------------

model::Qwen35MoeConfig attention_config() {
  model::Qwen35MoeConfig c;
  c.hidden = 48;
  c.n_layers = 1;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 64;  // the smallest head int8 groups and q4 blocks both hold
  c.rope_dims = 16;
  c.rope_theta = 10000.0;
  c.rms_eps = 1e-6;
  c.context_length = 64;
  return c;
}

class CpuAttention : public ::testing::TestWithParam<Format> {};

// Chunks of 5 then 3 tokens through attention_forward with the cache in the format, against a naive
// double-precision gated attention whose K/V are the format's dequantized values (the rotated
// stores rotated back) of the keys and values the fp32 cache holds. The fp32 cache's keys are
// themselves checked against naive RMSNorm + RoPE; the format's cache must hold exactly the codes
// of those keys.
TEST_P(CpuAttention, MatchesNaiveReferenceOverTheFormatsValues) {
  const Format format = GetParam();
  const model::Qwen35MoeConfig c = attention_config();
  const int64_t H = c.hidden, hd = c.head_dim, nh = c.n_heads, nkv = c.n_kv_heads;
  std::mt19937 rng(1);
  model::AttentionWeights w;
  const auto wq = normal_floats(size_t(2 * nh * hd * H), rng, 0.3f);
  const auto wk = normal_floats(size_t(nkv * hd * H), rng, 0.3f);
  const auto wv = normal_floats(size_t(nkv * hd * H), rng, 0.3f);
  const auto wo = normal_floats(size_t(H * nh * hd), rng, 0.3f);
  w.q = f32_view(wq, 2 * nh * hd, H);
  w.k = f32_view(wk, nkv * hd, H);
  w.v = f32_view(wv, nkv * hd, H);
  w.output = f32_view(wo, H, nh * hd);
  w.q_norm = normal_floats(size_t(hd), rng, 0.2f, 1.0f);
  w.k_norm = normal_floats(size_t(hd), rng, 0.2f, 1.0f);

  const int64_t T = 8;
  const auto x = normal_floats(size_t(T * H), rng, 1.0f);
  auto run = [&](cpu::KvCache& cache) {
    std::vector<float> out(size_t(T * H));
    cpu::attention_forward(w, c, cache, x.data(), out.data(), 5, 0, {.threads = 2});
    cpu::attention_forward(w, c, cache, x.data() + 5 * H, out.data() + 5 * H, 3, 5, {.threads = 1});
    return out;
  };
  cpu::KvCache plain(Format::f32, nkv, hd), cache(format, nkv, hd);
  run(plain);
  const std::vector<float> got = run(cache);
  ASSERT_EQ(cache.positions(), T);

  // Naive q and k; the fp32 cache's keys must be these.
  std::vector<Vec> q(T), k(T);
  for (int64_t t = 0; t < T; ++t) {
    q[t] = mat_vec(wq, 2 * nh * hd, H, x.data() + t * H);
    k[t] = mat_vec(wk, nkv * hd, H, x.data() + t * H);
    for (int64_t h = 0; h < nh; ++h) {
      rms_norm(&q[t][h * 2 * hd], hd, w.q_norm.data(), c.rms_eps);
      naive_rope(&q[t][h * 2 * hd], c.rope_dims, t, c.rope_theta);
    }
    for (int64_t h = 0; h < nkv; ++h) {
      rms_norm(&k[t][h * hd], hd, w.k_norm.data(), c.rms_eps);
      naive_rope(&k[t][h * hd], c.rope_dims, t, c.rope_theta);
      std::vector<float> stored(static_cast<size_t>(hd));
      plain.key(t, h, stored.data());
      for (int64_t d = 0; d < hd; ++d) EXPECT_NEAR(stored[d], k[t][h * hd + d], 1e-5) << t << " " << h << " " << d;
    }
  }
  // The format's K/V: the codes of the fp32 cache's rows, dequantized and rotated back.
  const kv::Layout layout = kv::layout(format);
  auto through_format = [&](Store store, bool keys, int64_t t) {
    std::vector<float> row(size_t(nkv * hd));
    for (int64_t h = 0; h < nkv; ++h) (keys ? plain.key(t, h, &row[h * hd]) : plain.value(t, h, &row[h * hd]));
    std::vector<uint8_t> bytes(size_t(kv::row_bytes(store, nkv, hd)));
    kv::encode_row(store, row.data(), nkv, hd, bytes.data());
    std::vector<float> decoded(row.size()), held(static_cast<size_t>(hd));
    kv::decode_row(store, bytes.data(), nkv, hd, decoded.data());
    for (int64_t h = 0; h < nkv; ++h) {
      (keys ? cache.key(t, h, held.data()) : cache.value(t, h, held.data()));
      EXPECT_TRUE(std::equal(held.begin(), held.end(), decoded.begin() + h * hd)) << "position " << t << " head " << h;
      if (kv::is_rotated(store)) kv::hadamard(decoded.data() + h * hd, hd);
    }
    return Vec(decoded.begin(), decoded.end());
  };
  std::vector<Vec> kq(T), vq(T);
  for (int64_t t = 0; t < T; ++t) kq[t] = through_format(layout.k, true, t), vq[t] = through_format(layout.v, false, t);

  Vec want(size_t(T * H));
  for (int64_t t = 0; t < T; ++t) {
    Vec o(size_t(nh * hd), 0.0);
    for (int64_t h = 0; h < nh; ++h) {
      const int64_t g = h / (nh / nkv);
      Vec p(size_t(t + 1));
      for (int64_t j = 0; j <= t; ++j) {
        double s = 0;
        for (int64_t d = 0; d < hd; ++d) s += q[t][h * 2 * hd + d] * kq[j][g * hd + d];
        p[j] = s / std::sqrt(double(hd));
      }
      const double m = *std::max_element(p.begin(), p.end());
      double sum = 0;
      for (double& e : p) sum += (e = std::exp(e - m));
      for (int64_t d = 0; d < hd; ++d) {
        double acc = 0;
        for (int64_t j = 0; j <= t; ++j) acc += p[j] / sum * vq[j][g * hd + d];
        o[h * hd + d] = acc * sigmoid(q[t][h * 2 * hd + hd + d]);
      }
    }
    const Vec y = mat_vec(wo, H, nh * hd, o);
    std::copy(y.begin(), y.end(), want.begin() + t * H);
  }
  EXPECT_LE(relative_error(got, want), 1e-4) << kv::to_string(format);
}

std::vector<Format> formats_and_debug_ones() {
  std::vector<Format> formats = kv::all_formats();
  formats.push_back(Format::q4_unrotated);
  return formats;
}

INSTANTIATE_TEST_SUITE_P(EveryFormat, CpuAttention, ::testing::ValuesIn(formats_and_debug_ones()),
                         [](const auto& info) { return test_name(info.param); });

// --- whole sequences on lode-mini (real weights, head_dim 256) ----------------------------------

struct Mini {
  gguf::Reader reader{lode::test::mini_model_path().string()};
  model::Qwen35MoeConfig config = model::read_config(reader.metadata());
  std::shared_ptr<const model::ModelWeights> weights =
      std::make_shared<const model::ModelWeights>(model::bind_weights(reader, config));
  cpu::Session session(Format format) const {
    // deltanet_chunk 0: prompt chunks run the recurrence token by token, so chunked prefill must
    // equal decoding bit for bit.
    return cpu::Session(weights, {.threads = 2, .max_context = 256, .deltanet_chunk = 0, .kv_format = format});
  }
};

std::vector<int32_t> some_tokens(int n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[size_t(i)] = int32_t(1000 + 37 * i % 5000);
  return t;
}

class CpuSessionKv : public ::testing::TestWithParam<Format> {};

// The prompt path and the decode path write and read cells the same way.
TEST_P(CpuSessionKv, PromptChunksEqualTokenByToken) {
  static const Mini mini;
  const auto tokens = some_tokens(40);
  cpu::Session chunked = mini.session(GetParam()), stepped = mini.session(GetParam());
  const std::vector<float> all = chunked.prefill(tokens, 16, true);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::vector<float> one = stepped.decode(tokens[i]);
    ASSERT_TRUE(std::equal(one.begin(), one.end(), all.begin() + int64_t(i) * chunked.vocab())) << "position " << i;
  }
}

// Rewinding cuts encoded rows and copying a prefix copies them: both continue exactly as a fresh
// sequence of the same tokens does.
TEST_P(CpuSessionKv, RewindAndCopiedPrefixesContinueLikeAFreshSequence) {
  static const Mini mini;
  const auto tokens = some_tokens(48);
  const std::span<const int32_t> head = std::span(tokens).first(32);
  cpu::Session fresh = mini.session(GetParam());
  fresh.prefill(head, 16);
  const std::vector<float> want = fresh.decode(7);

  cpu::Session a = mini.session(GetParam());
  a.prefill(head, 16);
  const cpu::SequenceCheckpoint at32 = a.checkpoint();
  a.prefill(std::span(tokens).subspan(32), 16);
  cpu::Session b = mini.session(GetParam());
  b.copy_prefix(a, at32);
  EXPECT_EQ(b.decode(7), want);
  a.rewind(at32);
  EXPECT_EQ(a.decode(7), want);

  const Format other = GetParam() == Format::f16 ? Format::f32 : Format::f16;
  cpu::Session c = mini.session(other);
  EXPECT_THROW(c.copy_prefix(a, at32), Error);  // cells of another format
}

// lode kv-quality's comparison: fp32 against itself is exact; fp16 moves the distributions a
// little and q4 more, and every row covers the same positions. Run in passes of one format beside
// a fresh reference, the rows are the same.
TEST(KvQuality, ComparesEachFormatWithTheReferenceSession) {
  static const Mini mini;
  engine::KvQualityOptions options;
  options.formats = {Format::f32, Format::f16, Format::q4};
  options.chunk = 16;
  options.greedy_tokens = 8;
  const engine::OpenSequence open = [](Format format, int64_t context) {
    return cpu::open_sequence(mini.weights, {.threads = 2, .max_context = context, .kv_format = format});
  };
  const auto rows = engine::compare_kv_formats(open, some_tokens(64), options);
  options.formats_per_pass = 1;
  const auto in_passes = engine::compare_kv_formats(open, some_tokens(64), options);
  ASSERT_EQ(in_passes.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(in_passes[i].format, rows[i].format);
    EXPECT_NEAR(in_passes[i].kl_sum, rows[i].kl_sum, 1e-12 + 1e-9 * rows[i].kl_sum);
    EXPECT_EQ(in_passes[i].top1_same, rows[i].top1_same);
    EXPECT_EQ(in_passes[i].greedy_same, rows[i].greedy_same);
  }
  options.scored_positions = 20;  // the last 20 positions: 19 have a next token to score
  const auto last_only = engine::compare_kv_formats(open, some_tokens(64), options);
  for (const auto& r : last_only) EXPECT_EQ(r.positions, 19);
  EXPECT_EQ(last_only[3].greedy_same, rows[3].greedy_same);  // the same context before the greedy run
  ASSERT_EQ(rows.size(), 4u);
  for (const auto& r : rows) {
    EXPECT_EQ(r.positions, 63);
    EXPECT_EQ(r.greedy_tokens, 8);
  }
  EXPECT_EQ(rows[0].format, Format::f32);
  EXPECT_EQ(rows[1].kl_sum, 0.0);
  EXPECT_EQ(rows[1].top1_same, 63);
  EXPECT_EQ(rows[1].greedy_same, 8);
  EXPECT_EQ(rows[1].nll_sum, rows[0].nll_sum);
  EXPECT_GT(rows[2].mean_kl(), 0.0);
  EXPECT_GT(rows[3].mean_kl(), rows[2].mean_kl());  // 4 bits move it more than 16
  EXPECT_LT(rows[3].mean_kl(), 0.1);
}

TEST(KvQuality, KlDivergenceOfKnownDistributions) {
  const std::vector<float> p = {0.0f, 0.0f}, q = {std::log(3.0f), 0.0f};  // (1/2, 1/2) and (3/4, 1/4)
  EXPECT_NEAR(engine::kl_divergence(p, q), 0.5 * std::log(0.5 / 0.75) + 0.5 * std::log(0.5 / 0.25), 1e-7);
  EXPECT_EQ(engine::kl_divergence(q, q), 0.0);
}

INSTANTIATE_TEST_SUITE_P(EveryFormat, CpuSessionKv, ::testing::ValuesIn(kv::all_formats()),
                         [](const auto& info) { return test_name(info.param); });

}  // namespace
}  // namespace lode::test
