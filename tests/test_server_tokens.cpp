// POST /tokenize and /detokenize (llama-server's and vLLM's shapes) on lode-mini.
#include "chat/template.h"
#include "test_server_support.h"

namespace lode::test {
namespace {

TEST(ServerTokens, TokenizeAndDetokenizeRoundTrip) {
  TestServer s;
  const tokenizer::Tokenizer& tok = mini_model()->tokenizer;
  const std::string text = "The ls command<|im_end|> lists files";
  const std::vector<int32_t> want = tok.encode(text, true);
  for (const char* field : {"content", "prompt"}) {
    const json reply = s.post_json("/tokenize", {{field, text}});
    EXPECT_EQ(reply["tokens"], json(want)) << field;
    EXPECT_EQ(reply["count"], want.size());
    EXPECT_EQ(reply["max_model_len"], 512);
  }
  // parse_special false: the control token's text is plain text.
  EXPECT_EQ(s.post_json("/tokenize", {{"content", text}, {"parse_special", false}})["tokens"], json(tok.encode(text, false)));
  const json pieces = s.post_json("/tokenize", {{"content", "ls -l"}, {"with_pieces", true}});
  std::string joined;
  for (const json& p : pieces["tokens"]) {
    EXPECT_TRUE(p["id"].is_number_integer());
    joined += p["piece"].get<std::string>();
  }
  EXPECT_EQ(joined, "ls -l");
  const json back = s.post_json("/detokenize", {{"tokens", want}});
  EXPECT_EQ(back["content"], text);
  EXPECT_EQ(back["prompt"], text);
  // A chat: the prompt the chat route renders.
  const json chat = {{"messages", {{{"role", "user"}, {"content", "Hello"}}}}};
  std::vector<chat::Message> messages(1);
  messages[0].role = "user";
  messages[0].content = "Hello";
  const std::string rendered =
      chat::render_qwen35(messages, nullptr, {.add_generation_prompt = true, .enable_thinking = true});
  EXPECT_EQ(s.post_json("/tokenize", chat)["tokens"], json(tok.encode(rendered, true)));
}

TEST(ServerTokens, BadRequestsSayWhy) {
  TestServer s;
  const auto refused = [&](const std::string& path, const json& body, const std::string& param) {
    const json reply = s.post_json(path, body, 400);
    EXPECT_EQ(reply["error"]["param"], param) << reply;
  };
  refused("/tokenize", json::object(), "content");
  refused("/tokenize", {{"content", 5}}, "content");
  refused("/detokenize", {{"tokens", "abc"}}, "tokens");
  refused("/detokenize", {{"tokens", {1, -2}}}, "tokens");
  refused("/detokenize", {{"tokens", {1, 1 << 30}}}, "tokens");
  EXPECT_EQ(s.post_json("/tokenize", {{"content", "a"}, {"model", "gpt-4o"}}, 404)["error"]["code"], "model_not_found");
  auto res = s.client().Get("/tokenize");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 405);
}

}  // namespace
}  // namespace lode::test
