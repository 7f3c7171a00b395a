// Frozen parameters (ParamSpec::trainable false; Note [Frozen parameters] in
// src/zero/partition.h): sharded, placed and fetched as trained ones, with no master,
// gradient or optimizer state. The trained parameters of a model with frozen ones beside them
// (in the same modules and in a module of their own) train bitwise as the same model without
// the frozen ones; the frozen ones keep their initial values (in the compute precision) through
// steps, checkpoints and resharding; the host arrays hold nothing for them; and what has no
// meaning for them (their gradient, a step of a model of nothing else, a checkpoint that trained
// them) is refused, naming the parameter.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "tests/testing/engine_setup.h"
#include "tests/testing/float_file.h"
#include "tests/testing/fork_ranks.h"
#include "tests/testing/temp_dir.h"
#include "zinf/dtype.h"
#include "zinf/engine.h"
#include "zinf/tiered_store.h"

namespace zinf {
namespace {

using testing::ReadFloats;
using testing::RunRanks;
using testing::WriteFloats;

struct TestParam {
  const char* name;
  std::vector<int64_t> shape;
  int module;
  bool trainable;
};

// 140,000 elements in "a": with 64K-element NVMe chunks it spans chunks; the frozen ones sit
// between trained ones in registration, and module 2 holds frozen ones alone.
const std::vector<TestParam> kParams = {
    {"a", {700, 200}, 0, true}, {"base0", {300, 50}, 0, false}, {"base1", {77}, 1, false},
    {"b", {50, 40}, 1, true},   {"base2", {1000, 3}, 2, false}, {"c", {33}, 2, false}};
constexpr int kModules = 3;
constexpr int kSteps = 3;

uint64_t Numel(const TestParam& p) {
  uint64_t n = 1;
  for (int64_t d : p.shape) n *= d;
  return n;
}
int Index(const std::string& name) {
  for (size_t i = 0; i < kParams.size(); ++i) {
    if (name == kParams[i].name) return static_cast<int>(i);
  }
  return -1;
}
float Initial(int param, uint64_t i) { return 0.5f * std::sin(0.001f * i + 1.7f * param) + 0.01f; }
float Grad(int step, int param, uint64_t i) {
  return 0.1f * std::cos(0.37f * i + 0.9f * step + 0.3f * param);
}

struct Setup {
  bool optimizer_nvme = false;
  bool params_nvme = false;
  bool bf16 = false;
};

std::string Config(const Setup& s, const std::string& dir) {
  return R"({"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 100, )" +
         testing::OffloadJson({.optimizer_nvme = s.optimizer_nvme, .params_nvme = s.params_nvme},
                              dir) +
         R"(}, "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}},
            "bf16": {"enabled": )" +
         (s.bf16 ? "true" : "false") + R"(}, "zinf": {"host_budget": 9437184}})";
}

// The engine's modules: their ids (-1 where none was registered) and the kParams each holds.
struct Built {
  std::vector<int> ids;
  std::vector<std::vector<int>> params;
};

// Registers kParams (the frozen ones only when `with_frozen`, all of them trained when
// `train_all`) and initializes them from Initial, or the frozen ones from `frozen_value`.
StatusOr<Built> Build(Engine& e, bool with_frozen, bool train_all = false,
                      std::optional<float> frozen_value = std::nullopt) {
  Built b;
  b.params.resize(kModules);
  std::vector<std::vector<ParamSpec>> modules(kModules);
  for (size_t pi = 0; pi < kParams.size(); ++pi) {
    const TestParam& p = kParams[pi];
    if (!p.trainable && !with_frozen) continue;
    modules[p.module].push_back(
        {.name = p.name, .shape = p.shape, .trainable = p.trainable || train_all});
    b.params[p.module].push_back(static_cast<int>(pi));
  }
  for (int m = 0; m < kModules; ++m) {
    StatusOr<int> id = modules[m].empty() ? StatusOr<int>(-1)
                                          : e.RegisterModule("m" + std::to_string(m), modules[m]);
    ZINF_RETURN_IF_ERROR(id.status());
    b.ids.push_back(*id);
  }
  ZINF_RETURN_IF_ERROR(
      e.Initialize([&](const std::string& name, uint64_t first, uint64_t count, float* out) {
        const int pi = Index(name);
        for (uint64_t k = 0; k < count; ++k) {
          out[k] = !kParams[pi].trainable && frozen_value ? *frozen_value : Initial(pi, first + k);
        }
        return OkStatus();
      }));
  return b;
}

// Steps [first, last): backward writes the trained parameters' gradients; a frozen one gets
// no buffer, and a module of frozen ones alone is not reduced (a trainer would skip it).
Status Train(Engine& e, const Built& b, int first, int last) {
  for (int step = first; step < last; ++step) {
    for (int m = kModules - 1; m >= 0; --m) {
      if (b.ids[m] < 0) continue;
      ZINF_RETURN_IF_ERROR(e.Fetch(b.ids[m]).status());
      ZINF_ASSIGN_OR_RETURN(std::vector<float*> grads, e.Gradients(b.ids[m]));
      bool trains = false;
      for (size_t k = 0; k < grads.size(); ++k) {
        const int pi = b.params[m][k];
        if (!kParams[pi].trainable) {
          if (grads[k] != nullptr) return Internal(std::string("a buffer for ") + kParams[pi].name);
          continue;
        }
        if (grads[k] == nullptr) return Internal(std::string("no buffer for ") + kParams[pi].name);
        for (uint64_t i = 0; i < Numel(kParams[pi]); ++i) grads[k][i] = Grad(step, pi, i);
        trains = true;
      }
      if (trains) ZINF_RETURN_IF_ERROR(e.ReduceGradients(b.ids[m]));
      ZINF_RETURN_IF_ERROR(e.Release(b.ids[m]));
    }
    ZINF_RETURN_IF_ERROR(e.Step().status());
  }
  return OkStatus();
}

// The values of kParams' trained (or frozen) parameters, back to back.
StatusOr<std::vector<float>> Values(Engine& e, bool trainable) {
  std::vector<float> all, v;
  for (const TestParam& p : kParams) {
    if (p.trainable != trainable) continue;
    ZINF_RETURN_IF_ERROR(e.GatherParameter(p.name, &v));
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

// The frozen parameters' initial values as the parameter tier keeps them.
std::vector<float> FrozenInitial(bool bf16) {
  std::vector<float> out;
  for (size_t pi = 0; pi < kParams.size(); ++pi) {
    if (kParams[pi].trainable) continue;
    for (uint64_t i = 0; i < Numel(kParams[pi]); ++i) {
      float x = Initial(pi, i);
      if (bf16) {
        uint16_t h;
        ConvertFromFp32(&x, ElementType::kBf16, &h, 1);
        ConvertToFp32(&h, ElementType::kBf16, &x, 1);
      }
      out.push_back(x);
    }
  }
  return out;
}

size_t Differ(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], 4) != 0;
  return n;
}

struct Case {
  const char* name;
  Setup setup;
  int world;
};

// The case's name, for ctest's test names (not the struct's bytes, a pointer among them).
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class FrozenParamsTest : public ::testing::TestWithParam<Case> {};

// The same loop with the frozen parameters and without them: the trained ones bitwise alike,
// the frozen ones unchanged, and the host arrays smaller by at least the optimizer's 16 bytes
// an element of what the frozen ones would have cost trained.
TEST_P(FrozenParamsTest, TrainedOnesStepAsWithoutTheFrozenOnesWhichKeepTheirValues) {
  const Case c = GetParam();
  const testing::TempDir tmp("zinf-frozen");
  const std::string dir = tmp.path();
  const std::vector<int> ports = testing::FreePorts(3);  // one per variant's engine
  const std::vector<int> codes = RunRanks(c.world, [&](int rank, int) {
    const std::string json = Config(c.setup, dir);
    Status s;
    uint64_t host_bytes[2] = {0, 0};
    for (int variant = 0; variant < 3 && s.ok(); ++variant) {
      // 0: with the frozen ones; 1: without them; 2: every parameter trained (host bytes).
      auto engine =
          testing::CreateRankEngine(json, testing::HostRankOptions(rank, c.world, ports[variant]));
      if (!engine.ok()) return 10;
      Engine& e = **engine;
      StatusOr<Built> ids = Build(e, variant != 1, variant == 2);
      s = ids.status();
      if (s.ok() && variant == 0) {
        // A fetch hands out the frozen values.
        StatusOr<FetchedModule> f = e.Fetch(ids->ids[2]);
        s = f.status();
        if (s.ok() && f->params[0][5] != FrozenInitial(c.setup.bf16)[15077 + 5]) {
          s = Internal("the fetched frozen value is not its initial one");
        }
        if (s.ok()) s = e.Release(ids->ids[2]);
      }
      if (s.ok() && variant == 2) {
        StatusOr<TieredStoreStats> stats = e.store_stats();
        s = stats.status();
        if (s.ok()) host_bytes[1] = stats->tiers[static_cast<int>(Tier::kHost)].in_use_bytes;
        break;
      }
      if (s.ok()) s = Train(e, *ids, 0, kSteps);
      if (s.ok() && variant == 0) {
        StatusOr<TieredStoreStats> stats = e.store_stats();
        s = stats.status();
        if (s.ok()) host_bytes[0] = stats->tiers[static_cast<int>(Tier::kHost)].in_use_bytes;
      }
      StatusOr<std::vector<float>> trained = Values(e, true);
      if (s.ok()) s = trained.status();
      if (s.ok() && rank == 0)
        s = WriteFloats(dir + "/trained" + std::to_string(variant), *trained);
      if (s.ok() && variant == 0) {
        StatusOr<std::vector<float>> frozen = Values(e, false);
        s = frozen.status();
        if (s.ok() && rank == 0) s = WriteFloats(dir + "/frozen", *frozen);
        std::vector<float> unused;
        Status refused = e.GatherGradient("base0", &unused);
        if (s.ok() && (refused.code() != StatusCode::kInvalidArgument ||
                       refused.message().find("base0") == std::string::npos)) {
          s = Internal("GatherGradient of a frozen parameter: " + refused.ToString());
        }
      }
    }
    // What the frozen ones would have cost trained: master, accumulator and two states.
    const uint64_t frozen_elements = (15000 + 77 + 3000 + 33) / c.world;
    if (s.ok() && !c.setup.optimizer_nvme && host_bytes[0] + 16 * frozen_elements > host_bytes[1]) {
      s = Internal("host bytes with frozen parameters " + std::to_string(host_bytes[0]) +
                   ", all trained " + std::to_string(host_bytes[1]));
    }
    if (!s.ok()) std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
    return s.ok() ? 0 : 13;
  });
  ASSERT_EQ(codes, std::vector<int>(c.world, 0));
  EXPECT_EQ(Differ(ReadFloats(dir + "/trained0"), ReadFloats(dir + "/trained1")), 0u)
      << "the trained parameters differ from a model without the frozen ones";
  EXPECT_FALSE(ReadFloats(dir + "/trained0").empty());
  EXPECT_EQ(Differ(ReadFloats(dir + "/frozen"), FrozenInitial(c.setup.bf16)), 0u)
      << "a frozen parameter changed";
}

INSTANTIATE_TEST_SUITE_P(
    Placements, FrozenParamsTest,
    ::testing::Values(Case{"host_1", {}, 1}, Case{"host_2", {}, 2},
                      Case{"bf16_1", {.bf16 = true}, 1},
                      Case{"nvme_1", {.optimizer_nvme = true, .params_nvme = true}, 1},
                      Case{"nvme_2", {.optimizer_nvme = true, .params_nvme = true}, 2}),
    [](const auto& info) { return std::string(info.param.name); });

// Two steps on 2 ranks, a checkpoint, an engine on 1 rank whose frozen parameters start at 0
// loads it and takes the last step: every value as the run without the checkpoint. An engine
// that trains a parameter the checkpoint kept frozen refuses it, naming the parameter.
TEST(FrozenParamsCheckpointTest, FrozenValuesComeBackResharded) {
  for (bool nvme : {false, true}) {
    const testing::TempDir tmp("zinf-frozen-ckpt");
    const std::string dir = tmp.path();
    const std::string json = Config({.optimizer_nvme = nvme, .params_nvme = nvme}, dir);
    std::vector<int> codes = RunRanks(2, [&](int rank, int port) {
      auto e = testing::CreateRankEngine(json, testing::HostRankOptions(rank, 2, port));
      if (!e.ok()) return 10;
      StatusOr<Built> ids = Build(**e, true);
      Status s = ids.status();
      if (s.ok()) s = Train(**e, *ids, 0, 2);
      if (s.ok()) s = (*e)->SaveCheckpoint(dir + "/ckpt", "two");
      if (!s.ok()) std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
      return s.ok() ? 0 : 11;
    });
    ASSERT_EQ(codes, std::vector<int>(2, 0));
    const std::vector<int> ports = testing::FreePorts(3);  // one per engine
    codes = RunRanks(1, [&](int rank, int) {
      Status s;
      for (int run = 0; run < 2 && s.ok(); ++run) {
        // 0: straight through; 1: from the checkpoint, frozen values starting at 0.
        auto e = testing::CreateRankEngine(json, testing::HostRankOptions(rank, 1, ports[run]));
        if (!e.ok()) return 10;
        StatusOr<Built> ids =
            Build(**e, true, false, run == 1 ? std::optional<float>(0.0f) : std::nullopt);
        s = ids.status();
        if (s.ok())
          s = run == 0 ? Train(**e, *ids, 0, 2) : (*e)->LoadCheckpoint(dir + "/ckpt").status();
        if (s.ok()) s = Train(**e, *ids, 2, 3);
        std::vector<float> all;
        for (bool trainable : {true, false}) {
          StatusOr<std::vector<float>> v = Values(**e, trainable);
          if (s.ok()) s = v.status();
          if (s.ok()) all.insert(all.end(), v->begin(), v->end());
        }
        if (s.ok()) s = WriteFloats(dir + "/run" + std::to_string(run), all);
      }
      auto other = testing::CreateRankEngine(json, testing::HostRankOptions(rank, 1, ports[2]));
      if (!other.ok()) return 12;
      if (s.ok()) s = Build(**other, true, /*train_all=*/true).status();
      Status refused = s.ok() ? (*other)->LoadCheckpoint(dir + "/ckpt").status() : s;
      if (s.ok() &&
          (refused.code() != StatusCode::kFailedPrecondition ||
           refused.message().find("'base0' was frozen when saved") == std::string::npos)) {
        s = Internal("a checkpoint of frozen parameters loaded into trained ones: " +
                     refused.ToString());
      }
      if (!s.ok()) std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return s.ok() ? 0 : 11;
    });
    ASSERT_EQ(codes, std::vector<int>(1, 0)) << (nvme ? "nvme" : "host");
    EXPECT_EQ(Differ(ReadFloats(dir + "/run1"), ReadFloats(dir + "/run0")), 0u)
        << (nvme ? "nvme" : "host");
    EXPECT_FALSE(ReadFloats(dir + "/run0").empty());
  }
}

// A model of frozen parameters alone (an inference or reference model) is sharded and fetched
// with its values, and its Step is refused, saying why; SetParameter replaces a frozen value.
TEST(FrozenParamsTest, AModelWithNothingToTrainFetchesAndRefusesToStep) {
  for (bool nvme : {false, true}) {
    const testing::TempDir tmp("zinf-frozen-only");
    const std::string dir = tmp.path();
    const std::vector<int> codes = RunRanks(2, [&](int rank, int port) {
      auto e = testing::CreateRankEngine(Config({.optimizer_nvme = nvme, .params_nvme = nvme}, dir),
                                         testing::HostRankOptions(rank, 2, port));
      if (!e.ok()) return 10;
      StatusOr<int> id =
          (*e)->RegisterModule("ref", {{.name = "w", .shape = {300, 40}, .trainable = false},
                                       {.name = "v", .shape = {9}, .trainable = false}});
      if (!id.ok()) return 11;
      Status s = (*e)->Initialize();
      StatusOr<Engine::ShardRange> shard = (*e)->Shard("w");
      if (s.ok() && (!shard.ok() || shard->size != 6000)) s = Internal("not sharded over 2 ranks");
      std::vector<float> before, after, set(12000, 0.25f);
      if (s.ok()) s = (*e)->GatherParameter("w", &before);
      StatusOr<FetchedModule> f = s.ok() ? (*e)->Fetch(*id) : StatusOr<FetchedModule>(s);
      if (s.ok()) s = f.status();
      if (s.ok() && std::memcmp(f->params[0], before.data(), before.size() * 4) != 0) {
        s = Internal("the fetched values are not the parameter's");
      }
      if (s.ok()) s = (*e)->Release(*id);
      Status step = (*e)->Step().status();
      if (s.ok() && (step.code() != StatusCode::kFailedPrecondition ||
                     step.message().find("no trainable parameter") == std::string::npos)) {
        s = Internal("Step of a model with nothing to train: " + step.ToString());
      }
      if (s.ok()) s = (*e)->SetParameter("w", set.data(), set.size());
      if (s.ok()) s = (*e)->GatherParameter("w", &after);
      if (s.ok() && after != set) s = Internal("SetParameter of a frozen parameter did not take");
      if (!s.ok()) std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
      return s.ok() ? 0 : 12;
    });
    ASSERT_EQ(codes, std::vector<int>(2, 0)) << (nvme ? "nvme" : "host");
  }
}

}  // namespace
}  // namespace zinf
