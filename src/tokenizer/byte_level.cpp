#include "tokenizer/byte_level.h"

#include "core/utf8.h"

namespace lode::tokenizer {
namespace {

bool stands_for_itself(uint32_t b) { return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174; }

struct Alphabet {
  std::array<std::string, 256> symbols;
  std::array<int16_t, 512> byte_of_code_point;  // every symbol is below U+0200; -1 when unused
  Alphabet() {
    byte_of_code_point.fill(-1);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const uint32_t cp = stands_for_itself(b) ? b : next++;
      utf8::append(symbols[b], cp);
      byte_of_code_point[cp] = int16_t(b);
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet a;
  return a;
}

}  // namespace

const std::array<std::string, 256>& byte_symbols() { return alphabet().symbols; }

std::optional<uint8_t> symbol_byte(uint32_t cp) {
  if (cp >= 512 || alphabet().byte_of_code_point[cp] < 0) return std::nullopt;
  return uint8_t(alphabet().byte_of_code_point[cp]);
}

std::optional<std::string> bytes_of_symbols(std::string_view symbols) {
  std::string out;
  out.reserve(symbols.size());
  for (size_t pos = 0; pos < symbols.size();) {
    const size_t len = utf8::valid_sequence_length(symbols, pos);
    if (len == 0) return std::nullopt;
    const auto b = symbol_byte(utf8::decode_sequence(symbols, pos, len));
    if (!b) return std::nullopt;
    out += char(*b);
    pos += len;
  }
  return out;
}

}  // namespace lode::tokenizer
