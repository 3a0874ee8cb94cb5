// SCAFFOLDING: replaced by the real command with the GGUF reader.
#include "cli/commands.h"
#include "core/error.h"
namespace lode::cli {
void add_dump_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("dump", "(being written)");
  cmd->callback([] { fail("dump: not built yet"); });
}
}  // namespace lode::cli
