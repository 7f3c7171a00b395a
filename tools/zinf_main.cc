// The `zinf` command line: info, run, ckpt, plot, plan, bench.
#include <fmt/core.h>

#include <cstdio>
#include <string>

#include "core/log.h"
#include "tools/commands.h"

namespace zinf::tools {

int& ExitCode() {
  static int code = 0;
  return code;
}

bool Report(const char* command, const Status& s) {
  if (s.ok()) return true;
  fmt::print(stderr, "{}: {}\n", command, s.ToString());
  ExitCode() = 1;
  return false;
}

namespace {

// CLI11 reports a mistyped subcommand only as "A subcommand is required". Finds the word it did
// not know: the first one left over at the deepest subcommand that parsed, where that one
// expects subcommands. Empty when the error is something else.
std::string UnknownSubcommand(CLI::App& app, std::string* path, std::string* known) {
  CLI::App* at = &app;
  *path = app.get_name();
  for (;;) {
    const std::vector<CLI::App*> parsed = at->get_subcommands();
    if (parsed.empty()) break;
    at = parsed.front();
    *path += " " + at->get_name();
  }
  const std::vector<CLI::App*> choices = at->get_subcommands({});
  const std::vector<std::string> rest = at->remaining();
  if (choices.empty() || rest.empty() || rest.front().empty() || rest.front()[0] == '-') {
    return "";
  }
  for (const CLI::App* c : choices) *known += (known->empty() ? "" : ", ") + c->get_name();
  return rest.front();
}

}  // namespace
}  // namespace zinf::tools

int main(int argc, char** argv) {
  CLI::App app("zinf: ZeRO-3 sharding with CPU and NVMe offload", "zinf");
  app.require_subcommand(1);
  app.set_version_flag("--version", "zinf " ZINF_VERSION_STRING);  // tools/CMakeLists.txt
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "Log debug messages (same as ZINF_LOG_LEVEL=debug)");
  app.parse_complete_callback([&] {
    if (verbose) zinf::log::SetLevel(zinf::log::Level::kDebug);
  });

  zinf::tools::AddInfoCommand(app);
  zinf::tools::AddRunCommand(app);
  zinf::tools::AddCkptCommands(app);
  zinf::tools::AddPlotCommands(app);
  zinf::tools::AddPlanCommand(app);
  CLI::App* bench = app.add_subcommand("bench", "Measure zinf against this machine's limits");
  zinf::tools::AddBenchCommands(*bench);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::string path, known;
    const std::string word = zinf::tools::UnknownSubcommand(app, &path, &known);
    if (!word.empty() && e.get_exit_code() != 0) {
      std::fprintf(stderr, "%s: unknown command '%s'; expected one of: %s (see %s --help)\n",
                   path.c_str(), word.c_str(), known.c_str(), path.c_str());
      return e.get_exit_code();
    }
    return app.exit(e);
  }
  return zinf::tools::ExitCode();
}
