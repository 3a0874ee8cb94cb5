// Decode-path matrix-vector kernels on the GPU against the device's bandwidth ceiling, measured in
// the same run. For each case (a matrix of the qwen3.6-35b-a3b geometry in the type the ud-q4_k_xl
// recipe gives it) it times the kernel with CUDA events (median of 50 after 5 warm-ups) and
// reports the weight bytes read per call, GB/s, and the fraction of the ceiling: a device-to-device
// copy of 2 GiB (read + write bytes / time, median of 10). Weights are random bytes with valid
// fp16 scales (speed does not depend on the values; correctness is tests/test_cuda_matvec.cpp).
//
//   build/bench_cuda_matvec [--json]
// Each case runs with float32 x and, for the types with integer kernels, with 8-bit x (MatvecInput::q8).
// The "by group" cases are a step of many sequences' expert products (8-bit x), the bytes they must
// read each chosen expert's once; the "prompt experts" cases a prompt pass's (tf32 on tensor cores).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/fp16.h"
#include "core/quant/types.h"
#include "cuda/expert_products.h"
#include "cuda/matvec.h"
#include "cuda/roofline.h"
#include "cuda/vram.h"

namespace {

using lode::GgmlType;

struct Case {
  const char* name;
  GgmlType type;
  int64_t rows, cols;
  int64_t problems;  // products per call: experts per token (8), or inputs of one plain matrix (decode rows)
  bool grouped;
};

// Random bytes, with every fp16 field a block's scale could sit in set to a small finite value.
std::vector<uint8_t> random_weights(GgmlType type, size_t bytes, std::mt19937& rng) {
  std::vector<uint8_t> w(bytes);
  for (size_t i = 0; i + 4 <= bytes; i += 4) {
    const uint32_t r = rng();
    std::memcpy(&w[i], &r, 4);
  }
  const auto& t = lode::traits(type);
  const uint16_t small = lode::fp32_to_fp16(0.01f);
  if (type != GgmlType::F32 && type != GgmlType::BF16) {
    for (size_t b = 0; b + t.block_bytes <= bytes; b += t.block_bytes) {
      // Block scales sit at the start (d, dmin) or, for Q6_K, the end; F16 rows are all halves.
      if (type == GgmlType::F16) break;
      const size_t at = type == GgmlType::Q6_K ? b + t.block_bytes - 2 : b;
      std::memcpy(&w[at], &small, 2);
      if (type == GgmlType::Q4_K || type == GgmlType::Q5_K) std::memcpy(&w[at + 2], &small, 2);
    }
  }
  return w;
}

// The cases' lines, as text or as JSON objects (the commas between them counted).
struct Lines {
  bool json;
  double ceiling;
  int printed = 0;
  void line(const char* name, GgmlType type, const char* x_type, double bytes, double ms) {
    const double gbps = bytes / (ms * 1e-3) / 1e9;
    if (json)
      std::printf("%s{\"case\": \"%s\", \"type\": \"%s\", \"x\": \"%s\", \"MB\": %.2f, \"us\": %.1f, "
                  "\"GBps\": %.1f, \"of_ceiling\": %.3f}",
                  printed++ ? ", " : "", name, lode::traits(type).name, x_type, bytes / 1e6, ms * 1e3, gbps,
                  gbps / ceiling);
    else
      std::printf("  %-34s %-5s x %-3s %8.2f MB %9.1f us %8.1f GB/s  %5.1f%% of the copy ceiling\n", name,
                  lode::traits(type).name, x_type, bytes / 1e6, ms * 1e3, gbps, 100.0 * gbps / ceiling);
  }
};

// A grouped product by expert: step_rows rows, each with kSlots distinct experts of kExperts, their
// pairs grouped by expert as kernels::expert_groups groups them (experts ascending, pairs in order,
// at most `cap` a group, empty groups after the last).
struct GroupCase {
  const char* name;
  GgmlType type;
  int64_t rows, cols, step_rows;
  int32_t cap;
  bool swiglu;        // x is a SwiGLU's gate and up halves (the down product)
  int32_t parts = 1;  // 2: gate and up in one launch (MatvecInput::group_parts)
};
constexpr int64_t kExperts = 256, kSlots = 8;

// Each of `tokens` rows' kSlots distinct experts of kExperts, drawn at random, row after row.
std::vector<int32_t> random_routes(int64_t tokens, std::mt19937& rng) {
  std::vector<int32_t> route, all(static_cast<size_t>(kExperts));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int32_t e = 0; e < int32_t(kExperts); ++e) all[size_t(e)] = e;
    std::shuffle(all.begin(), all.end(), rng);
    route.insert(route.end(), all.begin(), all.begin() + kSlots);
  }
  return route;
}

std::vector<lode::cuda::ExpertGroup> expert_groups(int64_t step_rows, int32_t cap, std::mt19937& rng) {
  const std::vector<int32_t> route = random_routes(step_rows, rng);
  std::vector<lode::cuda::ExpertGroup> groups;
  for (int32_t e = 0; e < int32_t(kExperts); ++e)
    for (int32_t p = 0; p < int32_t(route.size()); ++p) {
      if (route[size_t(p)] != e) continue;
      if (groups.empty() || groups.back().id != e || groups.back().count == cap) groups.push_back({e, 0, {}});
      groups.back().pairs[groups.back().count++] = p;
    }
  groups.resize(route.size(), lode::cuda::ExpertGroup{-1, 0, {}});
  return groups;
}

// The median time of the case's launch (ms), and in *bytes the weights it must read: each expert
// its groups name, once.
double time_expert_groups(const GroupCase& c, lode::cuda::VramAccountant& vram, std::mt19937& rng, double* bytes) {
  const size_t row_bytes = lode::row_bytes(c.type, c.cols), matrix_bytes = row_bytes * size_t(c.rows);
  const auto host = random_weights(c.type, matrix_bytes * size_t(c.parts * kExperts), rng);
  lode::cuda::DeviceBuffer w(vram, host.size(), lode::cuda::VramUse::weights, c.name);
  cudaMemcpy(w.data(), host.data(), host.size(), cudaMemcpyHostToDevice);
  std::vector<const void*> table;
  for (int64_t e = 0; e < c.parts * kExperts; ++e) table.push_back(w.as<uint8_t>() + size_t(e) * matrix_bytes);
  const auto groups = expert_groups(c.step_rows, c.cap, rng);
  std::vector<bool> read(static_cast<size_t>(kExperts), false);
  for (const auto& g : groups)
    if (g.count > 0) read[size_t(g.id)] = true;
  *bytes = double(matrix_bytes) * double(c.parts) * double(std::count(read.begin(), read.end(), true));
  const int64_t pairs = c.step_rows * kSlots, x_stride = c.swiglu ? 2 * c.cols : c.cols;
  const std::vector<float> xh(size_t(c.step_rows * x_stride), 0.5f);
  lode::cuda::DeviceBuffer x(vram, xh.size() * 4, lode::cuda::VramUse::scratch, "x");
  lode::cuda::DeviceBuffer y(vram, size_t(c.rows * pairs * c.parts) * 4, lode::cuda::VramUse::scratch, "y");
  lode::cuda::DeviceBuffer dtable(vram, table.size() * sizeof(void*), lode::cuda::VramUse::scratch, "table");
  lode::cuda::DeviceBuffer dgroups(vram, groups.size() * sizeof(groups[0]), lode::cuda::VramUse::scratch, "groups");
  cudaMemcpy(x.data(), xh.data(), xh.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dtable.data(), table.data(), table.size() * sizeof(void*), cudaMemcpyHostToDevice);
  cudaMemcpy(dgroups.data(), groups.data(), groups.size() * sizeof(groups[0]), cudaMemcpyHostToDevice);
  lode::cuda::MatvecInput input{.swiglu_up = c.swiglu ? c.cols : 0, .q8 = true};
  input.x_run = int32_t(kSlots), input.groups = dgroups.as<lode::cuda::ExpertGroup>(), input.group_inputs = c.cap;
  input.group_parts = c.parts, input.part_entries = kExperts;
  const size_t rounded_bytes = lode::cuda::rounded_inputs_bytes(c.type, c.cols, row_bytes, c.step_rows);
  lode::cuda::DeviceBuffer rounded(vram, rounded_bytes, lode::cuda::VramUse::scratch, "rounded x");
  input.rounded = rounded.data(), input.rounded_bytes = rounded_bytes;
  return lode::cuda::median_event_ms(
      [&] {
        lode::cuda::grouped_matvec(c.type, dtable.as<const void*>(), nullptr, pairs, c.rows, c.cols, row_bytes,
                                   x.as<float>(), x_stride, y.as<float>(), nullptr, input);
      },
      5, 50);
}

// A prompt pass's expert products on tensor cores (cuda/expert_products.h): `tokens` rows, each
// with kSlots distinct experts of kExperts, tiled by expert as the prompt pass tiles them.
struct PromptCase {
  const char* name;
  GgmlType type;
  int64_t parts, part_rows, cols, tokens;
};

double time_prompt_experts(const PromptCase& c, lode::cuda::VramAccountant& vram, std::mt19937& rng, double* bytes) {
  const size_t row_bytes = lode::row_bytes(c.type, c.cols), matrix_bytes = row_bytes * size_t(c.part_rows);
  const auto host = random_weights(c.type, matrix_bytes * size_t(c.parts * kExperts), rng);
  lode::cuda::DeviceBuffer w(vram, host.size(), lode::cuda::VramUse::weights, c.name);
  cudaMemcpy(w.data(), host.data(), host.size(), cudaMemcpyHostToDevice);
  std::vector<int32_t> counts(static_cast<size_t>(kExperts), 0);
  for (const int32_t e : random_routes(c.tokens, rng)) ++counts[size_t(e)];
  std::vector<lode::cuda::ExpertTile> tiles;
  std::vector<const void*> table;  // entry parts * j + p: part p of the j-th expert used
  lode::cuda::TileRows tile_rows{int32_t(lode::cuda::kExpertTileRows), 0};
  int32_t first = 0;
  for (int64_t e = 0; e < kExperts; ++e) {
    const int32_t n = counts[size_t(e)];
    if (n == 0) continue;
    const int32_t j = int32_t(table.size() / size_t(c.parts));
    for (int64_t p = 0; p < c.parts; ++p) table.push_back(w.as<uint8_t>() + size_t(e * c.parts + p) * matrix_bytes);
    for (int32_t r = 0; r < n; r += int32_t(lode::cuda::kExpertTileRows)) {
      const int32_t rows = std::min(int32_t(lode::cuda::kExpertTileRows), n - r);
      tiles.push_back({j, first + r, rows, 0});
      tile_rows.fewest = std::min(tile_rows.fewest, rows), tile_rows.most = std::max(tile_rows.most, rows);
    }
    first += n;
  }
  *bytes = double(matrix_bytes) * double(table.size());
  const int64_t n = c.parts * c.part_rows, pairs = c.tokens * kSlots;
  const std::vector<float> xh(size_t(pairs * c.cols), 0.5f);
  lode::cuda::DeviceBuffer x(vram, xh.size() * 4, lode::cuda::VramUse::scratch, "x");
  lode::cuda::DeviceBuffer y(vram, size_t(pairs * n) * 4, lode::cuda::VramUse::scratch, "y");
  lode::cuda::DeviceBuffer dtable(vram, table.size() * sizeof(void*), lode::cuda::VramUse::scratch, "table");
  lode::cuda::DeviceBuffer dtiles(vram, tiles.size() * sizeof(tiles[0]), lode::cuda::VramUse::scratch, "tiles");
  cudaMemcpy(x.data(), xh.data(), xh.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dtable.data(), table.data(), table.size() * sizeof(void*), cudaMemcpyHostToDevice);
  cudaMemcpy(dtiles.data(), tiles.data(), tiles.size() * sizeof(tiles[0]), cudaMemcpyHostToDevice);
  return lode::cuda::median_event_ms(
      [&] {
        const char* err = lode::cuda::expert_products(
            c.type, dtiles.as<lode::cuda::ExpertTile>(), int64_t(tiles.size()), tile_rows, dtable.as<const void*>(),
            c.parts, c.part_rows, c.cols, row_bytes, x.as<float>(), c.cols, y.as<float>(), n, nullptr);
        if (err) std::fprintf(stderr, "bench_cuda_matvec: %s: %s\n", c.name, err);
      },
      3, 20);
}

}  // namespace

int main(int argc, char** argv) {
  // Arguments: --json, and a piece of the cases' names to run only those.
  bool json = false;
  const char* only = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0) json = true;
    else only = argv[i];
  }
  lode::cuda::VramAccountant vram;
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);

  // The ceiling: a device-to-device copy.
  const size_t copy_bytes = size_t(2) << 30;
  lode::cuda::DeviceBuffer a(vram, copy_bytes, lode::cuda::VramUse::scratch, "copy source");
  lode::cuda::DeviceBuffer b(vram, copy_bytes, lode::cuda::VramUse::scratch, "copy target");
  cudaMemset(a.data(), 1, copy_bytes);
  const double copy_ms = lode::cuda::median_event_ms(
      [&] { cudaMemcpy(b.data(), a.data(), copy_bytes, cudaMemcpyDeviceToDevice); }, 2, 10);
  const double ceiling = 2.0 * double(copy_bytes) / (copy_ms * 1e-3) / 1e9;
  a.reset();
  b.reset();

  const std::vector<Case> cases = {
      {"lm head (vocab 248320 x 2048)", GgmlType::Q6_K, 248320, 2048, 1, false},
      {"lm head, 2 inputs", GgmlType::Q6_K, 248320, 2048, 2, false},
      {"lm head, 8 inputs", GgmlType::Q6_K, 248320, 2048, 8, false},
      {"lm head, 16 inputs", GgmlType::Q6_K, 248320, 2048, 16, false},
      {"lm head, 64 inputs", GgmlType::Q6_K, 248320, 2048, 64, false},
      {"deltanet qkv (8192 x 2048)", GgmlType::Q8_0, 8192, 2048, 1, false},
      {"deltanet qkv, 2 inputs", GgmlType::Q8_0, 8192, 2048, 2, false},
      {"deltanet qkv, 4 inputs", GgmlType::Q8_0, 8192, 2048, 4, false},
      {"deltanet qkv, 8 inputs", GgmlType::Q8_0, 8192, 2048, 8, false},
      {"deltanet qkv, 16 inputs", GgmlType::Q8_0, 8192, 2048, 16, false},
      {"deltanet qkv, 32 inputs", GgmlType::Q8_0, 8192, 2048, 32, false},
      {"deltanet qkv, 64 inputs", GgmlType::Q8_0, 8192, 2048, 64, false},
      {"q4_K trunk (8192 x 2048)", GgmlType::Q4_K, 8192, 2048, 1, false},
      {"q4_K trunk, 8 inputs", GgmlType::Q4_K, 8192, 2048, 8, false},
      {"q4_K trunk, 16 inputs", GgmlType::Q4_K, 8192, 2048, 16, false},
      {"q4_K trunk, 64 inputs", GgmlType::Q4_K, 8192, 2048, 64, false},
      {"attention q|gate (8192 x 2048)", GgmlType::Q8_0, 8192, 2048, 1, false},
      {"8 experts gate (8 x 512 x 2048)", GgmlType::Q4_K, 512, 2048, 8, true},
      {"8 experts down (8 x 2048 x 512)", GgmlType::Q5_K, 2048, 512, 8, true},
      {"deltanet out (2048 x 4096)", GgmlType::Q8_0, 2048, 4096, 1, false},
      {"deltanet out, 16 inputs", GgmlType::Q8_0, 2048, 4096, 16, false},
      {"deltanet out, 64 inputs", GgmlType::Q8_0, 2048, 4096, 64, false},
      {"shared down (2048 x 512)", GgmlType::Q8_0, 2048, 512, 1, false},
      {"f16 (8192 x 2048)", GgmlType::F16, 8192, 2048, 1, false},
      {"f32 (8192 x 2048)", GgmlType::F32, 8192, 2048, 1, false},
  };
  // A step's rows' experts by expert group (kernels::expert_groups's groups, as a step of that many
  // sequences at full VRAM makes them: at most 4 pairs a group), each row's 8 experts drawn from 256.
  const std::vector<GroupCase> group_cases = {
      {"experts gate by group, 16 rows", GgmlType::Q4_K, 512, 2048, 16, 4, false},
      {"experts down by group, 16 rows", GgmlType::Q5_K, 2048, 512, 16, 4, true},
      {"experts gate by group, 64 rows", GgmlType::Q4_K, 512, 2048, 64, 4, false},
      {"experts down by group, 64 rows", GgmlType::Q5_K, 2048, 512, 64, 4, true},
      {"experts gate by group, 64 rows, 8 a group", GgmlType::Q4_K, 512, 2048, 64, 8, false},
      {"experts gate|up by group, 16 rows", GgmlType::Q4_K, 512, 2048, 16, 4, false, 2},
      {"experts gate|up by group, 64 rows", GgmlType::Q4_K, 512, 2048, 64, 4, false, 2},
  };
  // A prompt pass's experts by expert on tensor cores, from a short prompt to a long chunk's.
  const std::vector<PromptCase> prompt_cases = {
      {"prompt experts gate|up, 256 tokens", GgmlType::Q4_K, 2, 512, 2048, 256},
      {"prompt experts down, 256 tokens", GgmlType::Q5_K, 1, 2048, 512, 256},
      {"prompt experts gate|up, 720 tokens", GgmlType::Q4_K, 2, 512, 2048, 720},
      {"prompt experts down, 720 tokens", GgmlType::Q5_K, 1, 2048, 512, 720},
      {"prompt experts gate|up, 2048 tokens", GgmlType::Q4_K, 2, 512, 2048, 2048},
      {"prompt experts down, 2048 tokens", GgmlType::Q5_K, 1, 2048, 512, 2048},
  };
  std::mt19937 rng(1);
  Lines out{json, ceiling};
  if (json) std::printf("{\"device\": \"%s\", \"copy_GBps\": %.1f, \"cases\": [", prop.name, ceiling);
  else std::printf("%s: device-to-device copy %.1f GB/s (the ceiling below)\n", prop.name, ceiling);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    if (only && !std::strstr(c.name, only)) continue;
    const size_t row_bytes = lode::row_bytes(c.type, c.cols);
    const size_t matrix_bytes = row_bytes * size_t(c.rows);
    // Grouped cases pick 8 of 32 stored experts, as a token picks 8 of 256.
    const int64_t stored = c.grouped ? 32 : 1;
    const auto host = random_weights(c.type, matrix_bytes * size_t(stored), rng);
    lode::cuda::DeviceBuffer w(vram, host.size(), lode::cuda::VramUse::weights, c.name);
    cudaMemcpy(w.data(), host.data(), host.size(), cudaMemcpyHostToDevice);
    std::vector<float> xh(size_t(c.cols * c.problems), 0.5f);
    lode::cuda::DeviceBuffer x(vram, xh.size() * 4, lode::cuda::VramUse::scratch, "x");
    lode::cuda::DeviceBuffer y(vram, size_t(c.rows * c.problems) * 4, lode::cuda::VramUse::scratch, "y");
    cudaMemcpy(x.data(), xh.data(), xh.size() * 4, cudaMemcpyHostToDevice);
    std::vector<const void*> table;
    for (int64_t e = 0; e < stored; ++e) table.push_back(w.as<uint8_t>() + size_t(e) * matrix_bytes);
    std::vector<int32_t> ids;
    for (int64_t p = 0; p < c.problems; ++p) ids.push_back(int32_t((p * 5 + 3) % stored));
    lode::cuda::DeviceBuffer dtable(vram, table.size() * sizeof(void*), lode::cuda::VramUse::scratch, "table");
    lode::cuda::DeviceBuffer dids(vram, ids.size() * 4, lode::cuda::VramUse::scratch, "ids");
    cudaMemcpy(dtable.data(), table.data(), table.size() * sizeof(void*), cudaMemcpyHostToDevice);
    cudaMemcpy(dids.data(), ids.data(), ids.size() * 4, cudaMemcpyHostToDevice);
    // Float32 activations for every type; 8-bit activations where the type has integer kernels.
    for (const bool q8 : {false, true}) {
      if (q8 && !lode::cuda::has_q8_matvec(c.type)) continue;
      if (!q8 && !c.grouped && c.problems > 1) continue;  // float x reads a plain matrix once an input
      lode::cuda::MatvecInput input{.q8 = q8};
      const size_t rounded_bytes = lode::cuda::rounded_inputs_bytes(c.type, c.cols, row_bytes, c.problems);
      lode::cuda::DeviceBuffer rounded(vram, rounded_bytes, lode::cuda::VramUse::scratch, "rounded x");
      input.rounded = rounded.data(), input.rounded_bytes = rounded_bytes;
      const double ms = lode::cuda::median_event_ms(
          [&] {
            if (c.grouped)
              lode::cuda::grouped_matvec(c.type, dtable.as<const void*>(), dids.as<int32_t>(), c.problems, c.rows,
                                         c.cols, row_bytes, x.as<float>(), 0, y.as<float>(), nullptr, input);
            else
              lode::cuda::matvec(c.type, w.data(), c.rows, c.cols, row_bytes, x.as<float>(), y.as<float>(),
                                 c.problems, nullptr, input);
          },
          5, 50);
      // The bytes a launch must read: each problem's matrix once (a plain matrix's inputs share it).
      out.line(c.name, c.type, q8 ? "q8" : "f32", double(matrix_bytes) * double(c.grouped ? c.problems : 1), ms);
    }
  }
  for (const GroupCase& c : group_cases) {
    if (only && !std::strstr(c.name, only)) continue;
    double bytes = 0;
    const double ms = time_expert_groups(c, vram, rng, &bytes);
    out.line(c.name, c.type, "q8", bytes, ms);
  }
  for (const PromptCase& c : prompt_cases) {
    if (only && !std::strstr(c.name, only)) continue;
    double bytes = 0;
    const double ms = time_prompt_experts(c, vram, rng, &bytes);
    out.line(c.name, c.type, "tf32", bytes, ms);
  }
  if (json) std::printf("]}\n");
  return 0;
}
