// Replies constrained to one JSON object (`response_format` json_object): the byte-level prefix
// check (sample/json_prefix.h), the masking in engine::Generation, and the chat route on lode-mini.
#include <nlohmann/json.hpp>

#include <string>

#include "engine/generation.h"
#include "sample/json_prefix.h"
#include "sample/json_tokens.h"
#include "test_server_support.h"

namespace lode::test {
namespace {

// Where a text stops being the beginning of a JSON object: the index of the refused byte, or -1.
int refused_at(std::string_view text) {
  sample::JsonPrefix p;
  for (size_t i = 0; i < text.size(); ++i)
    if (!p.push(text[i])) return int(i);
  return -1;
}

TEST(JsonPrefix, TakesEveryBeginningOfAnObjectAndNothingElse) {
  const std::string valid[] = {
      R"({})", R"(  {"a": 1})", R"({"a":[1,-2.5e+3,0,0.25E-1,true,false,null,"x\"\\\/\b\f\n\r\t\u00e9"],"b":{"c":{}}})",
      "{\"caf\xc3\xa9\": [[], {}, [[1]]]}", R"({"a" : [ 1 , 2 ] , "b" : "" })"};
  for (const std::string& text : valid) {
    sample::JsonPrefix p;
    for (size_t i = 0; i < text.size(); ++i) {
      EXPECT_FALSE(p.complete()) << text << " at " << i;
      ASSERT_TRUE(p.push(text[i])) << text << " refused at " << i;
    }
    EXPECT_TRUE(p.complete()) << text;
    EXPECT_EQ(nlohmann::json::parse(text).is_object(), true);  // (the cases are JSON indeed)
    EXPECT_FALSE(p.push(' '));  // nothing after the object
  }
  const std::pair<std::string, int> invalid[] = {
      {"[1]", 0}, {"\"a\"", 0}, {"x", 0}, {"{,}", 1}, {"{\"a\" 1}", 5}, {"{\"a\":1,}", 7}, {"{\"a\":01}", 6},
      {"{\"a\":-}", 6}, {"{\"a\":1.}", 7}, {"{\"a\":1e}", 7}, {"{\"a\":tru}", 8}, {"{\"a\":nul1}", 8},
      {"{\"a\":\"\\x\"}", 7}, {"{\"a\":\"\\u12g4\"}", 10}, {"{\"a\":\"\n\"}", 6}, {"{\"a\":[1,]}", 8},
      {"{\"a\":]}", 5}, {"{\"a\":1]}", 6}, {"{\"a\":[}", 6}, {"{1:2}", 1}, {"{\"a\":1}}", 7}, {"{\"a\":+1}", 5},
      {"{\"a\":.5}", 5}};
  for (const auto& [text, at] : invalid) EXPECT_EQ(refused_at(text), at) << text;
  // A refused byte leaves the state as it was.
  sample::JsonPrefix p;
  ASSERT_TRUE(p.push(std::string_view("{\"a\":12")));
  EXPECT_FALSE(p.push('x'));
  EXPECT_TRUE(p.push(std::string_view("3}")));
  EXPECT_TRUE(p.complete());
}

// Whitespace runs outside strings stop at kMaxWhitespaceRun bytes, wherever they begin (the byte
// that ends a number counts once), and never inside strings.
TEST(JsonPrefix, BoundsWhitespaceRunsOutsideStrings) {
  for (const char* prefix : {"", "{", "{\"a\":", "{\"a\":1", "{\"a\":1.5", "{\"a\":true", "{\"a\":[1"}) {
    sample::JsonPrefix p;
    ASSERT_TRUE(p.push(std::string_view(prefix))) << prefix;
    for (int i = 0; i < sample::JsonPrefix::kMaxWhitespaceRun; ++i) ASSERT_TRUE(p.push(' ')) << prefix << " " << i;
    EXPECT_FALSE(p.push('\n')) << prefix;
  }
  sample::JsonPrefix p;
  ASSERT_TRUE(p.push(std::string_view("{\"a\":\"")));
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(p.push(' '));
}

TEST(JsonPrefix, RefusesNestingPastItsDepth) {
  sample::JsonPrefix p;
  ASSERT_TRUE(p.push('{'));
  ASSERT_TRUE(p.push(std::string_view("\"a\":")));
  for (int depth = 1; depth < sample::JsonPrefix::kMaxDepth; ++depth) ASSERT_TRUE(p.push('[')) << depth;
  EXPECT_FALSE(p.push('['));
  EXPECT_FALSE(p.push('{'));
  EXPECT_TRUE(p.push('1'));
}

// The mask's walk over the sorted vocabulary takes exactly the tokens that trying each one's bytes
// takes: lode-mini's vocabulary and a made-up one of shared prefixes, from states in and out of
// strings, numbers, literals and nesting.
TEST(JsonTokens, TakeWhatTryingEveryTokenTakes) {
  std::vector<std::string> made = {"{", "{\"", "{\"a", "{\"a\":", "{}", "}", "}}", "]", "],", "\"", "\",\"", "\\",
                                   "\\u", "\\u00", "1", "12", "1.", "1.5e", "-", " ", "  ", "\n", "\t{", "true",
                                   "tr", "null", "x", "", "a\"b", ", ", ",\"", "[", "[[", "\x01", "\xc3\xa9"};
  std::vector<std::string_view> made_views(made.begin(), made.end());
  std::vector<bool> made_excluded(made.size(), false);
  made_excluded[4] = true;  // "{}" taken as markup: never allowed
  const auto [mini_views, mini_excluded] = mini_token_bytes();
  const std::pair<const std::vector<std::string_view>*, const std::vector<bool>*> vocabularies[] = {
      {&made_views, &made_excluded}, {&mini_views, &mini_excluded}};
  const char* prefixes[] = {"", "  ", "{", "{\"ke", "{\"key\"", "{\"a\":", "{\"a\": [1, 2", "{\"a\":[", "{\"a\":\"x\\",
                            "{\"a\":\"\\u0", "{\"a\":tr", "{\"a\":-", "{\"a\":1.5", "{\"a\":{}", "{\"a\":[[]]"};
  for (const auto& [views, excluded] : vocabularies) {
    const sample::JsonTokens tokens(*views, *excluded);
    std::vector<uint8_t> allowed;
    for (const char* prefix : prefixes) {
      sample::JsonPrefix state;
      ASSERT_TRUE(state.push(std::string_view(prefix))) << prefix;
      tokens.mark(state, allowed);
      ASSERT_EQ(allowed.size(), views->size());
      for (size_t id = 0; id < views->size(); ++id) {
        sample::JsonPrefix tried = state;
        const bool takes = !(*excluded)[id] && !(*views)[id].empty() && tried.push((*views)[id]);
        EXPECT_EQ(bool(allowed[id]), takes) << "after " << prefix << ", token " << id << " \"" << (*views)[id] << "\"";
      }
    }
  }
}

// Rows of logits that rank `preferred` first, then `second`: a JSON reply must take the second
// where the first would break the object.
std::vector<float> ranking(int32_t preferred, int32_t second, int64_t vocab) {
  std::vector<float> row(size_t(vocab), 0.0f);
  row[size_t(preferred)] = 20.0f;
  row[size_t(second)] = 10.0f;
  return row;
}

TEST(JsonOutput, MasksTokensThatWouldBreakTheObject) {
  const tokenizer::Tokenizer& tok = mini_model()->tokenizer;
  const int64_t vocab = mini_model()->config.vocab;
  const auto id = [&](const std::string& text) {
    const auto found = tok.find_token(text);
    EXPECT_TRUE(found) << text;
    return found.value_or(0);
  };
  engine::GenerateOptions o;
  o.sampling.temperature = 0;
  o.max_tokens = 20;
  o.json = engine::JsonOutput{};
  sample::Sampler sampler(o.sampling, vocab);
  std::string text;
  engine::Generation g(tok, sampler, o, [&](std::string_view t) { text += t; }, 1);
  EXPECT_FALSE(g.greedy_only());  // a constrained row needs every logit
  const int32_t end = tok.end_of_generation().at(0);
  // The model prefers words, then an end, before and inside the object; the mask takes '{', ...
  EXPECT_EQ(g.step(ranking(id("the"), id("{"), vocab)), id("{"));
  EXPECT_EQ(g.step(ranking(end, id("\""), vocab)), id("\""));  // no end while the object is open
  EXPECT_EQ(g.step(ranking(id("a"), end, vocab)), id("a"));    // words are fine inside a string
  EXPECT_EQ(g.step(ranking(end, id("\""), vocab)), id("\""));
  EXPECT_EQ(g.step(ranking(id("the"), id(":"), vocab)), id(":"));
  EXPECT_EQ(g.step(ranking(id("}"), id("1"), vocab)), id("1"));  // a value must come first
  EXPECT_EQ(g.step(ranking(id("the"), id("}"), vocab)), id("}"));
  // Closed: only an end-of-generation token may follow, whatever the model prefers.
  EXPECT_FALSE(g.step(ranking(id("the"), id("1"), vocab)));
  EXPECT_EQ(g.result().finish, engine::FinishReason::end_of_generation);
  EXPECT_EQ(text, "{\"a\":1}");
}

TEST(JsonOutput, BeginsAfterThinking) {
  const tokenizer::Tokenizer& tok = mini_model()->tokenizer;
  const int64_t vocab = mini_model()->config.vocab;
  const int32_t end_of_thinking = tok.find_token("</think>").value();
  const int32_t word = tok.find_token("the").value(), brace = tok.find_token("{").value();
  engine::GenerateOptions o;
  o.sampling.temperature = 0;
  o.json = engine::JsonOutput{.after = end_of_thinking};
  sample::Sampler sampler(o.sampling, vocab);
  engine::Generation g(tok, sampler, o, [](std::string_view) {}, 1);
  EXPECT_TRUE(g.greedy_only());  // free while thinking
  EXPECT_EQ(g.step(ranking(word, brace, vocab)), word);
  EXPECT_EQ(g.step(ranking(end_of_thinking, brace, vocab)), end_of_thinking);
  EXPECT_FALSE(g.greedy_only());
  EXPECT_EQ(g.step(ranking(word, brace, vocab)), brace);
}

// lode-mini was not trained on JSON: left alone it writes whitespace and strings of spaces (the
// runs outside strings are bounded, so its greedy reply at least opens an object). Biased towards
// '}' and away from every token with a quote (which would open a key, inside which '}' is text),
// it closes the object, after which only an end may come: a whole reply.
TEST(JsonOutput, ChatRouteGivesAnObject) {
  TestServer s;
  const tokenizer::Tokenizer& tok = mini_model()->tokenizer;
  json bias = {{std::to_string(tok.find_token("}").value()), 100}};
  for (int32_t id = 0; id < int32_t(tok.size()); ++id)
    if (tok.token_bytes(id).find('"') != std::string::npos) bias[std::to_string(id)] = -100;
  json body = {{"messages", {{{"role", "user"}, {"content", "List three files in /etc as JSON."}}}},
               {"max_tokens", 60}, {"temperature", 0}, {"reasoning_effort", "none"},
               {"response_format", {{"type", "json_object"}}}};
  const json free = s.post_json("/v1/chat/completions", body);
  const std::string opened = free["choices"][0]["message"]["content"];
  EXPECT_NE(opened.find('{'), std::string::npos) << opened;
  EXPECT_LE(opened.find('{'), size_t(sample::JsonPrefix::kMaxWhitespaceRun)) << opened;
  body["logit_bias"] = bias;
  const json closed = s.post_json("/v1/chat/completions", body);
  const json& choice = closed["choices"][0];
  ASSERT_EQ(choice["finish_reason"], "stop") << closed;
  EXPECT_EQ(json::parse(choice["message"]["content"].get<std::string>()), json::object()) << choice;
  // The completions route takes response_format too.
  json completion = {{"prompt", "Files:"}, {"max_tokens", 60}, {"temperature", 0}, {"logit_bias", bias},
                     {"response_format", {{"type", "json_object"}}}};
  const json completed = s.post_json("/v1/completions", completion);
  ASSERT_EQ(completed["choices"][0]["finish_reason"], "stop") << completed;
  EXPECT_EQ(json::parse(completed["choices"][0]["text"].get<std::string>()), json::object()) << completed;
  // With a forced tool call: refused, as the reply cannot be both.
  json both = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
               {"response_format", {{"type", "json_object"}}},
               {"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}, {"tool_choice", "required"}};
  EXPECT_EQ(s.post_json("/v1/chat/completions", both, 400)["error"]["param"], "response_format");
}

}  // namespace
}  // namespace lode::test
