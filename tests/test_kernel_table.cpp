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

}  // namespace
