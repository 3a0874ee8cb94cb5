// Parsing one GGUF file's bytes (already mapped) into its header facts, metadata and tensors.
#pragma once
#include <filesystem>
#include <span>
#include <vector>

#include "gguf/reader.h"

namespace lode::gguf {

struct ParsedFile {
  FileInfo info;
  Metadata metadata;
  std::vector<TensorInfo> tensors;  // data pointers into the bytes given to parse_file()
};

// Validates everything (see reader.h); fails with a lode::Error naming `path`.
ParsedFile parse_file(std::span<const uint8_t> bytes, const std::filesystem::path& path);

}  // namespace lode::gguf
