#include "sample/json_prefix.h"

namespace lode::sample {

namespace {

bool whitespace(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool digit(unsigned char c) { return c >= '0' && c <= '9'; }
bool hex(unsigned char c) { return digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

}  // namespace

bool JsonPrefix::push(char c) {
  const JsonPrefix before = *this;
  if (push_byte(static_cast<unsigned char>(c))) return true;
  *this = before;
  return false;
}

bool JsonPrefix::push(std::string_view bytes) {
  for (char c : bytes)
    if (!push_byte(static_cast<unsigned char>(c))) return false;
  return true;
}

bool JsonPrefix::can_end() const {
  if (done_) return true;
  const bool number_whole = lex_ == Lex::zero || lex_ == Lex::integer || lex_ == Lex::fraction ||
                            lex_ == Lex::exponent_digits;
  return any_root_ && depth_ == 0 && number_whole;
}

std::array<bool, 256> JsonPrefix::next_bytes() const {
  std::array<bool, 256> takes{};
  for (int c = 0; c < 256; ++c) {
    JsonPrefix after = *this;
    takes[size_t(c)] = after.push_byte(static_cast<unsigned char>(c));
  }
  return takes;
}

bool JsonPrefix::open(char container) {
  if (depth_ == kMaxDepth) return false;
  const uint64_t bit = uint64_t(1) << depth_++;
  objects_ = container == '{' ? objects_ | bit : objects_ & ~bit;
  lex_ = container == '{' ? Lex::key_or_close : Lex::value_or_close;
  return true;
}

bool JsonPrefix::close(char container) {
  if (depth_ == 0 || top() != container) return false;
  --depth_;
  return end_value();
}

bool JsonPrefix::end_value() {
  if (depth_ == 0) done_ = true;  // (only the root object ends at depth 0)
  else lex_ = Lex::comma_or_close;
  return true;
}

// A number ends at the first byte that cannot continue it, which is then read after the number
// (a root number of any_value() has nothing after it: the byte is refused, can_end() true).
bool JsonPrefix::end_number_then(unsigned char c) {
  if (depth_ == 0) return false;
  end_value();
  return read(c);
}

bool JsonPrefix::push_byte(unsigned char c) {
  if (done_) return false;
  if (lex_ != Lex::string && lex_ != Lex::escape && lex_ != Lex::unicode) {
    if (!whitespace(c)) whitespace_run_ = 0;
    else if (whitespace_run_ == kMaxWhitespaceRun) return false;
    else ++whitespace_run_;
  }
  return read(c);
}

bool JsonPrefix::read(unsigned char c) {
  switch (lex_) {
    case Lex::value:
    case Lex::value_or_close:
      if (whitespace(c)) return true;
      if (depth_ == 0 && !any_root_) return c == '{' && open('{');  // the root is an object
      if (c == ']' && lex_ == Lex::value_or_close) return close('[');
      if (c == '{' || c == '[') return open(char(c));
      if (c == '"') return string_is_key_ = false, lex_ = Lex::string, true;
      if (c == '-') return lex_ = Lex::minus, true;
      if (c == '0') return lex_ = Lex::zero, true;
      if (digit(c)) return lex_ = Lex::integer, true;
      literal_ = c == 't' ? "rue" : c == 'f' ? "alse" : c == 'n' ? "ull" : nullptr;
      return literal_ && (lex_ = Lex::literal, true);
    case Lex::key_or_close:
      if (c == '}') return close('{');
      [[fallthrough]];
    case Lex::key:
      if (whitespace(c)) return true;
      return c == '"' && (string_is_key_ = true, lex_ = Lex::string, true);
    case Lex::colon:
      if (whitespace(c)) return true;
      return c == ':' && (lex_ = Lex::value, true);
    case Lex::comma_or_close: {
      if (whitespace(c)) return true;
      if (c == ',') return lex_ = top() == '{' ? Lex::key : Lex::value, true;
      return (c == '}' || c == ']') && close(c == '}' ? '{' : '[');
    }
    case Lex::string:
      if (c == '"') return string_is_key_ ? (lex_ = Lex::colon, true) : end_value();
      if (c == '\\') return lex_ = Lex::escape, true;
      return c >= 0x20;
    case Lex::escape:
      if (c == 'u') return hex_left_ = 4, lex_ = Lex::unicode, true;
      for (char e : {'"', '\\', '/', 'b', 'f', 'n', 'r', 't'})
        if (c == static_cast<unsigned char>(e)) return lex_ = Lex::string, true;
      return false;
    case Lex::unicode:
      if (!hex(c)) return false;
      if (--hex_left_ == 0) lex_ = Lex::string;
      return true;
    case Lex::minus:
      if (c == '0') return lex_ = Lex::zero, true;
      return digit(c) && (lex_ = Lex::integer, true);
    case Lex::zero:
    case Lex::integer:
      if (digit(c) && lex_ == Lex::integer) return true;
      if (c == '.') return lex_ = Lex::dot, true;
      if (c == 'e' || c == 'E') return lex_ = Lex::exponent, true;
      return end_number_then(c);
    case Lex::dot:
      return digit(c) && (lex_ = Lex::fraction, true);
    case Lex::fraction:
      if (digit(c)) return true;
      if (c == 'e' || c == 'E') return lex_ = Lex::exponent, true;
      return end_number_then(c);
    case Lex::exponent:
      if (c == '+' || c == '-') return lex_ = Lex::exponent_sign, true;
      [[fallthrough]];
    case Lex::exponent_sign:
      return digit(c) && (lex_ = Lex::exponent_digits, true);
    case Lex::exponent_digits:
      if (digit(c)) return true;
      return end_number_then(c);
    case Lex::literal:
      if (c != static_cast<unsigned char>(*literal_)) return false;
      if (*++literal_ == '\0') return end_value();
      return true;
  }
  return false;
}

}  // namespace lode::sample
