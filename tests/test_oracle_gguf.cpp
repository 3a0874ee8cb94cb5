// A GGUF written by ggml's own writer (tests/data/ggml/all_types.gguf, made by
// tools/oracle/gen_gguf.c) read by lode: the metadata ggml wrote (one key of every value type, one
// array of every element type), every tensor's name, type, shape and bytes, lode's dequantization
// of each against ggml's floats bit for bit, and the same floats through `lode dump`.
// Expected tensors come from the sidecar all_types.expected (format in gen_gguf.c).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.h"
#include "gguf/reader.h"
#include "support/paths.h"
#include "test_gguf_helpers.h"

using namespace lode::gguf;

namespace {

const std::filesystem::path kGgufPath = lode::test::test_data() / "ggml" / "all_types.gguf";
const std::filesystem::path kSidecarPath =
    lode::test::test_data() / "ggml" / "all_types.expected";

// --- what ggml wrote --------------------------------------------------------------------------

// The keys gen_gguf.c's set_metadata() sets, in its order (ggml writes keys in insertion order).
std::vector<KeyValue> expected_metadata() {
  return {
      {"general.architecture", Value("oracle")},
      {"general.name", Value("ggml oracle: every value type and tensor type")},
      {"oracle.u8", Value(uint8_t(200))},
      {"oracle.i8", Value(int8_t(-100))},
      {"oracle.u16", Value(uint16_t(60000))},
      {"oracle.i16", Value(int16_t(-30000))},
      {"oracle.u32", Value(uint32_t(4000000000u))},
      {"oracle.i32", Value(int32_t(-2000000000))},
      {"oracle.f32", Value(3.14159274f)},
      {"oracle.u64", Value(uint64_t(18000000000000000000ull))},
      {"oracle.i64", Value(int64_t(-9000000000000000000ll))},
      {"oracle.f64", Value(2.718281828459045)},
      {"oracle.bool", Value(true)},
      {"oracle.string", Value("héllo, ggml ✓")},
      {"oracle.empty_string", Value("")},
      {"oracle.array.u8", Value(Array(std::vector<uint8_t>{0, 1, 255}))},
      {"oracle.array.i8", Value(Array(std::vector<int8_t>{-128, 0, 127}))},
      {"oracle.array.u16", Value(Array(std::vector<uint16_t>{0, 65535}))},
      {"oracle.array.i16", Value(Array(std::vector<int16_t>{-32768, 32767, 1}))},
      {"oracle.array.u32", Value(Array(std::vector<uint32_t>{0, 1, 4294967295u, 7}))},
      {"oracle.array.i32", Value(Array(std::vector<int32_t>{-2147483647 - 1, 2147483647}))},
      {"oracle.array.f32", Value(Array(std::vector<float>{0.5f, -1.25f, 1e-30f, 3.4e38f}))},
      {"oracle.array.bool", Value(Array(std::vector<bool>{true, false, true}))},
      {"oracle.array.u64", Value(Array(std::vector<uint64_t>{0, 18446744073709551615ull}))},
      {"oracle.array.i64",
       Value(Array(std::vector<int64_t>{-9223372036854775807ll - 1, 9223372036854775807ll, -1}))},
      {"oracle.array.f64", Value(Array(std::vector<double>{1.0 / 3.0, -1e300}))},
      {"oracle.array.empty", Value(Array::empty(ValueType::U32))},
      {"oracle.array.string",
       Value(Array(std::vector<std::string>{"alpha", "", "ünïcöde", "a longer string, with spaces"}))},
  };
}

struct ExpectedTensor {
  std::string name;
  uint32_t ggml_type = 0;
  std::vector<int64_t> ne;
  std::vector<uint8_t> bytes;
  std::vector<float> dequantized;
};

// Reads all_types.expected; throws lode::Error when it is missing or malformed.
std::vector<ExpectedTensor> load_expected() {
  std::ifstream in(kSidecarPath, std::ios::binary);
  if (!in) lode::fail("{}: cannot open (regenerate with tools/oracle/generate)", kSidecarPath.string());
  const std::vector<uint8_t> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t pos = 0;
  auto read = [&](void* dst, uint64_t n) {
    if (n > data.size() - pos) lode::fail("{}: truncated at offset {}", kSidecarPath.string(), pos);
    if (n) std::memcpy(dst, data.data() + pos, n);
    pos += n;
  };
  auto u32 = [&] {
    uint32_t v;
    read(&v, 4);
    return v;
  };
  auto u64 = [&] {
    uint64_t v;
    read(&v, 8);
    return v;
  };
  char magic[4];
  read(magic, 4);
  if (std::memcmp(magic, "LGGX", 4) != 0 || u32() != 1)
    lode::fail("{}: not a version 1 sidecar", kSidecarPath.string());
  std::vector<ExpectedTensor> tensors(u32());
  for (ExpectedTensor& t : tensors) {
    t.name.resize(u32());
    read(t.name.data(), t.name.size());
    t.ggml_type = u32();
    t.ne.resize(u32());
    read(t.ne.data(), t.ne.size() * sizeof(int64_t));
    t.bytes.resize(u64());
    read(t.bytes.data(), t.bytes.size());
    t.dequantized.resize(u64());
    read(t.dequantized.data(), t.dequantized.size() * sizeof(float));
  }
  if (pos != data.size()) lode::fail("{}: {} trailing bytes", kSidecarPath.string(), data.size() - pos);
  return tensors;
}

// Empty when the two agree bit for bit; else where and how they first differ.
std::string compare_bits(const float* ours, const std::vector<float>& ggml) {
  for (size_t i = 0; i < ggml.size(); ++i) {
    const uint32_t a = std::bit_cast<uint32_t>(ours[i]), b = std::bit_cast<uint32_t>(ggml[i]);
    if (a != b)
      return fmt::format("index {}: lode {} (0x{:08x}), ggml {} (0x{:08x})", i, ours[i], a, ggml[i], b);
  }
  return {};
}

// --- the tests ---------------------------------------------------------------------------------

TEST(OracleGguf, FileLayoutIsGgmlsDefault) {
  const Reader reader(kGgufPath);
  EXPECT_EQ(reader.version(), 3u);
  EXPECT_EQ(reader.alignment(), kDefaultAlignment);
  EXPECT_FALSE(reader.is_split());
  EXPECT_EQ(reader.files().front().n_metadata, expected_metadata().size());
  EXPECT_EQ(reader.files().front().n_tensors, load_expected().size());
}

TEST(OracleGguf, MetadataIsWhatGgmlWrote) {
  const Reader reader(kGgufPath);
  const Metadata& metadata = reader.metadata();
  const std::vector<KeyValue> expected = expected_metadata();
  ASSERT_EQ(metadata.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const KeyValue& want = expected[i];
    EXPECT_EQ(metadata.entries()[i].key, want.key) << "key " << i << " out of order";
    const Value* have = metadata.find(want.key);
    ASSERT_NE(have, nullptr) << want.key << " is missing";
    EXPECT_EQ(value_type_name(have->type()), std::string(value_type_name(want.value.type()))) << want.key;
    if (have->type() == ValueType::Array && want.value.type() == ValueType::Array)
      EXPECT_EQ(value_type_name(have->as_array().element_type()),
                std::string(value_type_name(want.value.as_array().element_type())))
          << want.key << " element type";
    EXPECT_TRUE(*have == want.value) << want.key << ": lode read " << render(*have) << ", ggml wrote "
                                     << render(want.value);
  }
}

TEST(OracleGguf, TensorsAreGgmlsBytesAndDequantizeToGgmlsFloats) {
  const Reader reader(kGgufPath);
  const std::vector<ExpectedTensor> expected = load_expected();
  ASSERT_EQ(reader.tensors().size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    const ExpectedTensor& want = expected[i];
    const TensorInfo& t = reader.tensors()[i];
    SCOPED_TRACE(want.name);
    EXPECT_EQ(t.name, want.name);
    EXPECT_EQ(uint32_t(t.ggml_type()), want.ggml_type);
    ASSERT_EQ(size_t(t.n_dims), want.ne.size());
    for (size_t d = 0; d < want.ne.size(); ++d) EXPECT_EQ(t.ne[d], want.ne[d]) << "ne[" << d << "]";
    EXPECT_EQ(t.offset % reader.alignment(), 0u) << "data not aligned";
    ASSERT_EQ(t.size, want.bytes.size());
    const uint8_t* mine = std::mismatch(t.data, t.data + t.size, want.bytes.begin()).first;
    EXPECT_TRUE(mine == t.data + t.size)
        << "tensor bytes differ from what ggml wrote, first at byte " << (mine - t.data);

    ASSERT_NE(t.type->dequantize, nullptr) << "lode cannot dequantize " << t.type->name;
    ASSERT_EQ(size_t(t.n_elements()), want.dequantized.size());
    std::vector<float> ours(want.dequantized.size());
    try {
      t.type->dequantize(t.data, ours.data(), t.n_elements());
    } catch (const lode::Error& e) {
      ADD_FAILURE() << "dequantize threw: " << e.what();
      continue;
    }
    const std::string mismatch = compare_bits(ours.data(), want.dequantized);
    EXPECT_TRUE(mismatch.empty()) << t.type->name << " dequantization differs from ggml's at " << mismatch;
  }
}

// `lode dump FILE TENSOR -o OUT` writes the tensor as little-endian float32: ggml's floats.
TEST(OracleGguf, DumpCommandWritesGgmlsFloats) {
  const lode::test::TempDir dir;
  for (const ExpectedTensor& want : load_expected()) {
    SCOPED_TRACE(want.name);
    const std::filesystem::path out = dir / (want.name + ".f32");
    const std::string command =
        fmt::format("'{}' dump '{}' '{}' -o '{}' 2>'{}'", lode::test::lode_binary(), kGgufPath.string(), want.name,
                    out.string(), (dir / "stderr").string());
    const int status = std::system(command.c_str());
    if (status != 0) {
      const std::vector<uint8_t> err = lode::test::read_bytes(dir / "stderr");
      FAIL() << command << " exited with status " << status << ": " << std::string(err.begin(), err.end());
    }
    const std::vector<uint8_t> bytes = lode::test::read_bytes(out);
    ASSERT_EQ(bytes.size(), want.dequantized.size() * sizeof(float));
    std::vector<float> ours(want.dequantized.size());
    std::memcpy(ours.data(), bytes.data(), bytes.size());
    const std::string mismatch = compare_bits(ours.data(), want.dequantized);
    EXPECT_TRUE(mismatch.empty()) << "lode dump differs from ggml's floats at " << mismatch;
  }
}

}  // namespace
