// Optimizer parameter groups through the engine (Note [Parameter groups] in
// src/zero/optimizer_step.cc): parameters in two groups with their own lr, weight decay, betas
// and eps, interleaved over the flat shard, train bitwise as a CpuOptimizer with the same two
// groups steps each parameter on its own, with the optimizer state in host memory and on NVMe
// (where one parameter spans two chunks and a chunk holds both groups), on 1 and 2 ranks; a
// checkpoint keeps both groups, and a checkpoint of another group count is refused. The
// delayed update (zinf.delayed_param_update) steps the same way a batch late.
//
// Bitwise: every rank writes the same gradient, so the reduced sum is 2g exactly and the
// engine's scale 1/world gives back g; the reference steps g with scale 1.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "tests/testing/engine_setup.h"
#include "tests/testing/float_file.h"
#include "tests/testing/fork_ranks.h"
#include "tests/testing/temp_dir.h"
#include "zinf/cpu_optimizer.h"
#include "zinf/engine.h"

namespace zinf {
namespace {

using testing::ReadFloats;
using testing::RunRanks;
using testing::WriteFloats;

struct TestParam {
  const char* name;
  std::vector<int64_t> shape;
  int module;
  int group;
};

// 140,000 elements in "a": with 64K-element NVMe chunks (the least staging budget), chunk
// boundaries fall inside it on 1 and 2 ranks, and the last chunk holds both groups.
const std::vector<TestParam> kParams = {{"a", {700, 200}, 0, 0},
                                        {"b", {77}, 0, 1},
                                        {"c", {50, 40}, 1, 1},
                                        {"d", {33}, 1, 0},
                                        {"e", {41}, 1, 1}};
constexpr int kSteps = 4;

uint64_t Numel(const TestParam& p) {
  uint64_t n = 1;
  for (int64_t d : p.shape) n *= d;
  return n;
}

float Initial(int param, uint64_t i) { return 0.5f * std::sin(0.001f * i + 1.7f * param); }
float Grad(int step, int param, uint64_t i) {
  return 0.1f * std::cos(0.37f * i + 0.9f * step + 0.3f * param);
}

OptimizerHyperParams Group0() {
  OptimizerHyperParams hp;  // as the config below says
  hp.lr = 0.01;
  hp.weight_decay = 0.1;
  return hp;
}
OptimizerHyperParams Group1() {
  OptimizerHyperParams hp;
  hp.lr = 0.02;
  hp.weight_decay = 0.0;
  hp.beta1 = 0.8;
  hp.beta2 = 0.99;
  hp.eps = 1e-6;
  return hp;
}

std::string Config(bool nvme, const std::string& dir, bool delayed = false) {
  return R"({"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0, )" +
         testing::OffloadJson({.optimizer_nvme = nvme}, dir) +
         R"(}, "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}},
            "zinf": {"host_budget": 9437184, )" +
         (delayed ? R"("delayed_param_update": true, "delayed_param_update_warmup_steps": 0)"
                  : R"("delayed_param_update": false)") +
         "}}";
}

// The group-1 lr a client scheduler sets before step `step` (none before step 2).
double Group1Lr(int step) { return step < 2 ? 0.02 : 0.02 * (1.0 - 0.25 * step); }

// Registers kParams (in groups when `groups`) and initializes.
StatusOr<std::vector<int>> Build(Engine& e, bool groups) {
  if (groups) ZINF_RETURN_IF_ERROR(e.AddParamGroup(Group1()).status());
  std::vector<std::vector<ParamSpec>> modules(2);
  for (const TestParam& p : kParams) {
    modules[p.module].push_back(
        {.name = p.name, .shape = p.shape, .optimizer_group = groups ? p.group : 0});
  }
  std::vector<int> ids;
  for (int m = 0; m < 2; ++m) {
    ZINF_ASSIGN_OR_RETURN(int id, e.RegisterModule("m" + std::to_string(m), modules[m]));
    ids.push_back(id);
  }
  std::map<std::string, int> index;
  for (size_t i = 0; i < kParams.size(); ++i) index[kParams[i].name] = static_cast<int>(i);
  ZINF_RETURN_IF_ERROR(
      e.Initialize([&](const std::string& name, uint64_t first, uint64_t count, float* out) {
        for (uint64_t k = 0; k < count; ++k) out[k] = Initial(index[name], first + k);
        return OkStatus();
      }));
  return ids;
}

// Steps [first, last) of the loop; every rank writes the same gradients.
Status Train(Engine& e, const std::vector<int>& ids, int first, int last) {
  for (int step = first; step < last; ++step) {
    if (step >= 2) ZINF_RETURN_IF_ERROR(e.SetGroupLearningRate(1, Group1Lr(step)));
    for (int m : {1, 0}) {
      ZINF_RETURN_IF_ERROR(e.Fetch(ids[m]).status());
      ZINF_ASSIGN_OR_RETURN(std::vector<float*> grads, e.Gradients(ids[m]));
      int k = 0;
      for (size_t pi = 0; pi < kParams.size(); ++pi) {
        if (kParams[pi].module != m) continue;
        for (uint64_t i = 0; i < Numel(kParams[pi]); ++i) grads[k][i] = Grad(step, pi, i);
        ++k;
      }
      ZINF_RETURN_IF_ERROR(e.ReduceGradients(ids[m]));
      ZINF_RETURN_IF_ERROR(e.Release(ids[m]));
    }
    ZINF_RETURN_IF_ERROR(e.Step().status());
  }
  return OkStatus();
}

// Every parameter's value into `path` (rank 0).
Status Dump(Engine& e, const std::string& path) {
  std::vector<float> all, v;
  for (const TestParam& p : kParams) {
    ZINF_RETURN_IF_ERROR(e.GatherParameter(p.name, &v));
    all.insert(all.end(), v.begin(), v.end());
  }
  return e.rank() == 0 ? WriteFloats(path, all) : OkStatus();
}

// Two CpuOptimizer groups, each parameter a span of its own, on the same values.
std::vector<float> Reference() {
  auto opt = CpuOptimizer::Create({.threads = 1});
  EXPECT_TRUE(opt.ok());
  CpuOptimizer& o = **opt;
  EXPECT_EQ(*o.AddParamGroup(Group0()), 0);
  EXPECT_EQ(*o.AddParamGroup(Group1()), 1);
  std::vector<std::vector<float>> p, m, v, g;
  for (size_t pi = 0; pi < kParams.size(); ++pi) {
    const uint64_t n = Numel(kParams[pi]);
    p.emplace_back(n);
    m.emplace_back(n, 0.0f);
    v.emplace_back(n, 0.0f);
    g.emplace_back(n);
    for (uint64_t i = 0; i < n; ++i) p[pi][i] = Initial(pi, i);
  }
  for (int step = 0; step < kSteps; ++step) {
    OptimizerHyperParams hp1 = Group1();
    hp1.lr = Group1Lr(step);
    EXPECT_TRUE(o.SetHyperParams(1, hp1).ok());
    EXPECT_TRUE(o.BeginStep(0).ok());
    EXPECT_TRUE(o.BeginStep(1).ok());
    for (size_t pi = 0; pi < kParams.size(); ++pi) {
      for (uint64_t i = 0; i < g[pi].size(); ++i) g[pi][i] = Grad(step, pi, i);
      const OptimizerSpan span{.params = p[pi].data(),
                               .grads = g[pi].data(),
                               .state0 = m[pi].data(),
                               .state1 = v[pi].data(),
                               .count = p[pi].size()};
      EXPECT_TRUE(o.Update(kParams[pi].group, span, 1.0f).ok());
    }
  }
  std::vector<float> out;
  for (const auto& x : p) out.insert(out.end(), x.begin(), x.end());
  return out;
}

void ExpectBitwise(const std::vector<float>& got, const std::vector<float>& want,
                   const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &want[i], 4) != 0;
  EXPECT_EQ(differ, 0u) << what << ": elements differ from two CpuOptimizer groups";
}

struct Case {
  const char* name;
  bool nvme;
  int world;
  bool delayed = false;  // zinf.delayed_param_update
};

class ParamGroupsTest : public ::testing::TestWithParam<Case> {};

TEST_P(ParamGroupsTest, TwoGroupsStepAsTwoCpuOptimizerGroups) {
  const Case c = GetParam();
  const testing::TempDir tmp("zinf-param-groups");
  const std::string dir = tmp.path();
  const std::vector<int> codes = RunRanks(c.world, [&](int rank, int port) {
    auto engine = testing::CreateRankEngine(Config(c.nvme, dir, c.delayed),
                                            testing::HostRankOptions(rank, c.world, port));
    if (!engine.ok()) return 10;
    Engine& e = **engine;
    StatusOr<std::vector<int>> ids = Build(e, /*groups=*/true);
    Status s = ids.status();
    if (s.ok() && e.num_param_groups() != 2) return 11;
    if (s.ok()) s = Train(e, *ids, 0, kSteps);
    if (s.ok()) s = Dump(e, dir + "/final.bin");
    if (s.ok() && std::fabs(e.param_group(1)->lr - Group1Lr(kSteps - 1)) > 0) return 12;
    if (!s.ok()) std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
    return s.ok() ? 0 : 13;
  });
  ASSERT_EQ(codes, std::vector<int>(c.world, 0));
  ExpectBitwise(ReadFloats(dir + "/final.bin"), Reference(), c.name);
}

INSTANTIATE_TEST_SUITE_P(Placements, ParamGroupsTest,
                         ::testing::Values(Case{"host_1", false, 1}, Case{"host_2", false, 2},
                                           Case{"host_delayed_2", false, 2, true},
                                           Case{"nvme_1", true, 1}, Case{"nvme_2", true, 2}),
                         [](const auto& info) { return std::string(info.param.name); });

// Half the steps, a checkpoint, a fresh engine that loads it and takes the rest: bitwise the
// run without the checkpoint. An engine of one group refuses the checkpoint of two.
TEST(ParamGroupsCheckpointTest, BothGroupsResumeBitwiseAndAnotherCountIsRefused) {
  for (bool nvme : {false, true}) {
    const testing::TempDir tmp("zinf-param-groups-ckpt");
    const std::string dir = tmp.path();
    const std::vector<int> ports = testing::FreePorts(3);  // one per engine
    const std::vector<int> codes = RunRanks(1, [&](int rank, int) {
      const std::string json = Config(nvme, dir);
      auto first = testing::CreateRankEngine(json, testing::HostRankOptions(rank, 1, ports[0]));
      if (!first.ok()) return 10;
      StatusOr<std::vector<int>> ids = Build(**first, true);
      Status s = ids.status();
      if (s.ok()) s = Train(**first, *ids, 0, kSteps / 2);
      if (s.ok()) s = (*first)->SaveCheckpoint(dir + "/ckpt", "half");
      first->reset();
      auto second = testing::CreateRankEngine(json, testing::HostRankOptions(rank, 1, ports[1]));
      if (!s.ok() || !second.ok()) return 11;
      ids = Build(**second, true);
      if (ids.ok()) s = (*second)->LoadCheckpoint(dir + "/ckpt").status();
      if (s.ok()) s = Train(**second, *ids, kSteps / 2, kSteps);
      if (s.ok()) s = Dump(**second, dir + "/final.bin");
      second->reset();
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", s.ToString().c_str());
        return 12;
      }
      auto single = testing::CreateRankEngine(json, testing::HostRankOptions(rank, 1, ports[2]));
      if (!single.ok() || !Build(**single, false).ok()) return 13;
      Status refused = (*single)->LoadCheckpoint(dir + "/ckpt").status();
      std::fprintf(stderr, "%s\n", refused.ToString().c_str());
      if (refused.code() != StatusCode::kFailedPrecondition) return 14;
      return refused.message().find("2 parameter group(s), this engine 1") != std::string::npos
                 ? 0
                 : 15;
    });
    ASSERT_EQ(codes, std::vector<int>{0}) << (nvme ? "nvme" : "host");
    ExpectBitwise(ReadFloats(dir + "/final.bin"), Reference(), nvme ? "nvme" : "host");
  }
}

// The config's scheduler sets every group's lr after each step, as DeepSpeed's do: WarmupLR's
// warmup_max_lr is every group's, WarmupCosineLR's ratio scales each group's own lr; the
// trainer may not set it then.
TEST(ParamGroupsApiTest, TheConfigsSchedulerSetsEveryGroupsLr) {
  const std::string warmup =
      R"("scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.001,
         "warmup_max_lr": 0.004, "warmup_num_steps": 3, "warmup_type": "linear"}})";
  const std::string cosine =
      R"("scheduler": {"type": "WarmupCosineLR", "params": {"total_num_steps": 20,
         "warmup_num_steps": 4, "warmup_min_ratio": 0.5, "warmup_type": "linear"}})";
  for (const std::string& scheduler : {warmup, cosine}) {
    auto config = EngineConfig::FromJson(
        R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, )" + scheduler + "}");
    ASSERT_TRUE(config.ok()) << config.status();
    auto engine = Engine::Create(*config, {.device = "host", .optimizer_threads = 1});
    ASSERT_TRUE(engine.ok()) << engine.status();
    Engine& e = **engine;
    OptimizerHyperParams own = Group1();  // lr 0.02
    ASSERT_EQ(*e.AddParamGroup(own), 1);
    const int m = *e.RegisterModule(
        "m", {{.name = "w", .shape = {4}}, {.name = "b", .shape = {4}, .optimizer_group = 1}});
    ASSERT_TRUE(e.Initialize().ok());
    for (int step = 0; step < 2; ++step) {
      ASSERT_TRUE(e.Fetch(m).ok());
      ASSERT_TRUE(e.Gradients(m).ok());
      ASSERT_TRUE(e.ReduceGradients(m).ok());
      ASSERT_TRUE(e.Release(m).ok());
      ASSERT_TRUE(e.Step().ok());
    }
    const double lr0 = e.param_group(0)->lr, lr1 = e.param_group(1)->lr;
    EXPECT_GT(lr0, 0);
    if (scheduler == warmup) {
      EXPECT_EQ(lr0, lr1);  // linear from 0.001 to 0.004 over 3 steps: it = 1
      EXPECT_NEAR(lr0, 0.002, 1e-12);
    } else {
      EXPECT_NEAR(lr1 / lr0, 2.0, 1e-12);  // each group's own lr times one ratio
    }
    EXPECT_EQ(e.param_group(1)->weight_decay, 0.0);  // the rest stays the group's own
    EXPECT_EQ(e.SetGroupLearningRate(1, 0.1).code(), StatusCode::kFailedPrecondition);
  }
}

// Every rank must give its groups the same hyper-parameters: another is refused at Initialize.
TEST(ParamGroupsApiTest, RanksWhoseGroupsDifferAreRefused) {
  const testing::TempDir tmp("zinf-param-groups-ranks");
  const std::vector<int> codes = RunRanks(2, [&](int rank, int port) {
    auto engine = testing::CreateRankEngine(Config(false, tmp.path()),
                                            testing::HostRankOptions(rank, 2, port));
    if (!engine.ok()) return 10;
    OptimizerHyperParams own = Group1();
    if (rank == 1) own.weight_decay = 0.01;
    if (!(*engine)->AddParamGroup(own).ok()) return 11;
    if (!(*engine)->RegisterModule("m", {{.name = "w", .shape = {8}, .optimizer_group = 1}}).ok()) {
      return 12;
    }
    const Status s = (*engine)->Initialize();
    std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
    return s.code() == StatusCode::kFailedPrecondition &&
                   s.message().find("parameter groups") != std::string::npos
               ? 0
               : 13;
  });
  EXPECT_EQ(codes, std::vector<int>(2, 0));
}

TEST(ParamGroupsApiTest, ADifferentTypeOrAnUnknownGroupIsRefused) {
  auto config = EngineConfig::FromJson(R"({"optimizer": {"type": "AdamW"}})");
  ASSERT_TRUE(config.ok());
  auto engine = Engine::Create(*config, {.device = "host", .optimizer_threads = 1});
  ASSERT_TRUE(engine.ok()) << engine.status();
  Engine& e = **engine;
  OptimizerHyperParams adagrad = OptimizerHyperParams::Defaults(OptimizerType::kAdagrad);
  StatusOr<int> refused = e.AddParamGroup(adagrad);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("adagrad"), std::string::npos) << refused.status();
  ASSERT_TRUE(e.RegisterModule("m", {{.name = "w", .shape = {8}, .optimizer_group = 3}}).ok());
  Status s = e.Initialize();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("parameter 'w' is in optimizer group 3"), std::string::npos) << s;
  EXPECT_EQ(e.SetGroupLearningRate(5, 0.1).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zinf
