// `zinf run`: environment, output prefixes, and what happens when a rank fails.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "tests/tools/run_zinf.h"

namespace {

using zinf::testing::RunZinf;
using zinf::testing::ZinfRun;

TEST(ZinfRunTest, SetsTorchrunEnvironmentAndPrefixesOutput) {
  ZinfRun r = RunZinf(
      "run -n 3 -- sh -c 'echo env $RANK/$WORLD_SIZE/$LOCAL_RANK/$LOCAL_WORLD_SIZE/$MASTER_ADDR; "
      "echo to-stderr >&2; printf no-newline'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string p = "[rank " + std::to_string(rank) + "] ";
    EXPECT_NE(r.output.find(p + "env " + std::to_string(rank) + "/3/" + std::to_string(rank) +
                            "/3/127.0.0.1"),
              std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find(p + "to-stderr"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(p + "no-newline"), std::string::npos) << "partial lines are kept";
  }
}

TEST(ZinfRunTest, NodeRankOffsetsGlobalRanks) {
  ZinfRun r = RunZinf(
      "run -n 2 --nnodes 2 --node-rank 1 --master 127.0.0.1:29999 -- "
      "sh -c 'echo $RANK $LOCAL_RANK $WORLD_SIZE $MASTER_PORT'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 2] 2 0 4 29999"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 3] 3 1 4 29999"), std::string::npos) << r.output;
}

TEST(ZinfRunTest, AFailingRankStopsTheOthers) {
  const auto t0 = std::chrono::steady_clock::now();
  ZinfRun r = RunZinf("run -n 3 --grace 2 -- sh -c 'if [ $RANK = 1 ]; then exit 3; fi; sleep 60'");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("rank 1 exited with code 3"), std::string::npos) << r.output;
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20))
      << "the sleeping ranks must be stopped, not waited for";
}

TEST(ZinfRunTest, ACrashIsNamed) {
  ZinfRun r = RunZinf("run -n 2 -- sh -c 'if [ $RANK = 0 ]; then kill -SEGV $$; fi'");
  EXPECT_EQ(r.exit_code, 128 + 11) << r.output;
  EXPECT_NE(r.output.find("rank 0 was killed by signal 11"), std::string::npos) << r.output;
}

TEST(ZinfRunTest, BadInvocations) {
  ZinfRun missing = RunZinf("run -n 2 -- /nonexistent/trainer --flag");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("cannot run '/nonexistent/trainer'"), std::string::npos)
      << missing.output;
  EXPECT_NE(RunZinf("run -n 0 -- true").exit_code, 0);
  EXPECT_NE(RunZinf("run -n 2").exit_code, 0);
  ZinfRun no_master = RunZinf("run -n 1 --nnodes 2 -- true");
  EXPECT_NE(no_master.exit_code, 0);
  EXPECT_NE(no_master.output.find("--master ADDR:PORT is required"), std::string::npos);
  EXPECT_NE(RunZinf("run -n 1 --master nocolon -- true").exit_code, 0);
}

}  // namespace
