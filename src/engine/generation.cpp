#include "engine/generation.h"

#include <algorithm>
#include <limits>

namespace lode::engine {

namespace {
using clock = std::chrono::steady_clock;
double seconds(clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
}  // namespace

Generation::Generation(const tokenizer::Tokenizer& tokenizer, sample::Sampler& sampler,
                       const GenerateOptions& options, TextSink on_text, int64_t prompt_tokens)
    : tokenizer_(tokenizer), sampler_(sampler), options_(options), on_text_(std::move(on_text)),
      text_(tokenizer, options.render_special), stops_(options.stop_strings), started_(clock::now()) {
  result_.prompt_tokens = prompt_tokens;
  if (options.steer) steering_ = options.steer->after < 0 ? Steering::active : Steering::waiting;
}

std::vector<float> Generation::steered(std::span<const float> logits) const {
  std::vector<float> out(logits.size(), -std::numeric_limits<float>::infinity());
  for (size_t id = 0; id < logits.size() && int64_t(id) < tokenizer_.size(); ++id) {
    if (tokenizer_.type(int32_t(id)) == tokenizer::TokenType::control) continue;
    const std::string& bytes = tokenizer_.token_bytes(int32_t(id));
    if (bytes.empty()) continue;
    const std::string text = steered_text_ + bytes;
    for (const std::string& choice : options_.steer->choices) {
      if (choice.compare(0, text.size(), text) == 0) {
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

bool Generation::greedy_only() const {
  return sampler_.plain_greedy() && steering_ != Steering::active;
}

std::optional<int32_t> Generation::step(std::span<const float> logits) {
  if (!begin_step()) return std::nullopt;
  return take(steering_ == Steering::active ? sampler_.sample(steered(logits)) : sampler_.sample(logits));
}

std::optional<int32_t> Generation::step_chosen(int32_t token) {
  if (!begin_step()) return std::nullopt;
  return take(token);
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
  if (!piece.emit.empty()) on_text_(piece.emit);
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
  if (!flush) return;
  // Text held back by the decoder or by an undecided stop string goes out now.
  const auto tail = stops_.push(text_.flush());
  std::string rest = tail.emit;
  if (tail.stopped) result_.finish = FinishReason::stop_string;
  else rest += stops_.flush();
  if (!rest.empty()) on_text_(rest);
}

}  // namespace lode::engine
