// SCAFFOLDING: replaced by the real command with the GGUF reader.
#include "cli/commands.h"
#include "core/error.h"
namespace lode::cli {
void add_inspect_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("inspect", "(being written)");
  cmd->callback([] { fail("inspect: not built yet"); });
}
}  // namespace lode::cli
