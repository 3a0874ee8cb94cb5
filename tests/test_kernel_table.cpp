// `lode bench --profile`'s kernel table (measure/kernel_table.h): slowest class first, times per
// step, each class's share of the step, and GB/s against the copy ceiling only where a class moves
// bytes of note.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "measure/kernel_table.h"

namespace {

using lode::cuda::KernelClassTime;

TEST(KernelTable, SlowestFirstWithPerStepTimesSharesAndBandwidth) {
  const std::vector<KernelClassTime> classes = {
      {.name = "residual and norm", .launches = 80, .seconds = 2 * 40 * 4e-6, .bytes = 0},
      {.name = "experts gate|up (q4_k)", .launches = 80, .seconds = 2 * 40 * 12e-6, .bytes = 2 * 40 * 9.6e6},
  };
  const std::string text = lode::measure::kernel_table_text(classes, 2, 8192, 4000.0);
  const size_t experts = text.find("experts gate|up (q4_k)"), norms = text.find("residual and norm");
  ASSERT_NE(experts, std::string::npos) << text;
  ASSERT_NE(norms, std::string::npos) << text;
  EXPECT_LT(experts, norms) << text;  // 480 us a step before 160
  EXPECT_NE(text.find("at depth 8192"), std::string::npos) << text;
  EXPECT_NE(text.find("0.640 ms per token in all"), std::string::npos) << text;
  const std::string experts_row = text.substr(experts, text.find('\n', experts) - experts);
  // 40 launches a step, 12 us each, 480 us a step, 75% of it; 384 MB a step at 800 GB/s, 20% of 4000.
  for (const char* figure : {" 40.0 ", " 12.0 ", " 480.0 ", " 75.0%", " 384.00 ", " 800 ", " 20.0%"})
    EXPECT_NE(experts_row.find(figure), std::string::npos) << figure << " in " << experts_row;
  const std::string norms_row = text.substr(norms, text.find('\n', norms) - norms);
  EXPECT_NE(norms_row.find(" 25.0%"), std::string::npos) << norms_row;
  EXPECT_NE(norms_row.find(" -       -"), std::string::npos) << norms_row;  // no bytes, no rate
  EXPECT_EQ(norms_row.find('%', norms_row.find(" 25.0%") + 6), std::string::npos) << norms_row;  // no fraction
}

TEST(KernelTable, WithoutACeilingThereIsNoFractionColumn) {
  const std::string text = lode::measure::kernel_table_text(
      {{.name = "lm head (q6_k)", .launches = 1, .seconds = 2e-4, .bytes = 4.2e8}}, 1, 0, 0.0);
  EXPECT_EQ(text.find("of copy"), std::string::npos) << text;
  const size_t at = text.find("lm head (q6_k)");
  ASSERT_NE(at, std::string::npos) << text;
  const std::string row = text.substr(at, text.find('\n', at) - at);
  EXPECT_TRUE(row.ends_with(" 2100")) << row;  // 420 MB in 200 us, and nothing after it
  EXPECT_NE(row.find(" 420.00 "), std::string::npos) << row;
}

// The second table: the full step less the step without each class, costliest first, per launch
// too; a class the overlap hides costs nothing (or a little less than nothing, as measured).
TEST(KernelTable, CostsInsideTheStepAreWhatEachClassSaves) {
  using lode::measure::StepWithout;
  const std::string text = lode::measure::step_cost_table_text(
      3.4e-3, {{.name = "DeltaNet conv", .launches = 30, .step_seconds = 3.4e-3 + 1e-6},
               {.name = "router", .launches = 40, .step_seconds = 3.0e-3}},
      544);
  const size_t router = text.find("router"), conv = text.find("DeltaNet conv");
  ASSERT_NE(router, std::string::npos) << text;
  ASSERT_NE(conv, std::string::npos) << text;
  EXPECT_LT(router, conv) << text;
  EXPECT_NE(text.find("at depth 544"), std::string::npos) << text;
  EXPECT_NE(text.find("the whole step 3.400 ms"), std::string::npos) << text;
  const std::string router_row = text.substr(router, text.find('\n', router) - router);
  // 400 us a step saved by leaving out 40 launches: 10 us each, 11.8% of the step.
  for (const char* figure : {" 40.0 ", " 3.000 ms ", " 400.0 ", " 10.0 ", " 11.8%"})
    EXPECT_NE(router_row.find(figure), std::string::npos) << figure << " in " << router_row;
  const std::string conv_row = text.substr(conv, text.find('\n', conv) - conv);
  EXPECT_NE(conv_row.find(" -1.0 "), std::string::npos) << conv_row;  // slower without it, by 1 us
}

}  // namespace
