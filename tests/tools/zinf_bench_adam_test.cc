// Runs the real `zinf bench adam` on small sizes: each --load (threads of other work beside the
// step) is its own configuration with its own figures, and a bad --load is refused by name.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/tools/run_zinf.h"

namespace {

using zinf::testing::RunZinf;
using zinf::testing::ZinfRun;

TEST(ZinfBenchAdamTest, MeasuresEachLoadBesideTheStep) {
  const ZinfRun run = RunZinf("bench adam --params 64K --threads 2 --load 0,3 --reps 2 --json");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::vector<int> loads;
  std::istringstream lines(run.output);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] != '{') continue;
    const nlohmann::json j = nlohmann::json::parse(line);
    loads.push_back(j["load_threads"].get<int>());
    EXPECT_EQ(j["threads"], 2) << line;
    EXPECT_EQ(j["params"], 65536) << line;
    EXPECT_GT(j["GBps"].get<double>(), 0.0) << line;
    EXPECT_GT(j["limit_GBps"].get<double>(), 0.0) << line;
  }
  EXPECT_EQ(loads, (std::vector<int>{0, 3})) << run.output;
}

TEST(ZinfBenchAdamTest, RefusesANegativeLoad) {
  const ZinfRun run = RunZinf("bench adam --params 64K --load 0,-1 --reps 1");
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("--load must be >= 0, got -1"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("G params/s"), std::string::npos) << "measured first: " << run.output;
}

}  // namespace
