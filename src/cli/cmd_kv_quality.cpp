// `lode kv-quality -m MODEL (-f TEXT | --random-tokens N) [--reference F] [--formats LIST]
//  [--greedy N] [--needles CASES.jsonl]`: how far each K/V cache format moves the model from the
// reference cache (fp32 by default), on either engine (engine/kv_quality.h): mean KL divergence
// and top-1 agreement of the next-token distributions over the teacher-forced text, its
// perplexity, the greedy continuation's agreement with the reference's, and optionally needle
// retrieval (cases from tools/kv/needle_cases.py). Prints a Markdown table (docs/KV.md).
#include <fmt/format.h>

#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <random>

#include <nlohmann/json.hpp>

#include "cli/backend.h"
#include "cli/commands.h"
#include "cli/model_options.h"
#include "cli/validators.h"
#include "core/error.h"
#include "cpu/engine.h"
#include "engine/kv_quality.h"
#include "engine/perplexity.h"
#include "gguf/reader.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

#ifdef LODE_HAVE_CUDA
#include "cuda/engine.h"
#include "cuda/session.h"
#endif

namespace lode::cli {
namespace {

struct KvQualityCliOptions {
  std::string model, text_file, needles_file, formats, reference = "fp32";
  int64_t random_tokens = 0, max_tokens = 0, greedy = 256, chunk = 64, needle_cases = 0, formats_per_pass = 0,
          score_last = 0;
  int threads = 0;
  BackendOptions backend;
  uint64_t seed = 1;
};

std::vector<kv::Format> parse_format_list(const std::string& list, kv::Format reference) {
  std::vector<kv::Format> formats;
  if (list.empty()) {
    for (kv::Format f : kv::all_formats())
      if (f != reference) formats.push_back(f);
    formats.push_back(kv::Format::q4_unrotated);
    return formats;
  }
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    formats.push_back(kv::parse_format(list.substr(pos, comma - pos)));
    pos = comma + 1;
  }
  return formats;
}

// The text's tokens, or random ids when the model has no tokenizer (`tok` is then not used).
std::vector<int32_t> text_tokens(const KvQualityCliOptions& o, const std::optional<tokenizer::Tokenizer>& tok,
                                 int64_t vocab) {
  std::vector<int32_t> tokens;
  if (o.random_tokens > 0) {
    std::mt19937_64 rng(o.seed);
    for (int64_t i = 0; i < o.random_tokens; ++i) tokens.push_back(int32_t(rng() % uint64_t(vocab)));
    return tokens;
  }
  std::ifstream in(o.text_file, std::ios::binary);
  if (!in) fail("kv-quality: cannot read {}", o.text_file);
  const std::string text((std::istreambuf_iterator<char>(in)), {});
  tokens = tok->encode(text, false);
  if (o.max_tokens > 0 && int64_t(tokens.size()) > o.max_tokens) tokens.resize(size_t(o.max_tokens));
  return tokens;
}

struct NeedleCase {
  std::string prompt, answer;
};

// The cases of a JSON-lines file; each line's fault is named by file and line. Read before the
// evaluation, so a bad file does not waste it.
std::vector<NeedleCase> read_needles(const std::string& path, int64_t limit) {
  std::ifstream in(path);
  if (!in) fail("kv-quality: cannot read {}", path);
  std::vector<NeedleCase> cases;
  int64_t number = 0;
  for (std::string line; std::getline(in, line) && (limit <= 0 || int64_t(cases.size()) < limit);) {
    ++number;
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail("{}:{}: not a JSON object: {}", path, number, e.what());
    }
    const auto text = [&](const char* key) {
      if (!j.is_object() || !j.contains(key) || !j[key].is_string() || j[key].get<std::string>().empty())
        fail("{}:{}: a needle case is {{\"prompt\": \"...\", \"answer\": \"...\"}} with both non-empty strings; "
             "\"{}\" is not", path, number, key);
      return j[key].get<std::string>();
    };
    cases.push_back({text("prompt"), text("answer")});
  }
  if (cases.empty()) fail("{}: no needle cases", path);
  return cases;
}

// Cases whose greedy answer (as many tokens as the answer has, and one more) begins with it.
int64_t needles_found(const engine::OpenSequence& open, kv::Format format, const tokenizer::Tokenizer& tok,
                      const std::vector<NeedleCase>& cases) {
  int64_t found = 0;
  for (const NeedleCase& c : cases) {
    const auto prompt = tok.encode(c.prompt, false);
    const auto sequence = open(format, int64_t(prompt.size()) + 16);
    std::vector<float> logits = engine::prefill(*sequence, prompt, 64);
    std::vector<int32_t> reply;
    const size_t n = tok.encode(c.answer, false).size() + 1;
    while (reply.size() < n) {
      reply.push_back(int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
      logits = engine::decode(*sequence, reply.back());
    }
    found += tok.decode(reply, false).rfind(c.answer, 0) == 0;
  }
  return found;
}

// Sequences on the chosen engine: CPU sessions sharing one set of mapped weights, or CUDA sessions
// (each with its own copy of the weights on the GPU, hence --formats-per-pass for large models).
engine::OpenSequence sequence_opener(const KvQualityCliOptions& o, const gguf::Reader& reader,
                                     const model::Qwen35MoeConfig& config) {
  if (resolve_backend(o.backend) == "cuda") {
#ifdef LODE_HAVE_CUDA
    const std::vector<int> gpus = o.backend.gpus.empty() ? std::vector<int>{0} : parse_gpus(o.backend.gpus);
    return [&reader, config, gpus, budget = size_t(o.backend.vram_budget_mib) << 20](kv::Format format, int64_t context) {
      cuda::CudaSessionOptions options;
      options.max_context = context;
      options.vram_budget = budget;
      options.kv_format = format;
      auto weights = std::make_shared<const model::ModelWeights>(model::bind_weights(reader, config));
      return std::make_shared<cuda::CudaModel>(std::make_unique<cuda::CudaPipeline>(reader, std::move(weights), options, gpus))
          ->open_sequence();
    };
#else
    fail("--backend cuda: this lode was built without CUDA (configure with LODE_CMAKE_ARGS=-DLODE_CUDA=ON)");
#endif
  }
  note_gpu_options_unused(o.backend);
  auto weights = std::make_shared<const model::ModelWeights>(model::bind_weights(reader, config));
  return [weights, threads = o.threads](kv::Format format, int64_t context) {
    const cpu::SessionOptions options{.threads = threads, .max_context = context, .kv_format = format};
    return cpu::open_sequence(weights, options);
  };
}

void run_kv_quality(const KvQualityCliOptions& o) {
  gguf::Reader reader(o.model);
  const model::Qwen35MoeConfig config = model::read_config(reader.metadata());
  // Read once, when the text or the needles need it (the fixtures' models have none).
  std::optional<tokenizer::Tokenizer> tok;
  if (!o.text_file.empty() || !o.needles_file.empty()) tok = tokenizer::Tokenizer::from_metadata(reader.metadata());
  const std::vector<int32_t> tokens = text_tokens(o, tok, config.vocab);
  std::vector<NeedleCase> needles;
  if (!o.needles_file.empty()) needles = read_needles(o.needles_file, o.needle_cases);
  engine::KvQualityOptions options;
  options.reference = kv::parse_format(o.reference);
  options.formats = parse_format_list(o.formats, options.reference);
  for (kv::Format f : options.formats) kv::check_head_dim(f, config.head_dim);
  options.chunk = o.chunk;
  options.greedy_tokens = o.greedy;
  options.formats_per_pass = o.formats_per_pass;
  options.scored_positions = o.score_last;
  const engine::OpenSequence open = sequence_opener(o, reader, config);
  fmt::print(stderr, "kv-quality: {} tokens teacher-forced ({} scored), then {} greedy, in {} and {} other formats, "
             "on the {}\n", tokens.size(), o.score_last > 0 ? std::min<int64_t>(o.score_last, int64_t(tokens.size())) :
             int64_t(tokens.size()), o.greedy, kv::to_string(options.reference), options.formats.size(),
             resolve_backend(o.backend) == "cuda" ? "GPU" : "CPU");
  const auto rows = engine::compare_kv_formats(open, tokens, options, [](int64_t done, int64_t total) {
    fmt::print(stderr, "\r  {} / {} positions", done, total);
  });
  fmt::print(stderr, "\n");

  const char* ref = kv::to_string(options.reference);
  fmt::print("| --kv | bytes/cell | mean KL vs {} | top-1 agreement | perplexity | greedy tokens as {} |{}\n", ref,
             ref, needles.empty() ? "" : " needles found |");
  fmt::print("|---|---|---|---|---|---|{}\n", needles.empty() ? "" : "---|");
  for (const auto& r : rows) {
    const std::string needle_cell =
        needles.empty() ? "" : fmt::format(" {} / {} |", needles_found(open, r.format, *tok, needles), needles.size());
    fmt::print("| {} | {} | {:.3e} | {:.2f}% | {:.4f} | {} / {} |{}\n", kv::to_string(r.format),
               kv::cell_bytes(r.format, config.n_kv_heads, config.head_dim), r.mean_kl(), 100 * r.top1_agreement(),
               r.perplexity(), r.greedy_same, r.greedy_tokens, needle_cell);
    std::fflush(stdout);
  }
}

struct CompareLogitsOptions {
  std::string reference, other, tokens;
  int64_t vocab = 0;
};

std::vector<float> read_logits(const std::string& path, int64_t vocab) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("compare-logits: cannot read {}", path);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  if (bytes.size() % (sizeof(float) * size_t(vocab)) != 0)
    fail("compare-logits: {} holds {} bytes, not whole rows of {} float32 logits", path, bytes.size(), vocab);
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

// Two [n, vocab] float32 logit files of the same tokens: mean KL(reference || other), top-1
// agreement, and with --tokens the perplexity of each over the next tokens.
void run_compare_logits(const CompareLogitsOptions& o) {
  const std::vector<float> a = read_logits(o.reference, o.vocab), b = read_logits(o.other, o.vocab);
  if (a.size() != b.size()) fail("compare-logits: the files hold {} and {} rows", a.size() / o.vocab, b.size() / o.vocab);
  if (a.empty()) fail("compare-logits: the files hold no logits");
  const std::vector<int32_t> tokens = o.tokens.empty() ? std::vector<int32_t>{} : parse_token_list(o.tokens);
  const int64_t rows = int64_t(a.size()) / o.vocab;
  if (!tokens.empty() && int64_t(tokens.size()) != rows)
    fail("compare-logits: --tokens gives {} ids for {} rows of logits (one id a row)", tokens.size(), rows);
  double kl = 0, nll_a = 0, nll_b = 0;
  int64_t same = 0, scored = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const auto ra = std::span(a).subspan(size_t(r * o.vocab), size_t(o.vocab));
    const auto rb = std::span(b).subspan(size_t(r * o.vocab), size_t(o.vocab));
    kl += engine::kl_divergence(ra, rb);
    same += std::max_element(ra.begin(), ra.end()) - ra.begin() == std::max_element(rb.begin(), rb.end()) - rb.begin();
    if (r + 1 < int64_t(tokens.size())) {
      nll_a += engine::token_nll(ra, tokens[size_t(r + 1)]);
      nll_b += engine::token_nll(rb, tokens[size_t(r + 1)]);
      ++scored;
    }
  }
  fmt::print("rows {}: mean KL {:.3e}, top-1 agreement {:.2f}%", rows, kl / double(rows), 100.0 * double(same) / double(rows));
  if (scored) fmt::print(", perplexity {:.4f} vs {:.4f}", std::exp(nll_a / double(scored)), std::exp(nll_b / double(scored)));
  fmt::print("\n");
}

}  // namespace

void add_compare_logits_command(CLI::App& app) {
  auto o = std::make_shared<CompareLogitsOptions>();
  auto* cmd = app.add_subcommand("compare-logits", "Mean KL and top-1 agreement of two [n, vocab] float32 logit files");
  cmd->add_option("reference", o->reference, "Logits of the reference run")->required()->check(CLI::ExistingFile);
  cmd->add_option("other", o->other, "Logits of the run compared with it")->required()->check(CLI::ExistingFile);
  cmd->add_option("--vocab", o->vocab, "Logits per row")->required()->check(integer_at_least(1));
  cmd->add_option("--tokens", o->tokens, "The token ids both ran (1,2,3): also prints each one's perplexity");
  cmd->callback([o] { run_compare_logits(*o); });
}

void add_kv_quality_command(CLI::App& app) {
  auto o = std::make_shared<KvQualityCliOptions>();
  auto* cmd = app.add_subcommand("kv-quality", "How far each K/V cache format moves the model from the fp32 (or another) cache");
  cmd->add_option("-m,--model", o->model, "GGUF model")->required();
  auto* text = cmd->add_option("-f,--file", o->text_file, "Text to run teacher-forced")->check(CLI::ExistingFile);
  auto* random = cmd->add_option("--random-tokens", o->random_tokens,
                                 "Instead of a text: this many random token ids (models without a tokenizer)")
                     ->check(integer_at_least(1));
  text->excludes(random);
  cmd->add_option("--max-tokens", o->max_tokens, "Use at most this many tokens of the text (default: all)")
      ->check(integer_at_least(0))
      ->excludes(random);  // (--random-tokens says how many itself)
  cmd->add_option("--reference", o->reference, "The format the others are compared with (default fp32)");
  cmd->add_option("--formats", o->formats,
                  "Formats to compare, comma-separated (default: every other one, and q4-unrotated)");
  cmd->add_option("--greedy", o->greedy, "Greedy tokens generated after the text and compared (default 256)")
      ->check(integer_at_least(0));
  cmd->add_option("--needles", o->needles_file, "Needle cases, JSON lines {prompt, answer} (tools/kv/needle_cases.py)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--needle-cases", o->needle_cases, "Use at most this many needle cases (default: all)");
  cmd->add_option("--threads", o->threads, "CPU threads (default: all cores)")->check(thread_count());
  add_backend_options(*cmd, o->backend);
  cmd->add_option("--formats-per-pass", o->formats_per_pass,
                  "Formats run beside one reference sequence at a time (default: all at once; on the GPU each "
                  "sequence holds its own copy of the weights, so a large model needs passes)")
      ->check(integer_at_least(0));
  cmd->add_option("--score-last", o->score_last,
                  "Compare the distributions of the text's last N positions only (default: all); the text before "
                  "them still runs, teacher-forced, so they see the whole context")
      ->check(integer_at_least(0));
  cmd->add_option("--chunk", o->chunk, "Prompt tokens per forward chunk (default 64)")->check(integer_at_least(1));
  cmd->add_option("--seed", o->seed, "Seed of --random-tokens (default 1)");
  cmd->callback([o] {
    if (o->text_file.empty() && o->random_tokens == 0) fail("kv-quality: give a text (-f FILE) or --random-tokens N");
    run_kv_quality(*o);
  });
}

}  // namespace lode::cli
