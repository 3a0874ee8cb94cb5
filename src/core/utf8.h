// UTF-8 helpers shared by the tokenizer, the chat template's Python semantics and GGUF rendering:
// appending a code point, validating one sequence (the way a decoder with replacement would), and
// finding an incomplete character at the end of a buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace lode::utf8 {

void append(std::string& out, uint32_t code_point);

// Length (1..4) of the well-formed UTF-8 sequence starting at text[pos], or 0 when the byte there
// does not start one (a stray continuation byte, an overlong or surrogate form, a truncated
// sequence). Follows the Unicode "maximal subpart" rules, so 0xED 0xA0 0x80 is invalid.
size_t valid_sequence_length(std::string_view text, size_t pos);

// Decodes the well-formed sequence of `length` bytes at text[pos].
uint32_t decode_sequence(std::string_view text, size_t pos, size_t length);

// Bytes at the end of `text` that begin a character whose remaining bytes have not arrived yet
// (0 when the text ends on a character boundary or with bytes that can never become valid).
size_t incomplete_tail_length(std::string_view text);

}  // namespace lode::utf8
