// Whether a text is the beginning of one JSON object (RFC 8259, an object at the root, whitespace
// before it allowed), read a byte at a time: what constrains a reply to JSON (`response_format`
// json_object, engine::JsonOutput). A copy is 32 bytes and allocates nothing, so a sampler can
// try many tokens' bytes from the same state (sample/json_tokens.h).
//
//   JsonPrefix p;
//   for (char c : text) if (!p.push(c)) { /* text is no JSON object's beginning */ }
//   p.complete();  // the object has closed: nothing more may follow
#pragma once
#include <array>
#include <cstdint>
#include <string_view>

namespace lode::sample {

class JsonPrefix {
 public:
  JsonPrefix() = default;
  // A prefix of one JSON value of any kind at the root (sample/json_schema.h reads a schema's free
  // values with it): a number there has no byte of its own that ends it, so push() refuses the
  // byte after it and can_end() says the value may end before that byte.
  static JsonPrefix any_value() {
    JsonPrefix p;
    p.any_root_ = true;
    return p;
  }
  // Objects and arrays open at once, at most; a byte that would open one more is refused.
  static constexpr int kMaxDepth = 64;
  // Whitespace bytes in a row outside strings, at most (a newline and an indent of 2 x 10 levels,
  // say, fit; llama.cpp's JSON grammar allows 21): without a bound a model can fill its token
  // limit with whitespace that is valid JSON, as lode-mini did.
  static constexpr int kMaxWhitespaceRun = 24;

  // Takes the next byte: false (and the state unchanged) when no JSON object begins with the text
  // so far and this byte, or when it is whitespace past kMaxWhitespaceRun. Bytes of 0x80 and up pass inside strings unchecked (UTF-8 is not
  // validated); control bytes never do.
  bool push(char c);
  bool push(std::string_view bytes);  // every byte, or false at the first refused one (state then partly advanced)
  bool complete() const { return done_; }
  // Whether the value is whole if it ends here: complete(), or a root number of any_value() that
  // may end before the next byte.
  bool can_end() const;
  // Inside a string, where a byte other than '"', '\\' and the control bytes leaves the state as it
  // is: what lets a sampler pass most tokens without trying them.
  bool in_string() const { return lex_ == Lex::string; }
  // Which bytes push() would take next.
  std::array<bool, 256> next_bytes() const;

 private:
  enum class Lex : uint8_t {
    value,         // a value must come (whitespace before it)
    value_or_close,  // after '[': a value or ']'
    key_or_close,  // after '{': a key or '}'
    key,           // after ',' in an object: a key
    colon,         // after a key
    comma_or_close,  // after a value inside a container
    string,        // inside a string
    escape,        // after a backslash
    unicode,       // inside \uXXXX (hex_left more digits)
    minus,         // after a number's '-'
    zero,          // a number's integer part is 0
    integer,       // inside a number's integer digits
    dot,           // after '.'
    fraction,      // inside the fraction digits
    exponent,      // after 'e'
    exponent_sign,  // after the exponent's sign
    exponent_digits,
    literal,       // inside true / false / null
  };
  bool push_byte(unsigned char c);  // counts whitespace runs, then read()
  bool read(unsigned char c);       // the byte in the current lexical state
  bool open(char container);   // '{' or '['
  bool close(char container);  // '}' or ']'
  bool end_value();            // a value has ended: what may follow it
  bool end_number_then(unsigned char c);
  char top() const { return (objects_ >> (depth_ - 1)) & 1 ? '{' : '['; }  // the innermost open container

  uint64_t objects_ = 0;  // bit d: the container open at depth d (0 the outermost) is an object, not an array
  int depth_ = 0;
  Lex lex_ = Lex::value;
  bool string_is_key_ = false;
  bool done_ = false;
  bool any_root_ = false;  // any_value(): the root may be any value
  uint8_t hex_left_ = 0;
  uint8_t whitespace_run_ = 0;
  const char* literal_ = nullptr;  // the rest of the literal being read
};

}  // namespace lode::sample
