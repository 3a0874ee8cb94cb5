#include "tokenizer/hf_tokenizer.h"

#include <nlohmann/json.hpp>

#include <fstream>

#include "core/error.h"
#include "tokenizer/pre_split.h"

namespace lode::tokenizer {
namespace {

using json = nlohmann::json;

// GGUF token types.
constexpr int32_t kNormal = 1, kControl = 3, kUserDefined = 4, kUnused = 5;

const json& bpe_model(const json& tok) {
  if (!tok.contains("model") || !tok["model"].is_object()) fail("tokenizer.json has no 'model' object");
  const json& model = tok["model"];
  if (model.value("type", "") != "BPE")
    fail("tokenizer.json: model type is '{}', lode reads byte-level BPE tokenizers only", model.value("type", "?"));
  if (!model.contains("vocab") || !model["vocab"].is_object() || !model.contains("merges") || !model["merges"].is_array())
    fail("tokenizer.json: the BPE model lacks 'vocab' or 'merges'");
  return model;
}

// Every Split regex in the pre-tokenizer (a single Split, or a Sequence holding one).
void collect_split_patterns(const json& pre, std::vector<std::string>& out) {
  if (!pre.is_object()) return;
  if (pre.value("type", "") == "Split" && pre.contains("pattern") && pre["pattern"].contains("Regex"))
    out.push_back(pre["pattern"]["Regex"].get<std::string>());
  if (pre.contains("pretokenizers"))
    for (const json& p : pre["pretokenizers"]) collect_split_patterns(p, out);
}

// A token id: an integer in 0 .. 2^24 - 1 (no vocabulary is near; a negative one wrote out of
// bounds, 2^40 ran out of memory), else refused saying which entry.
size_t token_id(const json& id, std::string_view what) {
  constexpr int64_t kMost = (int64_t(1) << 24) - 1;
  if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > kMost)
    fail("tokenizer.json: {} has the id {}, not an integer in 0..{}", what, id.dump(), kMost);
  return size_t(id.get<int64_t>());
}

const std::string& token_text(const json& added) {
  if (!added.is_object() || !added.contains("content") || !added["content"].is_string())
    fail("tokenizer.json: an added token is not {{\"id\": ..., \"content\": \"...\"}}: {}", added.dump());
  return added["content"].get_ref<const std::string&>();
}

std::string merge_text(const json& merge) {
  if (merge.is_string()) return merge.get<std::string>();
  if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string())
    return merge[0].get<std::string>() + " " + merge[1].get<std::string>();
  fail("tokenizer.json: a merge is {}, not \"a b\" or [\"a\", \"b\"]", merge.dump());
}

}  // namespace

json read_tokenizer_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) fail("cannot open {}", path.string());
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    fail("{} is not valid JSON: {}", path.string(), e.what());
  }
}

int64_t hf_token_count(const json& tok) {
  int64_t count = 0;
  for (const auto& [text, id] : bpe_model(tok)["vocab"].items())
    count = std::max(count, int64_t(token_id(id, "the vocabulary entry '" + text + "'")) + 1);
  if (tok.contains("added_tokens")) {
    if (!tok["added_tokens"].is_array()) fail("tokenizer.json: added_tokens is not a list");
    for (const json& a : tok["added_tokens"])
      count = std::max(count, int64_t(token_id(a.is_object() && a.contains("id") ? a["id"] : json(), "an added token")) + 1);
  }
  return count;
}

std::string hf_pre_tokenizer(const json& tok) {
  std::vector<std::string> patterns;
  if (tok.contains("pre_tokenizer")) collect_split_patterns(tok["pre_tokenizer"], patterns);
  if (patterns.empty()) return "gpt2";  // ByteLevel's own regex
  if (patterns.size() == 1)
    for (std::string_view name : {"qwen35", "qwen2", "llama-bpe", "gpt2"})
      if (pre_tokenizer_spec(name).pattern == patterns[0]) return std::string(name);
  fail("tokenizer.json splits text with a regex lode does not know ({}); lode knows the {} families",
       patterns[0], supported_pre_tokenizers());
}

void store_hf_tokenizer(const json& tok, int64_t vocab, gguf::Metadata& m) {
  const json& model = bpe_model(tok);
  if (hf_token_count(tok) > vocab)
    fail("tokenizer.json has token ids up to {} but the model's vocabulary is {}", hf_token_count(tok) - 1, vocab);
  std::vector<std::string> tokens(static_cast<size_t>(vocab));
  std::vector<int32_t> types(static_cast<size_t>(vocab), kUnused);
  for (const auto& [text, id] : model["vocab"].items()) {
    tokens[token_id(id, text)] = text;
    types[token_id(id, text)] = kNormal;
  }
  if (tok.contains("added_tokens"))
    for (const json& a : tok["added_tokens"]) {
      const size_t id = token_id(a["id"], "an added token");
      tokens[id] = token_text(a);
      types[id] = a.contains("special") && a["special"] == true ? kControl : kUserDefined;
    }
  for (size_t i = 0; i < tokens.size(); ++i)
    if (types[i] == kUnused) tokens[i] = "[PAD" + std::to_string(i) + "]";
  std::vector<std::string> merges;
  merges.reserve(model["merges"].size());
  for (const json& mg : model["merges"]) merges.push_back(merge_text(mg));

  auto id_of = [&](std::string_view text) -> int64_t {
    for (size_t i = 0; i < tokens.size(); ++i)
      if (types[i] != kNormal && tokens[i] == text) return int64_t(i);
    return -1;
  };
  const int64_t eos = id_of("<|im_end|>"), pad = id_of("<|endoftext|>");
  m.set("tokenizer.ggml.model", "gpt2");
  m.set("tokenizer.ggml.pre", hf_pre_tokenizer(tok));
  m.set("tokenizer.ggml.tokens", gguf::Array(std::move(tokens)));
  m.set("tokenizer.ggml.token_type", gguf::Array(std::move(types)));
  m.set("tokenizer.ggml.merges", gguf::Array(std::move(merges)));
  if (eos >= 0) m.set("tokenizer.ggml.eos_token_id", uint32_t(eos));
  if (pad >= 0) m.set("tokenizer.ggml.padding_token_id", uint32_t(pad));
  m.set("tokenizer.ggml.add_bos_token", false);
}

}  // namespace lode::tokenizer
