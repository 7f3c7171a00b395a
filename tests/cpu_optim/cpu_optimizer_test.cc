// CpuOptimizer against PyTorch reference vectors (tests/data/cpu_optim_torch_ref.json, made by
// the script beside it), Lion's published rule, and the API's contracts: chunked == whole,
// bitwise identical for any thread count, overflow skips without touching anything, state
// save/restore is exact, bad input gets a clear error.
#include "zinf/cpu_optimizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cpu_optim/kernels.h"

namespace zinf {
namespace {

using cpu_optim::FloatToBf16;
using cpu_optim::FloatToFp16;

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Distance in units in the last place between two finite floats of the same sign region.
int64_t UlpDistance(float a, float b) {
  auto key = [](float f) {
    const int64_t u = Bits(f);
    return u & 0x80000000 ? -(u & 0x7FFFFFFF) : u;
  };
  return std::llabs(key(a) - key(b));
}

std::unique_ptr<CpuOptimizer> MakeOptimizer(CpuKernelIsa isa, int threads,
                                            StoreMode store = StoreMode::kAuto) {
  CpuOptimizerOptions options;
  options.isa = isa;
  options.threads = threads;
  options.store_mode = store;
  auto opt = CpuOptimizer::Create(options);
  EXPECT_TRUE(opt.ok()) << opt.status();
  return std::move(opt).value();
}

// ---- PyTorch reference vectors ----

OptimizerHyperParams ParseHp(const nlohmann::json& j) {
  OptimizerHyperParams hp;
  const std::string type = j.at("type");
  hp.type = type == "adamw"     ? OptimizerType::kAdamW
            : type == "adam"    ? OptimizerType::kAdam
            : type == "adagrad" ? OptimizerType::kAdagrad
                                : OptimizerType::kLion;
  hp.lr = j.at("lr");
  hp.beta1 = j.at("beta1");
  hp.beta2 = j.at("beta2");
  hp.eps = j.at("eps");
  hp.weight_decay = j.at("weight_decay");
  hp.bias_correction = j.at("bias_correction");
  hp.lr_decay = j.at("lr_decay");
  hp.initial_accumulator_value = j.at("initial_accumulator_value");
  return hp;
}

std::vector<float> Floats(const nlohmann::json& j) {
  std::vector<float> out;
  for (const auto& x : j) out.push_back(static_cast<float>(x.get<double>()));
  return out;
}

std::vector<uint16_t> U16s(const nlohmann::json& j) {
  std::vector<uint16_t> out;
  for (const auto& x : j) out.push_back(static_cast<uint16_t>(x.get<int>()));
  return out;
}

ElementType ParseType(const nlohmann::json& j) {
  if (j.is_null()) return ElementType::kFp32;
  const std::string s = j;
  return s == "bf16" ? ElementType::kBf16 : s == "fp16" ? ElementType::kFp16 : ElementType::kFp32;
}

nlohmann::json LoadReference() {
  std::ifstream in(std::string(ZINF_TEST_DATA_DIR) + "/cpu_optim_torch_ref.json");
  EXPECT_TRUE(in.good()) << "missing " << ZINF_TEST_DATA_DIR << "/cpu_optim_torch_ref.json";
  nlohmann::json j;
  in >> j;
  return j;
}

// torch's CPU kernels may fuse a multiply-add that zinf keeps separate (or the reverse), so
// results can differ in the last bits: at most 4 ulps after five steps when this was written,
// nowhere near the size of an update (lr 1e-2 moves a unit-size param by ~2^17 ulps).
constexpr int64_t kMaxUlps = 8;

TEST(CpuOptimizerTest, MatchesPyTorchReference) {
  const nlohmann::json ref = LoadReference();
  ASSERT_FALSE(ref.is_null());
  const size_t n = ref.at("n");
  int cases = 0;
  int64_t max_ulps = 0;
  auto track = [&](float a, float b) {
    const int64_t d = UlpDistance(a, b);
    max_ulps = std::max(max_ulps, d);
    return d;
  };
  for (CpuKernelIsa isa : SupportedCpuKernelIsas()) {
    for (int threads : {1, 2}) {
      for (const auto& c : ref.at("cases")) {
        const std::string name = std::string(CpuKernelIsaName(isa)) + "/" +
                                 c.at("name").get<std::string>() + "/threads" +
                                 std::to_string(threads);
        auto opt = MakeOptimizer(isa, threads);
        const OptimizerHyperParams hp = ParseHp(c.at("hp"));
        auto group = opt->AddParamGroup(hp);
        ASSERT_TRUE(group.ok()) << group.status();
        std::vector<float> p = Floats(c.at("init_params"));
        std::vector<float> s0(n, -1.0f), s1(n, -1.0f);
        std::vector<float> g32(n);
        std::vector<uint16_t> g16(n), copy(n);
        OptimizerSpan span;
        span.params = p.data();
        span.state0 = s0.data();
        span.state1 = hp.state_count() == 2 ? s1.data() : nullptr;
        span.grad_type = ParseType(c.at("grad_type"));
        span.grads = span.grad_type == ElementType::kFp32 ? static_cast<const void*>(g32.data())
                                                          : static_cast<const void*>(g16.data());
        const bool has_copy = !c.at("copy_type").is_null();
        if (has_copy) {
          span.param_copy = copy.data();
          span.param_copy_type = ParseType(c.at("copy_type"));
        }
        span.count = n;
        ASSERT_TRUE(opt->InitState(*group, span).ok());
        EXPECT_EQ(s0, Floats(c.at("init_state0"))) << name;
        if (span.state1) {
          EXPECT_EQ(s1, Floats(c.at("init_state1"))) << name;
        }
        StepOptions so;
        so.grad_scale = static_cast<float>(c.at("grad_scale").get<double>());
        int step = 0;
        for (const auto& s : c.at("steps")) {
          ++step;
          // Copy into the buffers the span points at (assignment would move new ones in).
          if (span.grad_type == ElementType::kFp32) {
            const std::vector<float> g = Floats(s.at("grads"));
            std::copy(g.begin(), g.end(), g32.begin());
          } else {
            const std::vector<uint16_t> g = U16s(s.at("grads"));
            std::copy(g.begin(), g.end(), g16.begin());
          }
          auto r = opt->Step(*group, span, so);
          ASSERT_TRUE(r.ok()) << r.status();
          ASSERT_EQ(r->step, step);
          const std::vector<float> want_p = Floats(s.at("params"));
          const std::vector<float> want_s0 = Floats(s.at("state0"));
          for (size_t i = 0; i < n; ++i) {
            ASSERT_LE(track(p[i], want_p[i]), kMaxUlps)
                << name << " step " << step << " params[" << i << "] " << p[i] << " vs torch "
                << want_p[i];
            ASSERT_LE(track(s0[i], want_s0[i]), kMaxUlps) << name << " state0[" << i << "]";
          }
          if (span.state1) {
            const std::vector<float> want_s1 = Floats(s.at("state1"));
            for (size_t i = 0; i < n; ++i) {
              ASSERT_LE(track(s1[i], want_s1[i]), kMaxUlps) << name << " state1[" << i << "]";
            }
          }
          if (has_copy) {
            // Our copy is exactly the rounding of our params; torch's of its own. Where the
            // params agree bitwise, the copies must too; elsewhere they may differ by one unit.
            const std::vector<uint16_t> want_c = U16s(s.at("copy"));
            for (size_t i = 0; i < n; ++i) {
              const uint16_t exact = span.param_copy_type == ElementType::kBf16 ? FloatToBf16(p[i])
                                                                                : FloatToFp16(p[i]);
              ASSERT_EQ(copy[i], exact) << name << " copy[" << i << "]";
              if (Bits(p[i]) == Bits(want_p[i])) {
                ASSERT_EQ(copy[i], want_c[i]) << name << " copy[" << i << "] vs torch";
              } else {
                ASSERT_LE(std::abs(int(copy[i]) - int(want_c[i])), 1)
                    << name << " copy[" << i << "]";
              }
            }
          }
        }
        ++cases;
      }
    }
  }
  EXPECT_GE(cases, 11);
  std::cout << "largest difference from torch: " << max_ulps << " ulps\n";
}

// ---- Lion, against the paper's rule written out by hand ----

TEST(CpuOptimizerTest, LionFollowsPublishedRule) {
  // Chen et al. 2023, Algorithm 2: c = b1*m + (1-b1)*g; p = p - lr*(sign(c) + wd*p);
  // m = b2*m + (1-b2)*g. zinf (like the reference implementation) applies the decay as
  // p *= 1 - lr*wd first, which is the same update.
  for (CpuKernelIsa isa : SupportedCpuKernelIsas()) {
    auto opt = MakeOptimizer(isa, 1);
    OptimizerHyperParams hp = OptimizerHyperParams::Defaults(OptimizerType::kLion);
    hp.lr = 0.125;
    hp.beta1 = 0.5;
    hp.beta2 = 0.75;
    hp.weight_decay = 0.5;
    const int group = *opt->AddParamGroup(hp);
    std::vector<float> p = {1.0f, 1.0f, -2.0f, 4.0f, 0.5f};
    std::vector<float> m = {0.0f, 1.0f, -1.0f, 2.0f, -1.0f};
    std::vector<float> g = {2.0f, -2.0f, 0.0f, -2.0f, 1.0f};
    OptimizerSpan span;
    span.params = p.data();
    span.state0 = m.data();
    span.grads = g.data();
    span.count = p.size();
    ASSERT_TRUE(opt->Step(group, span).ok());
    // c = 0.5*m + 0.5*g = {1, -0.5, -0.5, 0, 0}; decay factor 1 - 0.125*0.5 = 0.9375.
    const std::vector<float> want_p = {1.0f * 0.9375f - 0.125f, 1.0f * 0.9375f + 0.125f,
                                       -2.0f * 0.9375f + 0.125f, 4.0f * 0.9375f, 0.5f * 0.9375f};
    const std::vector<float> want_m = {0.5f, 0.25f, -0.75f, 1.0f, -0.5f};
    EXPECT_EQ(p, want_p) << CpuKernelIsaName(isa);
    EXPECT_EQ(m, want_m) << CpuKernelIsaName(isa);
  }
}

// ---- Contracts ----

struct Shard {
  Shard(size_t n, OptimizerType type, ElementType grad_type, bool copy, uint32_t seed)
      : n(n), p(n), s0(n), s1(n), g32(n), g16(n), c16(copy ? n : 0) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (size_t i = 0; i < n; ++i) {
      p[i] = normal(rng);
      g32[i] = normal(rng) * 1e-2f;
      g16[i] = grad_type == ElementType::kFp16 ? FloatToFp16(g32[i]) : FloatToBf16(g32[i]);
    }
    span.params = p.data();
    span.state0 = s0.data();
    span.state1 =
        type == OptimizerType::kAdamW || type == OptimizerType::kAdam ? s1.data() : nullptr;
    span.grad_type = grad_type;
    span.grads = grad_type == ElementType::kFp32 ? static_cast<const void*>(g32.data())
                                                 : static_cast<const void*>(g16.data());
    span.param_copy = copy ? c16.data() : nullptr;
    span.count = n;
  }
  bool operator==(const Shard& o) const {
    return std::memcmp(p.data(), o.p.data(), n * 4) == 0 &&
           std::memcmp(s0.data(), o.s0.data(), n * 4) == 0 &&
           std::memcmp(s1.data(), o.s1.data(), n * 4) == 0 && c16 == o.c16;
  }
  size_t n;
  std::vector<float> p, s0, s1, g32;
  std::vector<uint16_t> g16, c16;
  OptimizerSpan span;
};

TEST(CpuOptimizerTest, ChunkedStepEqualsWholeStep) {
  const size_t n = 1000003;
  for (OptimizerType type :
       {OptimizerType::kAdamW, OptimizerType::kAdagrad, OptimizerType::kLion}) {
    auto opt = MakeOptimizer(CpuKernelIsa::kAuto, 2);
    OptimizerHyperParams hp = OptimizerHyperParams::Defaults(type);
    const int whole_group = *opt->AddParamGroup(hp);
    const int chunk_group = *opt->AddParamGroup(hp);
    Shard whole(n, type, ElementType::kBf16, true, 1),
        chunked(n, type, ElementType::kBf16, true, 1);
    ASSERT_TRUE(opt->InitState(whole_group, whole.span).ok());
    ASSERT_TRUE(opt->InitState(chunk_group, chunked.span).ok());
    for (int step = 0; step < 3; ++step) {
      ASSERT_TRUE(opt->Step(whole_group, whole.span, {0.5f, false}).ok());
      ASSERT_TRUE(opt->BeginStep(chunk_group).ok());
      // Uneven chunks, out of order, one of them not a multiple of anything.
      const size_t cuts[] = {0, 4097, 300001, 300002, 777777, n};
      for (int k : {3, 0, 4, 2, 1}) {
        ASSERT_TRUE(
            opt->Update(chunk_group, chunked.span.Slice(cuts[k], cuts[k + 1] - cuts[k]), 0.5f)
                .ok());
      }
    }
    EXPECT_TRUE(whole == chunked) << OptimizerTypeName(type);
  }
}

TEST(CpuOptimizerTest, BitwiseIdenticalForAnyThreadCount) {
  const size_t n = 3 * 1000003;
  for (CpuKernelIsa isa : SupportedCpuKernelIsas()) {
    std::vector<std::unique_ptr<Shard>> results;
    std::vector<double> sums;
    for (int threads : {1, 2, 3, 4}) {
      auto opt = MakeOptimizer(isa, threads);
      const int group = *opt->AddParamGroup(OptimizerHyperParams::Defaults(OptimizerType::kAdamW));
      auto shard = std::make_unique<Shard>(n, OptimizerType::kAdamW, ElementType::kFp32, true, 7);
      ASSERT_TRUE(opt->InitState(group, shard->span).ok());
      for (int step = 0; step < 2; ++step) ASSERT_TRUE(opt->Step(group, shard->span).ok());
      auto stats = opt->ComputeGradStats(shard->g32.data(), ElementType::kFp32, n);
      ASSERT_TRUE(stats.ok());
      sums.push_back(stats->sum_squares);
      results.push_back(std::move(shard));
    }
    for (size_t i = 1; i < results.size(); ++i) {
      EXPECT_TRUE(*results[i] == *results[0]) << CpuKernelIsaName(isa) << " threads index " << i;
      EXPECT_EQ(Bits(static_cast<float>(sums[i])), Bits(static_cast<float>(sums[0])));
      EXPECT_EQ(sums[i], sums[0]) << CpuKernelIsaName(isa);
    }
  }
}

TEST(CpuOptimizerTest, ApplyStepsEqualsApplyStepPerSpan) {
  // Spans of many sizes (under a chunk and over several), each at its own step number, stepped
  // together and one by one: bitwise the same, for any thread count.
  const std::vector<size_t> sizes = {1, 100, 16383, 16385, 70001, 3, 250000};
  OptimizerHyperParams hp = OptimizerHyperParams::Defaults(OptimizerType::kAdamW);
  hp.weight_decay = 0.1;
  for (int threads : {1, 3}) {
    auto opt = MakeOptimizer(CpuKernelIsa::kAuto, threads);
    std::vector<std::unique_ptr<Shard>> together, alone;
    std::vector<SteppedSpan> spans;
    for (size_t i = 0; i < sizes.size(); ++i) {
      together.push_back(std::make_unique<Shard>(sizes[i], hp.type, ElementType::kBf16, true,
                                                 static_cast<uint32_t>(i)));
      alone.push_back(std::make_unique<Shard>(sizes[i], hp.type, ElementType::kBf16, true,
                                              static_cast<uint32_t>(i)));
    }
    for (int round = 0; round < 2; ++round) {
      spans.clear();
      for (size_t i = 0; i < sizes.size(); ++i) {
        const auto step = static_cast<int64_t>(1 + i + round);
        spans.push_back({step, together[i]->span});
        ASSERT_TRUE(opt->ApplyStep(hp, step, 0.5f, alone[i]->span).ok());
      }
      ASSERT_TRUE(opt->ApplySteps(hp, 0.5f, spans).ok());
    }
    for (size_t i = 0; i < sizes.size(); ++i) {
      EXPECT_TRUE(*together[i] == *alone[i]) << threads << " threads, span " << i;
    }

    // A bad span anywhere refuses the call before any span changes.
    Shard untouched(1000, hp.type, ElementType::kFp32, false, 99);
    Shard reference(1000, hp.type, ElementType::kFp32, false, 99);
    OptimizerSpan bad = untouched.span;
    bad.grads = nullptr;
    const std::vector<SteppedSpan> with_bad = {{1, untouched.span}, {1, bad}};
    EXPECT_EQ(opt->ApplySteps(hp, 1.0f, with_bad).code(), StatusCode::kInvalidArgument);
    const std::vector<SteppedSpan> bad_step = {{1, untouched.span}, {0, untouched.span}};
    EXPECT_EQ(opt->ApplySteps(hp, 1.0f, bad_step).code(), StatusCode::kInvalidArgument);
    EXPECT_TRUE(untouched == reference);
  }
}

TEST(CpuOptimizerTest, StoreModesGiveTheSameResult) {
  const size_t n = 100003;
  for (CpuKernelIsa isa : SupportedCpuKernelIsas()) {
    std::vector<std::unique_ptr<Shard>> results;
    for (StoreMode mode : {StoreMode::kCached, StoreMode::kNonTemporal}) {
      auto opt = MakeOptimizer(isa, 2, mode);
      const int group = *opt->AddParamGroup(OptimizerHyperParams::Defaults(OptimizerType::kAdam));
      auto shard = std::make_unique<Shard>(n, OptimizerType::kAdam, ElementType::kFp16, true, 3);
      // Offset the arrays differently, so streaming must fall back for the unmatched ones.
      ASSERT_TRUE(opt->InitState(group, shard->span).ok());
      ASSERT_TRUE(opt->Step(group, shard->span.Slice(1, n - 1)).ok());
      results.push_back(std::move(shard));
    }
    EXPECT_TRUE(*results[0] == *results[1]) << CpuKernelIsaName(isa);
  }
}

TEST(CpuOptimizerTest, AutoStoreModeSettlesOnOneModeWithoutChangingValues) {
  const size_t n = 100003;
  CpuOptimizerOptions options;
  options.threads = 2;
  options.nt_store_min_bytes = 1;  // every call is "large": tune
  auto tuned = std::move(CpuOptimizer::Create(options)).value();
  auto cached = MakeOptimizer(CpuKernelIsa::kAuto, 2, StoreMode::kCached);
  const OptimizerHyperParams hp = OptimizerHyperParams::Defaults(OptimizerType::kAdamW);
  const int g_tuned = *tuned->AddParamGroup(hp);
  const int g_cached = *cached->AddParamGroup(hp);
  Shard a(n, OptimizerType::kAdamW, ElementType::kFp32, true, 5);
  Shard b(n, OptimizerType::kAdamW, ElementType::kFp32, true, 5);
  EXPECT_EQ(tuned->store_mode_in_use(), StoreMode::kAuto);
  EXPECT_EQ(cached->store_mode_in_use(), StoreMode::kCached);
  EXPECT_EQ(cached->prefetch_bytes_in_use(), cached->options().prefetch_bytes);
  // Four candidates (two store kinds, with and without prefetch), five trials each.
  for (int step = 0; step < 20; ++step) {
    EXPECT_EQ(tuned->store_mode_in_use(), StoreMode::kAuto) << "decided after " << step;
    ASSERT_TRUE(tuned->Step(g_tuned, a.span).ok());
    ASSERT_TRUE(cached->Step(g_cached, b.span).ok());
  }
  EXPECT_NE(tuned->store_mode_in_use(), StoreMode::kAuto);
  const size_t pf = tuned->prefetch_bytes_in_use();
  EXPECT_TRUE(pf == 0 || pf == options.prefetch_bytes) << pf;
  EXPECT_TRUE(a == b);
}

TEST(CpuOptimizerTest, NonFiniteGradientsSkipTheStepAndTouchNothing) {
  const float inf = std::numeric_limits<float>::infinity();
  for (ElementType gt : {ElementType::kFp32, ElementType::kBf16, ElementType::kFp16}) {
    for (float bad : {inf, -inf, std::numeric_limits<float>::quiet_NaN()}) {
      auto opt = MakeOptimizer(CpuKernelIsa::kAuto, 2);
      const int group = *opt->AddParamGroup(OptimizerHyperParams::Defaults(OptimizerType::kAdamW));
      const size_t n = 200003;
      Shard shard(n, OptimizerType::kAdamW, gt, true, 9);
      ASSERT_TRUE(opt->InitState(group, shard.span).ok());
      ASSERT_TRUE(opt->Step(group, shard.span, {1.0f, true}).ok());
      const size_t at = 150001;
      shard.g32[at] = bad;
      shard.g16[at] = gt == ElementType::kFp16 ? FloatToFp16(bad) : FloatToBf16(bad);
      auto stats = opt->ComputeGradStats(shard.span.grads, gt, n);
      ASSERT_TRUE(stats.ok());
      EXPECT_FALSE(stats->finite);
      Shard before = shard;
      auto r = opt->Step(group, shard.span, {0.25f, true});
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_TRUE(r->skipped);
      EXPECT_FALSE(r->grad_stats.finite);
      EXPECT_EQ(r->step, 1);
      EXPECT_EQ(opt->group(group)->step, 1);
      EXPECT_TRUE(shard == before) << ElementTypeName(gt) << " " << bad;
      // Fixed gradients step normally, and the step count continues from 1.
      shard.g32[at] = 0.0f;
      shard.g16[at] = 0;
      r = opt->Step(group, shard.span, {0.25f, true});
      ASSERT_TRUE(r.ok());
      EXPECT_FALSE(r->skipped);
      EXPECT_TRUE(r->grad_stats.finite);
      EXPECT_EQ(r->step, 2);
    }
  }
}

TEST(CpuOptimizerTest, GradStatsSumOfSquares) {
  auto opt = MakeOptimizer(CpuKernelIsa::kAuto, 2);
  std::vector<float> g(1000003, 0.5f);
  g[17] = 3.0f;
  auto stats = opt->ComputeGradStats(g.data(), ElementType::kFp32, g.size());
  ASSERT_TRUE(stats.ok());
  EXPECT_TRUE(stats->finite);
  EXPECT_DOUBLE_EQ(stats->sum_squares, 0.25 * (g.size() - 1) + 9.0);
  auto empty = opt->ComputeGradStats(nullptr, ElementType::kBf16, 0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->sum_squares, 0.0);
}

// Accumulate on the optimizer's threads gives AccumulateFp32's bits (and with overwrite the
// values themselves), for any thread count, over a length that is no multiple of a chunk.
TEST(CpuOptimizerTest, AccumulateAddsOrCopiesAsOneThreadWould) {
  const size_t n = 3 * (size_t{1} << 14) + 77;
  std::vector<float> x(n), start(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = std::sin(0.37f * static_cast<float>(i)) * 1e-3f;
    start[i] = std::cos(0.11f * static_cast<float>(i));
  }
  std::vector<float> want = start;
  AccumulateFp32(want.data(), x.data(), n);
  for (int threads : {1, 2, 3}) {
    auto opt = MakeOptimizer(CpuKernelIsa::kAuto, threads);
    std::vector<float> acc = start;
    ASSERT_TRUE(opt->Accumulate(acc.data(), x.data(), n).ok());
    EXPECT_EQ(0, std::memcmp(acc.data(), want.data(), n * sizeof(float))) << threads;
    ASSERT_TRUE(opt->Accumulate(acc.data(), x.data(), n, /*overwrite=*/true).ok());
    EXPECT_EQ(acc, x) << threads;
  }
  auto opt = MakeOptimizer(CpuKernelIsa::kAuto, 2);
  EXPECT_EQ(opt->Accumulate(nullptr, x.data(), n).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(opt->Accumulate(nullptr, nullptr, 0).ok());
}

TEST(CpuOptimizerTest, SaveAndRestoreContinueExactly) {
  const size_t n = 50001;
  auto a = MakeOptimizer(CpuKernelIsa::kAuto, 2);
  OptimizerHyperParams adamw = OptimizerHyperParams::Defaults(OptimizerType::kAdamW);
  adamw.lr = 0.1 / 3.0;  // not representable in short decimal: the blob must keep all bits
  OptimizerHyperParams adagrad = OptimizerHyperParams::Defaults(OptimizerType::kAdagrad);
  adagrad.lr_decay = 1e-3;
  adagrad.initial_accumulator_value = 0.1;
  const int g0 = *a->AddParamGroup(adamw);
  const int g1 = *a->AddParamGroup(adagrad);
  Shard s0(n, OptimizerType::kAdamW, ElementType::kFp32, false, 1);
  Shard s1(n, OptimizerType::kAdagrad, ElementType::kFp32, false, 2);
  ASSERT_TRUE(a->InitState(g0, s0.span).ok());
  ASSERT_TRUE(a->InitState(g1, s1.span).ok());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(a->Step(g0, s0.span).ok());
    ASSERT_TRUE(a->Step(g1, s1.span).ok());
  }
  const std::string blob = a->SaveState();
  Shard r0 = s0, r1 = s1;  // the arrays, saved as bytes
  r0.span = s0.span;
  r0.span.params = r0.p.data();
  r0.span.state0 = r0.s0.data();
  r0.span.state1 = r0.s1.data();
  r0.span.grads = r0.g32.data();
  r1.span = s1.span;
  r1.span.params = r1.p.data();
  r1.span.state0 = r1.s0.data();
  r1.span.grads = r1.g32.data();
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(a->Step(g0, s0.span).ok());
    ASSERT_TRUE(a->Step(g1, s1.span).ok());
  }
  auto b = MakeOptimizer(CpuKernelIsa::kAuto, 1);
  ASSERT_TRUE(b->LoadState(blob).ok());
  ASSERT_EQ(b->num_groups(), 2);
  EXPECT_EQ(b->group(0)->step, 3);
  EXPECT_EQ(b->group(0)->hyper_params.lr, adamw.lr);
  EXPECT_EQ(b->group(1)->hyper_params.initial_accumulator_value, 0.1);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(b->Step(0, r0.span).ok());
    ASSERT_TRUE(b->Step(1, r1.span).ok());
  }
  EXPECT_TRUE(r0 == s0);
  EXPECT_TRUE(r1 == s1);
  EXPECT_EQ(b->SaveState(), a->SaveState());

  // Damage is detected, never half-loaded.
  std::string bad = blob;
  bad[20] ^= 1;
  EXPECT_EQ(b->LoadState(bad).code(), StatusCode::kDataLoss);
  EXPECT_EQ(b->LoadState(blob.substr(0, blob.size() - 3)).code(), StatusCode::kDataLoss);
  EXPECT_EQ(b->LoadState("").code(), StatusCode::kDataLoss);
  EXPECT_EQ(b->group(0)->step, 5);
}

TEST(CpuOptimizerTest, BadInputGetsAClearError) {
  auto opt = MakeOptimizer(CpuKernelIsa::kAuto, 1);
  OptimizerHyperParams hp;
  hp.beta1 = 1.0;
  auto g = opt->AddParamGroup(hp);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(g.status().message().find("beta1"), std::string::npos) << g.status();
  hp = OptimizerHyperParams();
  hp.lr = -1;
  EXPECT_NE(opt->AddParamGroup(hp).status().message().find("lr"), std::string::npos);

  const int group = *opt->AddParamGroup(OptimizerHyperParams());
  std::vector<float> p(8), m(8), grad(8);
  OptimizerSpan span;
  span.params = p.data();
  span.state0 = m.data();
  span.grads = grad.data();
  span.count = 8;
  auto st = opt->Step(group, span);  // AdamW without exp_avg_sq
  EXPECT_EQ(st.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.status().message().find("state1"), std::string::npos) << st.status();
  EXPECT_EQ(opt->group(group)->step, 0);
  EXPECT_EQ(opt->Update(group, span).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(opt->Update(7, span).code(), StatusCode::kInvalidArgument);
  OptimizerHyperParams lion = OptimizerHyperParams::Defaults(OptimizerType::kLion);
  EXPECT_EQ(opt->SetHyperParams(group, lion).code(), StatusCode::kInvalidArgument);

  CpuOptimizerOptions options;
  options.threads = -1;
  EXPECT_EQ(CpuOptimizer::Create(options).status().code(), StatusCode::kInvalidArgument);
  bool have512 = false;
  for (CpuKernelIsa isa : SupportedCpuKernelIsas()) have512 |= isa == CpuKernelIsa::kAvx512;
  if (!have512) {
    options = CpuOptimizerOptions();
    options.isa = CpuKernelIsa::kAvx512;
    auto forced = CpuOptimizer::Create(options);
    EXPECT_EQ(forced.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(forced.status().message().find("avx512"), std::string::npos) << forced.status();
  }
}

TEST(CpuOptimizerTest, AutoPicksTheBestSupportedKernel) {
  auto opt = MakeOptimizer(CpuKernelIsa::kAuto, 1);
  EXPECT_EQ(opt->isa(), SupportedCpuKernelIsas().back());
  EXPECT_EQ(SupportedCpuKernelIsas().front(), CpuKernelIsa::kScalar);
}

}  // namespace
}  // namespace zinf
