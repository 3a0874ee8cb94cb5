// What the MTP tests of both engines share (tests/test_mtp.cpp, tests/test_cuda_mtp.cpp): a model
// file opened once (its weights and tokenizer), lode-mini, and the teacher-forced agreement of a
// sequence's drafter with the model on lode-mini's held-out text.
#pragma once
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/engine.h"
#include "engine/generate.h"
#include "gguf/reader.h"
#include "model/weights.h"
#include "sample/sampler.h"
#include "support/fixtures.h"
#include "support/loaded_weights.h"
#include "support/paths.h"
#include "support/run_lode.h"
#include "tokenizer/tokenizer.h"

namespace lode::test {

// Its weights and its tokenizer.
struct LoadedFile : LoadedWeights {
  explicit LoadedFile(const std::filesystem::path& path)
      : LoadedWeights(path), text(tokenizer::Tokenizer::from_metadata(reader.metadata())) {}
  tokenizer::Tokenizer text;
};

inline const LoadedFile& mini() {
  static const LoadedFile loaded(repo_root() / "models/lode-mini.gguf");
  return loaded;
}

struct Generated {
  std::vector<int32_t> tokens;
  std::string text;
  engine::GenerateResult result;
};

// engine::generate on `sequence` (empty) of m's model: `max_tokens` after the prompt, not stopping
// at the end of generation, with up to mtp drafts a step.
inline Generated generate_on(engine::Sequence& sequence, const LoadedFile& m, const std::string& prompt, int64_t mtp,
                             float temperature, uint64_t seed, int64_t max_tokens, float mtp_min_p = 0.0f) {
  engine::GenerateOptions g;
  g.max_tokens = max_tokens;
  g.sampling.temperature = temperature;
  g.sampling.seed = seed;
  g.stop_at_end_of_generation = false;
  g.mtp = mtp;
  g.mtp_min_p = mtp_min_p;
  sample::Sampler sampler(g.sampling, m.config.vocab);
  Generated r;
  r.result = engine::generate(sequence, m.text, sampler, m.text.encode(prompt, false), g,
                              [&](std::string_view piece) { r.text += piece; });
  r.tokens = r.result.tokens;
  return r;
}

// Teacher-forced on lode-mini's held-out sample (up to 600 tokens through `sequence`, an empty
// sequence of lode-mini on either engine): the drafter's draft for position p+1 (from the model's
// state at p-1 and the token at p) against the model's own greedy token after p. The share that agree.
inline double held_out_agreement(engine::Sequence& sequence) {
  const LoadedFile& m = mini();
  const std::string text = slurp(repo_root() / "tests/data/mini/heldout_sample.txt").substr(0, 4000);
  std::vector<int32_t> tokens = m.text.encode(text, false);
  tokens.resize(std::min<size_t>(tokens.size(), 600));
  engine::StepRow row{.sequence = &sequence, .tokens = tokens, .logit_rows = int64_t(tokens.size()),
                      .want_hidden = true};
  sequence.model().step(std::span(&row, 1));
  engine::Drafter& drafter = sequence.drafter();
  const int64_t vocab = m.config.vocab, hidden = m.config.hidden;
  int64_t agree = 0, n = 0;
  for (size_t p = 0; p + 1 < tokens.size(); ++p) {
    if (p > 0) {
      const std::vector<int32_t> draft = drafter.draft(tokens[p], 1, 0.0f);
      EXPECT_EQ(draft.size(), 1u);
      if (draft.size() != 1) return 0;
      agree += draft[0] == sample::detail::argmax(std::span(row.logits).subspan(p * size_t(vocab), size_t(vocab)));
      ++n;
    }
    drafter.advance(std::span(&tokens[p], 1), std::span(row.hidden).subspan(p * size_t(hidden), size_t(hidden)));
  }
  const double share = double(agree) / double(n);
  std::printf("MTP drafts (%s) agreeing with the model's greedy next token: %.1f%% of %lld positions\n",
              drafter.describe().c_str(), 100 * share, static_cast<long long>(n));
  return share;
}

// The drafts of five drafters made together (together[i] drafters[i]'s, for pending[i], up to n[i]
// above min_p[i]) against each one's own draft of the same (none where n[i] is 0); the first wants
// four, the third none, and the fifth has followed nothing (the callers' setup).
template <class D>
void expect_drafts_as_alone(const std::vector<std::vector<int32_t>>& together, const std::vector<D*>& drafters,
                            const std::vector<int32_t>& pending, const std::vector<int64_t>& n,
                            const std::vector<float>& min_p) {
  ASSERT_EQ(together.size(), 5u);
  for (size_t i = 0; i < 5; ++i) {
    const std::vector<int32_t> alone = n[i] > 0 ? drafters[i]->draft(pending[i], n[i], min_p[i]) : std::vector<int32_t>{};
    EXPECT_EQ(together[i], alone) << "drafter " << i;
  }
  EXPECT_EQ(together[0].size(), 4u);
  EXPECT_TRUE(together[2].empty());
  EXPECT_TRUE(together[4].empty());
}

}  // namespace lode::test
