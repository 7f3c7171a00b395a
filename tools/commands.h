// The `zinf` subcommands. Each lives in its own file and adds itself to the CLI11 app;
// zinf_main.cc calls these in the order `zinf --help` lists them.
#ifndef ZINF_TOOLS_COMMANDS_H_
#define ZINF_TOOLS_COMMANDS_H_

#include <CLI/CLI.hpp>

#include "zinf/status.h"

namespace zinf::tools {

// Each Add* registers a subcommand whose callback sets the process exit code through
// ExitCode(); a subcommand reports failure by printing the Status and returning non-zero.
int& ExitCode();
// Reports a subcommand's outcome: an error is printed after `command` ("zinf plan") and sets
// the exit code. Returns whether `s` is OK.
bool Report(const char* command, const Status& s);

void AddInfoCommand(CLI::App& app);                  // tools/info.cc
void AddRunCommand(CLI::App& app);                   // tools/run.cc: `zinf run -n N -- CMD`
void AddCkptCommands(CLI::App& app);                 // tools/ckpt.cc: `zinf ckpt export / import`
void AddPlotCommands(CLI::App& app);                 // tools/plot_metrics.cc: `zinf plot metrics`
void AddPlanCommand(CLI::App& app);                  // tools/plan.cc: `zinf plan`
void AddBenchCommands(CLI::App& bench);              // tools/bench.cc: `zinf bench <what>`
void AddBenchNvmeCommand(CLI::App& bench);           // tools/bench_nvme.cc: `zinf bench nvme`
void AddBenchAdamCommand(CLI::App& bench);           // tools/bench_adam.cc: `zinf bench adam`
void AddBenchOptimizerStepCommand(CLI::App& bench);  // tools/bench_optimizer_step.cc
void AddBenchPcieCommand(CLI::App& bench);           // tools/bench_pcie.cc: `zinf bench pcie`
void AddBenchProfileCommand(CLI::App& bench);        // tools/bench_profile.cc

}  // namespace zinf::tools

#endif  // ZINF_TOOLS_COMMANDS_H_
