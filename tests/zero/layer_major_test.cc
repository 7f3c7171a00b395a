// Note [Layer-major micro-batches]: with zinf.layer_major the trainer runs every micro-batch
// through a module before the next, fetching each module once in forward and once in
// backward a step and reducing it once. On one rank that is bitwise the micro-batch-major
// schedule, for every placement (optimizer in memory or on NVMe with the overlapped step,
// parameters on NVMe, gradients on NVMe, fp16 with its loss scale); on two ranks the
// gradient is the documented order's, exactly; and a trainer that reduces per micro-batch
// under it is refused at Step, saying why.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/testing/engine_setup.h"
#include "tests/testing/fork_ranks.h"
#include "tests/testing/rank_outcome.h"
#include "tests/testing/temp_dir.h"
#include "zinf/engine.h"

namespace zinf {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

constexpr int kModules = 4;
constexpr int64_t kWeight = 300000;  // over one optimizer chunk on one rank
constexpr int64_t kBias = 40;        // persistent (below the threshold)
constexpr int kSteps = 3;
constexpr int kMicro = 4;  // gradient_accumulation_steps

struct TrainRun {
  int world = 1;
  bool layer_major = false;
  bool optimizer_nvme = false;
  bool params_nvme = false;
  bool gradients_nvme = false;
  bool fp16 = false;
  std::string dir;
};

std::string Config(const TrainRun& r) {
  const testing::Placement placement{.optimizer_nvme = r.optimizer_nvme,
                                     .params_nvme = r.params_nvme};
  return R"({"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 1000,
             "reduce_bucket_size": 500000, )" +
         testing::OffloadJson(placement, r.dir) +
         "}, \"gradient_accumulation_steps\": " + std::to_string(kMicro) +
         R"(, "gradient_clipping": 1.0, "fp16": {"enabled": )" + (r.fp16 ? "true" : "false") +
         R"(, "initial_scale_power": 8}, "optimizer": {"type": "AdamW", "params": {"lr": 0.01,
             "weight_decay": 0.01}}, "zinf": {"layer_major": )" +
         (r.layer_major ? "true" : "false") +
         ", \"gradients_on_nvme\": " + (r.gradients_nvme ? "true" : "false") + "}}";
}

// The gradient of micro-batch `micro` of `rank` for the module's weight: it depends on the
// fetched weights, so a stale or wrong fetch changes it. Step 1's is large enough to clip.
float WeightGradient(float seen, int64_t i, int m, int rank, int micro, int step, double scale) {
  const double a = (step == 1 ? 1e-2 : 1e-5) * scale;
  return static_cast<float>(a * (seen - std::sin(0.001 * i + m + 0.1 * rank + 0.37 * micro)));
}

struct Engine1 {
  std::unique_ptr<Engine> engine;
  std::vector<int> modules;
  std::vector<std::string> names;
};

StatusOr<Engine1> Make(int rank, int port, const TrainRun& r) {
  Engine1 e;
  ZINF_ASSIGN_OR_RETURN(
      e.engine,
      testing::CreateRankEngine(Config(r), testing::HostRankOptions(rank, r.world, port, 30000ms)));
  for (int m = 0; m < kModules; ++m) {
    const std::string w = "layer" + std::to_string(m) + ".weight";
    const std::string b = "layer" + std::to_string(m) + ".bias";
    ZINF_ASSIGN_OR_RETURN(
        int id, e.engine->RegisterModule(
                    "layer" + std::to_string(m),
                    {{w, {kWeight}, ParamInit::kNormal, 0.5f}, {b, {kBias}, ParamInit::kOnes}}));
    e.modules.push_back(id);
    e.names.push_back(w);
    e.names.push_back(b);
  }
  ZINF_RETURN_IF_ERROR(e.engine->Initialize());
  return e;
}

// One micro-batch's gradients of module m added into `g` (weight, bias).
void AddGradients(std::vector<float*>& g, const std::vector<float>& seen, int m, int rank,
                  int micro, int step, double scale) {
  for (int64_t i = 0; i < kWeight; ++i) {
    g[0][i] += WeightGradient(seen[i], i, m, rank, micro, step, scale);
  }
  for (int64_t i = 0; i < kBias; ++i) g[1][i] += static_cast<float>(1e-3 * scale * (i - 20));
}

// One step in either schedule; the weights each module's fetch gave, per module.
Status TrainStep(Engine& e, const std::vector<int>& modules, int rank, int step, bool layer_major) {
  std::vector<std::vector<float>> seen(kModules);
  const double scale = e.loss_scale();
  if (layer_major) {
    for (int m = 0; m < kModules; ++m) {  // forward: every micro-batch through module m
      ZINF_ASSIGN_OR_RETURN(FetchedModule f, e.Fetch(modules[m]));
      seen[m].assign(f.params[0], f.params[0] + kWeight);
      ZINF_RETURN_IF_ERROR(e.Release(modules[m]));
    }
    for (int m = kModules - 1; m >= 0; --m) {  // backward: one fetch, one reduction
      ZINF_RETURN_IF_ERROR(e.Fetch(modules[m]).status());
      ZINF_ASSIGN_OR_RETURN(std::vector<float*> g, e.Gradients(modules[m]));
      for (int micro = 0; micro < kMicro; ++micro) {
        AddGradients(g, seen[m], m, rank, micro, step, scale);
      }
      ZINF_RETURN_IF_ERROR(e.ReduceGradients(modules[m]));
      ZINF_RETURN_IF_ERROR(e.Release(modules[m]));
    }
    return OkStatus();
  }
  for (int micro = 0; micro < kMicro; ++micro) {
    for (int m = 0; m < kModules; ++m) {
      ZINF_ASSIGN_OR_RETURN(FetchedModule f, e.Fetch(modules[m]));
      seen[m].assign(f.params[0], f.params[0] + kWeight);
      ZINF_RETURN_IF_ERROR(e.Release(modules[m]));
    }
    for (int m = kModules - 1; m >= 0; --m) {
      ZINF_RETURN_IF_ERROR(e.Fetch(modules[m]).status());
      ZINF_ASSIGN_OR_RETURN(std::vector<float*> g, e.Gradients(modules[m]));
      AddGradients(g, seen[m], m, rank, micro, step, scale);
      ZINF_RETURN_IF_ERROR(e.ReduceGradients(modules[m]));
      ZINF_RETURN_IF_ERROR(e.Release(modules[m]));
    }
  }
  return OkStatus();
}

// kSteps steps; rank 0 writes every parameter to `dir`/out.bin and a line per step (skipped,
// clip coefficient, NVMe bytes read) to steps.txt.
int TrainRank(int rank, int port, const TrainRun& r) {
  StatusOr<Engine1> made = Make(rank, port, r);
  if (!made.ok()) {
    std::fprintf(stderr, "%s\n", made.status().ToString().c_str());
    return 11;
  }
  Engine& e = *made->engine;
  std::ofstream steps(rank == 0 ? r.dir + "/steps.txt" : "/dev/null");
  for (int step = 0; step < kSteps; ++step) {
    if (Status s = TrainStep(e, made->modules, rank, step, r.layer_major); !s.ok()) {
      std::fprintf(stderr, "step %d: %s\n", step, s.ToString().c_str());
      return 12;
    }
    StatusOr<StepSummary> summary = e.Step();
    if (!summary.ok()) {
      std::fprintf(stderr, "step %d: %s\n", step, summary.status().ToString().c_str());
      return 13;
    }
    steps << summary->skipped << " " << summary->clip_coefficient << " " << summary->bytes_nvme_read
          << "\n";
  }
  std::vector<float> v;
  std::ofstream out(rank == 0 ? r.dir + "/out.bin" : "/dev/null", std::ios::binary);
  for (const std::string& name : made->names) {
    if (!e.GatherParameter(name, &v).ok()) return 14;
    out.write(reinterpret_cast<const char*>(v.data()), v.size() * 4);
  }
  return out.good() ? 0 : 15;
}

using Outcome = testing::RankOutcome;

Outcome Train(TrainRun r, const std::string& label) {
  return testing::TrainRanks(r.world, "zinf-layer-major-" + label,
                             [&](int rank, int port, const std::string& dir) {
                               r.dir = dir;
                               return TrainRank(rank, port, r);
                             });
}

struct Case {
  const char* label;
  TrainRun run;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.label; }

class LayerMajorTest : public ::testing::TestWithParam<Case> {};

TEST_P(LayerMajorTest, OneRankIsBitwiseTheMicroBatchMajorSchedule) {
  TrainRun layer = GetParam().run, micro = layer;
  layer.layer_major = true;
  const Outcome a = Train(layer, std::string(GetParam().label) + "-layer");
  const Outcome b = Train(micro, std::string(GetParam().label) + "-micro");
  ASSERT_EQ(a.params.size(), size_t{kModules} * (kWeight + kBias) * 4);
  EXPECT_TRUE(a.params == b.params) << "layer-major changed the parameters";
  ASSERT_EQ(a.steps.size(), size_t{kSteps});
  ASSERT_EQ(b.steps.size(), size_t{kSteps});
  bool clipped = false;
  for (int s = 0; s < kSteps; ++s) {
    int skipped_a = 0, skipped_b = 0;
    double clip_a = 0, clip_b = 0;
    unsigned long long read_a = 0, read_b = 0;
    ASSERT_EQ(std::sscanf(a.steps[s].c_str(), "%d %lf %llu", &skipped_a, &clip_a, &read_a), 3);
    ASSERT_EQ(std::sscanf(b.steps[s].c_str(), "%d %lf %llu", &skipped_b, &clip_b, &read_b), 3);
    EXPECT_EQ(skipped_a, skipped_b) << "step " << s;
    EXPECT_EQ(clip_a, clip_b) << "step " << s;
    clipped |= clip_a < 1;
    std::printf("step %d: NVMe bytes read, layer-major %llu, micro-batch-major %llu\n", s, read_a,
                read_b);
    // What it is for: parameters on NVMe are read twice a step, not twice per micro-batch.
    if (GetParam().run.params_nvme) {
      EXPECT_LT(read_a, read_b) << "step " << s;
    }
  }
  EXPECT_TRUE(clipped) << "no step clipped: the case does not test the clipped step";
}

INSTANTIATE_TEST_SUITE_P(
    Placements, LayerMajorTest,
    ::testing::Values(Case{"memory", {}}, Case{"optimizer_nvme", {.optimizer_nvme = true}},
                      Case{"all_nvme",
                           {.optimizer_nvme = true, .params_nvme = true, .gradients_nvme = true}},
                      Case{"fp16", {.fp16 = true}}),
    [](const auto& info) { return std::string(info.param.label); });

// On two ranks each rank sums its micro-batches in micro-batch order, then the ranks' sums
// are reduced: the gradient the step applies is exactly (S_0 + S_1) / (G x 2).
TEST(LayerMajorTwoRanksTest, TheGradientIsTheDocumentedOrdersExactly) {
  const testing::TempDir tmp("zinf-layer-major-two");
  TrainRun r{.world = 2, .layer_major = true, .dir = tmp.path()};
  const std::vector<int> codes = testing::RunRanks(2, [&](int rank, int port) {
    StatusOr<Engine1> made = Make(rank, port, r);
    if (!made.ok()) return 11;
    Engine& e = *made->engine;
    // The weights are every rank's, so each rank can work out both ranks' sums.
    std::vector<std::vector<float>> seen(kModules);
    for (int m = 0; m < kModules; ++m) {
      if (!e.GatherParameter(made->names[2 * m], &seen[m]).ok()) return 12;
    }
    if (!TrainStep(e, made->modules, rank, /*step=*/0, /*layer_major=*/true).ok()) return 13;
    for (int m = 0; m < kModules; ++m) {
      std::vector<float> got;
      if (!e.GatherGradient(made->names[2 * m], &got).ok()) return 14;
      for (int64_t i = 0; i < kWeight; ++i) {
        float sums[2] = {0, 0};
        for (int k = 0; k < 2; ++k) {
          for (int micro = 0; micro < kMicro; ++micro) {
            sums[k] += WeightGradient(seen[m][i], i, m, k, micro, 0, 1.0);
          }
        }
        const float want = static_cast<float>((sums[0] + sums[1]) * (1.0 / (kMicro * 2)));
        if (std::memcmp(&got[i], &want, 4) != 0) {
          std::fprintf(stderr, "rank %d module %d element %lld: %a, want %a\n", rank, m,
                       static_cast<long long>(i), got[i], want);
          return 15;
        }
      }
    }
    return e.Step().ok() ? 0 : 16;
  });
  EXPECT_EQ(codes, std::vector<int>(2, 0));
}

TEST(LayerMajorMisuseTest, ReducingPerMicroBatchIsRefusedAtStepSayingWhy) {
  const testing::TempDir tmp("zinf-layer-major-misuse");
  TrainRun r{.layer_major = true, .dir = tmp.path()};
  StatusOr<Engine1> made = Make(0, 0, r);
  ASSERT_TRUE(made.ok()) << made.status();
  // The micro-batch-major loop under the layer-major key: four reductions a step.
  ASSERT_TRUE(TrainStep(*made->engine, made->modules, 0, 0, /*layer_major=*/false).ok());
  StatusOr<StepSummary> step = made->engine->Step();
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(step.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(step.status().message(), HasSubstr("zinf.layer_major: once a step"));
}

}  // namespace
}  // namespace zinf
