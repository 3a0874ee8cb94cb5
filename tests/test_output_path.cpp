// Output paths are checked before a command works (core/output_path.h): writing through
// PATH.partial and a rename must not replace a directory, a device or the command's own input, and
// a link is written through. The commands use it: lode logits and quantize refuse their model as
// the output and leave it unchanged; "-" is standard output.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "core/output_path.h"
#include "support/paths.h"
#include "support/run_lode.h"
#include "test_gguf_helpers.h"

namespace {

namespace fs = std::filesystem;
using lode::checked_output_path;
using lode::test::fails_with;

TEST(OutputPath, WhatWritingWouldDestroyIsRefusedAndLinksAreFollowed) {
  const lode::test::TempDir dir;
  const fs::path input = dir / "model.gguf";
  std::ofstream(input) << "weights";
  EXPECT_EQ(checked_output_path(dir / "new.bin", {input}), dir / "new.bin");
  EXPECT_TRUE(fails_with([&] { checked_output_path(input, {input}); }, {"which this command reads"}));
  fs::create_symlink("model.gguf", dir / "alias.gguf");
  EXPECT_TRUE(fails_with([&] { checked_output_path(dir / "alias.gguf", {input}); }, {"alias.gguf", "which this command reads"}));
  fs::create_directory(dir / "sub");
  EXPECT_TRUE(fails_with([&] { checked_output_path(dir / "sub", {}); }, {"is a directory"}));
  EXPECT_TRUE(fails_with([&] { checked_output_path("/dev/null", {}); }, {"/dev/null", "not a regular file"}));
  EXPECT_TRUE(fails_with([&] { checked_output_path(dir / "none" / "x.bin", {}); }, {"does not exist"}));
  // A link, even one whose target is not there yet, is written through: the link stays.
  fs::create_symlink("sub/real.bin", dir / "link.bin");
  EXPECT_EQ(checked_output_path(dir / "link.bin", {input}), dir / "sub/real.bin");
}

TEST(OutputPath, CommandsRefuseToOverwriteTheirModel) {
  const lode::test::TempDir dir;
  const fs::path model = dir / "m.gguf";
  fs::copy_file(lode::test::mini_model_path(), model);
  const std::string before = lode::test::slurp(model);
  const std::string m = "'" + model.string() + "'";
  auto r = lode::test::run_lode("logits -m " + m + " --tokens 1,2 -o " + m, dir.path());
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_NE(r.err.find("which this command reads"), std::string::npos) << r.err;
  r = lode::test::run_lode("quantize " + m + " " + m + " --type q8_0", dir.path());
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(lode::test::slurp(model), before);
  EXPECT_FALSE(fs::exists(dir / "m.gguf.partial"));
  // A split model's every part is its input, not only the first named.
  r = lode::test::run_lode("quantize " + m + " '" + (dir / "q.gguf").string() + "' --type q8_0 --split-max-gib 0.01",
                           dir.path());
  ASSERT_EQ(r.status, 0) << r.err;
  const fs::path second = dir / "q-00002-of-00002.gguf";
  ASSERT_TRUE(fs::exists(second));
  const std::string part = lode::test::slurp(second);
  r = lode::test::run_lode("logits -m '" + (dir / "q-00001-of-00002.gguf").string() + "' --tokens 1 -o '" +
                               second.string() + "'", dir.path());
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_EQ(lode::test::slurp(second), part);
  r = lode::test::run_lode("logits -m " + m + " --tokens 1,2 -o -", dir.path());
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out.size(), 2u * 8192u * sizeof(float));
  EXPECT_FALSE(fs::exists(dir / "-"));
}

}  // namespace
