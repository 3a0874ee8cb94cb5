#include <gtest/gtest.h>

#include <random>

#include "core/error.h"
#include "sample/stop.h"

using namespace lode;
using namespace lode::sample;

namespace {

struct Outcome {
  std::string shown;
  bool stopped = false;
  std::string matched;
  bool operator==(const Outcome&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Outcome& o) {
  return os << "{shown '" << o.shown << "', stopped " << o.stopped << ", matched '" << o.matched
            << "'}";
}

Outcome stream(const std::vector<std::string>& stops, const std::vector<std::string>& pieces) {
  StopMatcher matcher(stops);
  Outcome outcome;
  for (const std::string& piece : pieces) {
    auto result = matcher.push(piece);
    outcome.shown += result.emit;
    if (result.stopped) {
      outcome.stopped = true;
      outcome.matched = result.matched;
      EXPECT_EQ(matcher.flush(), "");
      return outcome;
    }
  }
  outcome.shown += matcher.flush();
  return outcome;
}

// The specification on the whole text: the stop ending first wins, then the one starting first.
Outcome reference(const std::vector<std::string>& stops, const std::string& text) {
  size_t best_end = std::string::npos, best_start = 0;
  std::string matched;
  for (const std::string& stop : stops)
    for (size_t start = 0; start + stop.size() <= text.size(); ++start)
      if (text.compare(start, stop.size(), stop) == 0) {
        const size_t end = start + stop.size();
        if (end < best_end || (end == best_end && start < best_start)) {
          best_end = end;
          best_start = start;
          matched = stop;
        }
      }
  if (best_end == std::string::npos) return {text, false, ""};
  return {text.substr(0, best_start), true, matched};
}

// One push, every split in two, and byte by byte all agree with the reference.
void expect_split_invariant(const std::vector<std::string>& stops, const std::string& text) {
  const Outcome want = reference(stops, text);
  EXPECT_EQ(stream(stops, {text}), want) << "one push of '" << text << "'";
  for (size_t cut = 0; cut <= text.size(); ++cut)
    EXPECT_EQ(stream(stops, {text.substr(0, cut), text.substr(cut)}), want)
        << "'" << text << "' split at " << cut;
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  EXPECT_EQ(stream(stops, bytes), want) << "'" << text << "' byte by byte";
}

}  // namespace

TEST(StopMatcher, StopsBeforeTheStopString) {
  EXPECT_EQ(stream({"</s>"}, {"Hello</s>world"}), (Outcome{"Hello", true, "</s>"}));
  expect_split_invariant({"</s>"}, "Hello</s>world");
  expect_split_invariant({"</s>", "\n\nUser:"}, "a < b </ s> <\n\nUser: hi </s>");
}

TEST(StopMatcher, HoldsBackOnlyWhatCouldBecomeAStop) {
  StopMatcher matcher({"</s>"});
  EXPECT_EQ(matcher.push("Hel<").emit, "Hel");
  EXPECT_EQ(matcher.push("/").emit, "");
  auto result = matcher.push("x>");
  EXPECT_EQ(result.emit, "</x>");
  EXPECT_FALSE(result.stopped);
  StopMatcher none({});
  EXPECT_EQ(none.push("anything <").emit, "anything <");
  EXPECT_EQ(none.flush(), "");
}

// Opaque text (an added token's: </think>) is never matched into, nor run across: "think" inside
// </think> does not stop (it cut the reasoning and left "</" in it), "a</" held back before it goes
// out first, and a stop after it still stops.
TEST(StopMatcher, OpaqueTextIsNeverMatched) {
  StopMatcher matcher({"think", "</think>x", "done"});
  EXPECT_EQ(matcher.push("I </").emit, "I ");
  auto r = matcher.push_opaque("</think>");
  EXPECT_EQ(r.emit, "</</think>");
  EXPECT_FALSE(r.stopped);
  r = matcher.push("x and done.");
  EXPECT_EQ(r.emit, "x and ");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.matched, "done");
}

TEST(StopMatcher, OverlappingStops) {
  EXPECT_EQ(stream({"ab", "b"}, {"xab"}), (Outcome{"x", true, "ab"}));
  EXPECT_EQ(stream({"b", "ab"}, {"x", "a", "b"}), (Outcome{"x", true, "ab"}));
  EXPECT_EQ(stream({"ab", "b"}, {"xbab"}), (Outcome{"x", true, "b"}));
  // The stop that completes first wins, even if a longer one started earlier.
  EXPECT_EQ(stream({"abc", "b"}, {"zabc"}), (Outcome{"za", true, "b"}));
  for (const char* text : {"xab", "xbab", "aab", "abab", "zabc", "aaab"}) {
    expect_split_invariant({"ab", "b"}, text);
    expect_split_invariant({"abc", "b", "aa"}, text);
  }
}

TEST(StopMatcher, StopSpanningManyPushes) {
  const std::vector<std::string> pieces{"The answer is 42", "<", "|", "im", "_", "end", "|", ">",
                                        "trailing"};
  EXPECT_EQ(stream({"<|im_end|>"}, pieces), (Outcome{"The answer is 42", true, "<|im_end|>"}));
  // A near miss is released in full once it cannot be a stop any more.
  EXPECT_EQ(stream({"<|im_end|>"}, {"a<|im", "_en", "x|>"}), (Outcome{"a<|im_enx|>", false, ""}));
}

TEST(StopMatcher, WithoutAStopEverythingComesOutAfterFlush) {
  StopMatcher matcher({"<|im_end|>"});
  std::string shown;
  for (const char* piece : {"abc<", "|im", "_en"}) {
    auto result = matcher.push(piece);
    EXPECT_FALSE(result.stopped);
    shown += result.emit;
  }
  EXPECT_EQ(shown, "abc");
  EXPECT_EQ(matcher.flush(), "<|im_en");
  EXPECT_EQ(matcher.flush(), "");
}

TEST(StopMatcher, NothingAfterAStop) {
  StopMatcher matcher({"END"});
  auto first = matcher.push("doneEND and more");
  EXPECT_TRUE(first.stopped);
  EXPECT_EQ(first.emit, "done");
  auto later = matcher.push("more text");
  EXPECT_TRUE(later.stopped);
  EXPECT_EQ(later.emit, "");
  EXPECT_EQ(later.matched, "END");
  EXPECT_EQ(matcher.flush(), "");
}

TEST(StopMatcher, MultibyteUtf8Stops) {
  const std::vector<std::string> stops{"\u3002", "\u7d42\u308f\u308a"};  // "。", "終わり"
  EXPECT_EQ(stream(stops, {"\u3053\u3093\u306b\u3061\u306f\u3002\u6b21"}),
            (Outcome{"\u3053\u3093\u306b\u3061\u306f", true, "\u3002"}));
  expect_split_invariant(stops, "\u3053\u3093\u306b\u3061\u306f\u3002\u6b21");
  // "、" shares its first two bytes with "。": held back, then released whole.
  expect_split_invariant(stops, "\u3001\u7d42\u308f\u3002");
  EXPECT_EQ(reference(stops, "\u3001\u7d42\u308f\u3002").shown, "\u3001\u7d42\u308f");
  expect_split_invariant(stops, "\u00e9t\u00e9 \u7d42\u308f\u308a!");
}

TEST(StopMatcher, RandomTextsAgreeWithTheSpecification) {
  std::mt19937 gen(3);
  const std::vector<std::vector<std::string>> stop_sets{
      {"ab"}, {"ab", "b"}, {"aba", "bab"}, {"abc", "ca", "bb"}, {"aaaa", "aab"}};
  for (const auto& stops : stop_sets)
    for (int trial = 0; trial < 40; ++trial) {
      std::string text;
      const int length = int(gen() % 12);
      for (int i = 0; i < length; ++i) text += char('a' + gen() % 3);
      expect_split_invariant(stops, text);
    }
}

TEST(StopMatcher, EmptyStopStringIsRejected) {
  EXPECT_THROW(StopMatcher({"ok", ""}), Error);
}
