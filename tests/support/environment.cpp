// The test process's environment, set before any test runs: LODE_KV (the K/V format a command
// falls back to) is cleared, so each test runs in the format it names and not in one a developer
// exported in their shell; the tests of LODE_KV itself set it around the commands they run.
#include <cstdlib>

namespace {
const bool kv_cleared = (unsetenv("LODE_KV"), true);
}  // namespace
