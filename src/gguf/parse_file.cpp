#include "gguf/parse_file.h"

#include <bit>

#include "gguf/byte_reader.h"
#include "gguf/parse_metadata.h"
#include "gguf/parse_tensors.h"
#include "gguf/tensor_shape.h"

namespace lode::gguf {
namespace {

// The fewest bytes a key/value pair can take: key length, one key byte, value type, a u8 value.
constexpr uint64_t kMinKeyValueBytes = 8 + 1 + 4 + 1;

void check_magic(std::span<const uint8_t> bytes, const std::string& file) {
  const char* start = reinterpret_cast<const char*>(bytes.data());
  const std::string_view head(start, std::min<size_t>(bytes.size(), 4));
  if (head == "GGUF") return;
  if (head == "FUGG")
    fail("{}: this is a big-endian GGUF file; lode reads little-endian GGUF only", file);
  if (head == "ggml" || head == "lmgg" || head == "fmgg" || head == "tjgg")
    fail("{}: this is a pre-GGUF ggml model file (GGML/GGMF/GGJT); convert it to GGUF with "
         "llama.cpp", file);
  std::string shown;
  for (size_t i = 0; i < head.size(); ++i)
    shown += fmt::format("{}{:02x}", i ? " " : "", uint8_t(head[i]));
  fail("{}: not a GGUF file (it starts with bytes {}; GGUF files start with \"GGUF\")", file,
       shown);
}

uint32_t check_version(ByteReader& in) {
  const uint32_t version = in.read<uint32_t>("the GGUF version");
  if (version == 2 || version == 3) return version;
  if (version == 1)
    in.fail_at(4, "GGUF version 1 is not supported (it predates 64-bit counts); re-convert the "
               "model with a current llama.cpp");
  const uint32_t swapped = __builtin_bswap32(version);
  if ((version & 0xffff) == 0 && swapped >= 1 && swapped <= 3)
    in.fail_at(4, "this is a big-endian GGUF file (version {} read byte-swapped as {}); lode reads "
               "little-endian GGUF only", swapped, version);
  in.fail_at(4, "unsupported GGUF version {} (lode reads versions 2 and 3)", version);
}

uint32_t alignment_of(const Metadata& metadata, const std::string& file) {
  const Value* value = metadata.find("general.alignment");
  if (!value) return kDefaultAlignment;
  if (value->type() != ValueType::U32)
    fail("{}: general.alignment is a {}, it must be a u32", file, value_type_name(value->type()));
  const uint32_t alignment = value->as_u32();
  if (!is_power_of_two(alignment))
    fail("{}: general.alignment is {}, it must be a non-zero power of two", file, alignment);
  return alignment;
}

}  // namespace

ParsedFile parse_file(std::span<const uint8_t> bytes, const std::filesystem::path& path) {
  const std::string file = path.string();
  check_magic(bytes, file);
  ByteReader in(bytes, file);
  in.read<uint32_t>("the magic");
  ParsedFile parsed{.info = {}, .metadata = Metadata(file), .tensors = {}};
  FileInfo& info = parsed.info;
  info.path = path;
  info.size = bytes.size();
  info.version = check_version(in);
  info.n_tensors = in.read<uint64_t>("the tensor count");
  info.n_metadata = in.read<uint64_t>("the metadata count");
  // Both counts must fit in what is left before anything is read or allocated for them.
  in.check_count(info.n_metadata, kMinKeyValueBytes, 16, "the metadata count");
  in.check_count(info.n_tensors, 8 + 1 + 4 + 8 + 4 + 8, 8, "the tensor count");
  read_metadata(in, info.n_metadata, parsed.metadata);
  info.alignment = alignment_of(parsed.metadata, file);
  parsed.tensors = read_tensor_infos(in, info.n_tensors);
  info.data_offset = align_up(in.offset(), info.alignment);
  place_tensor_data(parsed.tensors, bytes, info.data_offset, info.alignment, file);
  return parsed;
}

}  // namespace lode::gguf
