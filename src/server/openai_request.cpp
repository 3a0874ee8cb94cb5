#include "server/openai_request.h"

#include <charconv>

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "server/api_error.h"
#include "server/json_fields.h"

namespace lode::server {
namespace {

using json = nlohmann::ordered_json;

std::vector<std::string> stop_strings(const json& body) {
  const json* v = field(body, "stop");
  if (!v) return {};
  std::vector<std::string> out;
  auto add = [&](const json& s) {
    if (!s.is_string()) throw bad_request(fmt::format("stop must be a string or a list of strings, got {}", s.dump()), "stop");
    if (s.get<std::string>().empty()) throw bad_request("stop strings must not be empty", "stop");
    out.push_back(s.get<std::string>());
  };
  if (v->is_array()) {
    for (const json& s : *v) add(s);
  } else {
    add(*v);
  }
  return out;
}

// OpenAI's logit_bias: {"token id": bias in [-100, 100]}, added to those tokens' logits.
std::vector<std::pair<int32_t, float>> logit_bias(const json& body) {
  const json* v = field(body, "logit_bias");
  if (!v || v->is_null()) return {};
  if (!v->is_object()) throw bad_request("logit_bias must be an object {\"token id\": bias}", "logit_bias");
  std::vector<std::pair<int32_t, float>> out;
  for (auto it = v->begin(); it != v->end(); ++it) {
    const std::string& key = it.key();
    int32_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || id < 0)
      throw bad_request(fmt::format("logit_bias key \"{}\" is not a token id", key), "logit_bias");
    if (!it.value().is_number() || it.value().get<double>() < -100 || it.value().get<double>() > 100)
      throw bad_request(fmt::format("logit_bias[\"{}\"] must be a number in [-100, 100], got {}", key, it.value().dump()),
                        "logit_bias");
    out.emplace_back(id, it.value().get<float>());
  }
  return out;
}

// Fields of the chat route that would change what the reply means if they were ignored: refused,
// saying so.
void refuse_unsupported_chat(const json& body) {
  for (const char* older : {"functions", "function_call"})
    if (field(body, older))
      throw bad_request(fmt::format("{} (OpenAI's older form of tools) is not supported: send tools and tool_choice",
                                    older), older);
}

// response_format: {"type": "text"} or absent (free text: null), {"type": "json_object"} (any one
// JSON object), {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}} (one object
// the schema accepts; a schema lode cannot enforce is refused, saying what in it, never ignored).
std::shared_ptr<const sample::JsonSchema> json_reply_wanted(const json& body) {
  const json* f = field(body, "response_format");
  if (!f) return nullptr;
  const std::string type = string_or_empty(*f, "type");
  if (type == "text") return nullptr;
  if (type == "json_object") return sample::JsonSchema::any_object();
  if (type != "json_schema")
    throw bad_request(fmt::format("response_format {} is not supported: give type text, json_object or json_schema",
                                  f->dump()),
                      "response_format");
  const json* spec = field(*f, "json_schema");
  const json* schema = spec && spec->is_object() ? field(*spec, "schema") : nullptr;
  if (!schema)
    throw bad_request("response_format json_schema needs json_schema.schema: the JSON schema of the reply",
                      "response_format");
  try {
    return sample::JsonSchema::compile(*schema);
  } catch (const Error& e) {
    throw bad_request(e.what(), "response_format");
  }
}

// The chat route's logprobs (true or false) and top_logprobs (0 to 20, with logprobs true): the
// alternatives each token's entry lists, or -1 for none.
int chat_logprobs(const json& body) {
  const bool wanted = boolean(body, "logprobs", "logprobs").value_or(false);
  const auto top = integer_in(body, "top_logprobs", 0, sample::kMaxTopLogprobs);
  if (top.value_or(0) > 0 && !wanted) throw bad_request("top_logprobs needs logprobs: true", "top_logprobs");
  return wanted ? int(top.value_or(0)) : -1;
}

// The same for the legacy completions route, where logprobs is a count.
void refuse_unsupported_completion(const json& body) {
  if (boolean(body, "echo", "echo").value_or(false))
    throw bad_request("echo is not supported: the reply holds the completion alone; leave echo out or false", "echo");
  if (const json* suffix = field(body, "suffix"); suffix && *suffix != "")
    throw bad_request("suffix (text to insert before) is not supported: leave it out", "suffix");
  if (const auto best_of = integer_in(body, "best_of", 1, 20); best_of && *best_of != 1)
    throw bad_request(fmt::format("best_of {} is not supported: this server returns one completion (best_of = 1)",
                                  *best_of), "best_of");
}

GenerationRequest generation_request(const json& body, uint64_t random_seed) {
  GenerationRequest r;
  const int64_t huge = std::numeric_limits<int32_t>::max();
  r.max_tokens = integer_in(body, "max_tokens", 1, huge);
  if (auto m = integer_in(body, "max_completion_tokens", 1, huge)) r.max_tokens = m;
  sample::SamplingParams& s = r.sampling;
  if (auto t = number_in(body, "temperature", 0, 2)) s.temperature = float(*t);
  if (auto p = number_in(body, "top_p", 0, 1)) s.top_p = float(*p);
  if (auto k = integer_in(body, "top_k", 0, huge)) s.top_k = int(*k);
  if (auto p = number_in(body, "min_p", 0, 1)) s.min_p = float(*p);
  if (auto p = number_in(body, "presence_penalty", -2, 2)) s.presence_penalty = float(*p);
  if (auto p = number_in(body, "frequency_penalty", -2, 2)) s.frequency_penalty = float(*p);
  const json* seed = field(body, "seed");
  if (seed && !seed->is_number_integer()) throw bad_request(fmt::format("seed must be an integer, got {}", seed->dump()), "seed");
  s.seed = seed ? (seed->is_number_unsigned() ? seed->get<uint64_t>() : uint64_t(seed->get<int64_t>())) : random_seed;
  if (auto n = integer_in(body, "n", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()); n && *n != 1)
    throw bad_request(fmt::format("n {} is not supported: this server returns one choice (n = 1)", *n), "n");
  s.logit_bias = logit_bias(body);
  r.stop = stop_strings(body);
  r.stream = boolean(body, "stream", "stream").value_or(false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) throw bad_request("stream_options must be an object", "stream_options");
    r.include_usage = boolean(*so, "include_usage", "stream_options.include_usage").value_or(false);
  }
  return r;
}

std::vector<chat::Message> messages(const json& body) {
  const json* v = field(body, "messages");
  if (!v) throw bad_request("messages is required: a list of {role, content} objects", "messages");
  if (!v->is_array()) throw bad_request(fmt::format("messages must be a list, got {}", v->type_name()), "messages");
  if (v->empty()) throw bad_request("messages must not be empty", "messages");
  std::vector<chat::Message> out;
  for (size_t i = 0; i < v->size(); ++i) {
    const std::string param = fmt::format("messages[{}]", i);
    try {
      out.push_back(chat::message_from_json((*v)[i]));
    } catch (const Error& e) {
      throw bad_request(fmt::format("{}: {}", param, e.what()), param);
    }
    std::string& role = out.back().role;
    if (role == "developer") role = "system";  // (OpenAI's newer name for the system's instructions)
    if (role != "system" && role != "user" && role != "assistant" && role != "tool")
      throw bad_request(fmt::format("{}.role \"{}\" is not one of system, developer, user, assistant, tool", param,
                                    role),
                        param + ".role");
  }
  return out;
}

// The tool definitions shown to the model (null: none, or tool_choice "none"), and the names a
// forcing tool_choice allows.
std::pair<json, std::vector<std::string>> tools(const json& body) {
  const json* v = field(body, "tools");
  if (v && !v->is_array()) throw bad_request(fmt::format("tools must be a list, got {}", v->type_name()), "tools");
  for (size_t i = 0; v && i < v->size(); ++i) {
    const json& tool = (*v)[i];
    const json* fn = tool.is_object() ? field(tool, "function") : nullptr;
    const json* name = fn && fn->is_object() ? field(*fn, "name") : nullptr;
    if (!name || !name->is_string() || name->get<std::string>().empty())
      throw bad_request(fmt::format("tools[{}] must be {{\"type\": \"function\", \"function\": {{\"name\": ..., "
                                    "\"parameters\": ...}}}}", i), fmt::format("tools[{}]", i));
  }
  const json shown = v && !v->empty() ? *v : json(nullptr);
  const json* c = field(body, "tool_choice");
  if (!c || *c == "auto") return {shown, {}};
  if (*c == "none") return {nullptr, {}};
  if (*c == "required") return {shown, forced_tool_names(shown, "", "tool_choice")};
  const json* fn = c->is_object() ? field(*c, "function") : nullptr;
  const json* name = fn && fn->is_object() ? field(*fn, "name") : nullptr;
  if (string_or_empty(*c, "type") != "function" || !name || !name->is_string())
    throw bad_request(fmt::format("tool_choice {} is not \"auto\", \"none\", \"required\" or "
                                  "{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}", c->dump()),
                      "tool_choice");
  return {shown, forced_tool_names(shown, name->get<std::string>(), "tool_choice")};
}

bool thinking(const json& body) {
  bool on = true;
  if (const json* kwargs = field(body, "chat_template_kwargs")) {
    if (!kwargs->is_object()) throw bad_request("chat_template_kwargs must be an object", "chat_template_kwargs");
    on = boolean(*kwargs, "enable_thinking", "chat_template_kwargs.enable_thinking").value_or(true);
  }
  if (const json* effort = field(body, "reasoning_effort")) {
    static constexpr const char* known[] = {"none", "minimal", "low", "medium", "high"};
    if (!effort->is_string() || std::find(std::begin(known), std::end(known), effort->get<std::string>()) == std::end(known))
      throw bad_request(fmt::format("reasoning_effort {} is not one of none, minimal, low, medium, high", effort->dump()),
                        "reasoning_effort");
    if (*effort == "none") on = false;
  }
  return on;
}

Job make_job(std::vector<int32_t> prompt, const GenerationRequest& r, int64_t context, int64_t vocab) {
  for (const auto& [id, bias] : r.sampling.logit_bias)
    if (id >= vocab)
      throw bad_request(fmt::format("logit_bias names token {}, outside the vocabulary [0, {})", id, vocab), "logit_bias");
  const int64_t n = int64_t(prompt.size());
  if (n == 0) throw bad_request("the prompt is empty: give at least one token of text", "prompt");
  if (r.max_tokens && n + *r.max_tokens > context)
    throw bad_request(fmt::format("the prompt ({} tokens) plus max_tokens ({}) is {} tokens, the context is {}; "
                                  "shorten the prompt or lower max_tokens",
                                  n, *r.max_tokens, n + *r.max_tokens, context),
                      "max_tokens");
  if (!r.max_tokens && n >= context)
    throw bad_request(fmt::format("the prompt is {} tokens, the context is {}: shorten the prompt", n, context),
                      "messages");
  Job job;
  job.prompt = std::move(prompt);
  job.generate.max_tokens = r.max_tokens.value_or(context - n);
  job.generate.sampling = r.sampling;
  job.generate.stop_strings = r.stop;
  job.generate.logprobs = r.logprobs;
  return job;
}

}  // namespace

json parse_json_body(const std::string& body) {
  // Limits that keep a body from costing more than its bytes: nesting (the JSON library's dump and
  // the chat template's rendering recurse) and keys per object (an ordered object looks each new
  // key up among those before it, so n keys cost n^2 / 2 comparisons).
  constexpr int kMaxDepth = 128;
  constexpr size_t kMaxKeys = 4096;
  std::vector<size_t> keys;  // of each object open now, innermost last
  const json::parser_callback_t limits = [&](int depth, json::parse_event_t event, json&) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) && depth >= kMaxDepth)
      throw bad_request(fmt::format("the request body nests JSON more than {} levels deep", kMaxDepth));
    if (event == json::parse_event_t::object_start) keys.push_back(0);
    if (event == json::parse_event_t::object_end) keys.pop_back();
    if (event == json::parse_event_t::key && ++keys.back() > kMaxKeys)
      throw bad_request(fmt::format("the request body has an object of more than {} keys", kMaxKeys));
    return true;
  };
  json parsed;
  try {
    parsed = json::parse(body, limits);
  } catch (const json::parse_error& e) {
    throw bad_request(fmt::format("the request body is not valid JSON (at byte {}): {}", e.byte, e.what()));
  } catch (const json::exception& e) {  // (a number too large for a double, for one)
    throw bad_request(fmt::format("the request body is not valid JSON: {}", e.what()));
  }
  if (!parsed.is_object()) throw bad_request(fmt::format("the request body must be a JSON object, got {}", parsed.type_name()));
  return parsed;
}

ChatRequest parse_chat_request(const json& body, const ModelNames& names, uint64_t random_seed) {
  const std::string model = check_model(body, names);
  ChatRequest r;
  r.messages = messages(body);
  std::tie(r.tools, r.forced_tools) = tools(body);
  r.enable_thinking = thinking(body);
  refuse_unsupported_chat(body);
  r.generation = generation_request(body, random_seed);
  r.generation.logprobs = chat_logprobs(body);
  r.json_reply = json_reply_wanted(body);
  r.generation.model = model;
  return r;
}

CompletionRequest parse_completion_request(const json& body, const ModelNames& names, uint64_t random_seed) {
  const std::string model = check_model(body, names);
  CompletionRequest r;
  const json* p = field(body, "prompt");
  if (!p) throw bad_request("prompt is required: the text to continue", "prompt");
  if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) p = &(*p)[0];
  if (!p->is_string()) throw bad_request(fmt::format("prompt must be a string, got {}", p->type_name()), "prompt");
  r.prompt = p->get<std::string>();
  refuse_unsupported_completion(body);
  r.generation = generation_request(body, random_seed);
  // The legacy route's logprobs is the count of alternatives (0 to 5): the sampled token's own always.
  r.generation.logprobs = int(integer_in(body, "logprobs", 0, 5).value_or(-1));
  r.json_reply = json_reply_wanted(body);
  r.generation.model = model;
  if (!r.generation.max_tokens) r.generation.max_tokens = 16;  // OpenAI's default for completions
  return r;
}

std::vector<std::string> forced_tool_names(const json& tools, const std::string& name, const std::string& param) {
  if (!tools.is_array() || tools.empty())
    throw bad_request("tool_choice forces a tool call but no tools were given", param);
  std::vector<std::string> names;
  for (const json& tool : tools) {
    const json& fn = tool.contains("function") ? tool["function"] : tool;
    names.push_back(fn.value("name", ""));
  }
  if (name.empty()) return names;
  if (std::find(names.begin(), names.end(), name) == names.end())
    throw bad_request(fmt::format("tool_choice names \"{}\", which is not among the tools given", name), param);
  return {name};
}

namespace {

// Where a constrained reply begins when the model thinks first: after its </think> token (-1:
// at once, thinking off). 400 on `param` when the vocabulary has none; `what` names the reply.
int32_t after_thinking(bool thinking, const tokenizer::Tokenizer& tokenizer, const char* what, const char* param) {
  if (!thinking) return -1;
  const auto end_of_thinking = tokenizer.find_token("</think>");
  if (!end_of_thinking)
    throw bad_request(fmt::format("this model's vocabulary has no </think> token, so {} cannot follow thinking; turn "
                                  "thinking off", what), param);
  return *end_of_thinking;
}

// The steering that makes the reply call one of `names` (see ChatRequest::forced_tools).
engine::SteeredText steer_to_tools(const std::vector<std::string>& names, bool thinking,
                                   const tokenizer::Tokenizer& tokenizer) {
  engine::SteeredText steer;
  steer.after = after_thinking(thinking, tokenizer, "a forced tool call", "tool_choice");
  for (const std::string& name : names)
    steer.choices.push_back((thinking ? "\n\n" : "") + std::string("<tool_call>\n<function=") + name + ">\n");
  return steer;
}

}  // namespace

std::vector<int32_t> chat_prompt(const ChatRequest& request, const ServedModel& model) {
  chat::RenderedChat chat;
  try {
    chat = chat::render_qwen35_marked(request.messages, request.tools,
                                      {.add_generation_prompt = true,
                                       .enable_thinking = request.enable_thinking,
                                       .continue_final_message = request.continues_reply()});
  } catch (const Error& e) {  // the template's own refusals: the conversation is at fault
    throw bad_request(fmt::format("the chat template refused the conversation: {}", e.what()), "messages");
  }
  return model.tokenizer.encode(chat.text, chat.client);  // (control tokens only where the template wrote them)
}

Job chat_job(const ChatRequest& request, const ServedModel& model, int64_t context) {
  Job job = make_job(chat_prompt(request, model), request.generation, context, model.config.vocab);
  if (!request.forced_tools.empty() && request.json_reply)
    throw bad_request("a forced tool call and a JSON response_format exclude each other: the reply is "
                      "either a call or a JSON object; drop one", "response_format");
  if (!request.forced_tools.empty())
    job.generate.steer = steer_to_tools(request.forced_tools, request.reply_thinks(), model.tokenizer);
  if (request.json_reply) {
    job.generate.json = engine::JsonOutput{
        .after = after_thinking(request.reply_thinks(), model.tokenizer, "a JSON reply", "response_format"),
        .schema = request.json_reply,
        .vocabulary = model.json_tokens};
  }
  return job;
}

Job completion_job(const CompletionRequest& request, const ServedModel& model, int64_t context) {
  Job job = make_job(model.tokenizer.encode(request.prompt, /*allow_special=*/true), request.generation, context,
                     model.config.vocab);
  if (request.json_reply)
    job.generate.json = engine::JsonOutput{.after = -1, .schema = request.json_reply, .vocabulary = model.json_tokens};
  return job;
}

}  // namespace lode::server
