// `lode bench`'s report (measure/bench_report.h): the JSON is built by the JSON library, so any
// model path comes back intact, and each fraction is its figure over the ceiling measured with it;
// the text shows the expert tier's figures only where experts live in host RAM.
#include <gtest/gtest.h>

#include <string>

#include "measure/bench_report.h"

namespace {

using namespace lode;

measure::Ceilings h200_like() {
  return {.copy_gbps = 4200, .bf16_tflops = 700, .tf32_tflops = 350, .pcie_copy_gbps = 55, .pcie_mapped_gbps = 51};
}

measure::BenchRun a_run(const std::string& model, int64_t resident) {
  measure::BenchRun b;
  b.model = model, b.kv = "fp16", b.fill = "prompt", b.generated = 128, b.repeats = 2;
  b.prefills.push_back({.tokens = 8192, .tokens_per_s = 9601.04, .tflops = 35.0, .tier = {.hit_rate = 0.5}});
  b.decodes.push_back({.depth = 0, .tokens_per_s = 138.8, .bytes_per_token = 2.7e9, .gbps = 2100,
                       .tier = {.hit_rate = 0.75, .pcie_bytes = 1.5e8, .cpu_experts = 3.25, .swaps = 7}});
  b.plan.options.budget = size_t(12288) << 20;
  b.plan.experts_total = 10240, b.plan.experts_resident = resident;
  b.host_tier = "pinned (registered in place)", b.miss_path = "gpu";
  return b;
}

TEST(BenchReport, JsonKeepsAnyModelPathAndRelatesEachFigureToItsCeiling) {
  const std::string path = "/models/a \"quoted\" name\\with\tescapes.gguf";
  const auto parsed = nlohmann::json::parse(measure::to_json(h200_like(), a_run(path, 4785)).dump());
  EXPECT_EQ(parsed.at("model"), path);
  EXPECT_EQ(parsed.at("vram_budget_MiB"), 12288.0);
  EXPECT_EQ(parsed.at("experts_resident"), 4785);
  ASSERT_EQ(parsed.at("prefill").size(), 1u);
  EXPECT_EQ(parsed["prefill"][0].at("tokens_per_s"), 9601.0);
  EXPECT_DOUBLE_EQ(parsed["prefill"][0].at("of_tf32").get<double>(), 0.1);
  EXPECT_DOUBLE_EQ(parsed["prefill"][0].at("of_bf16").get<double>(), 0.05);
  ASSERT_EQ(parsed.at("decode").size(), 1u);
  const auto& d = parsed["decode"][0];
  EXPECT_DOUBLE_EQ(d.at("of_copy").get<double>(), 0.5);
  EXPECT_EQ(d.at("cpu_experts_per_token"), 3.25);
  EXPECT_EQ(d.at("swaps"), 7);
  EXPECT_EQ(parsed.at("miss_path"), "gpu");
  EXPECT_EQ(parsed.at("copy_ceiling_GBps"), 4200.0);
}

TEST(BenchReport, TextShowsTheTiersFiguresOnlyWhenExpertsLiveInHostRam) {
  const std::string partial = measure::to_text(h200_like(), a_run("m.gguf", 4785));
  EXPECT_NE(partial.find("pp8192"), std::string::npos) << partial;
  EXPECT_NE(partial.find("50.0% of copy"), std::string::npos) << partial;
  EXPECT_NE(partial.find("hit  75.0%"), std::string::npos) << partial;
  EXPECT_NE(partial.find("decode misses: gpu"), std::string::npos) << partial;
  EXPECT_NE(partial.find("CPU 3.2 experts/token"), std::string::npos) << partial;

  const std::string all = measure::to_text(h200_like(), a_run("m.gguf", 10240));
  EXPECT_EQ(all.find("hit "), std::string::npos) << all;
  EXPECT_EQ(all.find("decode misses"), std::string::npos) << all;
}

}  // namespace

// A verify window's row: its cost in one-token steps, and the speedup that implies at each draft
// acceptance (tokens a window yields, 1 + a + ... + a^(T-1), over its cost).
TEST(BenchReport, WindowsShowTheirCostInStepsAndTheSpeedupItImplies) {
  measure::BenchRun b = a_run("m.gguf", 10240);
  b.windows.push_back({.depth = 0, .tokens = 2, .seconds = 0.009, .step_ratio = 1.25});
  EXPECT_DOUBLE_EQ(b.windows[0].tokens_at(0.8), 1.8);
  const std::string text = measure::to_text(h200_like(), b);
  EXPECT_NE(text.find("window 2 @ depth 0"), std::string::npos) << text;
  EXPECT_NE(text.find("9.000 ms a window = 1.25 one-token steps"), std::string::npos) << text;
  EXPECT_NE(text.find("1.28x / 1.44x / 1.52x"), std::string::npos) << text;
  const auto parsed = nlohmann::json::parse(measure::to_json(h200_like(), b).dump());
  ASSERT_EQ(parsed.at("windows").size(), 1u);
  EXPECT_EQ(parsed["windows"][0].at("tokens"), 2);
  EXPECT_DOUBLE_EQ(parsed["windows"][0].at("speedup_at_acceptance").at("0.9").get<double>(), 1.52);
}

// Prompts read together: their rate in all, against one prompt at a time.
TEST(BenchReport, PromptsReadTogetherShowTheirRateAgainstOneAtATime) {
  measure::BenchRun b = a_run("m.gguf", 10240);
  b.pieces.push_back({.tokens = 256, .prompts = 16, .passes = 2, .seconds = 0.5, .alone_tokens_per_s = 4096.0});
  EXPECT_DOUBLE_EQ(b.pieces[0].tokens_per_s(), 8192.0);
  const std::string text = measure::to_text(h200_like(), b);
  EXPECT_NE(text.find("16 prompts of 256 together, 2 passes:   500.0 ms,    8192.0 tokens/s = 2.00x one at a time"),
            std::string::npos)
      << text;
  const auto parsed = nlohmann::json::parse(measure::to_json(h200_like(), b).dump());
  ASSERT_EQ(parsed.at("prompts_together").size(), 1u);
  EXPECT_EQ(parsed["prompts_together"][0].at("passes"), 2);
  EXPECT_DOUBLE_EQ(parsed["prompts_together"][0].at("x_one_at_a_time").get<double>(), 2.0);
}

// A step of several sequences: its cost in one-token steps, every sequence's tokens per second
// together, and how many sequences' worth of one-sequence decoding that is.
TEST(BenchReport, StepsOfSeveralSequencesShowTheirAggregateRate) {
  measure::BenchRun b = a_run("m.gguf", 10240);
  b.sequences.push_back({.depth = 4096, .sequences = 16, .seconds = 0.008, .step_ratio = 4.0});
  EXPECT_DOUBLE_EQ(b.sequences[0].tokens_per_s(), 2000.0);
  const std::string text = measure::to_text(h200_like(), b);
  EXPECT_NE(text.find("16 sequences @ depth 4096"), std::string::npos) << text;
  EXPECT_NE(text.find("8.000 ms a step = 4.00 one-token steps;   2000.0 tokens/s in all, 4.00x one sequence's"),
            std::string::npos)
      << text;
  const auto parsed = nlohmann::json::parse(measure::to_json(h200_like(), b).dump());
  ASSERT_EQ(parsed.at("sequences").size(), 1u);
  EXPECT_EQ(parsed["sequences"][0].at("sequences"), 16);
  EXPECT_DOUBLE_EQ(parsed["sequences"][0].at("tokens_per_s").get<double>(), 2000.0);
}

// Steps of several sequences' verify windows: their cost in steps of one token each of as many
// sequences, and the speedup that implies at each acceptance (every sequence's window yielding
// 1 + a tokens for a window of 2).
TEST(BenchReport, StepsOfSeveralSequencesWindowsShowTheSpeedupTheyImply) {
  measure::BenchRun b = a_run("m.gguf", 10240);
  b.sequences.push_back({.depth = 0, .sequences = 16, .seconds = 0.008, .step_ratio = 4.0});
  b.sequences.push_back({.depth = 0, .sequences = 16, .window = 2, .seconds = 0.01, .step_ratio = 5.0, .plain_ratio = 1.25});
  const std::string text = measure::to_text(h200_like(), b);
  EXPECT_NE(text.find("16 sequences x window 2 @ depth 0       10.000 ms a step = 1.25 steps of one token each; at "
                      "acceptance 0.6 / 0.8 / 0.9 they would decode 1.28x / 1.44x / 1.52x faster"),
            std::string::npos)
      << text;
  const auto parsed = nlohmann::json::parse(measure::to_json(h200_like(), b).dump());
  ASSERT_EQ(parsed.at("sequences").size(), 2u);
  EXPECT_EQ(parsed["sequences"][1].at("window"), 2);
  EXPECT_DOUBLE_EQ(parsed["sequences"][1].at("steps_of_one_token_each").get<double>(), 1.25);
  EXPECT_DOUBLE_EQ(parsed["sequences"][1]["speedup_at_acceptance"].at("0.8").get<double>(), 1.44);
  EXPECT_FALSE(parsed["sequences"][1].contains("tokens_per_s"));
  EXPECT_FALSE(parsed["sequences"][1].contains("ms_drafting"));
  EXPECT_EQ(text.find("drafting them"), std::string::npos) << text;  // (no MTP block: not timed)
}

// On a model with an MTP block the step of windows says what drafting them costs, and the speedup
// with it: a window of 3 yields 1 + 0.8 + 0.64 tokens at acceptance 0.8, for 1.5 steps of one token
// each plus drafts of 2 ms against the 8 ms step (0.25 steps).
TEST(BenchReport, StepsOfSeveralSequencesWindowsSayWhatDraftingThemCosts) {
  measure::BenchRun b = a_run("m.gguf", 10240);
  b.sequences.push_back({.depth = 0, .sequences = 4, .seconds = 0.008, .step_ratio = 4.0});
  b.sequences.push_back({.depth = 0, .sequences = 4, .window = 3, .seconds = 0.012, .step_ratio = 6.0, .plain_ratio = 1.5,
                         .draft_seconds = 0.002});
  const std::string text = measure::to_text(h200_like(), b);
  EXPECT_NE(text.find("4 sequences x window 3 @ depth 0       12.000 ms a step = 1.50 steps of one token each; at "
                      "acceptance 0.6 / 0.8 / 0.9 they would decode 1.31x / 1.63x / 1.81x faster; drafting them 2.000 ms "
                      "(0.25 steps), with it 1.12x / 1.39x / 1.55x\n"),
            std::string::npos)
      << text;
  const auto parsed = nlohmann::json::parse(measure::to_json(h200_like(), b).dump());
  EXPECT_DOUBLE_EQ(parsed["sequences"][1].at("ms_drafting").get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(parsed["sequences"][1]["speedup_with_drafting_at_acceptance"].at("0.8").get<double>(), 1.394);
}

// Under the tier a step of rows says what its misses cost both ways: the absent experts' bytes the
// GPU read over PCIe and the CPU's experts with the bytes it read; the CPU's part only where it took
// some.
TEST(BenchReport, StepsOfRowsUnderTheTierSayWhatTheyReadFromHostRam) {
  measure::BenchRun b = a_run("m.gguf", 4785);
  const measure::TierFigures tier{.pcie_bytes = 1e8, .cpu_experts = 20, .cpu_bytes = 4e7};
  b.sequences.push_back({.depth = 0, .sequences = 16, .seconds = 0.07, .step_ratio = 10.0, .tier = tier});
  b.windows.push_back({.depth = 0, .tokens = 2, .seconds = 0.01, .step_ratio = 1.5, .tier = tier});
  const std::string text = measure::to_text(h200_like(), b);
  EXPECT_NE(text.find("; 100.0 MB a step over PCIe, the CPU 20.0 experts (40.0 MB from host RAM)\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("faster; 100.0 MB a window over PCIe, the CPU 20.0 experts (40.0 MB from host RAM)\n"),
            std::string::npos)
      << text;
  b.sequences[0].tier.cpu_experts = 0;  // --miss-path gpu
  const std::string gpu = measure::to_text(h200_like(), b);
  EXPECT_NE(gpu.find("a step over PCIe\n"), std::string::npos) << gpu;
  const auto parsed = nlohmann::json::parse(measure::to_json(h200_like(), b).dump());
  EXPECT_EQ(parsed["sequences"][0].at("cpu_bytes_per_step"), 4e7);
  EXPECT_EQ(parsed["sequences"][0].at("pcie_bytes_per_step"), 1e8);
  EXPECT_EQ(parsed["windows"][0].at("cpu_experts_per_window"), 20.0);
  // With every expert in VRAM there is nothing to say.
  b.plan.experts_resident = b.plan.experts_total;
  const std::string resident = measure::to_text(h200_like(), b);
  EXPECT_EQ(resident.find("a step over PCIe"), std::string::npos) << resident;
  EXPECT_EQ(resident.find("a window over PCIe"), std::string::npos) << resident;
}
