// Robustness: thousands of damaged GGUF files (truncations at every offset, bit flips, fields
// overwritten with extreme values, bytes inserted and deleted) are each either refused with a
// lode::Error or read correctly (and then all their tensor bytes are touched). Nothing may crash,
// hang, or throw anything else.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "gguf/reader.h"
#include "gguf/writer.h"
#include "test_gguf_helpers.h"

using namespace lode;
using namespace lode::gguf;
using lode::test::TempDir;

namespace {

// A small file with a bit of everything: strings, nested arrays, five tensor types (one without
// a dequantizer), several shapes.
std::vector<uint8_t> make_base_file(const std::filesystem::path& path) {
  Writer writer;
  writer.set("general.architecture", Value("qwen35moe"));
  writer.set("general.name", Value("fuzz \"base\""));
  writer.set("qwen35moe.block_count", Value(2u));
  writer.set("qwen35moe.rope.freq_base", Value(1e7f));
  writer.set("flag", Value(true));
  writer.set("tokenizer.ggml.tokens",
             Value(Array(std::vector<std::string>{"<|a|>", "b", "Ġc", "", "dd", "ééé"})));
  writer.set("tokenizer.ggml.token_type", Value(Array(std::vector<int32_t>{3, 1, 1, 1, 1, 1})));
  writer.set("nested", Value(Array(std::vector<Array>{Array(std::vector<uint16_t>{1, 2}),
                                                      Array(std::vector<std::string>{"x"})})));
  writer.set("big", Value(uint64_t(1) << 40));
  auto filled = [](size_t n, uint8_t seed) {
    std::vector<uint8_t> bytes(n);
    for (size_t i = 0; i < n; ++i) bytes[i] = uint8_t(i * 7 + seed);
    return bytes;
  };
  const auto a = filled(8 * 2 * 4, 1), b = filled(18 * 2, 2), c = filled(34 * 2, 3),
             d = filled(36, 4), e = filled(16, 5);
  writer.add_tensor("token_embd.weight", GgmlType::F32, {8, 2}, a);
  writer.add_tensor("blk.0.attn_q.weight", GgmlType::Q4_0, {64}, b);
  writer.add_tensor("blk.0.ffn_down.weight", GgmlType::Q8_0, {32, 1, 2}, c);
  writer.add_tensor("blk.1.q8_1", GgmlType::Q8_1, {32}, d);
  writer.add_tensor("ids", GgmlType::I32, {2, 2}, e);
  writer.write(path);
  return test::read_bytes(path);
}

struct Outcome {
  int rejected = 0;
  int accepted = 0;
};

// Opens `bytes` as a file; returns true when it was read (every tensor byte then touched and
// checked to lie inside the file), false when refused with lode::Error. Anything else fails the
// test.
bool try_read(const std::filesystem::path& path, const std::vector<uint8_t>& bytes,
              const std::string& what, Outcome& outcome) {
  test::write_bytes(path, bytes);
  try {
    const Reader reader(path, {.follow_splits = false});
    uint64_t checksum = 0;
    for (const TensorInfo& t : reader.tensors()) {
      const FileInfo& file = reader.files()[t.file_index];
      EXPECT_LE(file.data_offset + t.offset + t.size, file.size) << what << " " << t.name;
      for (size_t i = 0; i < t.size; ++i) checksum += t.data[i];
    }
    for (const KeyValue& entry : reader.metadata().entries())
      checksum += render(entry.value, {.max_items = 4, .max_string_bytes = 16}).size();
    volatile uint64_t keep = checksum;  // so the reads are not optimised away
    (void)keep;
    ++outcome.accepted;
    return true;
  } catch (const Error&) {
    ++outcome.rejected;
    return false;
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": threw a non-lode exception: " << e.what();
    return false;
  }
}

}  // namespace

TEST(GgufFuzz, DamagedFilesAreRefusedOrReadNeverCrash) {
  const auto start = std::chrono::steady_clock::now();
  TempDir dir;
  const std::vector<uint8_t> base = make_base_file(dir / "base.gguf");
  const Reader base_reader(dir / "base.gguf");
  const uint64_t data_offset = base_reader.files()[0].data_offset;
  const auto path = dir / "mutant.gguf";
  std::mt19937_64 random(12345);
  Outcome outcome;
  int cases = 0;

  // 1. Truncation at every length. Cutting only the last tensor's padding is harmless; any
  // shorter file has lost tensor bytes or more, and must be refused.
  uint64_t data_end = 0;
  for (const TensorInfo& t : base_reader.tensors())
    data_end = std::max(data_end, data_offset + t.offset + t.size);
  for (size_t n = 0; n < base.size(); ++n, ++cases) {
    std::vector<uint8_t> cut(base.begin(), base.begin() + ptrdiff_t(n));
    const bool read = try_read(path, cut, "truncated to " + std::to_string(n), outcome);
    EXPECT_EQ(read, n >= data_end) << n;
  }

  // 2. Single bit flips. In the data section they must still read, with the flipped byte shown.
  for (int i = 0; i < 2000; ++i, ++cases) {
    std::vector<uint8_t> mutant = base;
    const size_t at = size_t(random() % mutant.size());
    mutant[at] ^= uint8_t(1u << (random() % 8));
    const bool read = try_read(path, mutant, "bit flip at " + std::to_string(at), outcome);
    if (at >= data_offset) {
      EXPECT_TRUE(read) << "a flip in tensor data at " << at << " was refused";
    }
  }

  // 3. Fields overwritten with extreme values, at every width.
  const uint64_t extremes[] = {0, 1, 2, 3, 4, 12, 13, 31, 33, 0x7f, 0x80, 0xff, 0xffff, 0x10000,
                               0x7fffffff, 0x80000000, 0xffffffff, uint64_t(1) << 32,
                               uint64_t(1) << 62, uint64_t(1) << 63, ~uint64_t(0), base.size(),
                               base.size() - data_offset};
  for (int i = 0; i < 1600; ++i, ++cases) {
    std::vector<uint8_t> mutant = base;
    const size_t width = size_t(1) << (random() % 4);
    const size_t at = size_t(random() % (data_offset - width + 1));  // the header, mostly fields
    const uint64_t value = extremes[random() % std::size(extremes)];
    std::memcpy(mutant.data() + at, &value, width);
    try_read(path, mutant, "overwrite at " + std::to_string(at), outcome);
  }

  // 4. The two header counts set to every extreme.
  for (uint64_t value : extremes) {
    for (size_t at : {size_t(8), size_t(16)}) {
      std::vector<uint8_t> mutant = base;
      std::memcpy(mutant.data() + at, &value, 8);
      try_read(path, mutant, "count at " + std::to_string(at), outcome);
      ++cases;
    }
  }

  // 5. Bytes inserted into or deleted from the header (everything after shifts).
  for (int i = 0; i < 400; ++i, ++cases) {
    std::vector<uint8_t> mutant = base;
    const size_t at = size_t(random() % data_offset);
    const size_t n = 1 + size_t(random() % 9);
    const auto where = mutant.begin() + ptrdiff_t(at);
    if (i % 2) mutant.insert(where, n, uint8_t(random()));
    else mutant.erase(where, where + ptrdiff_t(std::min(n, mutant.size() - at)));
    try_read(path, mutant, "shift at " + std::to_string(at), outcome);
  }

  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[ gguf fuzz ] %d damaged files (base %zu bytes): %d refused, %d read, %.2f s\n",
              cases, base.size(), outcome.rejected, outcome.accepted, seconds);
  EXPECT_GE(cases, 5000);
  EXPECT_EQ(outcome.rejected + outcome.accepted, cases);
  EXPECT_GT(outcome.rejected, 2000);  // the damage is mostly noticed...
  EXPECT_GT(outcome.accepted, 500);   // ...and harmless damage (data, padding) still reads
  EXPECT_LT(seconds, 45.0);  // ~2 s unloaded; generous for sanitizer builds on busy machines
}
