// The tokenizer's parts on small hand-made vocabularies: UTF-8 rules, the byte-level alphabet,
// BPE merge order, pre-splitting (qwen2 vs qwen35), added tokens, invalid bytes, streaming decode.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/pre_split.h"
#include "tokenizer/tokenizer.h"
#include "core/utf8.h"

namespace {

using lode::tokenizer::Tokenizer;

// 256 byte tokens, then one token per merge (in order), then added tokens (control or user-defined).
struct TinyVocab {
  std::vector<std::string> merges;  // in the byte-level alphabet, "left right"
  std::vector<std::pair<std::string, int32_t>> added;
  std::string pre = "qwen35";

  Tokenizer build() const {
    const auto& sym = lode::tokenizer::byte_symbols();
    std::vector<std::string> tokens(sym.begin(), sym.end());
    std::vector<int32_t> types(256, 1);
    for (const auto& m : merges) {
      const size_t space = m.find(' ');
      tokens.push_back(m.substr(0, space) + m.substr(space + 1));
      types.push_back(1);
    }
    for (const auto& [text, type] : added) tokens.push_back(text), types.push_back(type);
    lode::gguf::Metadata md;
    md.set("tokenizer.ggml.model", "gpt2");
    md.set("tokenizer.ggml.pre", pre);
    md.set("tokenizer.ggml.tokens", lode::gguf::Array(tokens));
    md.set("tokenizer.ggml.token_type", lode::gguf::Array(types));
    md.set("tokenizer.ggml.merges", lode::gguf::Array(merges));
    return Tokenizer::from_metadata(md);
  }
};

std::vector<std::string> pieces(std::string_view pre, std::string_view text) {
  lode::tokenizer::PreSplitter splitter(lode::tokenizer::pre_tokenizer_spec(pre).pattern);
  std::vector<std::string_view> views;
  splitter.split(text, views);
  return {views.begin(), views.end()};
}

TEST(Utf8, ValidSequencesFollowTheMaximalSubpartRules) {
  using lode::utf8::valid_sequence_length;
  EXPECT_EQ(valid_sequence_length("a", 0), 1u);
  EXPECT_EQ(valid_sequence_length("\xc3\xa9", 0), 2u);
  EXPECT_EQ(valid_sequence_length("\xe2\x82\xac", 0), 3u);
  EXPECT_EQ(valid_sequence_length("\xf0\x9f\x98\x80", 0), 4u);
  EXPECT_EQ(valid_sequence_length("\xc0\xaf", 0), 0u);      // overlong
  EXPECT_EQ(valid_sequence_length("\xed\xa0\x80", 0), 0u);  // surrogate
  EXPECT_EQ(valid_sequence_length("\xe2\x82" "a", 0), 0u);  // truncated
  EXPECT_EQ(valid_sequence_length("\x80", 0), 0u);          // stray continuation
  EXPECT_EQ(valid_sequence_length("\xf4\x90\x80\x80", 0), 0u);  // above U+10FFFF
}

TEST(Utf8, IncompleteTailIsOnlyAPrefixOfAValidCharacter) {
  using lode::utf8::incomplete_tail_length;
  EXPECT_EQ(incomplete_tail_length("ab"), 0u);
  EXPECT_EQ(incomplete_tail_length("a\xf0\x9f"), 2u);
  EXPECT_EQ(incomplete_tail_length("a\xf0\x9f\x98"), 3u);
  EXPECT_EQ(incomplete_tail_length("a\xf0\x9f\x98\x80"), 0u);
  EXPECT_EQ(incomplete_tail_length("a\xed\xa0"), 0u);  // can never complete
  EXPECT_EQ(incomplete_tail_length("\xff"), 0u);
}

TEST(ByteLevel, AlphabetIsABijectionOnBytes) {
  std::string all;
  for (int b = 0; b < 256; ++b) all += char(b);
  std::string spelled;
  for (unsigned char b : all) spelled += lode::tokenizer::byte_symbols()[b];
  EXPECT_EQ(lode::tokenizer::byte_symbols()[' '], "\xc4\xa0");  // Ġ
  EXPECT_EQ(lode::tokenizer::byte_symbols()['\n'], "\xc4\x8a");  // Ċ
  EXPECT_EQ(lode::tokenizer::bytes_of_symbols(spelled), all);
  EXPECT_FALSE(lode::tokenizer::bytes_of_symbols("\xe4\xb8\xad").has_value());  // 中 is no symbol
}

TEST(PreSplit, Qwen35JoinsCombiningMarksToLettersAndQwen2DoesNot) {
  // Devanagari: the vowel sign U+093F is a combining mark (Mc).
  const std::string hindi = "\xe0\xa4\xb9\xe0\xa4\xbf\xe0\xa4\xa8\xe0\xa5\x8d\xe0\xa4\xa6\xe0\xa5\x80";  // हिन्दी
  EXPECT_EQ(pieces("qwen35", hindi).size(), 1u);
  EXPECT_GT(pieces("qwen2", hindi).size(), 1u);
  EXPECT_EQ(pieces("qwen35", "Hello world's  123\n\n x"),
            (std::vector<std::string>{"Hello", " world", "'s", " ", " ", "1", "2", "3", "\n\n", " x"}));
}

// A run of whitespace longer than PCRE2's default match limit allows (ten million steps: the
// pattern's `\s*[\r\n]+` takes the run, then gives it back) is split like a short one, not refused.
TEST(PreSplit, AVeryLongRunOfSpacesIsSplitLikeAShortOne) {
  const std::string run(11'000'000, ' ');
  const auto split = pieces("qwen35", run + "x");
  ASSERT_EQ(split.size(), 2u);
  EXPECT_EQ(split[0].size(), run.size() - 1);
  EXPECT_EQ(split[1], " x");
}

TEST(PreSplit, Qwen2ContractionsIgnoreCase) {
  EXPECT_EQ(pieces("qwen2", "IT'S"), (std::vector<std::string>{"IT", "'S"}));
  EXPECT_EQ(pieces("qwen35", "IT'LL"), (std::vector<std::string>{"IT", "'LL"}));
}

TEST(PreSplit, UnknownFamilyIsRefusedNamingTheKnownOnes) {
  try {
    lode::tokenizer::pre_tokenizer_spec("deepseek-llm");
    FAIL();
  } catch (const lode::Error& e) {
    EXPECT_NE(std::string(e.what()).find("qwen35"), std::string::npos) << e.what();
  }
}

TEST(Bpe, MergesByRankLeftmostFirst) {
  // "aaa": the single merge a+a applies at the leftmost pair, leaving [aa, a].
  TinyVocab v{{"a a", "b c", "a bc"}, {}};
  const Tokenizer t = v.build();
  EXPECT_EQ(t.encode("aaa", false), (std::vector<int32_t>{256, 'a'}));
  // "abc": b+c (rank 1) then a+bc (rank 2); a+b is not a merge.
  EXPECT_EQ(t.encode("abc", false), (std::vector<int32_t>{258}));
  EXPECT_EQ(t.encode("aaaa", false), (std::vector<int32_t>{256, 256}));
}

TEST(Bpe, LowerRankWinsOverPosition) {
  // "abc" with merges [b c, a b]: b+c has the better rank although a+b is further left.
  TinyVocab v{{"b c", "a b"}, {}};
  const Tokenizer t = v.build();
  EXPECT_EQ(t.encode("abc", false), (std::vector<int32_t>{'a', 256}));
}

TEST(Tokenizer, ControlTokensOnlyWhenAllowedUserDefinedAlways) {
  TinyVocab v{{}, {{"<|im_start|>", 3}, {"<think>", 4}}};
  const Tokenizer t = v.build();
  const int32_t im_start = 256, think = 257;
  const auto with = t.encode("<|im_start|>x<think>", true);
  EXPECT_EQ(with, (std::vector<int32_t>{im_start, 'x', think}));
  const auto without = t.encode("<|im_start|>x<think>", false);
  ASSERT_GT(without.size(), 3u);
  EXPECT_EQ(without.back(), think);
  EXPECT_EQ(t.decode(without), "<|im_start|>x<think>");
  EXPECT_EQ(t.decode(with, /*render_special=*/false), "x<think>");
}

// encode(text, plain): control tokens are read outside the plain spans only (a chat's client text);
// one that starts before a span and runs into it is not read either; user-defined tokens and the
// rest of the text are encoded as encode(text, true) encodes them.
TEST(Tokenizer, ControlTokensAreOrdinaryTextInsidePlainSpans) {
  TinyVocab v{{}, {{"<|im_start|>", 3}, {"<think>", 4}}};
  const Tokenizer t = v.build();
  const int32_t im_start = 256, think = 257;
  const std::string text = "<|im_start|>a<|im_start|>b<think><|im_start|>";
  // (<|im_start|> at bytes 0, 13 and 33; "a" at 12, "b" at 25, <think> at 26)
  EXPECT_EQ(t.encode(text, std::vector<lode::TextSpan>{}), t.encode(text, true));
  const auto marked = t.encode(text, std::vector<lode::TextSpan>{{12, 33}});
  EXPECT_EQ(std::count(marked.begin(), marked.end(), im_start), 2);  // the first and the last
  EXPECT_EQ(marked.front(), im_start);
  EXPECT_EQ(marked.back(), im_start);
  EXPECT_EQ(std::count(marked.begin(), marked.end(), think), 1);
  EXPECT_EQ(t.decode(marked), text);
  const auto straddled = t.encode(text, std::vector<lode::TextSpan>{{10, 11}});  // inside the first one
  EXPECT_NE(straddled.front(), im_start);
  EXPECT_EQ(t.decode(straddled), text);
}

TEST(Tokenizer, LongestAddedTokenWins) {
  TinyVocab v{{}, {{"<a>", 4}, {"<a><b>", 4}}};
  const Tokenizer t = v.build();
  EXPECT_EQ(t.encode("<a><b><a>", false), (std::vector<int32_t>{257, 256}));
}

TEST(Tokenizer, InvalidUtf8BytesBecomeByteTokensAndRoundTrip) {
  const Tokenizer t = TinyVocab{}.build();
  const std::string text = "ok\xff\xe2\x82" "a\xed\xa0\x80z";
  const auto ids = t.encode(text, false);
  EXPECT_EQ(t.decode(ids), text);
  EXPECT_EQ(ids[2], 0xff);  // byte token ids equal the byte in this vocabulary
}

TEST(Tokenizer, NfcComposesBeforeSplitting) {
  const Tokenizer t = TinyVocab{}.build();
  // e + COMBINING ACUTE becomes é (U+00E9, 2 bytes) before byte-level encoding.
  EXPECT_EQ(t.decode(t.encode("e\xcc\x81", false)), "\xc3\xa9");
  TinyVocab gpt2{};
  gpt2.pre = "gpt2";  // no normaliser in that family
  const Tokenizer g = gpt2.build();
  EXPECT_EQ(g.decode(g.encode("e\xcc\x81", false)), "e\xcc\x81");
}

TEST(Tokenizer, RejectsOtherTokenizerModels) {
  lode::gguf::Metadata md;
  md.set("tokenizer.ggml.model", "llama");
  md.set("tokenizer.ggml.tokens", lode::gguf::Array(std::vector<std::string>{"a"}));
  EXPECT_THROW(Tokenizer::from_metadata(md), lode::Error);
  lode::gguf::Metadata none;
  try {
    Tokenizer::from_metadata(none);
    FAIL();
  } catch (const lode::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no tokenizer"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, MergeNamingAMissingTokenIsRefused) {
  const auto& sym = lode::tokenizer::byte_symbols();
  lode::gguf::Metadata md;
  md.set("tokenizer.ggml.tokens", lode::gguf::Array(std::vector<std::string>(sym.begin(), sym.end())));
  md.set("tokenizer.ggml.merges", lode::gguf::Array(std::vector<std::string>{"a b"}));
  EXPECT_THROW(Tokenizer::from_metadata(md), lode::Error);
}

TEST(TextStream, NeverEmitsHalfACharacter) {
  const Tokenizer t = TinyVocab{}.build();
  const std::string text = "h\xf0\x9f\x98\x80!\xe4\xb8\xad";  // h😀!中, one byte token each
  lode::tokenizer::TextStream stream(t);
  std::string out;
  for (int32_t id : t.encode(text, false)) {
    const std::string piece = stream.push(id);
    for (size_t i = 0; i < piece.size();) {  // every piece is whole characters
      const size_t len = lode::utf8::valid_sequence_length(piece, i);
      ASSERT_GT(len, 0u) << "split character in piece of " << out.size();
      i += len;
    }
    out += piece;
  }
  out += stream.flush();
  EXPECT_EQ(out, text);
}

TEST(TextStream, FlushReleasesAnUnfinishedCharacter) {
  const Tokenizer t = TinyVocab{}.build();
  lode::tokenizer::TextStream stream(t);
  EXPECT_EQ(stream.push(0xf0), "");
  EXPECT_EQ(stream.push(0x9f), "");
  EXPECT_EQ(stream.flush(), "\xf0\x9f");
}

}  // namespace
