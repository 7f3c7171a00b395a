// `zinf bench <what>`: one subcommand per benchmark; each measures its own physical limit in
// the same run and prints the ratio.
#include "tools/commands.h"

namespace zinf::tools {

void AddBenchCommands(CLI::App& bench) {
  bench.require_subcommand(1);
  AddBenchNvmeCommand(bench);
  AddBenchAdamCommand(bench);
  AddBenchOptimizerStepCommand(bench);
  AddBenchPcieCommand(bench);
  AddBenchProfileCommand(bench);
}

}  // namespace zinf::tools
