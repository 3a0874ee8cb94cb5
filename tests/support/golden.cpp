#include "support/golden.h"

#include <cstring>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "core/quant/types.h"
#include "support/paths.h"

namespace lode::test {
namespace {

struct Cursor {
  const std::vector<uint8_t>& data;
  size_t pos = 0;
  const std::string& path;
  void read(void* dst, size_t n) {
    if (n > data.size() - pos) fail("{}: truncated golden file at offset {}", path, pos);
    std::memcpy(dst, data.data() + pos, n);
    pos += n;
  }
  uint32_t u32() { uint32_t v; read(&v, 4); return v; }
  std::vector<float> floats(size_t n) { std::vector<float> v(n); read(v.data(), n * 4); return v; }
};

}  // namespace

GoldenFile load_golden(const std::string& type_name) {
  const std::string path = lode::test::test_data().string() + "/golden/" + type_name + ".bin";
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open golden file (regenerate with tools/oracle/generate)", path);
  const std::vector<uint8_t> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Cursor c{data, 0, path};
  char magic[4];
  c.read(magic, 4);
  if (std::memcmp(magic, "LGLD", 4) != 0) fail("{}: not a golden file", path);
  if (c.u32() != 1) fail("{}: unsupported golden version", path);
  GoldenFile file;
  file.ggml_type = c.u32();
  const TypeTraits* t = find_type(file.ggml_type);
  if (!t) fail("{}: unknown ggml type {}", path, file.ggml_type);
  const uint32_t n_cases = c.u32();
  for (uint32_t i = 0; i < n_cases; ++i) {
    GoldenCase g;
    g.kind = c.u32();
    g.n_values = c.u32();
    char label[33] = {};
    c.read(label, 32);
    g.label = label;
    if (g.kind == 0) g.input = c.floats(g.n_values);
    g.bytes.resize(row_bytes(t->type, g.n_values));
    c.read(g.bytes.data(), g.bytes.size());
    g.dequantized = c.floats(g.n_values);
    file.cases.push_back(std::move(g));
  }
  if (c.pos != data.size()) fail("{}: {} trailing bytes", path, data.size() - c.pos);
  return file;
}

}  // namespace lode::test
