// The streamed (SSE) side of a response: reads a job's output as it comes, turns it into OpenAI
// chunks, and writes them to the HTTP connection. When a write fails (the client went away) the job
// is cancelled, so the engine stops generating for nobody.
#pragma once
#include <httplib.h>

#include <memory>

#include "chat/output_parser.h"
#include "server/engine_worker.h"
#include "server/openai_response.h"

namespace lode::server {

// One step per call of httplib's chunked content provider: waits for the next output, writes its
// events; after the last one ([DONE]) it calls sink.done(). Returns false when the connection is
// gone (the job is then cancelled).
class ChatStreamWriter {
 public:
  ChatStreamWriter(std::shared_ptr<JobStream> job, ResponseMeta meta, chat::OutputParser parser, bool include_usage)
      : job_(std::move(job)), meta_(std::move(meta)), parser_(std::move(parser)), include_usage_(include_usage) {}
  bool step(httplib::DataSink& sink);

 private:
  bool write_delta(httplib::DataSink& sink, const chat::ParsedDelta& delta);

  std::shared_ptr<JobStream> job_;
  ResponseMeta meta_;
  chat::OutputParser parser_;
  bool include_usage_;
  bool started_ = false;
  bool any_tool_calls_ = false;
  int next_tool_index_ = 0;
};

class CompletionStreamWriter {
 public:
  CompletionStreamWriter(std::shared_ptr<JobStream> job, ResponseMeta meta, bool include_usage)
      : job_(std::move(job)), meta_(std::move(meta)), include_usage_(include_usage) {}
  bool step(httplib::DataSink& sink);

 private:
  std::shared_ptr<JobStream> job_;
  ResponseMeta meta_;
  bool include_usage_;
};

// Writes `text`; on failure cancels the job and returns false.
bool write_or_cancel(httplib::DataSink& sink, JobStream& job, const std::string& text);
// The job's next output. While none comes (the job waits for a slot, or a long prompt is being
// prefilled) it checks every quarter second that the client is still connected; when it is not,
// it cancels the job and returns nullopt, so a request abandoned in the queue frees its place.
std::optional<JobStream::Event> next_or_hang_up(JobStream& job, httplib::DataSink& sink);

}  // namespace lode::server
