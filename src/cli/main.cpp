#include <cstdio>
#include <exception>

#include "cli/commands.h"
#include "core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"lode: mixture-of-experts language models on GPUs too small to hold them"};
  app.set_version_flag("--version", std::string("lode ") + LODE_VERSION);
  app.require_subcommand(1);
  lode::cli::add_inspect_command(app);
  lode::cli::add_dump_command(app);
  lode::cli::add_quantize_command(app);
  lode::cli::add_synth_command(app);
  lode::cli::add_convert_command(app);
  lode::cli::add_logits_command(app);
  lode::cli::add_run_command(app);
  lode::cli::add_chat_command(app);
  lode::cli::add_tokenize_commands(app);
  lode::cli::add_ppl_command(app);
  lode::cli::add_kv_quality_command(app);
  lode::cli::add_compare_logits_command(app);
  lode::cli::add_serve_command(app);
  lode::cli::add_bench_command(app);
  lode::cli::add_plan_command(app);
  lode::cli::add_profile_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const lode::Error& e) {
    std::fprintf(stderr, "lode: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lode: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
