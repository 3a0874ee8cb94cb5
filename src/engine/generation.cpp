#include "engine/generation.h"

#include <algorithm>
#include <limits>
#include <string_view>
#include <utility>

#include "core/error.h"

namespace lode::engine {

namespace {
using clock = std::chrono::steady_clock;
double seconds(clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

std::vector<int32_t> user_defined_tokens(const tokenizer::Tokenizer& tokenizer) {
  std::vector<int32_t> added;
  for (int32_t id = 0; id < int32_t(tokenizer.size()); ++id)
    if (tokenizer.type(id) == tokenizer::TokenType::user_defined && !tokenizer.token_bytes(id).empty())
      added.push_back(id);
  return added;
}

// Where `text` holds any of the user-defined tokens `added`, as the tokenizer reads them (always,
// leftmost and longest first): (byte offset, id) in order.
std::vector<std::pair<size_t, int32_t>> added_tokens_in(std::string_view text, std::span<const int32_t> added,
                                                        const tokenizer::Tokenizer& tokenizer) {
  std::vector<std::pair<size_t, int32_t>> found;
  for (size_t at = 0; at < text.size();) {
    int32_t best = -1;
    size_t best_size = 0;
    for (int32_t id : added) {
      const std::string& bytes = tokenizer.token_bytes(id);
      if (bytes.size() > best_size && text.substr(at).starts_with(bytes)) best = id, best_size = bytes.size();
    }
    if (best < 0) {
      ++at;
    } else {
      found.emplace_back(at, best);
      at += best_size;
    }
  }
  return found;
}

}  // namespace

std::shared_ptr<const sample::JsonTokens> json_vocabulary(const tokenizer::Tokenizer& tokenizer) {
  std::vector<std::string_view> bytes;
  std::vector<bool> markup;  // control and added tokens are never JSON text
  for (int32_t id = 0; id < int32_t(tokenizer.size()); ++id) {
    bytes.push_back(tokenizer.token_bytes(id));
    const tokenizer::TokenType type = tokenizer.type(id);
    markup.push_back(type == tokenizer::TokenType::control || type == tokenizer::TokenType::user_defined);
  }
  return std::make_shared<const sample::JsonTokens>(std::move(bytes), markup);
}

Generation::Generation(const tokenizer::Tokenizer& tokenizer, sample::Sampler& sampler,
                       const GenerateOptions& options, TextSink on_text, int64_t prompt_tokens)
    : tokenizer_(tokenizer), sampler_(sampler), options_(options), on_text_(std::move(on_text)),
      text_(tokenizer, options.render_special), stops_(options.stop_strings), started_(clock::now()) {
  result_.prompt_tokens = prompt_tokens;
  if (options.steer && options.json) fail("generation: a reply cannot be both steered and JSON");
  if (options.json) {
    json_ = options.json->after < 0 ? Json::active : Json::waiting;
    json_vocabulary_ = options.json->vocabulary ? options.json->vocabulary : json_vocabulary(tokenizer);
    json_schema_ = options.json->schema;  // (none, or any object: JsonPrefix reads it, and faster)
    if (json_schema_ && json_schema_ != sample::JsonSchema::any_object())
      json_text_.emplace<sample::SchemaPrefix>(*json_schema_);
  }
  if (options.steer) {
    steering_ = options.steer->after < 0 ? Steering::active : Steering::waiting;
    const std::vector<int32_t> added = user_defined_tokens(tokenizer);
    for (const std::string& choice : options.steer->choices)
      added_in_choices_.push_back(added_tokens_in(choice, added, tokenizer));
  }
}

std::vector<float> Generation::steered(std::span<const float> logits) const {
  // The choices the text so far begins, each with what may come next: the added token that starts
  // here, or a token whose bytes continue the choice and end before its next added token (as the
  // template's text would be read, so the model sees the tokens it was trained on).
  struct Open {
    const std::string* choice;
    size_t end;            // the continuing bytes end here at most
    int32_t added = -1;    // the only token allowed, where an added token starts here
  };
  const size_t at = steered_text_.size();
  std::vector<Open> open;
  for (size_t c = 0; c < options_.steer->choices.size(); ++c) {
    const std::string& choice = options_.steer->choices[c];
    if (choice.size() <= at || choice.compare(0, at, steered_text_) != 0) continue;
    Open o{&choice, choice.size()};
    for (const auto& [offset, id] : added_in_choices_[c])
      if (offset >= at) {
        if (offset == at) o.added = id;
        else o.end = offset;
        break;
      }
    open.push_back(o);
  }
  std::vector<float> out(logits.size(), -std::numeric_limits<float>::infinity());
  for (size_t id = 0; id < logits.size() && int64_t(id) < tokenizer_.size(); ++id) {
    if (tokenizer_.type(int32_t(id)) == tokenizer::TokenType::control) continue;
    const std::string& bytes = tokenizer_.token_bytes(int32_t(id));
    if (bytes.empty()) continue;
    for (const Open& o : open) {
      const bool allowed = o.added >= 0 ? int32_t(id) == o.added
                                        : at + bytes.size() <= o.end && o.choice->compare(at, bytes.size(), bytes) == 0;
      if (allowed) {
        out[id] = logits[id];
        break;
      }
    }
  }
  return out;
}

void Generation::follow_steering(int32_t token) {
  if (steering_ == Steering::waiting && token == options_.steer->after) {
    steering_ = Steering::active;
  } else if (steering_ == Steering::active) {
    steered_text_ += tokenizer_.token_bytes(token);
    const auto& choices = options_.steer->choices;
    if (std::find(choices.begin(), choices.end(), steered_text_) != choices.end()) steering_ = Steering::done;
  }
}

std::span<const float> Generation::json_only(std::span<const float> logits) {
  std::vector<float>& out = json_masked_;
  out.assign(logits.size(), -std::numeric_limits<float>::infinity());
  if (json_complete()) {  // only an end may follow
    for (int32_t id : tokenizer_.end_of_generation())
      if (size_t(id) < logits.size()) out[size_t(id)] = logits[size_t(id)];
    return out;
  }
  std::visit([&](const auto& text) { json_vocabulary_->mark(text, json_allowed_); }, json_text_);
  bool any = false;
  for (size_t id = 0; id < logits.size() && id < json_allowed_.size(); ++id)
    if (json_allowed_[id]) out[id] = logits[id], any = true;
  if (!any)  // (no token goes on: a schema's required nesting past SchemaPrefix::kMaxDepth) the reply ends there
    for (int32_t id : tokenizer_.end_of_generation())
      if (size_t(id) < logits.size()) out[size_t(id)] = logits[size_t(id)];
  return out;
}

void Generation::follow_json(int32_t token) {
  if (json_ == Json::waiting && token == options_.json->after) json_ = Json::active;
  else if (json_ == Json::active && !json_complete())
    std::visit([&](auto& text) { text.push(tokenizer_.token_bytes(token)); }, json_text_);
}

bool Generation::greedy_only() const {
  return sampler_.plain_greedy() && !constrained() && options_.logprobs < 0;
}

std::optional<int32_t> Generation::step(std::span<const float> logits) {
  if (!begin_step()) return std::nullopt;
  const int32_t token = steering_ == Steering::active ? sampler_.sample(steered(logits))
                        : json_ == Json::active       ? sampler_.sample(json_only(logits))
                                                      : sampler_.sample(logits);
  if (options_.logprobs >= 0) note_logprobs(logits, token);
  return take(token);
}

bool Generation::top_only() const {
  return sampler_.takes_top() && !constrained() && options_.logprobs < 0;
}

std::optional<int32_t> Generation::step_top(const sample::TopCandidates& top) {
  if (!begin_step()) return std::nullopt;
  if (constrained()) fail("generation: a constrained reply needs the whole row of logits, not its top candidates");
  if (options_.logprobs >= 0) fail("generation: logprobs need the whole row of logits, not its top candidates");
  return take(sampler_.sample_top(top));
}

std::optional<int32_t> Generation::step_chosen(int32_t token) {
  if (!begin_step()) return std::nullopt;
  if (constrained()) fail("generation: a constrained reply needs the whole row of logits, not a chosen token");
  if (options_.logprobs >= 0) fail("generation: logprobs need the whole row of logits, not a chosen token");
  return take(token);
}

// (The model's raw logits, not the steered ones: what the model thought of the token.)
void Generation::note_logprobs(std::span<const float> logits, int32_t token) {
  result_.logprobs.push_back(sample::token_logprobs(logits, token, options_.logprobs));
  logprob_starts_.push_back(text_bytes_);
}

size_t Generation::shown_logprobs() const {
  return size_t(std::lower_bound(logprob_starts_.begin(), logprob_starts_.end(), streamed_bytes_) -
                logprob_starts_.begin());
}

void Generation::emit(const std::string& text) {
  if (text.empty()) return;
  streamed_bytes_ += int64_t(text.size());
  on_text_(text);
}

bool Generation::begin_step() {
  if (done_) return false;
  const auto now = clock::now();
  if (result_.tokens.empty()) {
    first_token_ = now;
    result_.prefill_seconds = seconds(started_, now);
  }
  if (options_.max_tokens <= 0) {
    end(FinishReason::length, true);
    return false;
  }
  return true;
}

std::optional<int32_t> Generation::take(int32_t token) {
  sampler_.accept(token);
  follow_steering(token);
  follow_json(token);
  if (options_.logprobs >= 0) text_bytes_ += int64_t(tokenizer_.decode(std::span(&token, 1), options_.render_special).size());
  result_.tokens.push_back(token);
  result_.last_token_pending = true;
  if (options_.cancel && options_.cancel->load()) {
    end(FinishReason::cancelled, false);  // nobody is reading: drop what was held back
    return std::nullopt;
  }
  const auto& ends = tokenizer_.end_of_generation();
  if (options_.stop_at_end_of_generation && std::find(ends.begin(), ends.end(), token) != ends.end()) {
    end(FinishReason::end_of_generation, true);
    return std::nullopt;
  }
  // (an added token's text is markup: no stop string matches into it)
  const tokenizer::TokenType type = tokenizer_.type(token);
  const bool markup = type == tokenizer::TokenType::control || type == tokenizer::TokenType::user_defined;
  const auto piece = markup ? stops_.push_opaque(text_.push(token)) : stops_.push(text_.push(token));
  emit(piece.emit);
  if (piece.stopped) {
    end(FinishReason::stop_string, false);
    return std::nullopt;
  }
  if (int64_t(result_.tokens.size()) >= options_.max_tokens) {
    end(FinishReason::length, true);
    return std::nullopt;
  }
  return token;
}

void Generation::stop(FinishReason reason) {
  if (!done_) end(reason, reason != FinishReason::cancelled);
}

void Generation::end(FinishReason reason, bool flush) {
  done_ = true;
  result_.finish = reason;
  result_.decode_seconds = result_.tokens.empty() ? 0.0 : seconds(first_token_, clock::now());
  if (flush) {  // text held back by the decoder or by an undecided stop string goes out now
    const auto tail = stops_.push(text_.flush());
    std::string rest = tail.emit;
    if (tail.stopped) result_.finish = FinishReason::stop_string;
    else rest += stops_.flush();
    emit(rest);
  }
  result_.logprobs.resize(shown_logprobs());  // the end-of-generation token's, a stop string's: never shown
}

}  // namespace lode::engine
