// Splits what a Qwen3.5 model generates after the generation prompt into reasoning, visible
// content and tool calls, as the text streams in.
//
// The text starts inside the <think> block when the prompt left it open; `</think>` (and the
// newlines after it) ends the reasoning. Tool calls look like
//   <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>
// where the newlines are optional. Whitespace right before `</think>` and `<tool_call>` and
// newlines right after `</think>` and `</tool_call>` are layout, not text, and are dropped
// (unless the "call" turns out malformed or unterminated: then all of it comes back as content).
#pragma once
#include "chat/template.h"

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace lode::chat {

struct ParsedDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCall> tool_calls;  // complete calls only, ids call_0, call_1, ... per parser
};

class OutputParser {
 public:
  // thinking_open: the prompt ended inside <think>. tools: the tool definitions (JSON array or
  // null), used to convert parameter values by their JSON-schema type (string stays string;
  // integer/number/boolean/object/array parsed as JSON; unknown: JSON if it parses, else string).
  OutputParser(bool thinking_open, nlohmann::ordered_json tools);

  // New text; returns what is now certain. Text that may still turn out to be (part of) a tag,
  // or layout around one, is held back until the next push() or finish() decides it.
  ParsedDelta push(std::string_view text);

  // End of generation: returns what was held back, verbatim. A tool call that never closed comes
  // back as content, so no text is lost. Call once, after the last push().
  ParsedDelta finish();

 private:
  enum class Mode { start, reasoning, content, tool_call };
  // Parameter name -> accepted JSON-schema types, per tool name.
  using ParameterTypes = std::map<std::string, std::map<std::string, std::vector<std::string>>>;

  bool step(ParsedDelta& out);  // one decision on pending_; false when it needs more text
  bool step_start();
  bool step_reasoning(ParsedDelta& out);
  bool step_content(ParsedDelta& out);
  bool step_tool_call(ParsedDelta& out);
  void drop_layout_newlines();
  bool emit_call_block(std::string_view block, ParsedDelta& out);  // false: not a call, as text

  Mode mode_ = Mode::start;
  bool thinking_open_;
  bool drop_newlines_ = false;      // newlines at the front of pending_ are layout after a tag
  std::string pending_;             // text not decided yet
  std::string layout_before_call_;  // whitespace dropped before the open <tool_call>
  std::size_t call_end_search_ = 0; // where to resume looking for </tool_call> in pending_
  int next_call_id_ = 0;
  ParameterTypes parameter_types_;
};

}  // namespace lode::chat
