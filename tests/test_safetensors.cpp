// The safetensors reader on files built byte by byte here: values, shards through an index, and
// every kind of damage refused with a message that names the file and tensor.
#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "core/fp16.h"
#include "model/safetensors.h"
#include "test_gguf_helpers.h"

namespace {

using lode::model::SafetensorsCheckpoint;

// A safetensors file: `header` JSON (padded with spaces to 8 bytes) then `data`.
std::vector<uint8_t> safetensors_bytes(std::string header, const std::vector<uint8_t>& data) {
  while (header.size() % 8) header += ' ';
  std::vector<uint8_t> out(8);
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

std::vector<uint8_t> floats_bytes(std::initializer_list<float> v) {
  std::vector<uint8_t> out(v.size() * 4);
  std::memcpy(out.data(), std::data(v), out.size());
  return out;
}

std::string error_of(const std::filesystem::path& p) {
  try {
    SafetensorsCheckpoint c(p);
  } catch (const lode::Error& e) {
    return e.what();
  }
  return "";
}

TEST(Safetensors, ReadsF32F16Bf16TensorsAsFloats) {
  const lode::test::TempDir dir;
  std::vector<uint8_t> data = floats_bytes({1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -0.5f});
  const uint16_t h[2] = {lode::fp32_to_fp16(0.25f), lode::fp32_to_fp16(-3.0f)};
  const uint16_t b[2] = {lode::fp32_to_bf16(1.0f), lode::fp32_to_bf16(-256.0f)};
  data.insert(data.end(), reinterpret_cast<const uint8_t*>(h), reinterpret_cast<const uint8_t*>(h) + 4);
  data.insert(data.end(), reinterpret_cast<const uint8_t*>(b), reinterpret_cast<const uint8_t*>(b) + 4);
  lode::test::write_bytes(dir / "model.safetensors",
                          safetensors_bytes(R"({"__metadata__":{"format":"pt"},)"
                                            R"("a.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                                            R"("b":{"dtype":"F16","shape":[2],"data_offsets":[24,28]},)"
                                            R"("c":{"dtype":"BF16","shape":[2],"data_offsets":[28,32]}})",
                                            data));
  const SafetensorsCheckpoint c(dir.path());
  ASSERT_EQ(c.tensors().size(), 3u);
  const auto& a = c.at("a.weight");
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(SafetensorsCheckpoint::to_float(a), (std::vector<float>{1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -0.5f}));
  EXPECT_EQ(SafetensorsCheckpoint::to_float(c.at("b")), (std::vector<float>{0.25f, -3.0f}));
  EXPECT_EQ(SafetensorsCheckpoint::to_float(c.at("c")), (std::vector<float>{1.0f, -256.0f}));
  EXPECT_EQ(c.find("missing"), nullptr);
}

TEST(Safetensors, FollowsTheIndexAcrossShards) {
  const lode::test::TempDir dir;
  lode::test::write_bytes(dir / "part-1.safetensors",
                          safetensors_bytes(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                                            floats_bytes({4.0f})));
  lode::test::write_bytes(dir / "part-2.safetensors",
                          safetensors_bytes(R"({"y":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                                            floats_bytes({5.0f, 6.0f})));
  std::ofstream(dir / "model.safetensors.index.json")
      << R"({"metadata":{},"weight_map":{"x":"part-1.safetensors","y":"part-2.safetensors"}})";
  const SafetensorsCheckpoint c(dir.path());
  EXPECT_EQ(c.files().size(), 2u);
  EXPECT_EQ(SafetensorsCheckpoint::to_float(c.at("y")), (std::vector<float>{5.0f, 6.0f}));
  EXPECT_EQ(c.at("y").file_index, 1u);
}

TEST(Safetensors, DamageIsRefusedWithAPreciseMessage) {
  const lode::test::TempDir dir;
  const auto f = dir / "bad.safetensors";
  struct Case {
    std::string header;
    std::vector<uint8_t> data;
    const char* expect;
  };
  const Case cases[] = {
      {R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", floats_bytes({1}), "outside"},
      {R"({"x":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", floats_bytes({1, 2}), "needs 12"},
      {R"({"x":{"dtype":"Q9","shape":[1],"data_offsets":[0,4]}})", floats_bytes({1}), "dtype Q9"},
      {R"({"x":{"dtype":"F32","shape":[1]}})", floats_bytes({1}), "lacks"},
      {R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", floats_bytes({1}), "non-integer"},
      {R"({"x": [1, 2)", {}, "not valid JSON"},
  };
  for (const auto& c : cases) {
    lode::test::write_bytes(f, safetensors_bytes(c.header, c.data));
    const std::string err = error_of(f);
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.header << " -> " << err;
    EXPECT_NE(err.find("bad.safetensors"), std::string::npos) << err;
  }
  std::vector<uint8_t> huge_length(16, 0xff);
  lode::test::write_bytes(f, huge_length);
  EXPECT_NE(error_of(f).find("runs past the end"), std::string::npos);

  std::ofstream(dir / "model.safetensors.index.json") << R"({"weight_map":{"x":"../etc/passwd"}})";
  EXPECT_NE(error_of(dir.path()).find("not a file beside the index"), std::string::npos);
}

}  // namespace
