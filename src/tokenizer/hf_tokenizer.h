// A Hugging Face tokenizer.json (byte-level BPE) as GGUF tokenizer.ggml.* metadata, the way
// llama.cpp's converter stores it: tokens padded to the model's vocabulary with unused [PAD<id>]
// entries, merges as "left right", added tokens typed control (special) or user-defined.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <filesystem>
#include <string>

#include "gguf/metadata.h"

namespace lode::tokenizer {

nlohmann::json read_tokenizer_json(const std::filesystem::path& path);  // fails naming the file

// Highest token id + 1 (the vocabulary a model needs at least).
int64_t hf_token_count(const nlohmann::json& tokenizer_json);

// The tokenizer.ggml.pre family whose regex the file's pre-tokenizer uses; fails when lode does
// not know it.
std::string hf_pre_tokenizer(const nlohmann::json& tokenizer_json);

// Writes tokenizer.ggml.{model,pre,tokens,token_type,merges}, the special ids
// (eos = <|im_end|>, padding = <|endoftext|>) and add_bos_token = false. vocab >= hf_token_count.
void store_hf_tokenizer(const nlohmann::json& tokenizer_json, int64_t vocab, gguf::Metadata& metadata);

}  // namespace lode::tokenizer
