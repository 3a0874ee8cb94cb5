// Writer -> file -> reader: every value type, both versions, several alignments, streamed tensors,
// split models; and the writer's own refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>

#include "gguf/reader.h"
#include "gguf/writer.h"
#include "test_gguf_helpers.h"

using namespace lode;
using namespace lode::gguf;
using lode::test::fails_with;
using lode::test::TempDir;

namespace {

// One key of every value type, arrays of every element type, nested arrays three deep.
Metadata every_value_type() {
  Metadata m("expected");
  m.set("general.architecture", Value("qwen35moe"));
  m.set("v.u8", Value(uint8_t(255)));
  m.set("v.i8", Value(int8_t(-128)));
  m.set("v.u16", Value(uint16_t(65535)));
  m.set("v.i16", Value(int16_t(-32768)));
  m.set("v.u32", Value(uint32_t(4294967295u)));
  m.set("v.i32", Value(int32_t(std::numeric_limits<int32_t>::min())));
  m.set("v.f32", Value(-0.0f));
  m.set("v.f32.nan", Value(std::numeric_limits<float>::quiet_NaN()));
  m.set("v.bool", Value(true));
  m.set("v.string", Value(std::string("with\0nul and ünïcode \"quotes\"", 31)));
  m.set("v.string.empty", Value(""));
  m.set("v.u64", Value(std::numeric_limits<uint64_t>::max()));
  m.set("v.i64", Value(std::numeric_limits<int64_t>::min()));
  m.set("v.f64", Value(1e-300));
  m.set("a.u8", Value(Array(std::vector<uint8_t>{0, 1, 255})));
  m.set("a.i8", Value(Array(std::vector<int8_t>{-1, 0, 127})));
  m.set("a.u16", Value(Array(std::vector<uint16_t>{1, 65535})));
  m.set("a.i16", Value(Array(std::vector<int16_t>{-1, 2})));
  m.set("a.u32", Value(Array(std::vector<uint32_t>{11, 11, 10, 0})));
  m.set("a.i32", Value(Array(std::vector<int32_t>{-5, 6})));
  m.set("a.f32", Value(Array(std::vector<float>{0.5f, -1e30f})));
  m.set("a.bool", Value(Array(std::vector<bool>{true, false, true})));
  m.set("a.string", Value(Array(std::vector<std::string>{"<|im_start|>", "", "Ġthe"})));
  m.set("a.u64", Value(Array(std::vector<uint64_t>{uint64_t(1) << 40})));
  m.set("a.i64", Value(Array(std::vector<int64_t>{-(int64_t(1) << 40)})));
  m.set("a.f64", Value(Array(std::vector<double>{3.141592653589793})));
  m.set("a.empty", Value(Array::empty(ValueType::String)));
  m.set("a.nested",
        Value(Array(std::vector<Array>{
            Array(std::vector<int32_t>{1, 2}),
            Array(std::vector<std::string>{"x", "y"}),
            Array(std::vector<Array>{Array(std::vector<double>{0.25}),
                                     Array::empty(ValueType::Bool)}),
            Array::empty(ValueType::Array)})));
  return m;
}

void expect_same_metadata(const Metadata& expected, const Metadata& actual) {
  for (const KeyValue& entry : expected.entries()) {
    const Value* value = actual.find(entry.key);
    ASSERT_NE(value, nullptr) << entry.key;
    if (entry.key == "v.f32.nan") {
      EXPECT_TRUE(std::isnan(value->as_f32()));
    } else if (entry.key == "v.f32") {
      EXPECT_TRUE(std::signbit(value->as_f32()));
    } else {
      EXPECT_EQ(*value, entry.value) << entry.key << ": " << render(*value);
    }
  }
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> bytes(n);
  for (size_t i = 0; i < n; ++i) bytes[i] = uint8_t(i * 31 + seed);
  return bytes;
}

}  // namespace

TEST(GgufRoundTrip, EveryValueTypeInFileOrder) {
  TempDir dir;
  Writer writer;
  const Metadata expected = every_value_type();
  for (const KeyValue& entry : expected.entries()) writer.set(entry.key, entry.value);
  writer.write(dir / "values.gguf");
  const Reader reader(dir / "values.gguf");
  EXPECT_EQ(reader.version(), 3u);
  EXPECT_EQ(reader.alignment(), 32u);
  ASSERT_EQ(reader.metadata().size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i)
    EXPECT_EQ(reader.metadata().entries()[i].key, expected.entries()[i].key);
  expect_same_metadata(expected, reader.metadata());
  EXPECT_TRUE(reader.tensors().empty());
}

TEST(GgufRoundTrip, BothVersionsAndSeveralAlignments) {
  for (uint32_t version : {2u, 3u}) {
    for (uint32_t alignment : {1u, 8u, 32u, 64u, 4096u}) {
      SCOPED_TRACE(testing::Message() << "v" << version << " alignment " << alignment);
      TempDir dir;
      Writer writer({.version = version, .alignment = alignment});
      writer.set("general.name", Value("test"));
      const auto a = pattern(4 * 33 * 2, 1);               // f32 [33, 2]: 264 bytes, unaligned end
      const auto b = pattern(34 * 3, 2);                   // q8_0 [96]: 3 blocks of 34 bytes
      const auto c = pattern(18, 3);                       // q4_0 [32]
      writer.add_tensor("a", GgmlType::F32, {33, 2}, a);
      writer.add_tensor("b", GgmlType::Q8_0, {96}, b);
      writer.add_tensor("c", GgmlType::Q4_0, {32, 1, 1, 1}, c);
      writer.write(dir / "m.gguf");
      const Reader reader(dir / "m.gguf");
      EXPECT_EQ(reader.version(), version);
      EXPECT_EQ(reader.alignment(), alignment);
      EXPECT_EQ(reader.metadata().contains("general.alignment"), alignment != 32);
      EXPECT_EQ(reader.files()[0].data_offset % alignment, 0u);
      ASSERT_EQ(reader.tensors().size(), 3u);
      const std::vector<uint8_t>* expected[] = {&a, &b, &c};
      for (size_t i = 0; i < 3; ++i) {
        const TensorInfo& t = reader.tensors()[i];
        EXPECT_EQ(t.offset % alignment, 0u);
        EXPECT_EQ(std::vector<uint8_t>(t.data, t.data + t.size), *expected[i]) << t.name;
      }
      EXPECT_EQ(reader.tensor("a").shape_string(), "[33, 2]");
      EXPECT_EQ(reader.tensor("a").n_dims, 2);
      EXPECT_EQ(reader.tensor("c").n_dims, 4);
      EXPECT_EQ(reader.tensor("b").ggml_type(), GgmlType::Q8_0);
      EXPECT_EQ(reader.tensor("b").n_elements(), 96);
      // The file ends on an alignment boundary after the last tensor's padding.
      EXPECT_EQ(reader.files()[0].size % alignment, 0u);
    }
  }
}

TEST(GgufRoundTrip, StreamedTensorsAreFilledIntoAWriterBuffer) {
  TempDir dir;
  Writer writer;
  int calls = 0;
  for (int i = 0; i < 5; ++i) {
    const int64_t n = 256 * (i + 1);
    writer.add_tensor("blk." + std::to_string(i) + ".w", GgmlType::F16, {n},
                      [&calls, i, n](std::span<uint8_t> out) {
                        ASSERT_EQ(out.size(), size_t(n) * 2);
                        for (size_t k = 0; k < out.size(); ++k) out[k] = uint8_t(k + i);
                        ++calls;
                      });
  }
  EXPECT_EQ(calls, 0);  // nothing is produced before write()
  writer.write(dir / "s.gguf");
  EXPECT_EQ(calls, 5);
  const Reader reader(dir / "s.gguf");
  for (int i = 0; i < 5; ++i) {
    const TensorInfo& t = reader.tensor("blk." + std::to_string(i) + ".w");
    ASSERT_EQ(t.size, size_t(256 * (i + 1)) * 2);
    for (size_t k = 0; k < t.size; ++k) ASSERT_EQ(t.data[k], uint8_t(k + i));
  }
}

TEST(GgufRoundTrip, SplitByMaxFileBytes) {
  TempDir dir;
  Writer writer({.max_file_bytes = 4096});
  const Metadata expected = every_value_type();
  for (const KeyValue& entry : expected.entries()) writer.set(entry.key, entry.value);
  std::vector<std::vector<uint8_t>> data;
  for (int i = 0; i < 10; ++i) {
    data.push_back(pattern(1024 + 4 * size_t(i), uint8_t(i)));  // f32 rows of 256 + i values
    writer.add_tensor("t" + std::to_string(i), GgmlType::F32, {256 + i}, data.back());
  }
  data.push_back(pattern(10000 * 4, 99));  // larger than a file: gets one of its own
  writer.add_tensor("big", GgmlType::F32, {10000}, data.back());
  const auto files = writer.write(dir / "model.gguf");
  ASSERT_GT(files.size(), 3u);
  for (size_t i = 0; i < files.size(); ++i) {
    EXPECT_EQ(files[i], dir / split_path("model", int(i + 1), int(files.size())).c_str());
    EXPECT_TRUE(std::filesystem::exists(files[i]));
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "model.gguf"));

  const Reader reader(files[0]);
  EXPECT_TRUE(reader.is_split());
  ASSERT_EQ(reader.files().size(), files.size());
  expect_same_metadata(expected, reader.metadata());
  EXPECT_EQ(reader.metadata().get<uint16_t>("split.no"), 0);
  EXPECT_EQ(reader.metadata().get<uint16_t>("split.count"), files.size());
  EXPECT_EQ(reader.metadata().get<int32_t>("split.tensors.count"), 11);
  ASSERT_EQ(reader.tensors().size(), 11u);
  for (size_t i = 0; i < 11; ++i) {
    const TensorInfo& t = reader.tensors()[i];
    EXPECT_EQ(std::vector<uint8_t>(t.data, t.data + t.size), data[i]) << t.name;
    const uint64_t file_size = reader.files()[t.file_index].size;
    if (t.name != "big") {
      EXPECT_LE(file_size, 4096u) << t.name;
    }
  }
  EXPECT_EQ(reader.tensor("big").file_index, files.size() - 1);
  EXPECT_EQ(reader.files()[reader.tensor("big").file_index].n_tensors, 1u);
  // Later parts carry only the split keys.
  EXPECT_EQ(reader.file_metadata(1).size(), 3u);
  EXPECT_EQ(reader.file_metadata(1).get<uint16_t>("split.no"), 1);

  // A later part alone is refused, naming the first; read on its own on request.
  EXPECT_TRUE(fails_with([&] { Reader r(files[1]); },
                         {files[1].string(), "part 2 of", files[0].string()}));
  const Reader part(files[1], {.follow_splits = false});
  EXPECT_FALSE(part.is_split());
  EXPECT_EQ(part.tensors().size(), part.files()[0].n_tensors);
}

TEST(GgufRoundTrip, ASplitThatFitsOneFileIsWrittenPlain) {
  TempDir dir;
  Writer writer({.max_file_bytes = uint64_t(1) << 30});
  const auto bytes = pattern(64, 0);
  writer.add_tensor("t", GgmlType::F32, {16}, bytes);
  const auto files = writer.write(dir / "one.gguf");
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0], dir / "one.gguf");
  const Reader reader(files[0]);
  EXPECT_FALSE(reader.metadata().contains("split.count"));
}

TEST(GgufRoundTrip, CopyingASplitModelsMetadataDropsItsSplitKeys) {
  TempDir dir;
  Writer split({.max_file_bytes = 200});
  const auto bytes = pattern(256, 0);
  split.set("general.name", Value("x"));
  split.add_tensor("a", GgmlType::F32, {64}, bytes);
  split.add_tensor("b", GgmlType::F32, {64}, bytes);
  const auto files = split.write(dir / "in.gguf");
  ASSERT_EQ(files.size(), 2u);
  const Reader in(files[0]);
  Writer copy;
  for (const KeyValue& entry : in.metadata().entries()) copy.set(entry.key, entry.value);
  for (const TensorInfo& t : in.tensors())
    copy.add_tensor(t.name, t.ggml_type(), std::span(t.ne.data(), size_t(t.n_dims)), t.bytes());
  copy.write(dir / "out.gguf");
  const Reader out(dir / "out.gguf");
  EXPECT_FALSE(out.metadata().contains("split.no"));
  EXPECT_EQ(out.metadata().get_string("general.name"), "x");
  EXPECT_EQ(out.tensors().size(), 2u);
}

TEST(GgufWriter, RefusesWhatItCannotWrite) {
  EXPECT_TRUE(fails_with([] { Writer w({.version = 1}); }, {"version 1"}));
  EXPECT_TRUE(fails_with([] { Writer w({.alignment = 48}); }, {"alignment 48", "power of two"}));
  EXPECT_TRUE(fails_with([] { Writer w({.alignment = 0}); }, {"power of two"}));
  Writer w;
  const auto bytes = pattern(64, 0);
  w.add_tensor("a", GgmlType::F32, {16}, bytes);
  EXPECT_TRUE(fails_with([&] { w.add_tensor("a", GgmlType::F32, {16}, bytes); }, {"'a'", "twice"}));
  EXPECT_TRUE(fails_with([&] { w.add_tensor("", GgmlType::F32, {16}, bytes); }, {"name"}));
  EXPECT_TRUE(fails_with([&] { w.add_tensor(std::string(64, 'n'), GgmlType::F32, {16}, bytes); },
                         {"64 bytes", "63"}));
  EXPECT_TRUE(fails_with([&] { w.add_tensor("b", GgmlType::F32, {15}, bytes); },
                         {"'b'", "needs 60 bytes", "64 were given"}));
  EXPECT_TRUE(fails_with([&] { w.add_tensor("c", GgmlType::Q4_0, {16}, bytes); },
                         {"'c'", "not whole q4_0 blocks"}));
  EXPECT_TRUE(fails_with([&] { w.add_tensor("d", GgmlType::F32, {16, 0}, bytes); },
                         {"'d'", "dimension 1", "positive"}));
  EXPECT_TRUE(fails_with([&] { w.add_tensor("e", GgmlType::F32, {1, 1, 1, 1, 16}, bytes); },
                         {"'e'", "5 dimensions"}));
  EXPECT_TRUE(fails_with([&] { w.add_tensor("f", GgmlType::F32, {16}, FillTensor{}); },
                         {"'f'", "no bytes"}));
  EXPECT_EQ(w.n_tensors(), 1u);
}

TEST(GgufWriter, ConflictingAlignmentKeyFails) {
  TempDir dir;
  Writer w({.alignment = 64});
  w.set("general.alignment", Value(32u));
  EXPECT_TRUE(fails_with([&] { w.write(dir / "x.gguf"); }, {"general.alignment", "64"}));
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
  Writer same({.alignment = 64});
  same.set("general.alignment", Value(64u));
  same.write(dir / "y.gguf");
  EXPECT_EQ(Reader(dir / "y.gguf").alignment(), 64u);
}

TEST(GgufWriter, AFailingFillLeavesNoFileBehind) {
  TempDir dir;
  Writer w({.max_file_bytes = 300});
  const auto bytes = pattern(256, 0);
  w.add_tensor("a", GgmlType::F32, {64}, bytes);
  w.add_tensor("b", GgmlType::F32, {64}, [](std::span<uint8_t>) { lode::fail("no data for b"); });
  EXPECT_TRUE(fails_with([&] { w.write(dir / "m.gguf"); }, {"tensor 'b'", "no data for b"}));
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}

TEST(GgufWriter, UnwritableDirectoryFails) {
  Writer w;
  EXPECT_TRUE(fails_with([&] { w.write("/nonexistent-dir-lode/x.gguf"); },
                         {"/nonexistent-dir-lode/x.gguf", "cannot create"}));
}

TEST(GgufReader, MovingAReaderKeepsItsTensorsValid) {
  TempDir dir;
  Writer writer;
  const auto bytes = pattern(64, 7);
  writer.add_tensor("t", GgmlType::F32, {16}, bytes);
  writer.write(dir / "m.gguf");
  Reader first(dir / "m.gguf");
  const uint8_t* data = first.tensor("t").data;
  Reader moved = std::move(first);
  EXPECT_EQ(moved.tensor("t").data, data);
  EXPECT_EQ(std::vector<uint8_t>(data, data + 64), bytes);
}
