// Each subcommand registers itself on the CLI11 app; main() only dispatches and reports errors.
#pragma once
#include <CLI/CLI.hpp>

namespace lode::cli {

void add_inspect_command(CLI::App& app);
void add_dump_command(CLI::App& app);
void add_quantize_command(CLI::App& app);
void add_synth_command(CLI::App& app);
void add_convert_command(CLI::App& app);
void add_logits_command(CLI::App& app);
void add_run_command(CLI::App& app);
void add_chat_command(CLI::App& app);
void add_tokenize_commands(CLI::App& app);
void add_ppl_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_profile_command(CLI::App& app);
void add_kv_quality_command(CLI::App& app);
void add_compare_logits_command(CLI::App& app);

}  // namespace lode::cli
