// Runs the `zinf` binary built with the tests (path from the ZINF_BINARY definition) and
// captures its exit code and combined output. Shared by the command-line tests.
#ifndef ZINF_TESTS_TOOLS_RUN_ZINF_H_
#define ZINF_TESTS_TOOLS_RUN_ZINF_H_

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

namespace zinf::testing {

struct ZinfRun {
  int exit_code = -1;  // -1 when it could not be started or was killed by a signal
  std::string output;  // stdout and stderr together
};

// Runs a shell command: its stdout and stderr together, and the exit code.
inline ZinfRun RunShell(const std::string& shell_command) {
  const std::string command = shell_command + " 2>&1";
  ZinfRun run;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  std::array<char, 4096> buffer;
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
    run.output.append(buffer.data(), n);
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

inline ZinfRun RunZinf(const std::string& args) {
  return RunShell(std::string(ZINF_BINARY) + " " + args);
}

// The JSON object a `--json` command printed after any log lines; null, with a test failure,
// when the command failed or printed none.
inline nlohmann::json JsonOutput(const ZinfRun& r) {
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const size_t brace = r.output.find('{');
  if (brace == std::string::npos) {
    ADD_FAILURE() << "no JSON in: " << r.output;
    return nullptr;
  }
  return nlohmann::json::parse(r.output.substr(brace), nullptr, /*allow_exceptions=*/false);
}

}  // namespace zinf::testing

#endif  // ZINF_TESTS_TOOLS_RUN_ZINF_H_
