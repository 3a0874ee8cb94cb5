#include "core/utf8.h"

namespace lode::utf8 {

void append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

namespace {

// Expected length of a sequence led by `lead`, and the allowed range of its second byte
// (Unicode Table 3-7); 0 for bytes that never lead.
struct LeadRule {
  size_t length;
  uint8_t second_lo, second_hi;
};

LeadRule lead_rule(uint8_t lead) {
  if (lead < 0x80) return {1, 0, 0};
  if (lead >= 0xC2 && lead <= 0xDF) return {2, 0x80, 0xBF};
  if (lead == 0xE0) return {3, 0xA0, 0xBF};
  if ((lead >= 0xE1 && lead <= 0xEC) || lead == 0xEE || lead == 0xEF) return {3, 0x80, 0xBF};
  if (lead == 0xED) return {3, 0x80, 0x9F};
  if (lead == 0xF0) return {4, 0x90, 0xBF};
  if (lead >= 0xF1 && lead <= 0xF3) return {4, 0x80, 0xBF};
  if (lead == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

bool is_continuation(uint8_t b) { return (b & 0xC0) == 0x80; }

// How many bytes starting at pos agree with a well-formed sequence (at most rule.length).
size_t matching_prefix(std::string_view text, size_t pos, const LeadRule& rule) {
  size_t n = 1;
  if (pos + 1 >= text.size()) return n;
  const uint8_t second = uint8_t(text[pos + 1]);
  if (second < rule.second_lo || second > rule.second_hi) return n;
  for (n = 2; n < rule.length && pos + n < text.size() && is_continuation(uint8_t(text[pos + n])); ++n) {
  }
  return n;
}

}  // namespace

size_t valid_sequence_length(std::string_view text, size_t pos) {
  const LeadRule rule = lead_rule(uint8_t(text[pos]));
  if (rule.length <= 1) return rule.length;
  return matching_prefix(text, pos, rule) == rule.length ? rule.length : 0;
}

uint32_t decode_sequence(std::string_view text, size_t pos, size_t length) {
  const uint8_t lead = uint8_t(text[pos]);
  if (length == 1) return lead;
  uint32_t cp = lead & (0xFF >> (length + 1));
  for (size_t i = 1; i < length; ++i) cp = (cp << 6) | (uint8_t(text[pos + i]) & 0x3F);
  return cp;
}

size_t incomplete_tail_length(std::string_view text) {
  // A character is at most 4 bytes: only the last 3 can be an unfinished one.
  const size_t from = text.size() > 3 ? text.size() - 3 : 0;
  for (size_t pos = from; pos < text.size(); ++pos) {
    const LeadRule rule = lead_rule(uint8_t(text[pos]));
    if (rule.length <= 1) continue;
    const size_t have = text.size() - pos;
    if (have < rule.length && matching_prefix(text, pos, rule) == have) return have;
  }
  return 0;
}

}  // namespace lode::utf8
