// `lode inspect FILE.gguf`: what a GGUF model holds — architecture, every metadata key with a
// readable value, the tensor table, bytes per tensor type, totals. Split models open whole.
// `lode inspect --kv FILE.gguf`: the K/V cache each format would take for this model instead.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <vector>

#include "cli/commands.h"
#include "cli/human.h"
#include "cli/validators.h"
#include "gguf/reader.h"
#include "kv/format.h"
#include "model/qwen35moe.h"

namespace lode::cli {
namespace {

struct InspectOptions {
  std::string path;
  bool tensors = true;
  bool one_shard = false;
  bool kv = false;
  size_t max_items = 8;
};

void print_files(const gguf::Reader& model) {
  for (const auto& f : model.files())
    fmt::print("file: {}  ({}, GGUF v{}, alignment {}, {} tensors, {} keys)\n", f.path.string(),
               human_bytes(f.size), f.version, f.alignment, f.n_tensors, f.n_metadata);
  const auto& meta = model.metadata();
  fmt::print("architecture: {}\n", meta.get_string_or("general.architecture", "(not set)"));
  if (meta.contains("general.name")) fmt::print("name: {}\n", gguf::render(meta.at("general.name")));
}

void print_metadata(const gguf::Metadata& meta, size_t max_items) {
  fmt::print("\nmetadata: {} keys\n", meta.size());
  // Keys and names come from the file: escaped, so a damaged one cannot break the listing.
  size_t key_width = 0;
  for (const auto& kv : meta.entries()) key_width = std::max(key_width, gguf::escape(kv.key).size());
  const gguf::RenderLimits limits{max_items, 200};
  for (const auto& kv : meta.entries()) {
    std::string type = gguf::value_type_name(kv.value.type());
    if (kv.value.type() == gguf::ValueType::Array)
      type = fmt::format("{}[{}]", gguf::value_type_name(kv.value.as_array().element_type()),
                         kv.value.as_array().size());
    fmt::print("  {:<{}}  {:<14} {}\n", gguf::escape(kv.key), key_width, type, gguf::render(kv.value, limits));
  }
}

void print_tensors(const gguf::Reader& model) {
  fmt::print("\ntensors: {}\n", model.tensors().size());
  size_t name_width = 4;
  for (const auto& t : model.tensors()) name_width = std::max(name_width, gguf::escape(t.name).size());
  const bool split = model.is_split();
  fmt::print("  {:<{}}  {:<8} {:<26} {:>12}{}\n", "name", name_width, "type", "shape", "bytes",
             split ? "  file" : "");
  for (const auto& t : model.tensors()) {
    fmt::print("  {:<{}}  {:<8} {:<26} {:>12}", gguf::escape(t.name), name_width, t.type->name, t.shape_string(), t.size);
    if (split) fmt::print("  {}", t.file_index + 1);
    fmt::print("\n");
  }
}

void print_type_histogram(const gguf::Reader& model) {
  struct Row { size_t tensors = 0; uint64_t bytes = 0; int64_t values = 0; };
  std::map<std::string, Row> by_type;
  for (const auto& t : model.tensors()) {
    Row& r = by_type[t.type->name];
    ++r.tensors;
    r.bytes += t.size;
    r.values += t.n_elements();
  }
  const uint64_t total = model.tensor_bytes();
  std::vector<std::pair<std::string, Row>> rows(by_type.begin(), by_type.end());
  std::stable_sort(rows.begin(), rows.end(),
                   [](const auto& a, const auto& b) { return a.second.bytes > b.second.bytes; });
  fmt::print("\nbytes by type:\n");
  for (const auto& [name, r] : rows) {
    const double bits = r.values ? 8.0 * double(r.bytes) / double(r.values) : 0.0;
    fmt::print("  {:<8} {:>5} tensor{} {:>12} {:>6.2f}%  {:>6.3f} bits/value\n", name, r.tensors,
               r.tensors == 1 ? " " : "s",
               human_bytes(r.bytes), total ? 100.0 * double(r.bytes) / double(total) : 0.0, bits);
  }
  uint64_t file_bytes = 0;
  int64_t values = 0;
  for (const auto& f : model.files()) file_bytes += f.size;
  for (const auto& t : model.tensors()) values += t.n_elements();
  fmt::print("total: {} in tensors ({} values, {:.3f} bits/value), {} on disk in {} file{}\n",
             human_bytes(total), values, values ? 8.0 * double(total) / double(values) : 0.0,
             human_bytes(file_bytes), model.files().size(), model.files().size() == 1 ? "" : "s");
}

// Bytes per cell and the cache at 32K / 128K / 262K positions (and the model's own context, when
// it is none of those) for every K/V format.
void print_kv_table(const gguf::Reader& model) {
  const model::Qwen35MoeConfig c = model::read_config(model.metadata());
  const int64_t layers = c.n_full_attention_layers();
  std::vector<int64_t> contexts = {32768, 131072, 262144};
  if (c.context_length > 0 && std::find(contexts.begin(), contexts.end(), c.context_length) == contexts.end())
    contexts.push_back(c.context_length);
  fmt::print("K/V cache: {} attention layer{} of {} KV heads x head_dim {}; one cell = one position of one layer\n",
             layers, layers == 1 ? "" : "s", c.n_kv_heads, c.head_dim);
  fmt::print("  {:<8} {:>10}", "--kv", "bytes/cell");
  for (int64_t n : contexts) fmt::print(" {:>14}", fmt::format("{} ctx", n));
  fmt::print("\n");
  for (kv::Format f : kv::all_formats()) {
    fmt::print("  {:<8}", kv::to_string(f));
    if (const std::string why = kv::unsupported_reason(f, c.head_dim); !why.empty()) {
      fmt::print(" cannot hold this model's heads ({})\n", why);
      continue;
    }
    const int64_t cell = kv::cell_bytes(f, c.n_kv_heads, c.head_dim);
    fmt::print(" {:>10}", cell);
    for (int64_t n : contexts) fmt::print(" {:>14}", human_bytes(uint64_t(cell * layers * n)));
    fmt::print("\n");
  }
  fmt::print("(per sequence; the model's context is {} positions; fp16 is the default)\n", c.context_length);
}

void run_inspect(const InspectOptions& o) {
  gguf::Reader model(o.path, gguf::ReadOptions{.follow_splits = !o.one_shard});
  if (o.kv) return print_kv_table(model);
  print_files(model);
  print_metadata(model.metadata(), o.max_items);
  if (o.tensors) print_tensors(model);
  print_type_histogram(model);
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto options = std::make_shared<InspectOptions>();
  auto* cmd = app.add_subcommand("inspect", "Show a GGUF model's metadata, tensors and sizes");
  cmd->add_option("file", options->path, "GGUF file (for a split model: its first file)")->required();
  cmd->add_flag("!--no-tensors", options->tensors, "Leave out the tensor table");
  cmd->add_flag("--shard", options->one_shard, "Read only the file given, not the whole split model");
  cmd->add_flag("--kv", options->kv,
                "Instead of the listing: bytes per K/V cell and the K/V cache at 32K/128K/262K positions in every "
                "--kv format");
  cmd->add_option("--max-items", options->max_items, "Array items shown per key (default 8)")->check(integer_at_least(0));
  cmd->callback([options] { run_inspect(*options); });
}

}  // namespace lode::cli
