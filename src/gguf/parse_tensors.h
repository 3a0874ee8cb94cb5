// Reading GGUF tensor infos and locating each tensor's bytes, validating as it goes.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gguf/byte_reader.h"
#include "gguf/reader.h"

namespace lode::gguf {

// Reads n_tensors tensor infos (name, dims, type, offset) and checks each one's shape and type;
// data pointers are left for place_tensor_data().
std::vector<TensorInfo> read_tensor_infos(ByteReader& in, uint64_t n_tensors);

// Points each tensor into `file` (data section at data_offset), after checking its offset is
// aligned, its bytes lie inside the file, and no two tensors share bytes.
void place_tensor_data(std::vector<TensorInfo>& tensors, std::span<const uint8_t> file,
                       uint64_t data_offset, uint32_t alignment, const std::string& file_name);

}  // namespace lode::gguf
