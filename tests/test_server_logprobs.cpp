// Log-probabilities (OpenAI's `logprobs`): the log-softmax itself, which tokens a generation lists
// (not the end-of-generation token, not a stop string's), and both OpenAI routes, whole and
// streamed, against the engine's own logits for the same tokens.
#include <cmath>
#include <limits>
#include <random>

#include "chat/template.h"
#include "cpu/session.h"
#include "engine/generate.h"
#include "engine/generation.h"
#include "sample/logprobs.h"
#include "server/openai_response.h"
#include "test_server_support.h"

namespace lode::test {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(Logprobs, AreTheLogSoftmaxOfTheRow) {
  const std::vector<float> row = {1.5f, -2.0f, 3.25f, 3.25f, -kInf, 0.0f, 2.0f};
  double sum = 0;
  for (float l : row) sum += std::exp(double(l));
  const auto expected = [&](size_t i) { return float(double(row[i]) - std::log(sum)); };
  const sample::TokenLogprobs e = sample::token_logprobs(row, 1, 3);
  EXPECT_EQ(e.token, 1);
  EXPECT_NEAR(e.logprob, expected(1), 1e-6);
  ASSERT_EQ(e.top.size(), 3u);  // best first, the lower id first on ties; the sampled token need not be among them
  EXPECT_EQ(e.top[0].first, 2);
  EXPECT_EQ(e.top[1].first, 3);
  EXPECT_EQ(e.top[2].first, 6);
  for (const auto& [id, logprob] : e.top) EXPECT_NEAR(logprob, expected(size_t(id)), 1e-6) << id;
  EXPECT_EQ(sample::token_logprobs(row, 4, 0).logprob, -kInf);
  EXPECT_TRUE(sample::token_logprobs(row, 0, 0).top.empty());
  EXPECT_THROW(sample::token_logprobs(row, 7, 0), Error);
  EXPECT_THROW(sample::token_logprobs(row, 0, 21), Error);
  EXPECT_THROW(sample::token_logprobs(std::vector<float>{-kInf, -kInf}, 0, 0), Error);
}

// A long row (the vector path, eight at a time, and its tail): within float rounding of the
// log-softmax computed in double, with -inf entries and a far tail that underflows.
TEST(Logprobs, AreTheLogSoftmaxOfALongRow) {
  std::mt19937 gen(5);
  std::normal_distribution<float> normal(0.0f, 1.5f);  // (the mass spread over thousands of terms)
  std::vector<float> row(10007);
  for (float& l : row) l = normal(gen);
  row[3] = -kInf, row[100] = -200.0f, row[9000] = 9.0f;
  double sum = 0;
  for (float l : row) sum += std::exp(double(l) - 9.0);
  const double normaliser = 9.0 + std::log(sum);
  for (int32_t token : {0, 3, 100, 9000, 10006}) {
    const sample::TokenLogprobs e = sample::token_logprobs(row, token, 5);
    if (std::isinf(row[size_t(token)])) EXPECT_EQ(e.logprob, -kInf);
    else EXPECT_NEAR(e.logprob, double(row[size_t(token)]) - normaliser, 2e-5) << token;
    EXPECT_EQ(e.top.at(0).first, 9000);
    EXPECT_NEAR(e.top.at(0).second, 9.0 - normaliser, 2e-5);
  }
}

// A row of logits that makes `token` the greedy choice.
std::vector<float> choosing(int32_t token, int64_t vocab) {
  std::vector<float> row(size_t(vocab), 0.0f);
  row[size_t(token)] = 20.0f;
  return row;
}

struct Driven {
  std::string text;
  std::vector<size_t> shown_at_each_text;  // shown_logprobs() as the sink saw it
  engine::GenerateResult result;
};

// A generation driven by rows that choose `tokens` in turn, with logprobs on.
Driven drive(const std::vector<int32_t>& tokens, std::vector<std::string> stop = {}) {
  const tokenizer::Tokenizer& tok = mini_model()->tokenizer;
  const int64_t vocab = mini_model()->config.vocab;
  engine::GenerateOptions o;
  o.sampling.temperature = 0;
  o.max_tokens = 100;
  o.stop_strings = std::move(stop);
  o.logprobs = 2;
  sample::Sampler sampler(o.sampling, vocab);
  Driven d;
  engine::Generation* g = nullptr;
  engine::Generation generation(tok, sampler, o, [&](std::string_view t) {
    d.text += t;
    d.shown_at_each_text.push_back(g->shown_logprobs());
  }, 1);
  g = &generation;
  EXPECT_FALSE(generation.greedy_only());  // logprobs need every row's logits
  EXPECT_FALSE(generation.top_only());
  for (int32_t t : tokens)
    if (!generation.step(choosing(t, vocab))) break;
  if (!generation.done()) generation.stop(engine::FinishReason::length);
  d.result = generation.result();
  return d;
}

std::string token_text(int32_t id) { return mini_model()->tokenizer.decode(std::span(&id, 1), true); }

TEST(Logprobs, ListTheTokensTheTextShows) {
  const tokenizer::Tokenizer& tok = mini_model()->tokenizer;
  const std::vector<int32_t> words = tok.encode(" the manual page of ls", false);
  ASSERT_GE(words.size(), 4u);
  const int32_t end = tok.end_of_generation().at(0);
  {  // The end-of-generation token ends it unlisted; every other token listed, in order.
    std::vector<int32_t> tokens = words;
    tokens.push_back(end);
    const Driven d = drive(tokens);
    EXPECT_EQ(d.result.finish, engine::FinishReason::end_of_generation);
    ASSERT_EQ(d.result.logprobs.size(), words.size());
    std::string listed;
    for (size_t i = 0; i < words.size(); ++i) {
      EXPECT_EQ(d.result.logprobs[i].token, words[i]);
      EXPECT_EQ(d.result.logprobs[i].top.at(0).first, words[i]);
      EXPECT_LT(d.result.logprobs[i].logprob, 0.0f);
      listed += token_text(words[i]);
    }
    EXPECT_EQ(listed, d.text);
    // The sink saw each text with the entries of the tokens it shows.
    ASSERT_FALSE(d.shown_at_each_text.empty());
    EXPECT_TRUE(std::is_sorted(d.shown_at_each_text.begin(), d.shown_at_each_text.end()));
    EXPECT_EQ(d.shown_at_each_text.back(), words.size());
  }
  {  // A stop string's tokens are not shown, so not listed.
    const std::string stop = token_text(words[2]);
    const Driven d = drive(words, {stop});
    EXPECT_EQ(d.result.finish, engine::FinishReason::stop_string);
    EXPECT_EQ(d.text, token_text(words[0]) + token_text(words[1]));
    ASSERT_EQ(d.result.logprobs.size(), 2u);
    EXPECT_EQ(d.result.logprobs[1].token, words[1]);
  }
}

TEST(Logprobs, NeedTheWholeRow) {
  const int64_t vocab = mini_model()->config.vocab;
  engine::GenerateOptions o;
  o.sampling.temperature = 0;
  o.logprobs = 0;
  sample::Sampler sampler(o.sampling, vocab);
  engine::Generation g(mini_model()->tokenizer, sampler, o, [](std::string_view) {}, 1);
  EXPECT_THROW(g.step_chosen(5), Error);
}

// What the engine gives for a prompt with logprobs on, and the log-softmax of the model's logits at
// each of its tokens, computed apart: the whole text prefilled at once, the DeltaNet recurrence
// token by token (so each row is a decode step's up to the prompt's chunked prefill, ~1e-6).
struct Reference {
  engine::GenerateResult result;
  std::string text;
};

Reference reference(const std::vector<int32_t>& prompt, const engine::GenerateOptions& g) {
  const auto& m = *mini_model();
  cpu::Session session(m.reader, m.config, {.threads = 1, .max_context = 512});
  sample::Sampler sampler(g.sampling, session.vocab());
  Reference r;
  r.result = engine::generate(*cpu::borrow_sequence(session), m.tokenizer, sampler, prompt, g,
                              [&](std::string_view t) { r.text += t; });
  return r;
}

void expect_model_logprobs(const std::vector<int32_t>& prompt, const engine::GenerateResult& result) {
  const auto& m = *mini_model();
  cpu::Session session(m.reader, m.config, {.threads = 1, .max_context = 512, .deltanet_chunk = 0});
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), result.tokens.begin(), result.tokens.end());
  const std::vector<float> logits = session.prefill(all, int64_t(all.size()), /*all_logits=*/true);
  const size_t vocab = size_t(session.vocab());
  ASSERT_LE(result.logprobs.size(), result.tokens.size());
  for (size_t i = 0; i < result.logprobs.size(); ++i) {
    const std::span<const float> row(logits.data() + (prompt.size() - 1 + i) * vocab, vocab);
    double sum = 0;
    for (float l : row) sum += std::exp(double(l));
    const sample::TokenLogprobs& e = result.logprobs[i];
    EXPECT_EQ(e.token, result.tokens[i]);
    EXPECT_NEAR(e.logprob, double(row[size_t(e.token)]) - std::log(sum), 1e-4) << "token " << i;
    for (const auto& [id, logprob] : e.top) EXPECT_NEAR(logprob, double(row[size_t(id)]) - std::log(sum), 1e-4);
  }
}

TEST(Logprobs, AreTheModelsOwnAtEverySampledToken) {
  const std::vector<int32_t> prompt = mini_model()->tokenizer.encode("The ls command lists", true);
  engine::GenerateOptions g;
  g.max_tokens = 16;
  g.sampling = {.temperature = 1.2f, .top_k = 0, .top_p = 1.0f, .seed = 7};
  g.sampling.logit_bias = {{11, 3.0f}};  // reshapes what is sampled, never what is reported
  g.logprobs = 4;
  const Reference r = reference(prompt, g);
  ASSERT_EQ(r.result.logprobs.size(), r.result.tokens.size());  // (the limit ends it: every token shown)
  expect_model_logprobs(prompt, r.result);
}

// The entries of a chat reply's logprobs, checked against the reference's.
void expect_chat_entries(const json& content, const std::vector<sample::TokenLogprobs>& want, int top) {
  ASSERT_EQ(content.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const json& e = content[i];
    const std::string text = token_text(want[i].token);
    EXPECT_EQ(e["logprob"].get<float>(), want[i].logprob) << i;
    json bytes = json::array();
    for (unsigned char c : text) bytes.push_back(int(c));
    EXPECT_EQ(e["bytes"], bytes) << i;
    ASSERT_EQ(e["top_logprobs"].size(), size_t(top));
    for (int k = 0; k < top; ++k) EXPECT_EQ(e["top_logprobs"][k]["logprob"].get<float>(), want[i].top[size_t(k)].second);
  }
}

TEST(Logprobs, ChatRouteWholeAndStreamed) {
  TestServer s;
  json body = {{"messages", {{{"role", "user"}, {"content", "What does ls do?"}}}}, {"max_tokens", 20},
               {"temperature", 0.9}, {"seed", 3}, {"logprobs", true}, {"top_logprobs", 2}};
  std::vector<chat::Message> messages(1);
  messages[0].role = "user";
  messages[0].content = "What does ls do?";
  const std::vector<int32_t> prompt = mini_model()->tokenizer.encode(
      chat::render_qwen35(messages, nullptr, {.add_generation_prompt = true, .enable_thinking = true}), true);
  engine::GenerateOptions g;
  g.max_tokens = 20;
  g.sampling.temperature = 0.9f;
  g.sampling.seed = 3;
  g.logprobs = 2;
  const Reference r = reference(prompt, g);
  expect_model_logprobs(prompt, r.result);

  const json whole = s.post_json("/v1/chat/completions", body);
  const json& logprobs = whole["choices"][0]["logprobs"];
  EXPECT_TRUE(logprobs["refusal"].is_null());
  expect_chat_entries(logprobs["content"], r.result.logprobs, 2);
  std::string listed;
  for (const json& e : logprobs["content"])
    for (int b : e["bytes"]) listed += char(b);
  EXPECT_EQ(listed, r.text);  // every token of the reply, its thinking included

  body["stream"] = true;
  auto res = s.post("/v1/chat/completions", body.dump());
  ASSERT_TRUE(res);
  json streamed = json::array();
  for (const std::string& event : sse_payloads(res->body)) {
    if (event == "[DONE]") continue;
    const json chunk = json::parse(event);
    const json& lp = chunk["choices"][0]["logprobs"];
    if (!lp.is_null())
      for (const json& e : lp["content"]) streamed.push_back(e);
  }
  EXPECT_EQ(streamed, logprobs["content"]);

  // Not asked for: null, as before.
  body.erase("logprobs"), body.erase("top_logprobs"), body["stream"] = false;
  EXPECT_TRUE(s.post_json("/v1/chat/completions", body)["choices"][0]["logprobs"].is_null());
}

TEST(Logprobs, CompletionsRouteWholeAndStreamed) {
  TestServer s;
  const std::string prompt = "The ls command lists";
  const json body = {{"prompt", prompt}, {"max_tokens", 12}, {"temperature", 0}, {"logprobs", 3}};
  engine::GenerateOptions g;
  g.max_tokens = 12;
  g.sampling.temperature = 0;
  g.logprobs = 3;
  const Reference r = reference(mini_model()->tokenizer.encode(prompt, true), g);

  const json whole = s.post_json("/v1/completions", body);
  const json& lp = whole["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), r.result.logprobs.size());
  int64_t offset = 0;
  for (size_t i = 0; i < r.result.logprobs.size(); ++i) {
    const sample::TokenLogprobs& e = r.result.logprobs[i];
    EXPECT_EQ(lp["tokens"][i], token_text(e.token));
    EXPECT_EQ(lp["token_logprobs"][i].get<float>(), e.logprob);
    EXPECT_EQ(lp["text_offset"][i], offset);
    offset += int64_t(token_text(e.token).size());  // (this prompt's reply is ASCII)
    // Greedy: the sampled token is the first alternative, so 3 entries in all.
    EXPECT_EQ(lp["top_logprobs"][i].size(), 3u);
    EXPECT_EQ(lp["top_logprobs"][i][token_text(e.token)].get<float>(), e.logprob);
  }
  EXPECT_EQ(whole["choices"][0]["text"], r.text);

  json stream_body = body;
  stream_body["stream"] = true;
  auto res = s.post("/v1/completions", stream_body.dump());
  ASSERT_TRUE(res);
  json tokens = json::array(), offsets = json::array();
  for (const std::string& event : sse_payloads(res->body)) {
    if (event == "[DONE]") continue;
    const json chunk = json::parse(event);
    const json& chunk_lp = chunk["choices"][0]["logprobs"];
    if (chunk_lp.is_null()) continue;
    for (const json& t : chunk_lp["tokens"]) tokens.push_back(t);
    for (const json& o : chunk_lp["text_offset"]) offsets.push_back(o);
  }
  EXPECT_EQ(tokens, lp["tokens"]);
  EXPECT_EQ(offsets, lp["text_offset"]);
}

// The legacy form writes a token that holds part of a UTF-8 character as "bytes:\xNN...", as
// OpenAI's does, so two such alternatives stay two keys (as text both would be U+FFFD).
TEST(Logprobs, LegacyTokensOfPartCharactersAreTheirBytes) {
  const tokenizer::Tokenizer& tok = mini_model()->tokenizer;
  std::vector<int32_t> partial;
  for (int32_t id = 0; id < int32_t(tok.size()) && partial.size() < 2; ++id) {
    const std::string text = tok.decode(std::span(&id, 1), false);
    if (text.size() == 1 && static_cast<unsigned char>(text[0]) >= 0x80) partial.push_back(id);
  }
  ASSERT_EQ(partial.size(), 2u);
  const sample::TokenLogprobs entry{.token = partial[0], .logprob = -0.5f, .top = {{partial[1], -0.25f}, {partial[0], -0.5f}}};
  int64_t offset = 0;
  const json lp = server::completion_logprobs(std::span(&entry, 1), tok, offset);
  const std::string first = lp["tokens"][0];
  EXPECT_EQ(first.rfind("bytes:\\x", 0), 0u) << first;
  EXPECT_EQ(lp["top_logprobs"][0].size(), 2u) << lp;
  EXPECT_EQ(offset, 0);  // a piece of a character is no character
}

TEST(Logprobs, BadFieldsAreRefused) {
  TestServer s;
  const json chat = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 2}};
  const auto refused = [&](const std::string& path, json body, const std::string& param) {
    const json reply = s.post_json(path, body, 400);
    EXPECT_EQ(reply["error"]["param"], param) << reply;
  };
  json b = chat;
  b["top_logprobs"] = 2;
  refused("/v1/chat/completions", b, "top_logprobs");  // without logprobs: true
  b["logprobs"] = true, b["top_logprobs"] = 21;
  refused("/v1/chat/completions", b, "top_logprobs");
  refused("/v1/completions", {{"prompt", "a"}, {"logprobs", 6}}, "logprobs");
  b = chat;
  b["logprobs"] = true;  // top_logprobs may be left out: the sampled tokens' own, no alternatives
  const json reply = s.post_json("/v1/chat/completions", b);
  for (const json& e : reply["choices"][0]["logprobs"]["content"]) EXPECT_TRUE(e["top_logprobs"].empty());
}

}  // namespace
}  // namespace lode::test
