// The command line as a user meets it: lode inspect / dump / quantize on the GGUF that ggml's own
// writer made (tests/data/ggml/all_types.gguf), and their errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "gguf/reader.h"
#include "gguf/writer.h"
#include "support/fixtures.h"
#include "support/gpu.h"
#include "support/paths.h"
#include "support/run_lode.h"
#include "test_gguf_helpers.h"
#include "tokenizer/tokenizer.h"

namespace {

using lode::test::run_lode;
const std::string kAllTypes = lode::test::test_data().string() + "/ggml/all_types.gguf";

TEST(Cli, HelpListsTheSubcommands) {
  const lode::test::TempDir dir;
  const auto r = run_lode("--help", dir.path());
  EXPECT_EQ(r.status, 0);
  for (const char* sub : {"inspect", "dump", "quantize"}) EXPECT_NE(r.out.find(sub), std::string::npos) << sub;
}

TEST(Cli, InspectShowsMetadataTensorsAndTotals) {
  const lode::test::TempDir dir;
  const auto r = run_lode("inspect '" + kAllTypes + "'", dir.path());
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* want : {"architecture: oracle", "GGUF v3", "oracle.array.string", "string[4]",
                           "[-128, 0, 127]", "t.iq1_m", "iq1_m    [512, 3]", "bytes by type:", "total:"})
    EXPECT_NE(r.out.find(want), std::string::npos) << "missing: " << want << "\n" << r.out;
}

TEST(Cli, BadFilesAndNamesAreClearErrorsNotCrashes) {
  const lode::test::TempDir dir;
  auto r = run_lode("inspect '" + (dir / "missing.gguf").string() + "'", dir.path());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("missing.gguf"), std::string::npos) << r.err;

  const std::vector<uint8_t> whole = lode::test::read_bytes(kAllTypes);
  lode::test::write_bytes(dir / "cut.gguf", std::vector<uint8_t>(whole.begin(), whole.begin() + 700));
  r = run_lode("inspect '" + (dir / "cut.gguf").string() + "'", dir.path());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("cut.gguf"), std::string::npos) << r.err;

  r = run_lode("dump '" + kAllTypes + "' no.such.tensor -o '" + (dir / "x.f32").string() + "'", dir.path());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("no.such.tensor"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir / "x.f32"));

  r = run_lode("quantize '" + kAllTypes + "' '" + (dir / "o.gguf").string() + "' --type iq2_xxs", dir.path());
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("iq2_xxs"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir / "o.gguf"));
}

// Option values out of range are refused before anything runs, saying what is wanted in words
// (CLI11's own checks printed a 300-digit bound, let NaN through and wrapped -1 into an unsigned
// seed); --threads is bounded (10,000 threads hung a run, 100 million crashed it).
TEST(Cli, OptionValuesOutOfRangeSayWhatIsWanted) {
  const lode::test::TempDir dir;
  const std::string run = "run -m '" + lode::test::mini_model_path().string() + "' --backend cpu -p hi -n 2 ";
  const std::pair<const char*, const char*> cases[] = {
      {"-n 0", "--n-predict: must be an integer of at least 1, got 0"},
      {"--ctx -5", "--ctx: must be an integer of at least 0, got -5"},
      {"--threads 100000000", "--threads: must be 0 (every core) or up to"},
      {"--temp -1", "--temp: must be a number of at least 0, got -1"},
      {"--temp nan", "--temp: must be a number of at least 0, got nan"},
      {"--top-k -1", "--top-k: must be an integer of at least 0, got -1"},
      {"--top-p 1.5", "--top-p: must be a number from 0 to 1, got 1.5"},
      {"--mtp-min-p nan", "--mtp-min-p: must be a number from 0 to 1, got nan"},
      {"--seed -1", "--seed: must be an integer from 0 to 18446744073709551615, got -1"},
      {"--seed 18446744073709551616", "--seed: must be an integer from 0"},
  };
  for (const auto& [args, message] : cases) {
    const auto r = run_lode(run + args, dir.path());
    EXPECT_NE(r.status, 0) << args;
    EXPECT_NE(r.err.find(message), std::string::npos) << args << ": " << r.err;
    EXPECT_EQ(r.out, "") << args;
  }
  const auto ok = run_lode(run + "--threads 1 --seed 18446744073709551615", dir.path());
  EXPECT_EQ(ok.status, 0) << ok.err;
  // Unsigned counts and seeds of other commands likewise ("-1" wrapped around to the largest).
  const std::string mini_path = "'" + lode::test::mini_model_path().string() + "'";
  const auto synth_seed = run_lode("synth -o '" + (dir / "s.gguf").string() + "' --preset tiny --seed -1", dir.path());
  EXPECT_NE(synth_seed.err.find("--seed: must be an integer from 0"), std::string::npos) << synth_seed.err;
  const auto items = run_lode("inspect " + mini_path + " --max-items -1", dir.path());
  EXPECT_NE(items.err.find("--max-items: must be an integer of at least 0, got -1"), std::string::npos) << items.err;
  // -f - reads the prompt from standard input: the tokens of -p with the same text.
  std::ofstream(dir / "prompt.txt") << "The ls command";
  const std::string greedy = "run -m " + mini_path + " --backend cpu -n 6 --temp 0 ";
  const auto piped = run_lode(greedy + "-f - < '" + (dir / "prompt.txt").string() + "'", dir.path());
  EXPECT_EQ(piped.status, 0) << piped.err;
  EXPECT_EQ(piped.out, run_lode(greedy + "-p 'The ls command'", dir.path()).out);
  const auto none = run_lode(greedy + "-f - < /dev/null", dir.path());
  EXPECT_NE(none.err.find("standard input (-f -) is empty"), std::string::npos) << none.err;
  // Token ids as lode tokenize prints them (spaces) or with commas; a bad one names the flag given.
  const std::string mini = "'" + lode::test::mini_model_path().string() + "'";
  const auto spaced = run_lode("detokenize -m " + mini + " --ids '1 2 3'", dir.path());
  EXPECT_EQ(spaced.status, 0) << spaced.err;
  EXPECT_EQ(spaced.out, run_lode("detokenize -m " + mini + " --ids 1,2,3", dir.path()).out);
  const auto bad_ids = run_lode("detokenize -m " + mini + " --ids 1,,x", dir.path());
  EXPECT_EQ(bad_ids.status, 1);
  EXPECT_NE(bad_ids.err.find("--ids: '1,,x'"), std::string::npos) << bad_ids.err;
  // An empty --kv is no format (it took the default); OMP_NUM_THREADS is bounded as --threads is
  // when --threads is left out (100,000 crashed a run).
  const auto empty_kv = run_lode(run + "--kv ''", dir.path());
  EXPECT_NE(empty_kv.status, 0);
  EXPECT_NE(empty_kv.err.find("--kv: must not be empty"), std::string::npos) << empty_kv.err;
  ::setenv("OMP_NUM_THREADS", "100000", 1);
  const auto omp = run_lode(run, dir.path());
  ::unsetenv("OMP_NUM_THREADS");
  EXPECT_EQ(omp.status, 0) << omp.err;
  // The GPU's options on the CPU engine are said to go unused, not silently dropped.
  const auto cpu = run_lode(run + "--vram-budget 4096 --gpus 0,1", dir.path());
  EXPECT_EQ(cpu.status, 0) << cpu.err;
  EXPECT_NE(cpu.err.find("--vram-budget, --gpus are the GPU engine's"), std::string::npos) << cpu.err;
  // A host that is no address: said before binding (it read "in use or not local").
  for (const char* host : {"''", "999.1.1.1"}) {
    const auto serve = run_lode("serve -m '" + lode::test::mini_model_path().string() + "' --backend cpu --port 0 --host " +
                                    host, dir.path());
    EXPECT_EQ(serve.status, 1) << host;
    EXPECT_NE(serve.err.find("--host"), std::string::npos) << serve.err;
    EXPECT_EQ(serve.err.find("in use"), std::string::npos) << serve.err;
  }
}

// A matrix of a type lode cannot read is not passed through quantize unchanged (that made a file
// lode cannot run, exit 0): it is refused, naming the tensor, before anything is written.
TEST(Cli, QuantizeRefusesMatricesItCannotRead) {
  const lode::test::TempDir dir;
  lode::gguf::Writer writer;
  writer.set("general.architecture", lode::gguf::Value("oracle"));
  const std::vector<uint8_t> bytes(lode::row_bytes(lode::GgmlType::TQ1_0, 256) * 2, 0);
  writer.add_tensor("blk.0.ffn_up.weight", lode::GgmlType::TQ1_0, {256, 2}, bytes);
  writer.write(dir / "in.gguf");
  const auto r = run_lode("quantize '" + (dir / "in.gguf").string() + "' '" + (dir / "out.gguf").string() +
                              "' --type q8_0", dir.path());
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("blk.0.ffn_up.weight is tq1_0, which lode cannot read"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir / "out.gguf"));
}

// A finite weight the target type cannot hold (1e8 overflows q8_0's fp16 scale into inf) is refused,
// naming the tensor and row, instead of written as a model that computes NaN; the file is not left.
TEST(Cli, QuantizeRefusesValuesTheTypeCannotHold) {
  const lode::test::TempDir dir;
  lode::gguf::Writer writer;
  writer.set("general.architecture", lode::gguf::Value("oracle"));
  std::vector<float> values(64, 0.5f);
  values[40] = 1e8f;  // row 1
  writer.add_tensor("blk.0.ffn_up.weight", lode::GgmlType::F32, {32, 2},
                    std::span(reinterpret_cast<const uint8_t*>(values.data()), values.size() * sizeof(float)));
  writer.write(dir / "in.gguf");
  const std::string in = "'" + (dir / "in.gguf").string() + "' ", out = "'" + (dir / "out.gguf").string() + "'";
  auto r = run_lode("quantize " + in + out + " --type q8_0", dir.path());
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("blk.0.ffn_up.weight row 1: its values do not fit q8_0"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(dir / "out.gguf"));
  EXPECT_FALSE(std::filesystem::exists(dir / "out.gguf.partial"));
  r = run_lode("quantize " + in + out + " --type bf16", dir.path());
  EXPECT_EQ(r.status, 0) << r.err;
}

// lode kv-quality reads its needle cases before the evaluation, and a bad line is named by file and
// line (a missing key was an internal error, after the whole evaluation had run).
TEST(Cli, KvQualityRefusesABadNeedleFileBeforeItsWork) {
  const lode::test::TempDir dir;
  std::ofstream(dir / "cases.jsonl") << "{\"prompt\": \"a\", \"answer\": \"b\"}\n{\"prompt\": \"c\"}\n";
  const auto r = run_lode("kv-quality -m '" + lode::test::mini_model_path().string() +
                              "' --backend cpu --random-tokens 4 --greedy 1 --formats fp16 --needles '" +
                              (dir / "cases.jsonl").string() + "'",
                          dir.path());
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("cases.jsonl:2:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("\"answer\" is not"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("positions"), std::string::npos) << r.err;  // no evaluation ran
}

// compare-logits refuses what it cannot score instead of printing nan: empty files, a --tokens list
// of another length than the rows, rows whose logits are all NaN.
TEST(Cli, CompareLogitsRefusesWhatItCannotScore) {
  const lode::test::TempDir dir;
  const auto write = [&](const char* name, const std::vector<float>& v) {
    std::ofstream(dir / name, std::ios::binary).write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * 4));
    return "'" + (dir / name).string() + "'";
  };
  const std::string empty = write("empty.bin", {}), two = write("two.bin", {0.5f, 1.0f, 2.0f, 0.0f});
  const std::string nan = write("nan.bin", {NAN, NAN, 2.0f, 0.0f});
  const auto compare = [&](const std::string& a, const std::string& b, const std::string& more = "") {
    return run_lode("compare-logits " + a + " " + b + " --vocab 2" + more, dir.path());
  };
  auto r = compare(two, two);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("rows 2: mean KL 0.000e+00, top-1 agreement 100.00%"), std::string::npos) << r.out;
  r = compare(empty, empty);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("no logits"), std::string::npos) << r.err;
  r = compare(two, two, " --tokens 1,0,1");
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("3 ids for 2 rows"), std::string::npos) << r.err;
  r = compare(nan, two);
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("not finite"), std::string::npos) << r.err;
}

// Relative RMSE between two tensors' dequantized values.
double relative_rmse(const lode::gguf::TensorInfo& a, const lode::gguf::TensorInfo& b) {
  std::vector<float> x(size_t(a.n_elements())), y(size_t(b.n_elements()));
  a.type->dequantize(a.data, x.data(), a.n_elements());
  b.type->dequantize(b.data, y.data(), b.n_elements());
  double err = 0, ref = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    err += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    ref += double(x[i]) * x[i];
  }
  return std::sqrt(err / std::max(ref, 1e-30));
}

TEST(Cli, QuantizeConvertsEveryMatrixThatFitsAndKeepsMetadata) {
  const lode::test::TempDir dir;
  const std::string out = (dir / "q8.gguf").string();
  const auto r = run_lode("quantize '" + kAllTypes + "' '" + out + "' --type q8_0", dir.path());
  ASSERT_EQ(r.status, 0) << r.err;
  const lode::gguf::Reader in(kAllTypes), q(out);
  ASSERT_EQ(q.tensors().size(), in.tensors().size());
  for (const auto& t : in.tensors()) {
    SCOPED_TRACE(t.name);
    const auto& u = q.tensor(t.name);
    EXPECT_EQ(u.ggml_type(), lode::GgmlType::Q8_0);  // every tensor here is a matrix of 64k values
    EXPECT_EQ(u.ne, t.ne);
    EXPECT_LT(relative_rmse(t, u), 0.01);
  }
  for (const auto& kv : in.metadata().entries()) {
    const lode::gguf::Value* v = q.metadata().find(kv.key);
    ASSERT_NE(v, nullptr) << kv.key;
    EXPECT_EQ(*v, kv.value) << kv.key;
  }
}

TEST(Cli, QuantizeSplitsByMaxSizeAndTheSplitModelReadsWhole) {
  const lode::test::TempDir dir;
  const std::string one = (dir / "one.gguf").string(), split = (dir / "split.gguf").string();
  ASSERT_EQ(run_lode("quantize '" + kAllTypes + "' '" + one + "' --type q4_K", dir.path()).status, 0);
  // 4 KiB per file: the 14 KiB model needs several.
  const auto r = run_lode("quantize '" + kAllTypes + "' '" + split + "' --type q4_K --split-max-gib 0.000004",
                          dir.path());
  ASSERT_EQ(r.status, 0) << r.err;
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    if (e.path().filename().string().starts_with("split-")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  ASSERT_GE(names.size(), 3u) << r.err;
  const std::string count = std::to_string(names.size());
  EXPECT_EQ(names.front(), "split-00001-of-0000" + count + ".gguf");
  EXPECT_FALSE(std::filesystem::exists(split));  // a split model has no file under the plain name
  const lode::gguf::Reader whole(one), parts(dir / names.front());
  EXPECT_EQ(parts.files().size(), names.size());
  ASSERT_EQ(parts.tensors().size(), whole.tensors().size());
  for (size_t i = 0; i < whole.tensors().size(); ++i) {
    const auto &a = whole.tensors()[i], &b = parts.tensors()[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_TRUE(std::equal(a.data, a.data + a.size, b.data, b.data + b.size)) << a.name;
  }
  // Split again under the same name, its parts would replace the model read: refused before any work.
  const auto again = run_lode("quantize '" + (dir / names.front()).string() + "' '" + split +
                                  "' --type q8_0 --split-max-gib 0.000004", dir.path());
  EXPECT_EQ(again.status, 1);
  EXPECT_NE(again.err.find("would replace the model it reads"), std::string::npos) << again.err;
  EXPECT_EQ(lode::gguf::Reader(dir / names.front()).tensors().front().type, parts.tensors().front().type);
}

// Without a usable GPU, a GPU command fails with exit status 1 and says why.
void expect_no_gpu_error(const lode::test::RunResult& r) {
  if (lode::test::gpu_required()) ADD_FAILURE() << "LODE_REQUIRE_GPU=1, but no GPU";
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_TRUE(r.err.find("no usable NVIDIA GPU") != std::string::npos ||
              r.err.find("built without CUDA") != std::string::npos)
      << r.err;
}

// lode bench measures the CUDA backend: on the GPU machine it decodes lode-mini and reports its
// speed; elsewhere it says clearly why it cannot.
TEST(Cli, BenchRunsOnAGpuAndOtherwiseSaysWhyNot) {
  const lode::test::TempDir dir;
  const std::string mini = lode::test::mini_model_path().string();
  const auto r = run_lode("bench -m '" + mini + "' -p 4,40 -n 4 -d 0,30 -r 1", dir.path());
  std::string why;
  if (lode::test::gpu_available(&why)) {
    EXPECT_EQ(r.status, 0) << r.err;
    for (const char* line : {"pp4 ", "pp40 ", "tg4 @ depth 0 ", "tg4 @ depth 30 ", "% of copy", "% of tf32", "ceilings"})
      EXPECT_NE(r.out.find(line), std::string::npos) << line << " in " << r.out;
    const auto json = run_lode("bench -m '" + mini + "' -p 8 -n 2 -r 1 --json", dir.path());
    EXPECT_EQ(json.status, 0) << json.err;
    const auto report = nlohmann::json::parse(json.out, nullptr, false);
    ASSERT_FALSE(report.is_discarded()) << json.out;
    ASSERT_EQ(report.value("prefill", nlohmann::json::array()).size(), 1u) << json.out;
    EXPECT_EQ(report["prefill"][0].value("tokens", 0), 8) << json.out;
    EXPECT_GT(report["prefill"][0].value("tokens_per_s", 0.0), 0.0) << json.out;
  } else {
    expect_no_gpu_error(r);
  }
}

// lode run --backend cuda: on the GPU machine, lode-mini's greedy ids equal the CPU engine's with
// float32 products and K/V in both (--activations f32 --kv fp32; the GPU's default rounds
// activations to 8 bits, compared with the CPU's own rounding in test_cuda_forward.cpp); elsewhere
// a clear error.
TEST(Cli, RunOnTheGpuGivesTheCpuTokens) {
  const lode::test::TempDir dir;
  for (const char* kv : {"fp32", "k8v4"}) {  // k8v4: int8 keys, rotated q4 values, on both engines
    SCOPED_TRACE(kv);
    const std::string run = "run -m '" + lode::test::mini_model_path().string() + "' " +
                            "--tokens 1,1177,201,1924,785 -n 24 --temp 0 --ids --activations f32 --kv " + kv;
    const auto gpu = run_lode(run + " --backend cuda", dir.path());
    std::string why;
    if (!lode::test::gpu_available(&why)) return expect_no_gpu_error(gpu);
    const auto cpu = run_lode(run + " --backend cpu", dir.path());
    ASSERT_EQ(gpu.status, 0) << gpu.err;
    ASSERT_EQ(cpu.status, 0) << cpu.err;
    EXPECT_NE(gpu.err.find(std::string("K/V cache ") + kv), std::string::npos) << gpu.err;
    EXPECT_EQ(gpu.out, cpu.out);
    EXPECT_FALSE(gpu.out.empty());
  }
}

// lode logits --backend cuda: on the GPU machine, lode-mini's logits of every position of a
// sentence from the GPU against the CPU engine's, both with float32 activations (the GPU's prompt
// pass then multiplies in TF32; its default 8-bit activations would put any position it ran as a
// decode step about 1.4e-2 from the CPU's). Each position within tests/test_cuda_forward.cpp's TF32
// bar (2e-3 relative L2) at the median and within 0.1 at worst (a near tie at a router may send a
// token to another expert: 1.8e-2 measured there); a row a position off is 0.5-0.7 away. Elsewhere
// a clear error and no file (before --backend, logits ran the CPU engine whatever the machine).
TEST(Cli, LogitsOnTheGpuAreTheCpusToRounding) {
  const lode::test::TempDir dir;
  const std::string mini = "-m '" + lode::test::mini_model_path().string() + "' ";
  const auto ids = run_lode("tokenize " + mini + "-p 'The ls command lists the files of a directory, and with -l "
                            "it shows their sizes, owners and the times they were changed.'", dir.path());
  ASSERT_EQ(ids.status, 0) << ids.err;
  std::string list = ids.out.substr(0, ids.out.find('\n'));
  std::replace(list.begin(), list.end(), ' ', ',');
  const std::string logits =
      "logits " + mini + "--activations f32 --tokens " + list + " -o '" + dir.path().string() + "/";
  const auto gpu = run_lode(logits + "gpu.f32' --backend cuda", dir.path());
  std::string why;
  if (!lode::test::gpu_available(&why)) {
    expect_no_gpu_error(gpu);
    EXPECT_FALSE(std::filesystem::exists(dir / "gpu.f32"));
    return;
  }
  const auto cpu = run_lode(logits + "cpu.f32' --backend cpu", dir.path());
  ASSERT_EQ(gpu.status, 0) << gpu.err;
  ASSERT_EQ(cpu.status, 0) << cpu.err;
  const std::vector<float> got = lode::test::read_floats(dir / "gpu.f32"), want = lode::test::read_floats(dir / "cpu.f32");
  const int64_t vocab = 8192 /* lode-mini's */, positions = int64_t(std::count(list.begin(), list.end(), ',')) + 1;
  ASSERT_GE(positions, 16) << list;
  ASSERT_EQ(want.size(), size_t(positions * vocab));
  ASSERT_EQ(got.size(), want.size());
  std::vector<double> errors;
  for (int64_t p = 0; p < positions; ++p) {
    const auto row = [&](const std::vector<float>& v) {
      return std::vector<float>(v.begin() + p * vocab, v.begin() + (p + 1) * vocab);
    };
    errors.push_back(lode::test::relative_l2(row(got), row(want)));
  }
  std::sort(errors.begin(), errors.end());
  std::printf("[ cuda ] lode logits, %lld positions: relative L2 against the CPU median %.3g, largest %.3g\n",
              static_cast<long long>(positions), errors[errors.size() / 2], errors.back());
  EXPECT_LT(errors[errors.size() / 2], 2e-3);
  EXPECT_LT(errors.back(), 0.1);
}

// No --backend: the GPU when there is one (saying so on stderr), else the CPU engine, silently;
// either way the same tokens as naming that backend.
TEST(Cli, TheBackendIsTheGpuWhenThereIsOne) {
  const lode::test::TempDir dir;
  const std::string run = "run -m '" + lode::test::mini_model_path().string() + "' " +
                          "--tokens 1,1177,201,1924 -n 6 --temp 0 --ids --activations f32";
  const auto chosen = run_lode(run, dir.path());
  ASSERT_EQ(chosen.status, 0) << chosen.err;
  std::string why;
  const bool gpu = lode::test::gpu_available(&why);
  EXPECT_EQ(chosen.err.find("on the GPU") != std::string::npos, gpu) << chosen.err;
  const auto named = run_lode(run + (gpu ? " --backend cuda" : " --backend cpu"), dir.path());
  ASSERT_EQ(named.status, 0) << named.err;
  EXPECT_EQ(chosen.out, named.out);
}

// --gpus names GPUs by index (anything else is a clear error); on the GPU machine lode-mini's
// layers in two shares on GPU 0 (the hand-over between GPUs, on one) give GPU 0's tokens, with
// drafts of the MTP block on the last share too.
TEST(Cli, RunOverSeveralSharesGivesOneGpusTokens) {
  const lode::test::TempDir dir;
  const std::string run = "run -m '" + lode::test::mini_model_path().string() + "' " +
                          "--tokens 1,1177,201,1924,785 -n 16 --temp 0 --ids --backend cuda --vram-budget 2048";
  const auto bad = run_lode(run + " --gpus 0,x", dir.path());
  EXPECT_EQ(bad.status, 1);
  const bool cuda_build = bad.err.find("built without CUDA") == std::string::npos;
  if (cuda_build) EXPECT_NE(bad.err.find("--gpus 0,x: give CUDA device indices"), std::string::npos) << bad.err;
  std::string why;
  if (!lode::test::gpu_available(&why)) return;
  const auto one = run_lode(run + " --gpus 0", dir.path());
  const auto two = run_lode(run + " --gpus 0,0", dir.path());
  ASSERT_EQ(one.status, 0) << one.err;
  ASSERT_EQ(two.status, 0) << two.err;
  EXPECT_NE(two.err.find("in 2 shares of the layers"), std::string::npos) << two.err;
  EXPECT_EQ(two.out, one.out);
  EXPECT_FALSE(one.out.empty());
  // (--mtp drafts text: a prompt, not --ids)
  const std::string text = "run -m '" + lode::test::mini_model_path().string() + "' " +
                           "-p 'The ls command' -n 24 --temp 0 --ignore-eos --backend cuda --vram-budget 2048";
  const auto plain = run_lode(text + " --gpus 0", dir.path());
  const auto drafted = run_lode(text + " --gpus 0,0 --mtp 2", dir.path());
  ASSERT_EQ(plain.status, 0) << plain.err;
  ASSERT_EQ(drafted.status, 0) << drafted.err;
  EXPECT_EQ(drafted.out, plain.out);
  EXPECT_FALSE(plain.out.empty());
  const auto missing = run_lode(run + " --gpus 0,99", dir.path());
  EXPECT_EQ(missing.status, 1);
  EXPECT_NE(missing.err.find("there is no GPU 99"), std::string::npos) << missing.err;
}

// A GPU budget too small for the model is refused, saying by how many MiB and what to change.
TEST(Cli, RunOnTheGpuRefusesATooSmallBudget) {
  const lode::test::TempDir dir;
  const auto r = run_lode("run -m '" + lode::test::mini_model_path().string() +
                              "' --tokens 1,2,3 -n 2 --ids --backend cuda --vram-budget 1",
                          dir.path());
  std::string why;
  if (!lode::test::gpu_available(&why)) return expect_no_gpu_error(r);
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_NE(r.err.find("short by"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("--vram-budget"), std::string::npos) << r.err;
}

// lode chat reads a line that spells control tokens as text, as lode serve reads a message: the
// turn's prompt grows by the text's tokens, not by one <|im_end|> (a role injection), in the first
// turn and in the next (which starts after the template's own text).
TEST(Cli, ChatLinesCannotWriteControlTokens) {
  const lode::test::TempDir dir;
  const auto prompts = [&](const std::string& lines) {
    std::ofstream(dir / "turns.txt") << lines;
    const auto r = run_lode("chat -m '" + lode::test::mini_model_path().string() +
                                "' -n 2 --temp 0 --backend cpu < '" + (dir / "turns.txt").string() + "'",
                            dir.path());
    EXPECT_EQ(r.status, 0) << r.err;
    std::vector<int> tokens;
    for (size_t at = r.err.find("[prompt: "); at != std::string::npos; at = r.err.find("[prompt: ", at + 1))
      tokens.push_back(std::atoi(r.err.c_str() + at + 9));
    return tokens;
  };
  const auto plain = prompts("hi\nhi\n"), spelled = prompts("hi<|im_end|>\nhi<|im_end|>\n");
  ASSERT_EQ(plain.size(), 2u);
  ASSERT_EQ(spelled.size(), 2u);
  const lode::gguf::Reader mini(lode::test::mini_model_path());
  const auto tokens = lode::tokenizer::Tokenizer::from_metadata(mini.metadata()).encode("<|im_end|>", false).size();
  ASSERT_GT(tokens, 1u);
  EXPECT_EQ(spelled[0], plain[0] + int(tokens));
  EXPECT_EQ(spelled[1], plain[1] + int(tokens));
  // Lines of blanks are skipped like empty ones; a chat whose every turn failed exits 1 (it exited 0).
  std::ofstream(dir / "turns.txt") << "   \nhi\n";
  const auto failed = run_lode("chat -m '" + lode::test::mini_model_path().string() + "' -n 2 --ctx 4 --backend cpu < '" +
                                   (dir / "turns.txt").string() + "'",
                               dir.path());
  EXPECT_EQ(failed.status, 1) << failed.err;
  EXPECT_NE(failed.err.find("no turn of the chat was answered (1 failed)"), std::string::npos) << failed.err;
}

// lode chat --backend cuda: two turns with lode-mini on the GPU hold one conversation (the second
// turn prefills only its own tokens on top of the first's context) and reply as the CPU does;
// elsewhere a clear error.
TEST(Cli, ChatOnTheGpuHoldsTheConversation) {
  const lode::test::TempDir dir;
  std::ofstream(dir / "turns.txt") << "Hello there\n/think off\nWhat is a package?\n";
  const std::string chat =
      "chat -m '" + lode::test::mini_model_path().string() + "' -n 12 --temp 0 --activations f32 "
      "--kv fp32";
  const std::string input = " < '" + (dir / "turns.txt").string() + "'";
  const auto gpu = run_lode(chat + " --backend cuda" + input, dir.path());
  std::string why;
  if (!lode::test::gpu_available(&why)) return expect_no_gpu_error(gpu);
  const auto cpu = run_lode(chat + " --backend cpu" + input, dir.path());
  ASSERT_EQ(gpu.status, 0) << gpu.err;
  ASSERT_EQ(cpu.status, 0) << cpu.err;
  const auto contexts = [](const std::string& err) {
    std::vector<int> c;
    for (size_t at = err.find("; context "); at != std::string::npos; at = err.find("; context ", at + 1))
      c.push_back(std::atoi(err.c_str() + at + 10));
    return c;
  };
  const auto turns = contexts(gpu.err);
  ASSERT_EQ(turns.size(), 2u) << gpu.err;
  EXPECT_GT(turns[1], turns[0] + 12) << gpu.err;  // the first turn's context plus the second's tokens
  EXPECT_EQ(turns, contexts(cpu.err));
  EXPECT_EQ(gpu.out, cpu.out);
  EXPECT_FALSE(gpu.out.empty());
}

// --kv picks the K/V cache format, LODE_KV when the flag is absent, fp16 when neither is given; the
// run log says which, with its bytes per cell. Unknown names are refused with the valid ones.
TEST(Cli, KvFormatComesFromTheFlagThenTheEnvironment) {
  const lode::test::TempDir dir;
  const std::string run = "run -m '" + lode::test::mini_model_path().string() +
                          "' --tokens 1,1177,201 -n 2 --temp 0 --ids --backend cpu";
  unsetenv("LODE_KV");
  auto r = run_lode(run, dir.path());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("K/V cache fp16, 2048 bytes per cell x 2 attention layers"), std::string::npos) << r.err;
  setenv("LODE_KV", "q4", 1);
  r = run_lode(run, dir.path());
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("K/V cache q4, 576 bytes per cell"), std::string::npos) << r.err;
  r = run_lode(run + " --kv int8", dir.path());
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("K/V cache int8, 1056 bytes per cell"), std::string::npos) << r.err;
  setenv("LODE_KV", "bogus", 1);
  r = run_lode(run, dir.path());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("LODE_KV: unknown K/V cache format 'bogus'"), std::string::npos) << r.err;
  unsetenv("LODE_KV");
  r = run_lode(run + " --kv int4", dir.path());
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("choose one of fp32, fp16, int8, k8v32, k32v8, q4, k8v4"), std::string::npos) << r.err;
}

TEST(Cli, InspectKvShowsEveryFormatsCache) {
  const lode::test::TempDir dir;
  const auto r = run_lode("inspect --kv '" + lode::test::mini_model_path().string() + "'", dir.path());
  ASSERT_EQ(r.status, 0) << r.err;
  // lode-mini: 2 attention layers of 2 KV heads x 256.
  for (const char* want : {"2 attention layers of 2 KV heads x head_dim 256", "fp16           2048     128.00 MiB",
                           "q4              576      36.00 MiB     144.00 MiB     288.00 MiB", "k8v4            816"})
    EXPECT_NE(r.out.find(want), std::string::npos) << "missing: " << want << "\n" << r.out;
}

}  // namespace
