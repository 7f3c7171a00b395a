// Runs the real `zinf` binary: `zinf info` must describe this machine and reject bad paths.
#include <gtest/gtest.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <string>

#include "tests/tools/run_zinf.h"

namespace {

using zinf::testing::RunZinf;
using zinf::testing::ZinfRun;

TEST(ZinfInfoTest, JsonDescribesTheMachine) {
  ZinfRun r = RunZinf("info --json --path /tmp");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json info = nlohmann::json::parse(r.output);
  EXPECT_EQ(info["cpu"]["logical_cpus"].get<long>(), sysconf(_SC_NPROCESSORS_ONLN));
  EXPECT_GT(info["memory"]["total_bytes"].get<uint64_t>(), 0u);
  EXPECT_TRUE(info["io_uring"].contains("available"));
  ASSERT_EQ(info["paths"].size(), 1u);
  EXPECT_EQ(info["paths"][0]["path"], "/tmp");
  EXPECT_TRUE(info["paths"][0]["writable"].get<bool>());
  // Without a GPU the reason is given; with one, each GPU is listed.
  EXPECT_TRUE(!info["cuda"]["gpus"].empty() || !info["cuda"]["error"].get<std::string>().empty());
}

TEST(ZinfInfoTest, TextNamesEverySection) {
  ZinfRun r = RunZinf("info");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* section : {"CPU", "ISA", "Cores", "Memory", "GPU", "io_uring"}) {
    EXPECT_NE(r.output.find(section), std::string::npos) << section << " missing from:\n"
                                                         << r.output;
  }
}

TEST(ZinfInfoTest, BadPathIsReportedAndFails) {
  ZinfRun r = RunZinf("info --path /nonexistent/zinf");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("/nonexistent/zinf does not exist"), std::string::npos) << r.output;
}

TEST(ZinfCliTest, UnknownSubcommandFails) {
  ZinfRun r = RunZinf("frobnicate");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("unknown command 'frobnicate'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("info, run"), std::string::npos) << r.output;
  ZinfRun nested = RunZinf("-v bench frob");
  EXPECT_NE(nested.exit_code, 0);
  EXPECT_NE(nested.output.find("zinf bench: unknown command 'frob'"), std::string::npos)
      << nested.output;
  EXPECT_NE(nested.output.find("nvme"), std::string::npos) << nested.output;
  ZinfRun help = RunZinf("--help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.output.find("info"), std::string::npos);
  EXPECT_NE(help.output.find("bench"), std::string::npos);
}

}  // namespace
