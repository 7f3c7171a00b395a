// train_gpt run long (the demo-size GPT, examples/gpt/configs): nothing in the process grows
// with the number of steps. Two placements: two ranks with everything in memory, and one rank
// with parameters, optimizer state and gradients on NVMe with the overlapped step. Every run
// checks that the median of the tiered store's bookkeeping (StepSummary::store_entries) does
// not climb; runs of 2,000 steps or more also check that the resident set after step 1,000
// and at the end differ by under 1%. The step count is ZINF_SOAK_STEPS: a short build of this
// test runs 300, the one labelled slow 20,000 (tests/gpt/CMakeLists.txt), as the suites
// ZINF_SOAK_SUITE names: SoakTest and SoakSlowTest.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
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

constexpr int64_t kSteps = ZINF_SOAK_STEPS;
constexpr int64_t kRssFromStep = 1000;  // allocators and caches have settled by then

struct StepMetrics {
  int64_t step = 0;
  uint64_t store_entries = 0;
  uint64_t rss_bytes = 0;
};

std::vector<StepMetrics> ReadMetrics(const std::string& path) {
  std::vector<StepMetrics> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    const auto m = nlohmann::json::parse(line, nullptr, false);
    EXPECT_FALSE(m.is_discarded()) << line;
    if (m.is_discarded()) break;
    out.push_back({m.at("step").get<int64_t>(), m.at("store_entries").get<uint64_t>(),
                   m.at("rss_bytes").get<uint64_t>()});
  }
  return out;
}

// The median of the store entries over steps [first, last] (1-based, inclusive). Not the
// most: a step's count includes the jobs and free ranges in flight when it ends, which moves
// by a few entries from run to run (239..258 in one run of 300 steps), while a leak raises
// every step's count from the step it begins on, and so the median.
uint64_t MedianEntries(const std::vector<StepMetrics>& steps, int64_t first, int64_t last) {
  std::vector<uint64_t> entries;
  for (const StepMetrics& s : steps) {
    if (s.step >= first && s.step <= last) entries.push_back(s.store_entries);
  }
  if (entries.empty()) return 0;
  const auto mid = entries.begin() + static_cast<std::ptrdiff_t>(entries.size() / 2);
  std::nth_element(entries.begin(), mid, entries.end());
  return *mid;
}

void ExpectNothingGrows(const std::string& metrics_path) {
  const std::vector<StepMetrics> steps = ReadMetrics(metrics_path);
  ASSERT_EQ(static_cast<int64_t>(steps.size()), kSteps);
  // After the first steps (the traced order, the pools' first carving) the entries move
  // within a range set by what is in flight; the second half's median may not exceed the
  // first's.
  const uint64_t settled = MedianEntries(steps, kSteps / 6, kSteps / 2);
  const uint64_t later = MedianEntries(steps, kSteps / 2 + 1, kSteps);
  EXPECT_GT(settled, 0u);
  EXPECT_LE(later, settled) << "the store's bookkeeping grew from a median of " << settled
                            << " entries in steps " << kSteps / 6 << ".." << kSteps / 2 << " to "
                            << later;
  if (kSteps < 2 * kRssFromStep) return;
  const double from = static_cast<double>(steps[kRssFromStep - 1].rss_bytes);
  const double end = static_cast<double>(steps.back().rss_bytes);
  EXPECT_LT(std::abs(end - from) / from, 0.01)
      << "RSS " << from / 1e6 << " MB after step " << kRssFromStep << ", " << end / 1e6
      << " MB after step " << kSteps;
}

std::string TrainArgs(const std::string& config, const std::string& metrics) {
  return std::string(TRAIN_GPT_BINARY) + " --config " + ZINF_SOURCE_DIR + "/examples/gpt/configs/" +
         config + " --steps " + std::to_string(kSteps) + " --threads 1 --log-every 0 --metrics " +
         metrics;
}

TEST(ZINF_SOAK_SUITE, TwoRanksInMemoryGrowNothing) {
  ScratchDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string metrics = dir.path() + "/metrics.jsonl";
  const ZinfRun run = RunZinf("run -n 2 -- " + TrainArgs("memory.json", metrics));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  ExpectNothingGrows(metrics);
}

TEST(ZINF_SOAK_SUITE, OneRankWithEverythingOnNvmeAndTheOverlapGrowsNothing) {
  ScratchDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string metrics = dir.path() + "/metrics.jsonl";
  const ZinfRun run =
      RunZinf("run -n 1 -- " + TrainArgs("nvme.json", metrics) + " --nvme-path " + dir.Sub("nvme") +
              " --set zinf.gradients_on_nvme=true --set zinf.overlap_optimizer=true");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  ExpectNothingGrows(metrics);
}

}  // namespace
