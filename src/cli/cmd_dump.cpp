// `lode dump FILE.gguf TENSOR -o OUT.f32`: one tensor dequantized to little-endian float32 in ggml
// order (ne[0] fastest), written row by row.
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <vector>

#include "cli/commands.h"
#include "cli/human.h"
#include "cli/output_file.h"
#include "core/error.h"
#include "gguf/reader.h"

namespace lode::cli {
namespace {

struct DumpOptions {
  std::string path, tensor, output;
};

// Dequantizes `t` row by row into `out`.
void write_floats(const gguf::TensorInfo& t, std::FILE* out, const std::string& out_name) {
  const int64_t row_len = t.ne[0];
  const size_t row_size = row_bytes(t.ggml_type(), row_len);
  std::vector<float> row(static_cast<size_t>(row_len));
  for (int64_t r = 0; r < t.n_rows(); ++r) {
    t.type->dequantize(t.data + size_t(r) * row_size, row.data(), row_len);
    if (std::fwrite(row.data(), sizeof(float), row.size(), out) != row.size())
      fail("{}: write failed (disk full?)", out_name);
  }
}

void run_dump(const DumpOptions& o) {
  gguf::Reader model(o.path);
  const gguf::TensorInfo& t = model.tensor(o.tensor);
  if (!t.type->dequantize)
    fail("tensor '{}' has type {}, which lode cannot dequantize", t.name, t.type->name);
  write_output_file(o.output, [&t, &o](std::FILE* out) { write_floats(t, out, o.output); }, gguf::model_files(o.path));
  if (o.output == "-") return;
  fmt::print(stderr, "{}: {} {} {} -> {} ({} float32 values)\n", t.name, t.type->name,
             t.shape_string(), human_bytes(t.size), o.output, t.n_elements());
}

}  // namespace

void add_dump_command(CLI::App& app) {
  auto options = std::make_shared<DumpOptions>();
  auto* cmd = app.add_subcommand("dump", "Write one tensor, dequantized, as little-endian float32");
  cmd->add_option("file", options->path, "GGUF file (for a split model: its first file)")->required();
  cmd->add_option("tensor", options->tensor, "Tensor name, as `lode inspect` lists it")->required();
  cmd->add_option("-o,--output", options->output, "Output file, or - for stdout")->required();
  cmd->callback([options] { run_dump(*options); });
}

}  // namespace lode::cli
