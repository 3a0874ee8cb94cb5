// The reader refuses each kind of damaged or unsupported file with a message naming the file, the
// byte offset or tensor, and the problem. Files are built byte by byte, not by lode's writer.
#include <gtest/gtest.h>

#include <limits>

#include "gguf/reader.h"
#include "gguf/writer.h"
#include "test_gguf_helpers.h"

using namespace lode;
using namespace lode::gguf;
using lode::test::fails_with;
using lode::test::RawGguf;
using lode::test::TempDir;

namespace {

constexpr uint32_t kF32 = 0, kQ4_0 = 2, kQ8_1 = 9;

class GgufValidation : public testing::Test {
protected:
  // Writes `raw` and checks that opening it fails with a message holding the file name and parts.
  testing::AssertionResult rejects(const RawGguf& raw,
                                   std::initializer_list<std::string_view> parts) {
    const auto path = dir_ / "bad.gguf";
    test::write_bytes(path, raw.bytes());
    auto result = fails_with([&] { Reader r(path); }, parts);
    if (!result) return result;
    return fails_with([&] { Reader r(path); }, {path.string()});
  }
  // A valid file with one f32 [4] tensor, built by hand.
  static RawGguf one_tensor_file(uint64_t offset = 0, int64_t n = 4, uint32_t type = kF32) {
    RawGguf raw;
    raw.header(1, 1).kv_string("general.name", "t").tensor("w", {n}, type, offset).pad_to(32);
    raw.zeros(size_t(offset) + 16);
    return raw;
  }
  TempDir dir_;
};

}  // namespace

TEST_F(GgufValidation, AHandBuiltFileReads) {
  RawGguf raw = one_tensor_file();
  test::write_bytes(dir_ / "ok.gguf", raw.bytes());
  const Reader reader(dir_ / "ok.gguf");
  EXPECT_EQ(reader.metadata().get_string("general.name"), "t");
  EXPECT_EQ(reader.tensor("w").size, 16u);
  EXPECT_EQ(reader.files()[0].data_offset, 96u);  // 24 + 33 + 33 = 90, aligned to 32
}

TEST_F(GgufValidation, Magic) {
  EXPECT_TRUE(rejects(RawGguf().raw("GGML").u32(3), {"not a GGUF file", "47 47 4d 4c"}));
  EXPECT_TRUE(rejects(RawGguf().raw("GG"), {"not a GGUF file"}));
  EXPECT_TRUE(rejects(RawGguf().raw("FUGG").u32(3), {"big-endian"}));
  EXPECT_TRUE(rejects(RawGguf().raw("tjgg").u32(3), {"pre-GGUF"}));
}

TEST_F(GgufValidation, Version) {
  EXPECT_TRUE(rejects(RawGguf().header(0, 0, 1), {"byte 4", "version 1 is not supported"}));
  EXPECT_TRUE(rejects(RawGguf().header(0, 0, 4), {"byte 4", "unsupported GGUF version 4"}));
  EXPECT_TRUE(rejects(RawGguf().header(0, 0, 0x03000000), {"big-endian", "version 3"}));
  EXPECT_TRUE(rejects(RawGguf().raw("GGUF").u16(3),
                      {"byte 4", "ends while reading the GGUF version"}));
}

TEST_F(GgufValidation, EmptyMissingAndDirectory) {
  test::write_bytes(dir_ / "empty.gguf", {});
  EXPECT_TRUE(fails_with([&] { Reader r(dir_ / "empty.gguf"); }, {"empty.gguf", "empty"}));
  EXPECT_TRUE(fails_with([&] { Reader r(dir_ / "none.gguf"); }, {"none.gguf", "cannot open"}));
  EXPECT_TRUE(fails_with([&] { Reader r(dir_.path()); }, {"not a regular file"}));
}

TEST_F(GgufValidation, CountsBeyondTheFile) {
  EXPECT_TRUE(rejects(RawGguf().header(0, uint64_t(1) << 60),
                      {"byte 16", "metadata count", "bytes left"}));
  EXPECT_TRUE(rejects(RawGguf().header(~uint64_t(0), 0), {"byte 8", "tensor count", "bytes left"}));
  EXPECT_TRUE(rejects(RawGguf().raw("GGUF").u32(3).u64(0),
                      {"byte 16", "metadata count", "truncated"}));
  // Three key/value pairs promised, one present.
  EXPECT_TRUE(rejects(RawGguf().header(0, 3).kv_u32("a", 1).zeros(30), {"metadata"}));
}

TEST_F(GgufValidation, StringLengths) {
  RawGguf key_length;
  key_length.header(0, 1).u64(1000).raw("abc").zeros(20);
  EXPECT_TRUE(rejects(key_length, {"byte 24", "metadata key claims 1000 bytes", "23 are left"}));
  RawGguf value_length;
  value_length.header(0, 1).str("k").u32(8).u64(~uint64_t(0));
  EXPECT_TRUE(rejects(value_length, {"byte 37", "string value claims", "'k'"}));
  RawGguf empty_key;
  empty_key.header(0, 1).str("").u32(4).u32(0);
  EXPECT_TRUE(rejects(empty_key, {"byte 24", "empty"}));
}

TEST_F(GgufValidation, ValueTypesAndBools) {
  RawGguf type;
  type.header(0, 1).str("k").u32(13).u32(0);
  EXPECT_TRUE(rejects(type, {"byte 33", "value type of 'k' is 13", "0..12"}));
  RawGguf boolean;
  boolean.header(0, 1).str("flag").u32(7).u8(2);
  EXPECT_TRUE(rejects(boolean, {"byte 40", "bool holds 2", "'flag'"}));
}

TEST_F(GgufValidation, Arrays) {
  RawGguf huge;  // 2^61 u64 elements
  huge.header(0, 1).str("k").u32(9).u32(10).u64(uint64_t(1) << 61).zeros(16);
  EXPECT_TRUE(rejects(huge, {"byte 41", "array of u64", "bytes left", "'k'"}));
  RawGguf strings;  // more strings than 8-byte lengths could fit
  strings.header(0, 1).str("k").u32(9).u32(8).u64(5).u64(0).u64(0);
  EXPECT_TRUE(rejects(strings, {"array of string", "bytes left"}));
  RawGguf element_type;
  element_type.header(0, 1).str("k").u32(9).u32(42).u64(0);
  EXPECT_TRUE(rejects(element_type, {"byte 37", "element type is 42"}));
  RawGguf deep;  // arrays of one array, nested 20 deep
  deep.header(0, 1).str("k").u32(9);
  for (int i = 0; i < 20; ++i) deep.u32(9).u64(1);
  deep.u32(0).u64(0);
  EXPECT_TRUE(rejects(deep, {"nested more than 16 deep"}));
}

TEST_F(GgufValidation, DuplicateKeys) {
  RawGguf raw;
  raw.header(0, 2).kv_u32("general.x", 1).kv_u32("general.x", 2);
  EXPECT_TRUE(rejects(raw, {"byte 49", "'general.x' appears twice"}));
}

TEST_F(GgufValidation, Alignment) {
  RawGguf wrong_type;
  wrong_type.header(0, 1).str("general.alignment").u32(5).i32(32);
  EXPECT_TRUE(rejects(wrong_type, {"general.alignment is a i32", "u32"}));
  RawGguf zero;
  zero.header(0, 1).kv_u32("general.alignment", 0);
  EXPECT_TRUE(rejects(zero, {"general.alignment is 0", "power of two"}));
  RawGguf odd;
  odd.header(0, 1).kv_u32("general.alignment", 48);
  EXPECT_TRUE(rejects(odd, {"general.alignment is 48", "power of two"}));
}

TEST_F(GgufValidation, TensorShapes) {
  auto with_tensor = [](auto&& add) {
    RawGguf raw;
    raw.header(1, 0);
    add(raw);
    raw.pad_to(32).zeros(4096);
    return raw;
  };
  EXPECT_TRUE(rejects(with_tensor([](RawGguf& r) { r.str("w").u32(0).u32(0).u64(0); }),
                      {"byte 33", "'w' has 0 dimensions", "1 to 4"}));
  EXPECT_TRUE(rejects(with_tensor([](RawGguf& r) { r.str("w").u32(5); }),
                      {"'w' has 5 dimensions"}));
  EXPECT_TRUE(rejects(with_tensor([](RawGguf& r) { r.tensor("w", {4, 0}, kF32, 0); }),
                      {"byte 24", "tensor 'w'", "dimension 1", "is 0", "positive"}));
  EXPECT_TRUE(rejects(with_tensor([](RawGguf& r) { r.tensor("w", {-4}, kF32, 0); }),
                      {"tensor 'w'", "is -4"}));
  EXPECT_TRUE(rejects(with_tensor([](RawGguf& r) {
                        r.tensor("w", {int64_t(1) << 32, int64_t(1) << 32}, kF32, 0);
                      }),
                      {"tensor 'w'", "more than 2^63 elements"}));
  EXPECT_TRUE(rejects(with_tensor([](RawGguf& r) {
                        r.tensor("w", {int64_t(1) << 61, 2}, kF32, 0);
                      }),
                      {"tensor 'w'", "2^64 bytes"}));
  EXPECT_TRUE(rejects(with_tensor([](RawGguf& r) { r.tensor("w", {48}, kQ4_0, 0); }),
                      {"tensor 'w'", "48 values", "q4_0 blocks of 32"}));
  EXPECT_TRUE(rejects(with_tensor([](RawGguf& r) { r.tensor("w", {32}, 4, 0); }),
                      {"byte 45", "'w' has ggml type id 4"}));
  EXPECT_TRUE(rejects(with_tensor([](RawGguf& r) { r.tensor("w", {32}, 1000, 0); }),
                      {"'w' has ggml type id 1000"}));
  EXPECT_TRUE(rejects(with_tensor([](RawGguf& r) { r.tensor("", {32}, kF32, 0); }),
                      {"empty name"}));
  // Names from a damaged file are escaped, so a message stays on one line.
  EXPECT_TRUE(rejects(with_tensor([](RawGguf& r) { r.tensor("a\n\xff", {0}, kF32, 0); }),
                      {"tensor 'a\\n\\xff'"}));
}

TEST_F(GgufValidation, DuplicateTensorNames) {
  RawGguf raw;
  raw.header(2, 0).tensor("w", {4}, kF32, 0).tensor("w", {4}, kF32, 32).pad_to(32).zeros(64);
  EXPECT_TRUE(rejects(raw, {"byte 57", "tensor name 'w' appears twice"}));
}

TEST_F(GgufValidation, TensorData) {
  EXPECT_TRUE(rejects(one_tensor_file(8), {"tensor 'w'", "data offset 8", "alignment 32"}));
  RawGguf past_end;
  past_end.header(1, 0).tensor("w", {4}, kF32, 64).pad_to(32).zeros(70);
  EXPECT_TRUE(rejects(past_end, {"tensor 'w'", "16 bytes at data offset 64", "past the end"}));
  RawGguf huge_offset;
  huge_offset.header(1, 0).tensor("w", {4}, kF32, ~uint64_t(31)).pad_to(32).zeros(16);
  EXPECT_TRUE(rejects(huge_offset, {"tensor 'w'", "beyond the end"}));
  RawGguf truncated = one_tensor_file();
  std::vector<uint8_t> cut(truncated.bytes().begin(), truncated.bytes().end() - 1);
  test::write_bytes(dir_ / "cut.gguf", cut);
  EXPECT_TRUE(fails_with([&] { Reader r(dir_ / "cut.gguf"); }, {"cut.gguf", "'w'", "truncated"}));
  RawGguf overlap;
  overlap.header(2, 0).tensor("a", {16}, kF32, 0).tensor("b", {16}, kF32, 32).pad_to(32).zeros(128);
  EXPECT_TRUE(rejects(overlap, {"tensor 'a'", "overlaps tensor 'b'"}));
}

TEST_F(GgufValidation, TypesWithoutADequantizerAreStillReadable) {
  RawGguf raw = one_tensor_file(0, 32, kQ8_1);  // q8_1: 36 bytes per block of 32
  raw.zeros(64);
  test::write_bytes(dir_ / "q8_1.gguf", raw.bytes());
  const Reader reader(dir_ / "q8_1.gguf");
  EXPECT_EQ(reader.tensor("w").ggml_type(), GgmlType::Q8_1);
  EXPECT_EQ(reader.tensor("w").size, 36u);
  EXPECT_EQ(reader.tensor("w").type->dequantize, nullptr);
}

TEST_F(GgufValidation, MissingTensorLookupNamesTheTensor) {
  test::write_bytes(dir_ / "ok.gguf", one_tensor_file().bytes());
  const Reader reader(dir_ / "ok.gguf");
  EXPECT_EQ(reader.find_tensor("nope"), nullptr);
  EXPECT_TRUE(fails_with([&] { reader.tensor("nope"); }, {"ok.gguf", "no tensor named 'nope'"}));
}

// --- split models ---

namespace {

// A hand-built shard: split keys, one f32 [4] tensor named `tensor`.
RawGguf shard(uint16_t no, uint16_t count, int32_t total, const std::string& tensor) {
  RawGguf raw;
  raw.header(1, 3);
  raw.str("split.no").u32(2).u16(no);
  raw.str("split.count").u32(2).u16(count);
  raw.str("split.tensors.count").u32(5).i32(total);
  raw.tensor(tensor, {4}, kF32, 0).pad_to(32).zeros(32);
  return raw;
}

}  // namespace

TEST_F(GgufValidation, SplitModelReadsAsOne) {
  for (int i = 0; i < 3; ++i)
    test::write_bytes(dir_ / split_path("m", i + 1, 3),
                      shard(uint16_t(i), 3, 3, "t" + std::to_string(i)).bytes());
  const Reader reader(dir_ / "m-00001-of-00003.gguf");
  ASSERT_EQ(reader.tensors().size(), 3u);
  EXPECT_EQ(reader.tensors()[2].name, "t2");
  EXPECT_EQ(reader.tensors()[2].file_index, 2u);
}

TEST_F(GgufValidation, SplitModelProblems) {
  const auto first = dir_ / "m-00001-of-00003.gguf";
  const auto second = dir_ / "m-00002-of-00003.gguf";
  const auto third = dir_ / "m-00003-of-00003.gguf";
  test::write_bytes(first, shard(0, 3, 3, "t0").bytes());
  test::write_bytes(second, shard(1, 3, 3, "t1").bytes());
  EXPECT_TRUE(fails_with([&] { Reader r(first); }, {"part 3 of 3", "missing", third.string()}));
  EXPECT_TRUE(fails_with([&] { Reader r(second); },
                         {second.string(), "part 2 of a model split into 3", first.string()}));
  test::write_bytes(third, shard(2, 3, 3, "t0").bytes());
  EXPECT_TRUE(fails_with([&] { Reader r(first); },
                         {third.string(), "'t0'", "also in", first.string()}));
  test::write_bytes(third, shard(1, 3, 3, "t2").bytes());
  EXPECT_TRUE(fails_with([&] { Reader r(first); },
                         {third.string(), "say part 2 of 3", "name says part 3"}));
  test::write_bytes(third, shard(2, 3, 4, "t2").bytes());
  EXPECT_TRUE(fails_with([&] { Reader r(first); },
                         {third.string(), "split.tensors.count is 4", "3 in the first"}));
  test::write_bytes(third, one_tensor_file().bytes());
  EXPECT_TRUE(fails_with([&] { Reader r(first); }, {third.string(), "no split.count"}));
  // Consistent keys, but fewer tensors than split.tensors.count promises.
  test::write_bytes(first, shard(0, 3, 4, "t0").bytes());
  test::write_bytes(second, shard(1, 3, 4, "t1").bytes());
  test::write_bytes(third, shard(2, 3, 4, "t2").bytes());
  EXPECT_TRUE(fails_with([&] { Reader r(first); }, {"says the model has 4 tensors", "hold 3"}));
  // A first part whose name hides where the others are.
  const auto renamed = dir_ / "renamed.gguf";
  test::write_bytes(renamed, shard(0, 3, 3, "t0").bytes());
  EXPECT_TRUE(fails_with([&] { Reader r(renamed); },
                         {"renamed.gguf", "does not follow", "-00001-of-00003"}));
  // Name and keys disagree on the count.
  const auto two = dir_ / "m-00001-of-00002.gguf";
  test::write_bytes(two, shard(0, 3, 3, "t0").bytes());
  EXPECT_TRUE(fails_with([&] { Reader r(two); }, {"name says part 1 of 2", "part 1 of 3"}));
  // Out-of-range split keys.
  test::write_bytes(renamed, shard(3, 3, 3, "t0").bytes());
  EXPECT_TRUE(fails_with([&] { Reader r(renamed); }, {"split.no is 3"}));
  test::write_bytes(renamed, shard(0, 0, 3, "t0").bytes());
  EXPECT_TRUE(fails_with([&] { Reader r(renamed); }, {"split.count is 0"}));
}

TEST(GgufSplitName, ParsesAndFormatsGgufSplitNames) {
  EXPECT_EQ(split_path("dir/Model-Q4_K", 2, 12), "dir/Model-Q4_K-00002-of-00012.gguf");
  const auto name = parse_split_path("dir/Model-Q4_K-00002-of-00012.gguf");
  ASSERT_TRUE(name.has_value());
  EXPECT_EQ(name->prefix, "dir/Model-Q4_K");
  EXPECT_EQ(name->index, 2);
  EXPECT_EQ(name->count, 12);
  EXPECT_FALSE(parse_split_path("model.gguf").has_value());
  EXPECT_FALSE(parse_split_path("model-0001-of-0002.gguf").has_value());   // 4 digits
  EXPECT_FALSE(parse_split_path("model-00003-of-00002.gguf").has_value()); // index > count
  EXPECT_FALSE(parse_split_path("model-00000-of-00002.gguf").has_value());
  EXPECT_FALSE(parse_split_path("model-00001-of-00002.bin").has_value());
  EXPECT_FALSE(parse_split_path("dir/-00001-of-00002.gguf").has_value());
  EXPECT_FALSE(parse_split_path("-00001-of-00002.gguf").has_value());
}
