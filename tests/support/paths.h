// Where the tests find their data, the repository and the lode binary. Each comes from the
// environment when set (LODE_TEST_DATA, LODE_REPO, LODE_BINARY), else from beside the test binary
// (a build folder inside the repository: ../tests/data, .., ./lode), else from the paths baked in at
// build time. So a build carried to another machine or folder runs where it lands.
#pragma once
#include <filesystem>
#include <string>

namespace lode::test {

const std::filesystem::path& test_data();  // tests/data
const std::filesystem::path& repo_root();  // the checkout (test_data()/../..)
const std::filesystem::path& mini_model_path();  // models/lode-mini.gguf
const std::string& lode_binary();          // the lode binary this build made

}  // namespace lode::test
