// The parameter tier on the tiered store: the order it records and follows (training batches,
// forward-only loops, a changed order), and the engine's uploads hidden behind compute on the
// host device's modelled PCIe link.
#include "zero/param_tier.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "zinf/engine.h"

namespace zinf {
namespace {

constexpr int kModules = 4;
constexpr uint64_t kElements = 1000;

// A store with a host device and a host tier, and a tier of kModules modules of one parameter
// each, homed in host memory.
class ParamTierTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TieredStoreOptions options;
    options.device = "host";
    options.device_budget_bytes = 64 << 20;
    options.host_budget_bytes = 64 << 20;
    options.pin_host = false;
    auto device = CreateDevice(options.device, options.device_budget_bytes);
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = std::move(*device);
    auto store = TieredStore::Create(options, device_.get());
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    auto comm = CreateLocalCommunicator();
    ASSERT_TRUE(comm.ok());
    comm_ = std::move(*comm);
    for (int m = 0; m < kModules; ++m) {
      Param p;
      p.spec.name = "w" + std::to_string(m);
      p.spec.shape = {static_cast<int64_t>(kElements)};
      p.module = m;
      p.numel = kElements;
      params_.push_back(p);
      modules_.push_back({"m" + std::to_string(m), {m}});
    }
    Partition(params_, 1, 3, 0);
    tier_ = std::make_unique<ParamTier>(
        store_.get(), comm_.get(), &params_, &modules_,
        ParamTierOptions{.param_type = ElementType::kFp32,
                         .shard_home = Tier::kHost,
                         .prefetch_bucket_elements = kElements,  // the next module
                         .max_live_elements = 1 << 30});
    ASSERT_TRUE(tier_->Create(device_.get()).ok());
    for (const Param& p : params_) {
      std::vector<float> values(kElements, static_cast<float>(p.module));
      ASSERT_TRUE(tier_->WriteFp32(p, values.data()).ok());
    }
  }

  void Pass(bool backward) {
    for (int m = 0; m < kModules; ++m) {
      std::vector<ParamTensor> tensors;
      std::vector<float*> fp32;
      ASSERT_TRUE(tier_->Fetch(m, &tensors, &fp32).ok());
      ASSERT_EQ(fp32.size(), 1u);
      EXPECT_EQ(fp32[0][kElements - 1], static_cast<float>(m));
      if (backward) tier_->NoteBackward();
      ASSERT_TRUE(tier_->Release(m).ok());
      modules_[m].fetched = false;
    }
  }

  // Drops every shard's device copy, then fetches module 0: true when module 1's shard is in
  // the device tier once the transfers in flight are done (it was prefetched).
  bool FetchPrefetchesTheNext() {
    for (int m = 0; m < kModules; ++m) {
      EXPECT_TRUE(store_->Evict(tier_->shard(m), Tier::kDevice).ok());
    }
    std::vector<ParamTensor> tensors;
    EXPECT_TRUE(tier_->Fetch(0, &tensors, nullptr).ok());
    EXPECT_TRUE(store_->Flush().ok());  // waits for prefetches in flight
    auto tiers = store_->ResidentTiers(tier_->shard(1));
    EXPECT_TRUE(tier_->Release(0).ok());
    modules_[0].fetched = false;
    return tiers.ok() && std::count(tiers->begin(), tiers->end(), Tier::kDevice) == 1;
  }

  std::unique_ptr<Device> device_;  // the compute device, outliving the store
  std::unique_ptr<TieredStore> store_;
  std::unique_ptr<Communicator> comm_;
  std::vector<Param> params_;
  std::vector<Module> modules_;
  std::unique_ptr<ParamTier> tier_;
};

TEST_F(ParamTierTest, TrainingOrderIsFollowedAfterTheFirstBatch) {
  Pass(/*backward=*/false);
  Pass(/*backward=*/true);
  EXPECT_FALSE(FetchPrefetchesTheNext()) << "still recording: no batch has ended";
  tier_->EndBatch();
  EXPECT_TRUE(FetchPrefetchesTheNext());
}

TEST_F(ParamTierTest, ForwardOnlyLoopFindsItsOrderAndPrefetches) {
  Pass(/*backward=*/false);
  EXPECT_FALSE(FetchPrefetchesTheNext()) << "one pass and one fetch are not yet a repetition";
  for (int m = 1; m < kModules; ++m) {  // the rest of the second pass
    std::vector<ParamTensor> tensors;
    ASSERT_TRUE(tier_->Fetch(m, &tensors, nullptr).ok());
    ASSERT_TRUE(tier_->Release(m).ok());
    modules_[m].fetched = false;
  }
  EXPECT_TRUE(FetchPrefetchesTheNext()) << "the third pass follows the order found";
}

TEST_F(ParamTierTest, ChangedOrderIsRecordedAgain) {
  Pass(/*backward=*/true);
  tier_->EndBatch();
  EXPECT_TRUE(FetchPrefetchesTheNext());
  for (int m : {3, 2, 1, 0}) {  // leaves the order at its first fetch: recording starts again
    std::vector<ParamTensor> tensors;
    ASSERT_TRUE(tier_->Fetch(m, &tensors, nullptr).ok());
    tier_->NoteBackward();
    ASSERT_TRUE(tier_->Release(m).ok());
    modules_[m].fetched = false;
  }
  tier_->EndBatch();
  // The order is now 3 2 1 0: fetching 0 first leaves it again, so nothing is prefetched, and
  // the values stay right throughout.
  EXPECT_FALSE(FetchPrefetchesTheNext());
  Pass(/*backward=*/false);
}

// Sets ZINF_HOST_LINK_GBPS for one test and restores what was there.
class ScopedLink {
 public:
  explicit ScopedLink(const std::string& gbps) {
    if (const char* v = std::getenv(kVariable)) saved_ = v;
    setenv(kVariable, gbps.c_str(), 1);
  }
  ~ScopedLink() {
    if (saved_.empty()) {
      unsetenv(kVariable);
    } else {
      setenv(kVariable, saved_.c_str(), 1);
    }
  }

 private:
  static constexpr const char* kVariable = "ZINF_HOST_LINK_GBPS";
  std::string saved_;
};

struct LinkRun {
  double step_seconds = 0;       // the median of the steps after the first
  double optimizer_seconds = 0;  // Engine::Step's part of it, the same step
  std::vector<float> weights;
};

// Trains 8 modules of one 1M-element parameter each, parameters in host memory
// (offload_param cpu) so that every step uploads each shard over the modelled link once (the
// step rewrites them), with `compute` of sleep per module in forward and in backward.
LinkRun TrainBehindTheLink(uint64_t max_live, std::chrono::milliseconds compute) {
  constexpr int kLinkModules = 8;
  constexpr int64_t kN = 1 << 20;
  auto config = EngineConfig::FromJson(
      R"({"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
          "stage3_prefetch_bucket_size": 1048576, "stage3_max_live_parameters": )" +
      std::to_string(max_live) + R"(, "offload_param": {"device": "cpu"}}})");
  EXPECT_TRUE(config.ok()) << config.status();
  auto engine = Engine::Create(
      *config, {.device = "host", .rank = 0, .world_size = 1, .optimizer_threads = 1});
  EXPECT_TRUE(engine.ok()) << engine.status();
  Engine& e = **engine;
  for (int m = 0; m < kLinkModules; ++m) {
    EXPECT_TRUE(e.RegisterModule("m" + std::to_string(m), {{"w" + std::to_string(m), {kN}}}).ok());
  }
  EXPECT_TRUE(e.Initialize().ok());
  std::vector<std::pair<double, double>> steps;  // step, optimizer
  for (int step = 0; step < 4; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int m = 0; m < kLinkModules; ++m) {
      EXPECT_TRUE(e.Fetch(m).ok());
      std::this_thread::sleep_for(compute);
      EXPECT_TRUE(e.Release(m).ok());
    }
    for (int m = kLinkModules - 1; m >= 0; --m) {
      auto p = e.Fetch(m);
      auto g = e.Gradients(m);
      EXPECT_TRUE(p.ok() && g.ok());
      for (int64_t i = 0; i < kN; i += 4096) (*g)[0][i] = p->params[0][i];
      std::this_thread::sleep_for(compute);
      EXPECT_TRUE(e.ReduceGradients(m).ok());
      EXPECT_TRUE(e.Release(m).ok());
    }
    auto summary = e.Step();
    EXPECT_TRUE(summary.ok()) << summary.status();
    if (step > 0 && summary.ok()) {
      steps.emplace_back(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
          summary->seconds_optimizer);
    }
  }
  LinkRun run;
  std::sort(steps.begin(), steps.end());
  std::tie(run.step_seconds, run.optimizer_seconds) = steps[steps.size() / 2];
  EXPECT_TRUE(e.GatherParameter("w3", &run.weights).ok());
  return run;
}

// Each module's shard (4 MiB) takes X = 40 ms on the link and X of compute: a step's 8 uploads
// are hidden behind forward's compute when they are prefetched along the recorded order
// (step ~ 16 X of compute + the optimizer + the first upload), and add 8 X when they are not (a
// live window of one module leaves no room to prefetch). The results are the same bitwise.
TEST(EngineLinkTest, UploadsHideBehindComputeOnAModelledLink) {
  const std::chrono::milliseconds x(40);
  ScopedLink link("0.1048576");  // 4 MiB in 40 ms
  const LinkRun prefetched = TrainBehindTheLink(1 << 30, x);
  const LinkRun serial = TrainBehindTheLink(1 << 20, x);
  // The limit: the modules' compute and the optimizer step (the uploads are 8 X < 16 X).
  const double compute = 16 * 0.040 + prefetched.optimizer_seconds;
  std::printf("step: prefetched %.3f s, serial %.3f s, compute %.3f s (optimizer %.3f s)\n",
              prefetched.step_seconds, serial.step_seconds, compute, prefetched.optimizer_seconds);
  // Asserted loosely, as the suite runs two tests at a time on two cores: prefetching must
  // hide at least half of the 8 X of uploads the serial run pays (unloaded, the step is about
  // 1.15x its limit: bench/RESULTS.md).
  EXPECT_EQ(prefetched.weights, serial.weights);
#ifdef ZINF_SLOW_BUILD
  GTEST_SKIP() << "timing figures mean nothing in a sanitizer build";
#endif
  EXPECT_LE(prefetched.step_seconds + 4 * 0.040, serial.step_seconds);
  EXPECT_GE(serial.step_seconds, compute + 6 * 0.040) << "the link model is not in the way";
}

}  // namespace
}  // namespace zinf
