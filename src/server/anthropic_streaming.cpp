#include "server/anthropic_streaming.h"

#include "server/anthropic_response.h"
#include "server/api_error.h"
#include "server/streaming.h"
#include "server/wire_json.h"

namespace lode::server {
namespace {

using json = nlohmann::ordered_json;

}  // namespace

bool MessagesStreamWriter::write(httplib::DataSink& sink, const json& event) {
  return write_or_cancel(sink, *job_, anthropic_sse(event));
}

bool MessagesStreamWriter::close_block(httplib::DataSink& sink) {
  if (open_ == Block::none) return true;
  open_ = Block::none;
  return write(sink, {{"type", "content_block_stop"}, {"index", next_index_ - 1}});
}

bool MessagesStreamWriter::write_text(httplib::DataSink& sink, Block kind, const std::string& text) {
  if (text.empty()) return true;
  const bool thinking = kind == Block::thinking;
  if (open_ != kind) {
    if (!close_block(sink)) return false;
    const json block = thinking ? json{{"type", "thinking"}, {"thinking", ""}, {"signature", ""}}
                                : json{{"type", "text"}, {"text", ""}};
    if (!write(sink, {{"type", "content_block_start"}, {"index", next_index_}, {"content_block", block}})) return false;
    open_ = kind;
    ++next_index_;
  }
  const json delta = thinking ? json{{"type", "thinking_delta"}, {"thinking", text}}
                              : json{{"type", "text_delta"}, {"text", text}};
  return write(sink, {{"type", "content_block_delta"}, {"index", next_index_ - 1}, {"delta", delta}});
}

bool MessagesStreamWriter::write_delta(httplib::DataSink& sink, const chat::ParsedDelta& delta) {
  if (!write_text(sink, Block::thinking, delta.reasoning)) return false;
  if (!write_text(sink, Block::text, delta.content)) return false;
  for (const auto& call : delta.tool_calls) {
    if (!close_block(sink)) return false;
    // The call is complete when the parser hands it over, so its input goes out in one delta.
    json block = tool_use_block(call, tool_use_id(meta_.id, tool_uses_++));
    const std::string input = wire_json(block["input"]);
    block["input"] = json::object();
    const int index = next_index_++;
    if (!write(sink, {{"type", "content_block_start"}, {"index", index}, {"content_block", block}})) return false;
    if (!write(sink, {{"type", "content_block_delta"}, {"index", index},
                      {"delta", {{"type", "input_json_delta"}, {"partial_json", input}}}}))
      return false;
    if (!write(sink, {{"type", "content_block_stop"}, {"index", index}})) return false;
  }
  return true;
}

bool MessagesStreamWriter::finish(httplib::DataSink& sink, const engine::GenerateResult& result) {
  if (!write_delta(sink, parser_.finish()) || !close_block(sink)) return false;
  const auto stop_sequence = matched_stop_sequence(result, tokenizer_, stop_);
  if (!write(sink, message_delta_event(stop_reason(result.finish, tool_uses_ > 0), stop_sequence, result)))
    return false;
  if (!write(sink, {{"type", "message_stop"}})) return false;
  sink.done();
  return true;
}

bool MessagesStreamWriter::step(httplib::DataSink& sink) {
  if (!started_) {
    started_ = true;
    return write(sink, message_start_event(meta_, input_tokens_));
  }
  const auto next = next_or_hang_up(*job_, sink);
  if (!next) return false;
  const JobStream::Event& event = *next;
  if (!event.text.empty() && !write_delta(sink, parser_.push(event.text))) return false;
  if (!event.done) return true;
  if (event.error) {
    // The status line has gone out, so the error goes in the stream.
    if (!write(sink, ApiError(500, "server_error", "generation failed: " + *event.error).anthropic_body())) return false;
    sink.done();
    return true;
  }
  return finish(sink, *event.result);
}

}  // namespace lode::server
