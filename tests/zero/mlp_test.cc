// A two-layer MLP with hand-written forward and backward, trained through the engine on 1, 2
// and 4 ranks (forked processes over Gloo), against a plain single-process reference that
// keeps the whole model in memory and applies torch's AdamW itself.
//
// Tolerance: ranks sum their gradients in a different order than one process does, and the
// reference runs in double while the engine's AdamW runs in float, so results agree to
// rounding, not bitwise. Adam divides each update by sqrt(v), which keeps an early rounding
// difference from growing: after 8 steps of lr 1e-2 the parameters (|p| ~ 0.1-1) agree to a
// few 1e-6; the bound below is 2e-5 absolute, far under one update (1e-2), so a wrong
// gradient, a missed micro-batch or a wrong shard fails it by orders of magnitude.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "offload/tiered_store_internal.h"
#include "tests/testing/engine_setup.h"
#include "tests/testing/faulty_engine.h"
#include "tests/testing/fork_ranks.h"
#include "tests/testing/temp_dir.h"
#include "zinf/dtype.h"
#include "zinf/engine.h"

namespace zinf {
namespace {

using namespace std::chrono_literals;
using testing::RunRanks;

constexpr int kIn = 12, kHidden = 40, kOut = 5;
constexpr int kMicroRows = 8;  // rows per micro-batch on each rank
constexpr int kSteps = 8;

// The global batch of micro step `k`: rows of x and targets, a fixed function of the index.
void MakeRows(int first_row, int rows, std::vector<float>* x, std::vector<float>* t) {
  x->resize(rows * kIn);
  t->resize(rows * kOut);
  for (int r = 0; r < rows; ++r) {
    const int row = first_row + r;
    for (int i = 0; i < kIn; ++i) (*x)[r * kIn + i] = std::sin(0.37f * row + 1.3f * i);
    for (int o = 0; o < kOut; ++o) (*t)[r * kOut + o] = std::cos(0.11f * row * (o + 1));
  }
}

struct Grads {
  std::vector<double> w1, b1, w2, b2;
};

// Forward and backward of mean-over-rows 0.5 * |y - t|^2 for `rows` rows; gradients are
// added into `g` multiplied by `scale`. Parameters are read through `get`.
template <typename T>
double ForwardBackward(const T* w1, const T* b1, const T* w2, const T* b2,
                       const std::vector<float>& x, const std::vector<float>& t, int rows,
                       double scale, Grads* g) {
  double loss = 0;
  std::vector<double> h(kHidden), pre(kHidden), dy(kOut), dh(kHidden);
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < kHidden; ++j) {
      double s = b1[j];
      for (int i = 0; i < kIn; ++i) s += double(w1[j * kIn + i]) * x[r * kIn + i];
      pre[j] = s;
      h[j] = s > 0 ? s : 0;
    }
    for (int o = 0; o < kOut; ++o) {
      double s = b2[o];
      for (int j = 0; j < kHidden; ++j) s += double(w2[o * kHidden + j]) * h[j];
      const double d = s - t[r * kOut + o];
      loss += 0.5 * d * d / rows;
      dy[o] = d / rows * scale;
    }
    for (int j = 0; j < kHidden; ++j) {
      double s = 0;
      for (int o = 0; o < kOut; ++o) s += dy[o] * double(w2[o * kHidden + j]);
      dh[j] = pre[j] > 0 ? s : 0;
    }
    for (int o = 0; o < kOut; ++o) {
      g->b2[o] += dy[o];
      for (int j = 0; j < kHidden; ++j) g->w2[o * kHidden + j] += dy[o] * h[j];
    }
    for (int j = 0; j < kHidden; ++j) {
      g->b1[j] += dh[j];
      for (int i = 0; i < kIn; ++i) g->w1[j * kIn + i] += dh[j] * x[r * kIn + i];
    }
  }
  return loss;
}

struct Model {
  std::vector<float> w1, b1, w2, b2;
};

// Where the optimizer state, the parameters (testing::Placement) and the gradient
// accumulators live, and the gradient buckets' size.
struct MlpPlacement : testing::Placement {
  uint64_t reduce_bucket_size = 500000000;  // elements; DeepSpeed's default
  bool gradients_nvme = false;              // zinf.gradients_on_nvme
};

std::string ConfigJson(int stage, int accumulation, double clipping, bool fp16,
                       MlpPlacement placement = {}, const std::string& nvme_dir = "") {
  return "{\"zero_optimization\": {\"stage\": " + std::to_string(stage) +
         ", \"stage3_param_persistence_threshold\": 64, \"reduce_bucket_size\": " +
         std::to_string(placement.reduce_bucket_size) + ", " +
         testing::OffloadJson(placement, nvme_dir) +
         "}, \"gradient_accumulation_steps\": " + std::to_string(accumulation) +
         ", \"gradient_clipping\": " + std::to_string(clipping) +
         ", \"fp16\": {\"enabled\": " + (fp16 ? "true" : "false") +
         ", \"hysteresis\": 1}, \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, "
         "\"weight_decay\": 0.01}}, \"zinf\": {\"gradients_on_nvme\": " +
         (placement.gradients_nvme ? "true" : "false") + "}}";
}

// One rank's training run; writes the initial and final model (rank 0 of its data-parallel
// group) to `out_dir`. `group`: the data-parallel group's global ranks (empty: all).
// Returns a process exit code: 0 on success.
int TrainRank(int global_rank, int global_world, int port, int stage, int accumulation,
              double clipping, const std::string& out_dir, bool fp16 = false,
              MlpPlacement placement = {}, const std::vector<int>& group = {}) {
  auto engine = testing::CreateRankEngine(
      ConfigJson(stage, accumulation, clipping, fp16, placement, out_dir),
      testing::HostRankOptions(global_rank, global_world, port, 20000ms, group));
  if (!engine.ok()) return 11;
  Engine& e = **engine;
  const int rank = e.rank(), world = e.world_size();  // within the data-parallel group
  const int fc1 =
      *e.RegisterModule("fc1", {{"fc1.weight", {kHidden, kIn}, ParamInit::kNormal, 0.3f},
                                {"fc1.bias", {kHidden}, ParamInit::kZeros}});
  const int fc2 =
      *e.RegisterModule("fc2", {{"fc2.weight", {kOut, kHidden}, ParamInit::kNormal, 0.3f},
                                {"fc2.bias", {kOut}, ParamInit::kOnes}});
  if (!e.Initialize().ok()) return 12;
  auto dump = [&](const std::string& file) {
    std::vector<float> v;
    std::ofstream out(out_dir + "/" + file, std::ios::binary);
    for (const char* name : {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}) {
      if (!e.GatherParameter(name, &v).ok()) return false;
      out.write(reinterpret_cast<const char*>(v.data()), v.size() * 4);
    }
    return rank != 0 || out.good();
  };
  if (!dump("init.bin")) return 13;
  std::vector<float> x, t;
  std::vector<double> norms;
  for (int step = 0; step < kSteps; ++step) {
    for (int micro = 0; micro < accumulation; ++micro) {
      const int first = ((step * accumulation + micro) * world + rank) * kMicroRows;
      MakeRows(first, kMicroRows, &x, &t);
      // Forward needs both modules; backward fetches them again (stage 3 frees in between).
      auto p1 = e.Fetch(fc1);
      if (!p1.ok()) return 14;
      std::vector<float> w1(p1->params[0], p1->params[0] + kHidden * kIn),
          b1(p1->params[1], p1->params[1] + kHidden);
      if (!e.Release(fc1).ok()) return 15;
      auto p2 = e.Fetch(fc2);
      if (!p2.ok()) return 16;
      Grads g{std::vector<double>(kHidden * kIn), std::vector<double>(kHidden),
              std::vector<double>(kOut * kHidden), std::vector<double>(kOut)};
      ForwardBackward(w1.data(), b1.data(), p2->params[0], p2->params[1], x, t, kMicroRows,
                      e.loss_scale(), &g);
      auto g2 = e.Gradients(fc2);
      if (!g2.ok()) return 17;
      for (size_t i = 0; i < g.w2.size(); ++i) (*g2)[0][i] = static_cast<float>(g.w2[i]);
      for (size_t i = 0; i < g.b2.size(); ++i) (*g2)[1][i] = static_cast<float>(g.b2[i]);
      if (!e.ReduceGradients(fc2).ok() || !e.Release(fc2).ok()) return 18;
      if (!e.Fetch(fc1).ok()) return 19;
      auto g1 = e.Gradients(fc1);
      if (!g1.ok()) return 20;
      for (size_t i = 0; i < g.w1.size(); ++i) (*g1)[0][i] = static_cast<float>(g.w1[i]);
      for (size_t i = 0; i < g.b1.size(); ++i) (*g1)[1][i] = static_cast<float>(g.b1[i]);
      if (fp16 && step == 2 && rank == world - 1) (*g1)[0][3] = INFINITY;  // an overflow
      if (!e.ReduceGradients(fc1).ok() || !e.Release(fc1).ok()) return 21;
    }
    auto summary = e.Step();
    if (!summary.ok()) {
      std::fprintf(stderr, "%s\n", summary.status().ToString().c_str());
      return 22;
    }
    if (fp16 && summary->skipped != (step == 2)) return 23;  // every rank skips together
    norms.push_back(summary->grad_norm);
  }
  if (rank == 0) {
    std::ofstream out(out_dir + "/norms.bin", std::ios::binary);
    out.write(reinterpret_cast<const char*>(norms.data()), norms.size() * 8);
  }
  return dump("final.bin") ? 0 : 24;
}

Model ReadModel(const std::string& path) {
  Model m{std::vector<float>(kHidden * kIn), std::vector<float>(kHidden),
          std::vector<float>(kOut * kHidden), std::vector<float>(kOut)};
  std::ifstream in(path, std::ios::binary);
  for (auto* v : {&m.w1, &m.b1, &m.w2, &m.b2})
    in.read(reinterpret_cast<char*>(v->data()), v->size() * 4);
  EXPECT_TRUE(in.good()) << path;
  return m;
}

// Rounds values to the compute precision, as the engine's gathers do.
void Round(ElementType precision, std::vector<float>* v) {
  std::vector<uint16_t> half(v->size());
  ConvertFromFp32(v->data(), precision, half.data(), v->size());
  ConvertToFp32(half.data(), precision, v->data(), v->size());
}

// The plain reference: the whole model in one process, torch's AdamW in double, forward and
// backward with the weights rounded to `precision`.
Model Reference(const Model& init, int world, int accumulation, double clipping,
                int skipped_step = -1, std::vector<double>* norms = nullptr,
                ElementType precision = ElementType::kFp32) {
  std::vector<std::vector<double>> p = {{init.w1.begin(), init.w1.end()},
                                        {init.b1.begin(), init.b1.end()},
                                        {init.w2.begin(), init.w2.end()},
                                        {init.b2.begin(), init.b2.end()}};
  std::vector<std::vector<double>> m1, m2;
  for (auto& v : p) {
    m1.emplace_back(v.size());
    m2.emplace_back(v.size());
  }
  const double lr = 0.01, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01;
  int t = 0;
  std::vector<float> x, tg;
  for (int step = 0; step < kSteps; ++step) {
    Grads g{std::vector<double>(kHidden * kIn), std::vector<double>(kHidden),
            std::vector<double>(kOut * kHidden), std::vector<double>(kOut)};
    const int rows = kMicroRows * world;
    std::vector<float> w1(p[0].begin(), p[0].end()), bb1(p[1].begin(), p[1].end()),
        w2(p[2].begin(), p[2].end()), bb2(p[3].begin(), p[3].end());
    if (precision != ElementType::kFp32) {
      for (auto* w : {&w1, &bb1, &w2, &bb2}) Round(precision, w);
    }
    for (int micro = 0; micro < accumulation; ++micro) {
      MakeRows((step * accumulation + micro) * rows, rows, &x, &tg);
      ForwardBackward(w1.data(), bb1.data(), w2.data(), bb2.data(), x, tg, rows, 1.0 / accumulation,
                      &g);
    }
    std::vector<std::vector<double>*> gs = {&g.w1, &g.b1, &g.w2, &g.b2};
    double norm = 0;
    for (auto* gv : gs)
      for (double v : *gv) norm += v * v;
    norm = std::sqrt(norm);
    if (norms != nullptr) norms->push_back(norm);
    if (step == skipped_step) continue;
    const double clip = clipping > 0 && norm > clipping ? clipping / (norm + 1e-6) : 1.0;
    ++t;
    for (size_t k = 0; k < p.size(); ++k) {
      for (size_t i = 0; i < p[k].size(); ++i) {
        const double grad = (*gs[k])[i] * clip;
        p[k][i] *= 1 - lr * wd;
        m1[k][i] = b1 * m1[k][i] + (1 - b1) * grad;
        m2[k][i] = b2 * m2[k][i] + (1 - b2) * grad * grad;
        const double denom = std::sqrt(m2[k][i]) / std::sqrt(1 - std::pow(b2, t)) + eps;
        p[k][i] -= lr / (1 - std::pow(b1, t)) * m1[k][i] / denom;
      }
    }
  }
  return Model{{p[0].begin(), p[0].end()},
               {p[1].begin(), p[1].end()},
               {p[2].begin(), p[2].end()},
               {p[3].begin(), p[3].end()}};
}

double MaxDiff(const Model& a, const Model& b) {
  double d = 0;
  for (auto [x, y] : {std::pair{&a.w1, &b.w1}, {&a.b1, &b.b1}, {&a.w2, &b.w2}, {&a.b2, &b.b2}})
    for (size_t i = 0; i < x->size(); ++i) d = std::max(d, double(std::fabs((*x)[i] - (*y)[i])));
  return d;
}

// Rank `rank` of two on the host device, from a JSON config.
StatusOr<std::unique_ptr<Engine>> TwoRankEngine(const std::string& json, int rank, int port) {
  return testing::CreateRankEngine(json, testing::HostRankOptions(rank, 2, port));
}

// Note [Coalesced gathers]: a module's parameters are gathered by one collective, and each
// rank gets every rank's shard of each of them. Two ranks; module "m" of three parameters and
// "n" of one, every one gathered (no persistence), fetched in forward and again in backward:
// four collectives (a collective per parameter would be eight), and the fetched values are
// the parameters' own.
TEST(EngineGatherTest, AModulesParametersShareOneCollective) {
  const std::vector<int> codes = RunRanks(2, [](int rank, int port) {
    auto engine = TwoRankEngine(
        R"({"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}})", rank,
        port);
    if (!engine.ok()) return 1;
    Engine& e = **engine;
    const int m = *e.RegisterModule("m", {{"a", {64, 9}}, {"b", {7}}, {"c", {33, 32}}});
    const int n = *e.RegisterModule("n", {{"d", {100}}});
    if (!e.Initialize().ok()) return 2;
    const std::vector<std::string> names = {"a", "b", "c"};
    std::vector<std::vector<float>> expected(3);
    for (int i = 0; i < 3; ++i) {
      if (!e.GatherParameter(names[i], &expected[i]).ok()) return 3;
    }
    const int order[4] = {m, n, n, m};  // forward, then backward
    for (int k = 0; k < 4; ++k) {
      const int id = order[k];
      auto fetched = e.Fetch(id);
      if (!fetched.ok()) return 4;
      if (id == m) {
        for (int i = 0; i < 3; ++i) {
          const float* got = fetched->params[i];
          if (!std::equal(expected[i].begin(), expected[i].end(), got)) return 5 + i;
        }
      }
      if (k >= 2) {  // backward: zero gradients are enough to step
        if (!e.Gradients(id).ok() || !e.ReduceGradients(id).ok()) return 8;
      }
      if (!e.Release(id).ok()) return 9;
    }
    auto step = e.Step();
    if (!step.ok()) return 10;
    return step->gather_collectives == 4 ? 0 : 20 + static_cast<int>(step->gather_collectives);
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

// After each step the persistent parameters are gathered again, together (Note [Coalesced
// gathers]): in stage 3 with the rest of their module at its first fetch, in stage 2 (where
// everything persists) by the step in groups. Either way the second step counts one
// collective for the weight and the three biases (four with a collective each), and the
// biases fetched are the updated ones.
TEST(EngineGatherTest, PersistentParametersAreRegatheredTogether) {
  for (const int stage : {3, 2}) {
    const std::vector<int> codes = RunRanks(2, [stage](int rank, int port) {
      auto engine = TwoRankEngine(R"({"zero_optimization": {"stage": )" + std::to_string(stage) +
                                      R"(, "stage3_param_persistence_threshold": 1000},
            "optimizer": {"params": {"lr": 0.1}}})",
                                  rank, port);
      if (!engine.ok()) return 1;
      Engine& e = **engine;
      const int m =
          *e.RegisterModule("m", {{"w", {64, 64}}, {"b1", {64}}, {"b2", {64}}, {"b3", {9}}});
      if (!e.Initialize().ok()) return 2;
      StepSummary last;
      for (int step = 0; step < 2; ++step) {
        auto fetched = e.Fetch(m);
        if (!fetched.ok()) return 3;
        if (step == 1) {  // the biases as the first step left them
          std::vector<float> b1;
          if (!e.GatherParameter("b1", &b1).ok()) return 4;
          if (!std::equal(b1.begin(), b1.end(), fetched->params[1])) return 5;
        }
        auto grads = e.Gradients(m);
        if (!grads.ok()) return 6;
        for (float* g : *grads) g[0] = 1.0f;  // moves each parameter's first element
        if (!e.ReduceGradients(m).ok() || !e.Release(m).ok()) return 7;
        auto summary = e.Step();
        if (!summary.ok()) return 8;
        last = *summary;
      }
      return last.gather_collectives == 1 ? 0 : 20 + static_cast<int>(last.gather_collectives);
    });
    EXPECT_EQ(codes, (std::vector<int>{0, 0})) << "stage " << stage;
  }
}

struct Case {
  int world, stage, accumulation;
  double clipping;
  MlpPlacement placement;
};

class MlpTest : public ::testing::TestWithParam<Case> {};

// Note [Coalesced gathers]: a module's gather that fails while its shards are packed (here
// the second parameter's shard read from NVMe fails, on both ranks) drops what it prepared.
// The Fetch reports the error with the parameter named; the next Fetch gathers the whole
// module anew and hands back the parameters' own values, not buffers no collective filled.
TEST(EngineGatherTest, AGatherThatFailsWhilePackingLeavesNothingHalfDone) {
  const testing::TempDir tmp("zinf-gather-fault");
  const std::string& dir = tmp.path();
  const std::vector<int> codes = RunRanks(2, [&dir](int rank, int port) {
    FaultyEngine* faulty = nullptr;
    internal::SetTieredStoreEngineFactoryForTest(
        [&faulty](const AioOptions& aio) -> StatusOr<std::unique_ptr<IoEngine>> {
          ZINF_ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> base, CreateIoEngine(aio));
          auto wrapper = std::make_unique<FaultyEngine>(std::move(base));
          faulty = wrapper.get();
          return std::unique_ptr<IoEngine>(std::move(wrapper));
        });
    auto engine = TwoRankEngine(R"({"zero_optimization": {"stage": 3,
        "stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 0,
        "offload_param": {"device": "nvme", "nvme_path": ")" +
                                    dir + R"("}}})",
                                rank, port);
    if (!engine.ok()) return 1;
    Engine& e = **engine;
    const int m = *e.RegisterModule("m", {{"a", {64, 9}}, {"b", {7}}, {"c", {33, 32}}});
    const Status initialized = e.Initialize();  // opens the tiers: the store takes the engine
    internal::SetTieredStoreEngineFactoryForTest(nullptr);
    if (!initialized.ok() || faulty == nullptr) return 2;
    const std::vector<std::string> names = {"a", "b", "c"};
    std::vector<std::vector<float>> expected(3);
    for (int i = 0; i < 3; ++i) {
      if (!e.GatherParameter(names[i], &expected[i]).ok()) return 3;
    }
    const int before = faulty->injected();
    faulty->Arm(IoOp::kRead, 1, Fault::kEio);  // the module's second shard read: b's
    auto failed = e.Fetch(m);
    if (failed.ok() || faulty->injected() != before + 1) return 4;
    if (failed.status().message().find("'b'") == std::string::npos) return 5;
    auto fetched = e.Fetch(m);
    if (!fetched.ok()) return 6;
    for (int i = 0; i < 3; ++i) {
      const float* got = fetched->params[i];
      if (!std::equal(expected[i].begin(), expected[i].end(), got)) return 7 + i;
    }
    return e.Release(m).ok() ? 0 : 10;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

TEST_P(MlpTest, MatchesSingleProcessReference) {
  const Case c = GetParam();
  const testing::TempDir tmp("zinf-mlp-" + std::to_string(c.world));
  const std::string& dir = tmp.path();
  const std::vector<int> codes = RunRanks(c.world, [&](int rank, int port) {
    return TrainRank(rank, c.world, port, c.stage, c.accumulation, c.clipping, dir, false,
                     c.placement);
  });
  EXPECT_EQ(codes, std::vector<int>(c.world, 0));
  const Model init = ReadModel(dir + "/init.bin");
  const Model trained = ReadModel(dir + "/final.bin");
  std::vector<double> reference_norms;
  const Model reference =
      Reference(init, c.world, c.accumulation, c.clipping, -1, &reference_norms);
  EXPECT_GT(MaxDiff(init, reference), 0.01) << "training must move the parameters";
  EXPECT_LT(MaxDiff(trained, reference), 2e-5);
  // Adam is blind to a constant gradient scale, so the norm checks the averaging itself.
  std::vector<double> norms(kSteps);
  std::ifstream in(dir + "/norms.bin", std::ios::binary);
  in.read(reinterpret_cast<char*>(norms.data()), kSteps * 8);
  ASSERT_TRUE(in.good());
  for (int s = 0; s < kSteps; ++s) {
    EXPECT_NEAR(norms[s], reference_norms[s], 1e-5 * reference_norms[s]) << "step " << s;
  }
}

std::string Describe(const Case& c) {
  return "world" + std::to_string(c.world) + "_stage" + std::to_string(c.stage) + "_gas" +
         std::to_string(c.accumulation) + (c.clipping > 0 ? "_clip" : "") +
         (c.placement.optimizer_nvme ? "_optnvme" : "") +
         (c.placement.params_nvme ? "_paramnvme" : "") +
         (c.placement.gradients_nvme ? "_gradnvme" : "");
}
std::string CaseName(const ::testing::TestParamInfo<Case>& info) { return Describe(info.param); }
void PrintTo(const Case& c, std::ostream* os) { *os << Describe(c); }

INSTANTIATE_TEST_SUITE_P(
    Zero, MlpTest,
    ::testing::Values(Case{1, 3, 1, 0}, Case{2, 3, 1, 0}, Case{4, 3, 1, 0}, Case{2, 1, 1, 0},
                      Case{2, 2, 1, 0}, Case{4, 2, 2, 0}, Case{2, 3, 2, 0}, Case{2, 3, 1, 0.05},
                      Case{4, 1, 1, 0.05}, Case{1, 3, 1, 0, {true}}, Case{2, 3, 2, 0.05, {true}},
                      Case{4, 2, 1, 0, {true}}, Case{1, 3, 1, 0, {false, true}},
                      Case{2, 3, 2, 0, {false, true}}, Case{2, 3, 1, 0.05, {true, true}},
                      Case{4, 3, 2, 0, {true, true}},
                      // Note [Gradients on NVMe]: one rank and several, with accumulation,
                      // clipping and the parameters on NVMe too.
                      Case{1, 3, 1, 0, {true, false, 500000000, true}},
                      Case{1, 3, 2, 0.05, {true, true, 500000000, true}},
                      Case{2, 3, 2, 0.05, {true, false, 500000000, true}},
                      Case{4, 3, 1, 0, {true, true, 100, true}}),
    CaseName);

// Note [Gradient buckets]: the bucket size changes when and how gradients are reduced, never
// the result. 100 elements gives each weight a bucket of its own; 1000 (250 per rank) packs
// the first micro-batch (182 elements per rank) into one bucket and spreads the second and
// third over two, so that fc1's shard receives its three additions from three buckets.
TEST(MlpTest, BucketSizeDoesNotChangeTheResult) {
  const int world = 4;
  std::vector<std::string> finals;
  for (uint64_t bucket : {500000000u, 100u, 1000u}) {
    const testing::TempDir tmp("zinf-mlp-bucket-" + std::to_string(bucket));
    const std::string& dir = tmp.path();
    MlpPlacement placement;
    placement.reduce_bucket_size = bucket;
    const std::vector<int> codes = RunRanks(world, [&](int rank, int port) {
      return TrainRank(rank, world, port, 3, 3, 0.05, dir, false, placement);
    });
    ASSERT_EQ(codes, std::vector<int>(world, 0)) << "bucket " << bucket;
    std::ifstream in(dir + "/final.bin", std::ios::binary);
    finals.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ASSERT_FALSE(finals[0].empty());
  EXPECT_TRUE(finals[1] == finals[0]) << "bucket 100 differs from one bucket";
  EXPECT_TRUE(finals[2] == finals[0]) << "bucket 1000 differs from one bucket";
}

// Behind a modelled link (ZINF_HOST_LINK_GBPS) the host device's memory is reached only
// through its streams, as a GPU's is: gradients are packed into the buckets by device copies,
// and only the reduced slices (with one rank, the buckets) come down to the host tier, into
// the accumulators where they hold nothing of the batch (Note [Gradient buckets]). That path
// gives the same bits as the direct one, with accumulation too.
TEST(MlpTest, TheModelledLinkChangesNoBit) {
  // One rank with buckets of 100 elements: several buckets a backward, each micro-batch's
  // landing in the accumulators or added after the one before it.
  for (const Case& c :
       {Case{1, 3, 2, 0.05}, Case{1, 3, 3, 0.05, {false, false, 100}},
        Case{2, 3, 2, 0.05, {false, false, 100}}, Case{4, 3, 3, 0, {false, false, 1000}}}) {
    SCOPED_TRACE(Describe(c));
    std::vector<std::string> finals;
    for (const char* link : {"", "20"}) {
      const testing::TempDir tmp(std::string("zinf-mlp-link-") + link);
      const std::string& dir = tmp.path();
      ::setenv("ZINF_HOST_LINK_GBPS", link, 1);
      const std::vector<int> codes = RunRanks(c.world, [&](int rank, int port) {
        return TrainRank(rank, c.world, port, c.stage, c.accumulation, c.clipping, dir, false,
                         c.placement);
      });
      ::unsetenv("ZINF_HOST_LINK_GBPS");
      ASSERT_EQ(codes, std::vector<int>(c.world, 0)) << "link " << link;
      std::ifstream in(dir + "/final.bin", std::ios::binary);
      finals.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    ASSERT_FALSE(finals[0].empty());
    EXPECT_TRUE(finals[1] == finals[0]) << "the modelled link changed the trained model";
  }
}

// Data parallelism over a subset of the processes, as beside tensor parallelism of 2 on 4
// processes: groups {0, 2} and {1, 3} each train as a world of 2, through one store.
TEST(MlpTest, DataParallelSubgroupsTrainAsTheirOwnWorld) {
  const testing::TempDir tmp("zinf-mlp-groups");
  const std::string& dir = tmp.path();
  for (const char* g : {"/g0", "/g1"}) std::filesystem::create_directories(dir + g);
  const std::vector<int> codes = RunRanks(4, [&](int rank, int port) {
    const std::vector<int> group = rank % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
    return TrainRank(rank, 4, port, 3, 2, 0, dir + (rank % 2 == 0 ? "/g0" : "/g1"), false, {},
                     group);
  });
  ASSERT_EQ(codes, std::vector<int>(4, 0));
  for (const char* g : {"/g0", "/g1"}) {
    const Model init = ReadModel(dir + g + "/init.bin");
    const Model reference = Reference(init, 2, 2, 0);
    EXPECT_LT(MaxDiff(ReadModel(dir + g + "/final.bin"), reference), 2e-5) << g;
  }
}

TEST(EngineFailureTest, BadDataParallelGroupIsRefused) {
  auto config = EngineConfig::FromJson("{}");
  ASSERT_TRUE(config.ok());
  for (const std::vector<int>& group :
       {std::vector<int>{1, 3}, std::vector<int>{0, 0}, std::vector<int>{0, 4}}) {
    auto engine = Engine::Create(
        *config, {.device = "host", .rank = 0, .world_size = 4, .data_parallel_ranks = group});
    EXPECT_EQ(engine.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(engine.status().message().find("data_parallel_ranks"), std::string::npos)
        << engine.status();
  }
}

TEST(MlpTest, SameInitialModelForEveryWorldSize) {
  std::vector<Model> inits;
  for (int world : {1, 3}) {
    const testing::TempDir tmp("zinf-init-" + std::to_string(world));
    const std::string& dir = tmp.path();
    EXPECT_EQ(RunRanks(world, [&](int rank,
                                  int port) { return TrainRank(rank, world, port, 3, 1, 0, dir); }),
              std::vector<int>(world, 0));
    inits.push_back(ReadModel(dir + "/init.bin"));
  }
  EXPECT_EQ(MaxDiff(inits[0], inits[1]), 0.0);
}

TEST(MlpTest, Fp16OverflowSkipsTheStepOnAllRanks) {
  // The last rank injects an Inf at step 2; every rank must skip that step (TrainRank checks
  // summary.skipped on each rank), and the result equals the reference without that step.
  const testing::TempDir tmp("zinf-fp16");
  const std::string& dir = tmp.path();
  EXPECT_EQ(
      RunRanks(2, [&](int rank,
                      int port) { return TrainRank(rank, 2, port, 3, 1, 0, dir, /*fp16=*/true); }),
      (std::vector<int>{0, 0}));
  const Model init = ReadModel(dir + "/init.bin");
  const Model reference = Reference(init, 2, 1, 0, /*skipped_step=*/2, nullptr, ElementType::kFp16);
  // Loss scaling multiplies and divides by powers of two: exact in binary floating point. The
  // forward sees fp16 weights in both, rounded from an fp32 master here and a double one in
  // the reference; none lands on the other side of a rounding boundary in this (deterministic)
  // run, so the difference stays at fp32's (2.4e-7 measured).
  EXPECT_LT(MaxDiff(ReadModel(dir + "/final.bin"), reference), 2e-5);
}

TEST(EngineFailureTest, MismatchedConfigIsReportedAtStart) {
  const std::vector<int> codes = RunRanks(2, [](int rank, int port) {
    auto config =
        EngineConfig::FromJson(rank == 0 ? "{}" : R"({"optimizer": {"params": {"lr": 0.5}}})");
    auto engine = Engine::Create(
        *config,
        {.device = "host", .rank = rank, .world_size = 2, .master_port = port, .timeout = 10000ms});
    if (!engine.ok()) return 1;
    (void)(*engine)->RegisterModule("m", {{"w", {10}}});
    Status s = (*engine)->Initialize();
    if (s.code() != StatusCode::kFailedPrecondition) return 2;
    if (s.message().find("rank 1 was started with a different config") == std::string::npos)
      return 3;
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

TEST(EngineFailureTest, DeadRankIsReportedNotAHang) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int> codes = RunRanks(2, [](int rank, int port) {
    auto config = EngineConfig::FromJson("{}");
    auto engine = Engine::Create(
        *config,
        {.device = "host", .rank = rank, .world_size = 2, .master_port = port, .timeout = 3000ms});
    if (!engine.ok()) return 1;
    const int m = *(*engine)->RegisterModule("m", {{"w", {100000}}});
    if (!(*engine)->Initialize().ok()) return 2;
    if (rank == 1) _exit(42);  // dies before the first forward
    auto fetched = (*engine)->Fetch(m);
    if (fetched.ok()) return 3;
    std::fprintf(stderr, "rank 0 saw: %s\n", fetched.status().ToString().c_str());
    return fetched.status().message().find("rank 0") != std::string::npos ? 0 : 4;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 42}));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);
}

TEST(EngineFailureTest, MissingNvmePathIsNamed) {
  auto config = EngineConfig::FromJson(
      R"({"zero_optimization": {"offload_optimizer": {"device": "nvme",
          "nvme_path": "/nonexistent/zinf-nvme"}}})");
  ASSERT_TRUE(config.ok()) << config.status();
  auto engine = Engine::Create(*config, {.device = "host", .rank = 0, .world_size = 1});
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_TRUE((*engine)->RegisterModule("m", {{"w", {1000}}}).ok());
  Status s = (*engine)->Initialize();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("/nonexistent/zinf-nvme"), std::string::npos) << s;
  EXPECT_NE(s.message().find("NVMe swap space"), std::string::npos) << s;
}

TEST(EngineConfigTest, DeepSpeedKeysAndErrors) {
  auto c = EngineConfig::FromJson(R"({
    "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
    "gradient_clipping": 1.0, "steps_per_print": 10,
    "zero_optimization": {"stage": 3, "overlap_comm": true, "reduce_bucket_size": 5e8,
      "offload_optimizer": {"device": "cpu", "pin_memory": true}},
    "bf16": {"enabled": true},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-5, "betas": [0.8, 0.999],
      "eps": 1e-8, "weight_decay": 3e-7}},
    "aio": {"block_size": 1048576, "queue_depth": 8}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->zero_stage, 3);
  EXPECT_EQ(c->gradient_accumulation_steps, 2);
  EXPECT_EQ(c->offload_optimizer_device, OffloadDevice::kCpu);
  EXPECT_TRUE(c->bf16);
  EXPECT_DOUBLE_EQ(c->optimizer.beta1, 0.8);
  EXPECT_EQ(c->reduce_bucket_size, 500000000u);

  EXPECT_NE(EngineConfig::FromJson(R"({"zero_optimization": {"stage": 4}})")
                .status()
                .message()
                .find("'zero_optimization.stage' must be in [0, 3], got 4"),
            std::string::npos);
  EXPECT_NE(EngineConfig::FromJson(R"({"zero_optimisation": {}})")
                .status()
                .message()
                .find("'zero_optimisation' is not recognized"),
            std::string::npos);
  EXPECT_NE(EngineConfig::FromJson(R"({"optimizer": {"type": "SGD"}})")
                .status()
                .message()
                .find("must be one of AdamW, Adam, Adagrad, Lion"),
            std::string::npos);
  EXPECT_NE(EngineConfig::FromJson(R"({"aio": {"queue_depth": 0}})")
                .status()
                .message()
                .find("queue_depth"),
            std::string::npos);
  EXPECT_NE(
      EngineConfig::FromJson(R"({"zero_optimization": {"offload_param": {"device": "nvme"}}})")
          .status()
          .message()
          .find("nvme_path"),
      std::string::npos);
  EXPECT_NE(EngineConfig::FromJson(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})")
                .status()
                .message()
                .find("both true"),
            std::string::npos);
  // offload_optimizer.ratio is a fraction (its meaning: tests/zero/engine_config_test.cc);
  // offload_param has no ratio (as in DeepSpeed).
  auto ratio = EngineConfig::FromJson(
      R"({"zero_optimization": {"offload_optimizer": {"device": "cpu", "ratio": 0.25}}})");
  ASSERT_TRUE(ratio.ok()) << ratio.status();
  EXPECT_DOUBLE_EQ(ratio->offload_optimizer_cpu_ratio, 0.25);
  EXPECT_NE(EngineConfig::FromJson(
                R"({"zero_optimization": {"offload_optimizer": {"device": "cpu", "ratio": 1.5}}})")
                .status()
                .message()
                .find("ratio"),
            std::string::npos);
  EXPECT_FALSE(
      EngineConfig::FromJson(R"({"zero_optimization": {"offload_param": {"ratio": 0.5}}})").ok());
}

}  // namespace
}  // namespace zinf
