#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pre_split.h"

#include <pcre2.h>

#include <array>

#include "core/error.h"

namespace lode::tokenizer {
namespace {

// Qwen3.5 joins combining marks (\p{M}) to letters; Qwen2/Qwen3 do not. Both HF files declare an
// NFC normaliser. The llama-3 and GPT-2 patterns are the other common byte-level families.
constexpr std::array<PreTokenizerSpec, 4> kSpecs{{
    {"qwen35",
     R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     true},
    {"qwen2",
     R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     true},
    {"llama-bpe",
     R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     false},
    {"gpt2", R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)", false},
}};

}  // namespace

std::string supported_pre_tokenizers() {
  std::string names;
  for (const auto& s : kSpecs) names += (names.empty() ? "" : ", ") + std::string(s.name);
  return names;
}

const PreTokenizerSpec& pre_tokenizer_spec(std::string_view pre) {
  // llama.cpp writes "default" (and older files nothing) for GPT-2's own pattern.
  if (pre.empty() || pre == "default") pre = "gpt2";
  for (const auto& s : kSpecs)
    if (s.name == pre) return s;
  fail("tokenizer.ggml.pre '{}' is not supported; lode knows {} (ask for it, or re-convert the "
       "model with one of these)", pre, supported_pre_tokenizers());
}

struct PreSplitter::Compiled {
  pcre2_code* code = nullptr;
  ~Compiled() { pcre2_code_free(code); }
};

PreSplitter::PreSplitter(std::string_view pattern) : compiled_(std::make_unique<Compiled>()) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                  PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (!compiled_->code) {
    std::array<PCRE2_UCHAR, 256> message{};
    pcre2_get_error_message(error, message.data(), message.size());
    fail("pre-tokenizer regex does not compile at offset {}: {}", offset,
         reinterpret_cast<const char*>(message.data()));
  }
  // Without JIT (an exotic build) pcre2_match interprets the same pattern, only slower.
  pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE);
}

PreSplitter::~PreSplitter() = default;

void PreSplitter::split(std::string_view text, std::vector<std::string_view>& pieces) const {
  if (text.empty()) return;
  // Match data and a JIT stack per call keep the splitter shareable between threads; long runs of
  // one class (a 100 KB word) need more than PCRE2's default 32 KiB JIT stack.
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> data(
      pcre2_match_data_create_from_pattern(compiled_->code, nullptr), pcre2_match_data_free);
  std::unique_ptr<pcre2_jit_stack, void (*)(pcre2_jit_stack*)> stack(
      pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr), pcre2_jit_stack_free);
  std::unique_ptr<pcre2_match_context, void (*)(pcre2_match_context*)> context(
      pcre2_match_context_create(nullptr), pcre2_match_context_free);
  if (!data || !stack || !context) fail("out of memory while splitting text");
  pcre2_jit_stack_assign(context.get(), nullptr, stack.get());
  // A long run of one class costs backtracking steps in proportion to its length (a pattern's
  // `\s*[\r\n]+` takes a run of spaces, then gives it back): PCRE2's default limit of ten million
  // refused a 10 MB run of spaces.
  pcre2_set_match_limit(context.get(), UINT32_MAX);

  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t done = 0;  // text before this is in `pieces`
  size_t from = 0;
  while (from < text.size()) {
    const int rc = pcre2_match(compiled_->code, subject, text.size(), from, PCRE2_NO_UTF_CHECK,
                               data.get(), context.get());
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(rc, message.data(), message.size());
      fail("pre-tokenizer regex failed at byte {}: {}", from, reinterpret_cast<const char*>(message.data()));
    }
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    const size_t begin = ovector[0], end = ovector[1];
    if (begin > done) pieces.push_back(text.substr(done, begin - done));
    if (end > begin) {
      pieces.push_back(text.substr(begin, end - begin));
      done = from = end;
    } else {  // an empty match cannot happen with these patterns; step over one character
      from = begin + 1;
      while (from < text.size() && (uint8_t(text[from]) & 0xC0) == 0x80) ++from;
      done = begin;
    }
  }
  if (done < text.size()) pieces.push_back(text.substr(done));
}

}  // namespace lode::tokenizer
