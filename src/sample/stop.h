// Stop strings over streamed text: generation ends at the first stop string, and no byte of a
// stop string is ever shown, even when it arrives split over many tokens.
//
//   sample::StopMatcher stops({"</answer>", "\n\nUser:"});
//   for each token: auto r = stops.push(piece); show(r.emit); if (r.stopped) break;
//   at the end (no stop): show(stops.flush());
//
// push() holds back the longest suffix that could still grow into a stop string. When several
// stops match, the one that ends first wins (that is what a stream sees first, so the result does
// not depend on how the text was split); among those ending at the same byte, the one that starts
// first (the longer) wins, so none of its bytes are shown. Works on bytes: UTF-8 stop strings
// match exactly; holding back an incomplete UTF-8 character is the detokenizer's business.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace lode::sample {

class StopMatcher {
public:
  // An empty list never stops; an empty stop string fails (it would match before any text).
  explicit StopMatcher(std::vector<std::string> stops);

  struct Result {
    std::string emit;      // text safe to show now (on a stop: everything before the stop)
    bool stopped = false;  // a stop string matched; later pushes emit nothing
    std::string matched;   // the stop string that matched
  };
  Result push(std::string_view text);
  // Text no stop string may match into, or run across: an added token's (</think>, <tool_call>),
  // which is markup, not the reply's words. What was held back goes out first, then the text.
  Result push_opaque(std::string_view text);
  // End of generation: releases what was held back (nothing once stopped).
  std::string flush();

private:
  // Length of the longest suffix of held_ that is a proper prefix of some stop string.
  size_t longest_partial_suffix() const;

  std::vector<std::string> stops_;
  size_t longest_stop_ = 0;
  std::string held_;  // not yet shown: could be the start of a stop string
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace lode::sample
