#include "support/paths.h"

#include <cstdlib>
#include <system_error>

namespace lode::test {
namespace fs = std::filesystem;

namespace {

fs::path executable_dir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : exe.parent_path();
}

// The environment's value of `variable`, else `beside` when it exists, else `baked`.
fs::path locate(const char* variable, const fs::path& beside, const char* baked) {
  if (const char* set = std::getenv(variable); set && *set) return set;
  std::error_code ec;
  if (!beside.empty() && fs::exists(beside, ec)) return fs::weakly_canonical(beside, ec);
  return baked;
}

}  // namespace

const fs::path& test_data() {
  static const fs::path path = locate("LODE_TEST_DATA", executable_dir() / ".." / "tests" / "data", LODE_TEST_DATA);
  return path;
}

const fs::path& repo_root() {
  static const fs::path path = [] {
    if (const char* set = std::getenv("LODE_REPO"); set && *set) return fs::path(set);
    return test_data().parent_path().parent_path();
  }();
  return path;
}

const fs::path& mini_model_path() {
  static const fs::path path = repo_root() / "models" / "lode-mini.gguf";
  return path;
}

const std::string& lode_binary() {
  static const std::string path = locate("LODE_BINARY", executable_dir() / "lode", LODE_BINARY).string();
  return path;
}

}  // namespace lode::test
