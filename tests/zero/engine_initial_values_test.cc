// Engine::Initialize(InitialValues): a model's values handed over piece by piece at
// initialization, on every placement of parameters and optimizer state, on one rank and two;
// each rank is asked for its own elements only, each once; a failing source fails Initialize.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "tests/testing/fork_ranks.h"
#include "tests/testing/temp_dir.h"
#include "zinf/engine.h"

namespace zinf {
namespace {

using namespace std::chrono_literals;

// The model: "m0" {p0 [3000000]} and "m1" {p1 [2000, 3000], p2 [7]}. With everything on
// NVMe the optimizer's 8M-element chunk boundary falls inside p1, whose values then come in
// two pieces; p2 does not divide by two ranks (padding).
const std::map<std::string, std::vector<int64_t>> kShapes = {
    {"p0", {3000000}}, {"p1", {2000, 3000}}, {"p2", {7}}};

float Value(const std::string& name, uint64_t i) {
  return static_cast<float>(name[1] - '0') + 1e-6f * static_cast<float>(i % 1000003);
}

std::string Config(const std::string& placement, const std::string& dir) {
  const std::string nvme = R"({"device": "nvme", "nvme_path": ")" + dir + "\"}";
  const bool params_nvme = placement == "params_nvme" || placement == "all_nvme";
  const bool optimizer_nvme = placement == "optimizer_nvme" || placement == "all_nvme";
  return R"({"zero_optimization": {"stage": 3, "offload_optimizer": )" +
         (optimizer_nvme ? nvme : R"({"device": "cpu"})") + R"(, "offload_param": )" +
         (params_nvme ? nvme : R"({"device": "none"})") + "}}";
}

struct Outcome {
  Status initialized;
  std::map<std::string, std::vector<bool>> asked;  // per element: whether the source gave it
  int repeats = 0;                                 // elements asked for twice
  std::map<std::string, std::vector<float>> gathered;
};

// One rank: registers the model, initializes it from Value (or from a source that fails on
// p1 when `fail`), and gathers every parameter back.
Outcome RunRank(const std::string& placement, const std::string& dir, int rank, int world, int port,
                bool fail = false) {
  Outcome o;
  auto config = EngineConfig::FromJson(Config(placement, dir));
  EXPECT_TRUE(config.ok()) << config.status();
  auto engine = Engine::Create(*config, {.device = "host",
                                         .rank = rank,
                                         .world_size = world,
                                         .master_port = port,
                                         .timeout = 30000ms,
                                         .optimizer_threads = 1});
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return o;
  Engine& e = **engine;
  EXPECT_TRUE(e.RegisterModule("m0", {{"p0", kShapes.at("p0")}}).ok());
  EXPECT_TRUE(e.RegisterModule("m1", {{"p1", kShapes.at("p1")}, {"p2", kShapes.at("p2")}}).ok());
  for (const auto& [name, shape] : kShapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    o.asked[name].assign(n, false);
  }
  o.initialized = e.Initialize(
      [&](const std::string& name, uint64_t first, uint64_t count, float* out) -> Status {
        if (fail && name == "p1") return IoError("the disk is gone");
        std::vector<bool>& asked = o.asked.at(name);
        EXPECT_LE(first + count, asked.size()) << name;
        for (uint64_t i = first; i < first + count && i < asked.size(); ++i) {
          o.repeats += asked[i];
          asked[i] = true;
          out[i - first] = Value(name, i);
        }
        return OkStatus();
      });
  if (!o.initialized.ok()) return o;
  for (const auto& [name, shape] : kShapes) {
    EXPECT_TRUE(e.GatherParameter(name, &o.gathered[name]).ok()) << name;
  }
  return o;
}

class InitialValuesTest : public ::testing::TestWithParam<const char*> {
 protected:
  testing::TempDir tmp_{std::string("zinf-initial-values-") + GetParam()};
  const std::string dir_ = tmp_.path();
};

TEST_P(InitialValuesTest, OneRankIsAskedForEveryElementOnceAndKeepsIt) {
  const Outcome o = RunRank(GetParam(), dir_, 0, 1, 0);
  ASSERT_TRUE(o.initialized.ok()) << o.initialized;
  EXPECT_EQ(o.repeats, 0);
  for (const auto& [name, asked] : o.asked) {
    for (size_t i = 0; i < asked.size(); ++i) {
      ASSERT_TRUE(asked[i]) << name << "[" << i << "] was never asked for";
      ASSERT_EQ(o.gathered.at(name)[i], Value(name, i)) << name << "[" << i << "]";
    }
  }
}

TEST_P(InitialValuesTest, AFailingSourceFailsInitializeNamingTheParameter) {
  const Outcome o = RunRank(GetParam(), dir_, 0, 1, 0, /*fail=*/true);
  EXPECT_EQ(o.initialized.code(), StatusCode::kIoError) << o.initialized;
  EXPECT_NE(o.initialized.message().find("'p1'"), std::string::npos) << o.initialized;
  EXPECT_NE(o.initialized.message().find("the disk is gone"), std::string::npos);
}

// Two ranks: each is asked for exactly its own elements (rank r: [r * s, (r + 1) * s) of each
// parameter, s = ceil(numel / 2)), and both gather the whole model.
TEST_P(InitialValuesTest, EachOfTwoRanksIsAskedForItsOwnElements) {
  const int port = testing::FreePort();
  const std::vector<int> codes = testing::ForkRanks(2, [&](int rank) {
    const Outcome o = RunRank(GetParam(), dir_, rank, 2, port);
    if (!o.initialized.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, o.initialized.ToString().c_str());
      return 10;
    }
    if (o.repeats != 0) return 11;
    for (const auto& [name, asked] : o.asked) {
      const size_t shard = (asked.size() + 1) / 2;
      for (size_t i = 0; i < asked.size(); ++i) {
        if (asked[i] != (i / shard == static_cast<size_t>(rank))) {
          std::fprintf(stderr, "rank %d: %s[%zu] asked %d\n", rank, name.c_str(), i, int{asked[i]});
          return 12;
        }
        if (o.gathered.at(name)[i] != Value(name, i)) return 13;
      }
    }
    return ::testing::Test::HasFailure() ? 14 : 0;
  });
  EXPECT_EQ(codes, std::vector<int>({0, 0}));
}

INSTANTIATE_TEST_SUITE_P(Zero, InitialValuesTest,
                         ::testing::Values("memory", "optimizer_nvme", "params_nvme", "all_nvme"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace zinf
