// GPT-2's byte-level alphabet: every byte stands for one printable character, so any byte string
// can be spelled with vocabulary tokens. Printable Latin-1 bytes stand for themselves; the others
// for U+0100 + n in byte order.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lode::tokenizer {

// The 256 symbols as UTF-8 strings, indexed by byte.
const std::array<std::string, 256>& byte_symbols();

// The byte a symbol's code point stands for, or nothing when it is not one of the 256.
std::optional<uint8_t> symbol_byte(uint32_t code_point);

// A token's text in the byte-level alphabet back to raw bytes; nothing when it contains a
// character outside the alphabet.
std::optional<std::string> bytes_of_symbols(std::string_view symbols);

}  // namespace lode::tokenizer
