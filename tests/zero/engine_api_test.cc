// The engine's single-process API beyond training: setting and reading parameters and
// gradients, with the optimizer state in memory and on NVMe.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "zinf/engine.h"

namespace zinf {
namespace {

class EngineApiTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() /
            ("zinf-engine-api-" + std::to_string(getpid())))
               .string();
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A one-rank engine with modules "a" {a.w [3, 5], a.b [3]}; NVMe optimizer state when the
  // test parameter is true.
  std::unique_ptr<Engine> MakeEngine(int accumulation = 1) {
    const std::string offload = GetParam() ? R"({"device": "nvme", "nvme_path": ")" + dir_ + "\"}"
                                           : R"({"device": "cpu"})";
    auto config = EngineConfig::FromJson(
        R"({"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
            "offload_optimizer": )" +
        offload + R"(}, "gradient_accumulation_steps": )" + std::to_string(accumulation) + "}");
    EXPECT_TRUE(config.ok()) << config.status();
    auto engine = Engine::Create(*config, {.rank = 0, .world_size = 1, .optimizer_threads = 1});
    EXPECT_TRUE(engine.ok()) << engine.status();
    EXPECT_TRUE((*engine)->RegisterModule("a", {{"a.w", {3, 5}}, {"a.b", {3}}}).ok());
    EXPECT_TRUE((*engine)->Initialize().ok());
    return std::move(*engine);
  }

  std::string dir_;
};

TEST_P(EngineApiTest, SetParameterIsWhatFetchAndGatherSee) {
  auto engine = MakeEngine();
  std::vector<float> w(15);
  for (int i = 0; i < 15; ++i) w[i] = 0.5f * i - 3;
  ASSERT_TRUE(engine->SetParameter("a.w", w.data(), w.size()).ok());
  std::vector<float> got;
  ASSERT_TRUE(engine->GatherParameter("a.w", &got).ok());
  EXPECT_EQ(got, w);
  auto fetched = engine->Fetch(0);
  ASSERT_TRUE(fetched.ok());
  EXPECT_EQ(std::vector<float>(fetched->params[0], fetched->params[0] + 15), w);
  ASSERT_TRUE(engine->Release(0).ok());

  EXPECT_EQ(engine->SetParameter("a.w", w.data(), 14).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine->SetParameter("nope", w.data(), 15).code(), StatusCode::kInvalidArgument);
}

TEST_P(EngineApiTest, SetParameterSurvivesAStepAsTheOptimizerSeesIt) {
  auto engine = MakeEngine();
  std::vector<float> w(15, 1.0f);
  ASSERT_TRUE(engine->SetParameter("a.w", w.data(), w.size()).ok());
  ASSERT_TRUE(engine->Fetch(0).ok());
  ASSERT_TRUE(engine->Gradients(0).ok());  // zero gradients: AdamW only decays (wd 0: no-op)
  ASSERT_TRUE(engine->ReduceGradients(0).ok());
  ASSERT_TRUE(engine->Release(0).ok());
  ASSERT_TRUE(engine->Step().ok());
  std::vector<float> got;
  ASSERT_TRUE(engine->GatherParameter("a.w", &got).ok());
  EXPECT_EQ(got, w) << "a zero gradient must leave the set value in place";
}

TEST_P(EngineApiTest, GatherGradientIsTheMeanOverMicroBatches) {
  auto engine = MakeEngine(/*accumulation=*/2);
  for (int micro = 0; micro < 2; ++micro) {
    ASSERT_TRUE(engine->Fetch(0).ok());
    auto grads = engine->Gradients(0);
    ASSERT_TRUE(grads.ok());
    for (int i = 0; i < 15; ++i) (*grads)[0][i] = static_cast<float>(i + 10 * micro);
    for (int i = 0; i < 3; ++i) (*grads)[1][i] = -1.0f;
    ASSERT_TRUE(engine->ReduceGradients(0).ok());
    ASSERT_TRUE(engine->Release(0).ok());
  }
  std::vector<float> g;
  ASSERT_TRUE(engine->GatherGradient("a.w", &g).ok());
  ASSERT_EQ(g.size(), 15u);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(g[i], i + 5.0f) << i;
  ASSERT_TRUE(engine->GatherGradient("a.b", &g).ok());
  EXPECT_EQ(g, std::vector<float>(3, -1.0f));
  EXPECT_EQ(engine->GatherGradient("nope", &g).code(), StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Zero, EngineApiTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "nvme" : "memory"; });

}  // namespace
}  // namespace zinf
