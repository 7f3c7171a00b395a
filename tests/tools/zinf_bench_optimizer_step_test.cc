// Runs the real `zinf bench optimizer-step` on small sizes: the step and its two halves, the
// I/O alone and the update alone, each measured (the halves are the tool's own, on the store's
// and the optimizer's public calls), the I/O half moving the step's bytes, and the ratios
// computed from them. Figures are not judged here; bench/RESULTS.md has them.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/nvme/nvme_test_util.h"
#include "tests/tools/run_zinf.h"

namespace {

using zinf::testing::RunZinf;
using zinf::testing::ZinfRun;
using zinf::testing_util::ScratchDir;

constexpr char kSmall[] =
    "bench optimizer-step --params 1M --chunk 128K --host-budget 32MiB --buffers 4 --reps 2 "
    "--threads 2 --json";

void ExpectTheStepAndItsHalves(const nlohmann::json& j) {
  EXPECT_EQ(j["params"], 1 << 20);
  EXPECT_EQ(j["chunk_elements"], 128 * 1024);
  EXPECT_EQ(j["buffers"], 4);
  ASSERT_EQ(j["step_s_runs"].size(), 2u);
  ASSERT_EQ(j["io_only_s_runs"].size(), 2u);
  ASSERT_EQ(j["compute_only_s_runs"].size(), 2u);
  EXPECT_GT(j["step_s"].get<double>(), 0);
  EXPECT_GT(j["compute_only_s"].get<double>(), 0);
  const double bound = std::max(j["io_only_s"].get<double>(), j["compute_only_s"].get<double>());
  EXPECT_DOUBLE_EQ(j["overlap_ratio"].get<double>(), j["step_s"].get<double>() / bound);
}

TEST(ZinfBenchOptimizerStepTest, StateOnNvmeAgainstItsIoAndComputeHalves) {
  ScratchDir dir;
  const ZinfRun r = RunZinf(std::string(kSmall) + " --path " + dir.path());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = zinf::testing::JsonOutput(r);
  ExpectTheStepAndItsHalves(j);
  EXPECT_EQ(j["param_tier"], "nvme");
  // Each chunk's params and two moments read and written back, its gradients read, and its
  // bf16 copy written: 18 bytes of an element each way but the gradients' 4 and the copy's 2.
  EXPECT_EQ(j["bytes_read"].get<uint64_t>(), (1u << 20) * 16);
  EXPECT_EQ(j["bytes_written"].get<uint64_t>(), (1u << 20) * 14);
  EXPECT_GT(j["io_only_s"].get<double>(), 0);
  EXPECT_NEAR(j["io_only_GBps"].get<double>() * j["io_only_s"].get<double>() * 1e9,
              (1u << 20) * 30.0, 1.0)
      << "the I/O half moves the step's bytes";
}

TEST(ZinfBenchOptimizerStepTest, StateInHostMemoryHasNoIo) {
  const ZinfRun r = RunZinf(std::string(kSmall) + " --state-tier cpu");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json j = zinf::testing::JsonOutput(r);
  ExpectTheStepAndItsHalves(j);
  EXPECT_EQ(j["param_tier"], "host");
  EXPECT_EQ(j["bytes_read"], 0);
  EXPECT_EQ(j["bytes_written"], 0);
}

TEST(ZinfBenchOptimizerStepTest, NvmeWithoutAPathIsRefused) {
  const ZinfRun r = RunZinf("bench optimizer-step --params 1M --reps 1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--state-tier nvme needs --path DIR"), std::string::npos) << r.output;
}

}  // namespace
