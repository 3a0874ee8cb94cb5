// llama.cpp's names for the files of a split model: PREFIX-00001-of-00003.gguf.
#include <fmt/format.h>

#include <charconv>

#include "gguf/reader.h"

namespace lode::gguf {

std::string split_path(std::string_view prefix, int index, int count) {
  return fmt::format("{}-{:05d}-of-{:05d}.gguf", prefix, index, count);
}

std::string split_prefix(const std::filesystem::path& path) {
  std::string prefix = path.string();
  if (prefix.ends_with(".gguf")) prefix.resize(prefix.size() - 5);
  return prefix;
}

std::vector<std::filesystem::path> model_files(const std::filesystem::path& path) {
  const std::optional<SplitName> split = parse_split_path(path);
  if (!split) return {path};
  std::vector<std::filesystem::path> files;
  for (int i = 1; i <= split->count; ++i) files.emplace_back(split_path(split->prefix, i, split->count));
  return files;
}

std::optional<SplitName> parse_split_path(const std::filesystem::path& path) {
  // The tail "-NNNNN-of-NNNNN.gguf" is 20 characters; the counters are at least 5 digits.
  const std::string text = path.string();
  constexpr std::string_view kSuffix = ".gguf";
  if (text.size() < kSuffix.size() || !text.ends_with(kSuffix)) return std::nullopt;
  const std::string_view stem(text.data(), text.size() - kSuffix.size());
  const size_t of = stem.rfind("-of-");
  if (of == std::string_view::npos) return std::nullopt;
  const size_t dash = stem.rfind('-', of == 0 ? 0 : of - 1);
  if (dash == std::string_view::npos || dash >= of) return std::nullopt;
  const std::string_view index_text = stem.substr(dash + 1, of - dash - 1);
  const std::string_view count_text = stem.substr(of + 4);
  auto parse = [](std::string_view digits, int& out) {
    if (digits.size() < 5 || digits.size() > 9) return false;
    auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), out);
    return error == std::errc() && end == digits.data() + digits.size();
  };
  SplitName name;
  if (!parse(index_text, name.index) || !parse(count_text, name.count)) return std::nullopt;
  if (name.index < 1 || name.count < 1 || name.index > name.count) return std::nullopt;
  // The prefix must not end in a directory separator: "dir/-00001-of-00002.gguf" has none.
  name.prefix = std::string(stem.substr(0, dash));
  if (name.prefix.empty() || name.prefix.back() == '/') return std::nullopt;
  return name;
}

}  // namespace lode::gguf
