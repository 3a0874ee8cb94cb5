// The streamed (SSE) side of a response: reads a job's output as it comes, turns it into OpenAI
// chunks, and writes them to the HTTP connection. When a write fails (the client went away) the job
// is cancelled, so the engine stops generating for nobody.
#pragma once
#include <httplib.h>

#include <memory>
#include <vector>

#include "chat/output_parser.h"
#include "server/engine_worker.h"
#include "server/openai_response.h"

namespace lode::server {

// One step per call of httplib's chunked content provider: waits for the next output, writes its
// events; after the last one ([DONE]) it calls sink.done(). Returns false when the connection is
// gone (the job is then cancelled).
// With logprobs asked for (GenerateOptions::logprobs), a chunk carries the logprobs entries of the
// tokens whose text reached the writer since the chunk before (text the output parser holds back
// takes its entries to the next chunk it writes).
class ChatStreamWriter {
 public:
  ChatStreamWriter(std::shared_ptr<JobStream> job, ResponseMeta meta, chat::OutputParser parser, bool include_usage,
                   const tokenizer::Tokenizer& tokenizer, bool logprobs)
      : job_(std::move(job)), meta_(std::move(meta)), parser_(std::move(parser)), include_usage_(include_usage),
        tokenizer_(tokenizer), logprobs_(logprobs) {}
  bool step(httplib::DataSink& sink);

 private:
  bool write_delta(httplib::DataSink& sink, const chat::ParsedDelta& delta);
  // A choice chunk, carrying the entries not yet sent.
  bool write_chunk(httplib::DataSink& sink, nlohmann::ordered_json chunk);

  std::shared_ptr<JobStream> job_;
  ResponseMeta meta_;
  chat::OutputParser parser_;
  bool include_usage_;
  const tokenizer::Tokenizer& tokenizer_;
  bool logprobs_;
  std::vector<sample::TokenLogprobs> unsent_;
  bool started_ = false;
  bool any_tool_calls_ = false;
  int next_tool_index_ = 0;
};

class CompletionStreamWriter {
 public:
  CompletionStreamWriter(std::shared_ptr<JobStream> job, ResponseMeta meta, bool include_usage,
                         const tokenizer::Tokenizer& tokenizer, bool logprobs)
      : job_(std::move(job)), meta_(std::move(meta)), include_usage_(include_usage), tokenizer_(tokenizer),
        logprobs_(logprobs) {}
  bool step(httplib::DataSink& sink);

 private:
  std::shared_ptr<JobStream> job_;
  ResponseMeta meta_;
  bool include_usage_;
  const tokenizer::Tokenizer& tokenizer_;
  bool logprobs_;
  int64_t text_offset_ = 0;  // characters streamed (the logprobs' text_offset)
};

// Writes `text`; on failure cancels the job and returns false.
bool write_or_cancel(httplib::DataSink& sink, JobStream& job, const std::string& text);
// The job's next output. While none comes (the job waits for a slot, or a long prompt is being
// prefilled) it checks every quarter second that the client is still connected; when it is not,
// it cancels the job and returns nullopt, so a request abandoned in the queue frees its place.
std::optional<JobStream::Event> next_or_hang_up(JobStream& job, httplib::DataSink& sink);

}  // namespace lode::server
