#include "model/quantize.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "gguf/writer.h"

namespace lode::model {
namespace {

// Converts rows of `t` into `out` (already sized for the target type); rows in parallel. Each row is
// read back: a finite value the type cannot hold (a weight of 1e8 overflows q8_0's fp16 scale into
// inf) is refused, naming the row, rather than written as a model that computes NaN.
void requantize_rows(const gguf::TensorInfo& t, const TypeTraits& to, std::span<uint8_t> out) {
  const int64_t row_len = t.ne[0];
  const size_t in_row = row_bytes(t.ggml_type(), row_len), out_row = row_bytes(to.type, row_len);
  const int64_t rows = t.n_rows();
  int64_t bad_row = rows;  // the first row that did not survive (rows: none)
#pragma omp parallel
  {
    std::vector<float> floats(static_cast<size_t>(row_len)), back(static_cast<size_t>(row_len));
#pragma omp for schedule(static) reduction(min : bad_row)
    for (int64_t r = 0; r < rows; ++r) {
      t.type->dequantize(t.data + size_t(r) * in_row, floats.data(), row_len);
      uint8_t* const row = out.data() + size_t(r) * out_row;
      to.quantize(floats.data(), row, row_len);
      to.dequantize(row, back.data(), row_len);
      for (int64_t i = 0; i < row_len; ++i)
        if (std::isfinite(floats[size_t(i)]) && !std::isfinite(back[size_t(i)])) {
          bad_row = std::min(bad_row, r);
          break;
        }
    }
  }
  if (bad_row < rows)
    fail("tensor {} row {}: its values do not fit {} (they come back as inf or NaN): quantize it to another type "
         "(f16, bf16 or f32 hold them)", t.name, bad_row, to.name);
}

// Blocks of the model (for recipes that treat early/late blocks differently): highest blk.N + 1.
int64_t count_blocks(const gguf::Reader& in) {
  int64_t n = 0;
  for (const auto& t : in.tensors())
    if (const auto named = role_from_name(t.name)) n = std::max(n, named->block + 1);
  return n;
}

// The type a tensor should have: the recipe's for its role, else the single target type.
GgmlType target_type(const gguf::TensorInfo& t, const QuantizeOptions& options, int64_t n_blocks) {
  if (!options.recipe) return options.type;
  const auto named = role_from_name(t.name);
  if (!named) return t.ggml_type();  // not a qwen35moe tensor: keep it
  const TensorSpec spec{t.name, std::vector<int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims),
                        named->role, named->block};
  return recipe_type(*options.recipe, spec, n_blocks);
}

}  // namespace

bool may_requantize(const gguf::TensorInfo& t, GgmlType type) {
  const TypeTraits& to = traits(type);
  return t.n_dims >= 2 && t.type->dequantize && t.ne[0] % to.block_size == 0;
}

std::vector<std::filesystem::path> quantize_model(const gguf::Reader& in,
                                                  const std::filesystem::path& out,
                                                  const QuantizeOptions& options) {
  if (!options.recipe && !traits(options.type).quantize)
    fail("lode cannot quantize to {} (it can read it, not write it)", traits(options.type).name);
  gguf::Writer writer(gguf::WriteOptions{.alignment = in.alignment(),
                                         .max_file_bytes = options.max_file_bytes});
  for (const auto& kv : in.metadata().entries()) {
    if (kv.key == "general.alignment" || kv.key.starts_with("split.")) continue;  // the writer's own
    if (kv.key == "general.file_type") continue;  // would describe the input's types
    writer.set(kv.key, kv.value);
  }
  if (options.recipe) writer.set("general.file_type", gguf::Value(options.recipe->file_type));
  const int64_t n_blocks = count_blocks(in);
  const auto& tensors = in.tensors();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const gguf::TensorInfo& t = tensors[i];
    const std::span<const int64_t> ne(t.ne.data(), size_t(t.n_dims));
    auto report = [&options, i, n = tensors.size(), name = t.name] {
      if (options.on_tensor) options.on_tensor(i, n, name);
    };
    const GgmlType type = target_type(t, options, n_blocks);
    if (t.n_dims >= 2 && !t.type->dequantize && t.ggml_type() != type)  // (kept, it would leave a file lode cannot run)
      fail("tensor {} is {}, which lode cannot read, so it cannot be requantized to {}: make the file again from its "
           "source in a type lode reads (lode convert from the Hugging Face checkpoint, or llama.cpp's "
           "llama-quantize)", t.name, t.type->name, traits(type).name);
    if (!may_requantize(t, type) || t.ggml_type() == type) {
      writer.add_tensor(t.name, t.ggml_type(), ne, [&t, report](std::span<uint8_t> dst) {
        std::copy(t.data, t.data + t.size, dst.begin());
        report();
      });
      continue;
    }
    const TypeTraits& to = traits(type);
    if (!to.quantize) fail("lode cannot quantize to {} (it can read it, not write it)", to.name);
    writer.add_tensor(t.name, type, ne, [&t, &to, report](std::span<uint8_t> dst) {
      requantize_rows(t, to, dst);
      report();
    });
  }
  return writer.write(out);
}

}  // namespace lode::model
