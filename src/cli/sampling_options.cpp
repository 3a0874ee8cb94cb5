#include "cli/sampling_options.h"

#include <charconv>
#include <cmath>
#include <random>

#include "cli/validators.h"
#include "core/error.h"

namespace lode::cli {
namespace {

// "12:-inf, 7:1.5" -> {(12, -inf), (7, 1.5)}
std::vector<std::pair<int32_t, float>> parse_logit_bias(const std::string& text) {
  std::vector<std::pair<int32_t, float>> bias;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    std::string item = text.substr(pos, comma - pos);
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    const size_t colon = item.find(':');
    int32_t id = -1;
    const char* id_end = item.data() + (colon == std::string::npos ? item.size() : colon);
    const auto [p, err] = std::from_chars(item.data(), id_end, id);
    if (colon == std::string::npos || err != std::errc() || p != id_end || id < 0)
      fail("--logit-bias: '{}' is not TOKEN:BIAS (e.g. 42:-inf or 7:2.5)", item);
    const std::string value = item.substr(colon + 1);
    float b = 0;
    if (value == "-inf") b = -INFINITY;
    else {
      try {
        size_t used = 0;
        b = std::stof(value, &used);
        if (used != value.size()) throw std::invalid_argument(value);
      } catch (const std::exception&) {
        fail("--logit-bias: '{}' in '{}' is not a number (use a float or -inf)", value, item);
      }
    }
    bias.emplace_back(id, b);
    pos = comma + 1;
  }
  return bias;
}

}  // namespace

void add_draft_options(CLI::App& cmd, DraftCliOptions& o) {
  cmd.add_option("--mtp", o.mtp,
                 "Draft up to N tokens per step with the model's MTP block and verify them in one step; the output "
                 "is the same as without (default 0: off; both engines)")
      ->check(CLI::Range(int64_t(0), int64_t(16)));
  cmd.add_option("--mtp-min-p", o.min_p, "Stop drafting when the MTP block's most likely token is below this "
                                         "probability (default 0)")
      ->check(number_in(0, 1));
}

void add_sampling_options(CLI::App& cmd, SamplingCliOptions& o) {
  auto& p = o.params;
  cmd.add_option("--temp", p.temperature, "Temperature; 0 = greedy (default 0.6)")->check(number_at_least(0));
  cmd.add_option("--top-k", p.top_k, "Keep the k most likely tokens; 0 = off (default 20)")->check(integer_at_least(0));
  cmd.add_option("--top-p", p.top_p, "Nucleus: smallest set with this much probability; 1 = off (default 0.95)")
      ->check(number_in(0, 1));
  cmd.add_option("--min-p", p.min_p, "Drop tokens below min-p x the top probability; 0 = off (default 0)")
      ->check(number_in(0, 1));
  cmd.add_option("--repeat-penalty", p.repeat_penalty, "Penalise repeated tokens (1 = off, default)")
      ->check(number_at_least(0));
  cmd.add_option("--presence-penalty", p.presence_penalty, "Subtract from tokens already present (default 0)")
      ->check(finite_number());
  cmd.add_option("--frequency-penalty", p.frequency_penalty, "Subtract per occurrence (default 0)")
      ->check(finite_number());
  cmd.add_option("--repeat-last-n", p.penalty_last_n, "Tokens the penalties look back at; -1 = all (default 64)")
      ->check(integer_at_least(-1));
  cmd.add_option("--logit-bias", o.logit_bias, "Per-token bias: 'ID:BIAS,...' (BIAS may be -inf)");
  cmd.add_option("--seed", o.seed, "Random seed (default: random; run prints it at the end, chat at the start)")->check(unsigned_64());
}

sample::SamplingParams sampling_params(const SamplingCliOptions& o, int64_t n_vocab) {
  sample::SamplingParams p = o.params;
  p.logit_bias = parse_logit_bias(o.logit_bias);
  p.seed = o.seed ? *o.seed : std::random_device{}();
  sample::validate(p, n_vocab);
  return p;
}

}  // namespace lode::cli
