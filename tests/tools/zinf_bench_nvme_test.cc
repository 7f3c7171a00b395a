// Runs the real `zinf bench nvme` on small sizes: its JSON carries both directions, fio's
// figures and ratios that agree with them, the grid comparison picks fio's best cell by
// median, and bad arguments fail with a message naming them. Figures are not judged here;
// bench/RESULTS.md has them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/nvme/nvme_test_util.h"
#include "tests/tools/run_zinf.h"

namespace {

using zinf::testing::RunZinf;
using zinf::testing::ZinfRun;
using zinf::testing_util::ScratchDir;

// Parses the run's JSON, or skips where the scratch file system refuses O_DIRECT.
nlohmann::json ParseOrSkip(const ZinfRun& r) {
  if (r.exit_code != 0 && r.output.find("O_DIRECT") != std::string::npos) {
    return nullptr;
  }
  return zinf::testing::JsonOutput(r);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

TEST(ZinfBenchNvmeTest, JsonHasBothDirectionsAndRatiosAgainstFio) {
  ScratchDir dir;
  ZinfRun r = RunZinf("bench nvme --path " + dir.path() + " --size 8MiB --reps 3 --json");
  const nlohmann::json j = ParseOrSkip(r);
  if (j.is_null()) GTEST_SKIP() << "scratch directory refuses O_DIRECT: " << r.output;
  EXPECT_EQ(j["config"]["block_size"], 1 << 20);  // the defaults, since no flag was given
  EXPECT_EQ(j["config"]["queue_depth"], 8);
  EXPECT_EQ(j["config"]["single_submit"], true);
  EXPECT_GT(j["write_MBps"].get<double>(), 0);
  EXPECT_GT(j["read_MBps"].get<double>(), 0);
  ASSERT_EQ(j["runs"].size(), 3u);
  std::vector<double> reads;
  for (const auto& run : j["runs"]) reads.push_back(run["read_MBps"].get<double>());
  EXPECT_DOUBLE_EQ(j["read_MBps"].get<double>(), Median(reads));
  if (j["fio"].is_null()) GTEST_SKIP() << "fio is not on PATH: no ratios to check";
  EXPECT_DOUBLE_EQ(j["write_ratio"].get<double>(),
                   j["write_MBps"].get<double>() / j["fio_write_MBps"].get<double>());
  EXPECT_DOUBLE_EQ(j["read_ratio"].get<double>(),
                   j["read_MBps"].get<double>() / j["fio_read_MBps"].get<double>());
  // fio's file is deleted with zinf's swap files.
  EXPECT_FALSE(std::ifstream(dir.path() + "/zinf-bench-fio.dat").good());
}

TEST(ZinfBenchNvmeTest, GridComparesWithFiosBestCellByMedian) {
  ScratchDir dir;
  ZinfRun r = RunZinf("bench nvme --path " + dir.path() +
                      " --size 4MiB --block-size 256KiB --queue-depth 4 --reps 3 --vs-fio-grid"
                      " --single-submit 0 --json");
  const nlohmann::json j = ParseOrSkip(r);
  if (j.is_null()) GTEST_SKIP() << "scratch directory refuses O_DIRECT: " << r.output;
  EXPECT_EQ(j["config"]["block_size"], 256 << 10);
  EXPECT_EQ(j["config"]["queue_depth"], 4);
  EXPECT_EQ(j["config"]["single_submit"], false);
  if (j["fio"].is_null()) GTEST_SKIP() << "fio is not on PATH";
  ASSERT_EQ(j["fio_grid"].size(), 6u);  // {128K, 1M, 8M} x {QD 8, 32}
  double best_read = 0, best_write = 0;
  for (const auto& cell : j["fio_grid"]) {
    best_read = std::max(best_read, cell["read_MBps"].get<double>());
    best_write = std::max(best_write, cell["write_MBps"].get<double>());
  }
  EXPECT_DOUBLE_EQ(j["fio_read_MBps"].get<double>(), best_read);
  EXPECT_DOUBLE_EQ(j["fio_write_MBps"].get<double>(), best_write);
  EXPECT_DOUBLE_EQ(j["fio_best_read"]["read_MBps"].get<double>(), best_read);
  // Each repetition reports the best cell's run of that repetition, whose median it is.
  std::vector<double> fio_reads;
  for (const auto& run : j["runs"]) fio_reads.push_back(run["fio_read_MBps"].get<double>());
  EXPECT_DOUBLE_EQ(Median(fio_reads), best_read);
}

TEST(ZinfBenchNvmeTest, BadArgumentsFailNamingThem) {
  ScratchDir dir;
  const std::string file = dir.path() + "/plain-file";
  std::ofstream(file) << "x";
  struct Case {
    std::string args;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"--path /nonexistent/zinf", "--path /nonexistent/zinf is not an existing directory"},
      {"--path " + file, "is not an existing directory"},
      {"--path " + dir.path() + " --size 1MiB --block-size 2MiB", "must be at least --block-size"},
      {"--path " + dir.path() + " --queue-depth 0", "aio.queue_depth must be in [1, 4096], got 0"},
      {"--path " + dir.path() + " --block-size 1000", "aio.block_size must be a multiple of 4096"},
      {"--path " + dir.path() + " --reps 0", "--reps must be >= 1, got 0"},
      {"--path " + dir.path() + " --size lots", "lots"},
      {"--path " + dir.path() + " --staging 1000", "--staging must be a positive multiple of 4096"},
  };
  for (const Case& c : cases) {
    ZinfRun r = RunZinf("bench nvme --no-fio " + c.args);
    EXPECT_EQ(r.exit_code, 1) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.expected), std::string::npos) << c.args << "\n" << r.output;
  }
}

}  // namespace
