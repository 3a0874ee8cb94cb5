// The streamed side of /v1/messages: Anthropic's SSE events. message_start first; then the output
// as content blocks, each opened (content_block_start), filled (thinking_delta, text_delta, or one
// input_json_delta holding a tool's whole input) and closed (content_block_stop), a new block
// starting whenever the kind of output changes; then message_delta (stop_reason, output usage) and
// message_stop. A failure mid-stream is an `error` event. A failed write cancels the job.
#pragma once
#include <httplib.h>

#include <memory>
#include <string>
#include <vector>

#include "chat/output_parser.h"
#include "server/engine_worker.h"
#include "server/openai_response.h"
#include "tokenizer/tokenizer.h"

namespace lode::server {

class MessagesStreamWriter {
 public:
  MessagesStreamWriter(std::shared_ptr<JobStream> job, ResponseMeta meta, chat::OutputParser parser,
                       int64_t input_tokens, std::vector<std::string> stop, const tokenizer::Tokenizer& tokenizer)
      : job_(std::move(job)), meta_(std::move(meta)), parser_(std::move(parser)), input_tokens_(input_tokens),
        stop_(std::move(stop)), tokenizer_(tokenizer) {}
  // One step per call of httplib's chunked content provider; false when the connection is gone.
  bool step(httplib::DataSink& sink);

 private:
  enum class Block { none, thinking, text };
  bool write(httplib::DataSink& sink, const nlohmann::ordered_json& event);
  bool write_delta(httplib::DataSink& sink, const chat::ParsedDelta& delta);
  bool write_text(httplib::DataSink& sink, Block kind, const std::string& text);  // opens the block if needed
  bool close_block(httplib::DataSink& sink);
  bool finish(httplib::DataSink& sink, const engine::GenerateResult& result);

  std::shared_ptr<JobStream> job_;
  ResponseMeta meta_;
  chat::OutputParser parser_;
  int64_t input_tokens_;
  std::vector<std::string> stop_;
  const tokenizer::Tokenizer& tokenizer_;
  bool started_ = false;
  Block open_ = Block::none;
  int next_index_ = 0;  // the index the next content block gets
  int tool_uses_ = 0;
};

}  // namespace lode::server
