// `lode convert HF_DIR -o OUT.gguf [--outtype f32|f16|bf16|q8_0]`.
#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/human.h"
#include "core/error.h"
#include "core/output_path.h"
#include "model/convert.h"

namespace lode::cli {
namespace {

struct ConvertCliOptions {
  std::string input, output, outtype = "f32";
};

void run_convert(const ConvertCliOptions& o) {
  const auto type = type_from_name(o.outtype);
  if (!type) fail("--outtype {}: unknown type (f32, f16, bf16 or q8_0)", o.outtype);
  model::ConvertOptions options;
  options.outtype = *type;
  options.on_tensor = [](size_t i, size_t n, const std::string& name) {
    fmt::print(stderr, "[{}/{}] {}\n", i + 1, n, name);
  };
  const auto files = model::convert_checkpoint(o.input, checked_output_path(o.output), options);
  uint64_t bytes = 0;
  for (const auto& f : files) bytes += std::filesystem::file_size(f);
  fmt::print(stderr, "wrote {} ({})\n", files.front().string(), human_bytes(bytes));
}

}  // namespace

void add_convert_command(CLI::App& app) {
  auto o = std::make_shared<ConvertCliOptions>();
  auto* cmd = app.add_subcommand("convert", "Convert a Hugging Face qwen3_5_moe checkpoint to GGUF");
  cmd->add_option("hf_dir", o->input, "Checkpoint folder (config.json + *.safetensors)")->required();
  cmd->add_option("-o,--output", o->output, "GGUF file to write")->required();
  cmd->add_option("--outtype", o->outtype, "f32 (default), f16, bf16 or q8_0 for the matrices");
  cmd->callback([o] { run_convert(*o); });
}

}  // namespace lode::cli
