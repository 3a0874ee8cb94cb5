#include "server/streaming.h"

#include "server/api_error.h"

namespace lode::server {

bool write_or_cancel(httplib::DataSink& sink, JobStream& job, const std::string& text) {
  if (sink.write(text.data(), text.size())) return true;
  job.cancel();
  return false;
}

std::optional<JobStream::Event> next_or_hang_up(JobStream& job, httplib::DataSink& sink) {
  for (;;) {
    if (auto event = job.next_for(std::chrono::milliseconds(250))) return event;
    if (!sink.is_writable()) {
      job.cancel();
      return std::nullopt;
    }
  }
}

namespace {

// A generation that failed half-way: the status line has gone out, so the error goes in the stream.
bool write_error_and_end(httplib::DataSink& sink, JobStream& job, const std::string& message) {
  if (!write_or_cancel(sink, job, sse_event(error_body("generation failed: " + message, "server_error")))) return false;
  if (!write_or_cancel(sink, job, kSseDone)) return false;
  sink.done();
  return true;
}

// A choice chunk as an SSE event; with include_usage every such chunk carries "usage": null, as
// OpenAI's do (the usage chunk at the end carries the figures).
std::string chunk_event(nlohmann::ordered_json chunk, bool include_usage) {
  if (include_usage) chunk["usage"] = nullptr;
  return sse_event(chunk);
}

}  // namespace

bool ChatStreamWriter::write_chunk(httplib::DataSink& sink, nlohmann::ordered_json chunk) {
  if (logprobs_ && !unsent_.empty()) {
    chunk["choices"][0]["logprobs"] = chat_logprobs(unsent_, tokenizer_);
    unsent_.clear();
  }
  return write_or_cancel(sink, *job_, chunk_event(std::move(chunk), include_usage_));
}

bool ChatStreamWriter::write_delta(httplib::DataSink& sink, const chat::ParsedDelta& delta) {
  if (!delta.tool_calls.empty()) any_tool_calls_ = true;
  for (auto& chunk : chat_delta_chunks(meta_, delta, next_tool_index_))
    if (!write_chunk(sink, std::move(chunk))) return false;
  return true;
}

bool ChatStreamWriter::step(httplib::DataSink& sink) {
  if (!started_) {
    started_ = true;
    return write_or_cancel(sink, *job_, chunk_event(chat_chunk(meta_, {{"role", "assistant"}, {"content", ""}}),
                                                    include_usage_));
  }
  const auto next = next_or_hang_up(*job_, sink);
  if (!next) return false;
  const JobStream::Event& event = *next;
  unsent_.insert(unsent_.end(), event.logprobs.begin(), event.logprobs.end());
  if (!event.text.empty() && !write_delta(sink, parser_.push(event.text))) return false;
  if (!event.done) return true;
  if (event.error) return write_error_and_end(sink, *job_, *event.error);
  if (!write_delta(sink, parser_.finish())) return false;
  const engine::GenerateResult& result = *event.result;
  if (!write_chunk(sink, chat_chunk(meta_, nlohmann::ordered_json::object(), finish_reason(result.finish, any_tool_calls_))))
    return false;
  if (include_usage_ && !write_or_cancel(sink, *job_, sse_event(usage_chunk(meta_, result)))) return false;
  if (!write_or_cancel(sink, *job_, kSseDone)) return false;
  sink.done();
  return true;
}

bool CompletionStreamWriter::step(httplib::DataSink& sink) {
  const auto next = next_or_hang_up(*job_, sink);
  if (!next) return false;
  const JobStream::Event& event = *next;
  const nlohmann::ordered_json logprobs =
      logprobs_ ? completion_logprobs(event.logprobs, tokenizer_, text_offset_) : nlohmann::ordered_json(nullptr);
  if (!event.text.empty() &&
      !write_or_cancel(sink, *job_, chunk_event(text_completion_chunk(meta_, event.text, nullptr, logprobs), include_usage_)))
    return false;
  if (!event.done) return true;
  if (event.error) return write_error_and_end(sink, *job_, *event.error);
  const engine::GenerateResult& result = *event.result;
  if (!write_or_cancel(sink, *job_,
                       chunk_event(text_completion_chunk(meta_, "", finish_reason(result.finish, false)), include_usage_)))
    return false;
  if (include_usage_ && !write_or_cancel(sink, *job_, sse_event(usage_chunk(meta_, result, "text_completion"))))
    return false;
  if (!write_or_cancel(sink, *job_, kSseDone)) return false;
  sink.done();
  return true;
}

}  // namespace lode::server
