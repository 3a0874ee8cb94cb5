#include "server/token_routes.h"

#include <fmt/format.h>

#include "server/api_error.h"
#include "server/json_fields.h"
#include "server/openai_request.h"

namespace lode::server {

using json = nlohmann::ordered_json;

json tokenize_reply(const json& body, const ServedModel& model, const ModelNames& names, int64_t context) {
  check_model(body, names);
  std::vector<int32_t> tokens;
  if (field(body, "messages")) {
    tokens = chat_prompt(parse_chat_request(body, names, 0), model);
  } else {
    const json* text = field(body, "content");
    const char* name = "content";
    if (!text) text = field(body, "prompt"), name = "prompt";
    if (!text) throw bad_request("give the text as content (or prompt), or a chat as messages", "content");
    if (!text->is_string()) throw bad_request(fmt::format("{} must be a string, got {}", name, text->type_name()), name);
    tokens = model.tokenizer.encode(text->get<std::string>(), boolean(body, "parse_special", "parse_special").value_or(true));
  }
  json list = json::array();
  const bool pieces = boolean(body, "with_pieces", "with_pieces").value_or(false);
  for (int32_t id : tokens) {
    if (!pieces) list.push_back(id);
    else list.push_back({{"id", id}, {"piece", model.tokenizer.decode(std::span(&id, 1), true)}});
  }
  return {{"tokens", std::move(list)}, {"count", tokens.size()}, {"max_model_len", context}};
}

json detokenize_reply(const json& body, const ServedModel& model, const ModelNames& names) {
  check_model(body, names);
  const json* list = field(body, "tokens");
  if (!list || !list->is_array()) throw bad_request("tokens must be a list of token ids", "tokens");
  std::vector<int32_t> tokens;
  for (const json& t : *list) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= model.tokenizer.size())
      throw bad_request(fmt::format("tokens holds {}, not a token id in [0, {})", t.dump(), model.tokenizer.size()),
                        "tokens");
    tokens.push_back(t.get<int32_t>());
  }
  const std::string text = model.tokenizer.decode(tokens, true);
  return {{"content", text}, {"prompt", text}};
}

}  // namespace lode::server
