// The `zinf` command line: info, run, bench, ckpt.
#include <cstdio>

#include "core/log.h"
#include "tools/commands.h"

namespace zinf::tools {

int& ExitCode() {
  static int code = 0;
  return code;
}

}  // namespace zinf::tools

int main(int argc, char** argv) {
  CLI::App app("zinf: ZeRO-3 sharding with CPU and NVMe offload", "zinf");
  app.require_subcommand(1);
  app.set_version_flag("--version", "zinf 0.1.0");
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "Log debug messages (same as ZINF_LOG_LEVEL=debug)");
  app.parse_complete_callback([&] {
    if (verbose) zinf::log::SetLevel(zinf::log::Level::kDebug);
  });

  zinf::tools::AddInfoCommand(app);
  zinf::tools::AddRunCommand(app);
  zinf::tools::AddCkptCommands(app);
  CLI::App* bench = app.add_subcommand("bench", "Measure zinf against this machine's limits");
  zinf::tools::AddBenchCommands(*bench);

  CLI11_PARSE(app, argc, argv);
  return zinf::tools::ExitCode();
}
