// tools/plan_model.h against the engine: for every placement the plan offers, the bytes it
// predicts (Note [Plan memory]) against what a real engine reports after steps
// (StepSummary::host_bytes, nvme_bytes) and the traffic it predicts against the engine's
// counters; and the model, profile and config parsers' errors.
#include "tools/plan_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/testing/temp_dir.h"
#include "tests/tools/plan_training.h"
#include "zero/tier_budgets.h"
#include "zinf/engine.h"

namespace zinf::plan {
namespace {

// Rates that make every figure finite; the memory and byte counts do not depend on them.
MachineProfile TestProfile() {
  MachineProfile p;
  p.cores = 2;
  p.memory_bytes = 64ull << 30;
  p.nvme_free_bytes = 64ull << 30;
  p.nvme_read_Bps = 2e9;
  p.nvme_write_Bps = 1e9;
  p.optimizer.push_back({1, 1e8});
  p.memory_Bps = 1e10;
  p.matmul.push_back({1, 1e11, 2e11});
  p.loop_fp32_flops = 1e10;
  return p;
}

// TestProfile with the 2-rank collectives measured idle.
MachineProfile TwoRankProfile() {
  MachineProfile p = TestProfile();
  p.collective_latency_s = 100e-6;
  p.allgather_Bps = p.reduce_scatter_Bps = 1e10;
  return p;
}

// Stage 3 without persistent parameters: with several ranks every fetch gathers.
EngineConfig GatherEveryFetch() {
  EngineConfig c;
  c.zero_stage = 3;
  c.stage3_param_persistence_threshold = 0;
  return c;
}

// The least a profile file holds for FromJson to accept it.
nlohmann::json MinimalProfileJson() {
  return {{"zinf_profile", 1},
          {"machine", {{"cores", 2}, {"memory_bytes", 1 << 30}}},
          {"memory_GBps", 10},
          {"cpu_optimizer", {{{"threads", 1}, {"params_per_s", 1e8}}}},
          {"matmul", {{{"threads", 1}, {"fp32_GFLOPs", 50}}}},
          {"loop_fp32_GFLOPs", 5}};
}

class PlanMemoryTest : public ::testing::TestWithParam<std::tuple<int, int>> {
 protected:
  testing::TempDir tmp_{"zinf-plan"};
  const std::string dir_ = tmp_.path();
};

// Within `tolerance` of each other (relative), or both below 1 MiB apart.
void ExpectNear(uint64_t predicted, uint64_t measured, double tolerance, const std::string& what) {
  const double diff = std::fabs(static_cast<double>(predicted) - static_cast<double>(measured));
  EXPECT_TRUE(diff <= tolerance * static_cast<double>(measured) || diff < (1 << 20))
      << what << ": predicted " << predicted << ", measured " << measured;
}

TEST_P(PlanMemoryTest, SteadyBytesAndTrafficMatchTheEngine) {
  const auto [model_kind, accumulation] = GetParam();
  // A model of a few modules large enough that rounding does not hide a missing array: an
  // MLP of 1024-wide layers, or 6 modules of 0.8M elements (several NVMe optimizer chunks).
  StatusOr<ModelSpec> model =
      model_kind == 0 ? MlpModel(3, 1024, 4) : UniformModel(4'800'000, 6, 16);
  ASSERT_TRUE(model.ok()) << model.status();
  EngineConfig base;
  base.stage3_param_persistence_threshold = 2000;  // the MLP's biases persist
  base.stage3_prefetch_bucket_size = 1'000'000;
  base.gradient_accumulation_steps = accumulation;
  base.nvme_checksum = false;
  for (const EngineConfig& c : Placements(base, dir_)) {
    if (c.fp16) continue;                                              // the same bytes as bf16
    if (c.offload_optimizer_device == OffloadDevice::kNone) continue;  // the same as cpu
    SCOPED_TRACE(PlacementName(c));
    StatusOr<StepSummary> measured = Train(*model, c, 2);
    ASSERT_TRUE(measured.ok()) << measured.status();
    StatusOr<Estimate> est = EstimatePlacement(*model, c, TestProfile(), {});
    ASSERT_TRUE(est.ok()) << est.status();
    ExpectNear(est->memory.steady_host(), measured->host_bytes, 0.10, "host bytes");
    ExpectNear(est->memory.nvme, measured->nvme_bytes, 0.10, "NVMe bytes");
    // Where the parameter tier is the master, the chunks the unclipped step runs beside
    // backward also write their old parameters (Note [Parameters kept by the caller]): how
    // many depends on how far the step gets before backward ends, measured from a quarter of
    // them to all (4 bytes an element on 12 to 16); the plan's part is its profile's.
    const bool speculated = ParamTierIsMaster(c) && c.overlap_optimizer;
    ExpectNear(est->time.nvme_written, measured->bytes_nvme_written, speculated ? 0.30 : 0.10,
               "NVMe written");
    // With parameters on NVMe, how many shards a step reads back depends on how far the
    // prefetch gets ahead of compute and what the device tier evicted meanwhile: measured
    // 11-33% off on a loaded machine and under AddressSanitizer, both ways, against within 10% on a
    // quiet one; the plan's figure is the unhurried one.
    const bool timing_dependent = c.offload_param_device == OffloadDevice::kNvme;
    ExpectNear(est->time.nvme_read, measured->bytes_nvme_read, timing_dependent ? 0.40 : 0.10,
               "NVMe read");
    ExpectNear(est->time.bytes_gathered, measured->bytes_gathered, 0.10, "bytes gathered");
    // The peak bounds what the engine holds between steps.
    EXPECT_GE(est->memory.peak_device + est->memory.peak_host, measured->host_bytes);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, PlanMemoryTest,
                         ::testing::Values(std::tuple{0, 1}, std::tuple{1, 1}, std::tuple{1, 2}),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param) == 0 ? "Mlp" : "Uniform") +
                                  "Accumulation" + std::to_string(std::get<1>(info.param));
                         });

// A model four times the device tier's room, parameters on NVMe: the shards the device tier
// keeps between forward and backward, and so the bytes read from NVMe, follow the simulated
// eviction (the copy needed last goes first).
TEST_F(PlanMemoryTest, DeviceTierEvictionMatchesTheEngine) {
  StatusOr<ModelSpec> model = UniformModel(64 * 1'000'000, 64, 16);
  ASSERT_TRUE(model.ok());
  EngineConfig c;
  c.stage3_prefetch_bucket_size = 1'000'000;
  c.nvme_checksum = false;
  c.offload_param_device = OffloadDevice::kNvme;
  c.offload_param_nvme_path = {dir_};
  c.offload_optimizer_device = OffloadDevice::kCpu;
  StatusOr<Estimate> est = EstimatePlacement(*model, c, TestProfile(), {});
  ASSERT_TRUE(est.ok()) << est.status();
  const uint64_t tier = 64ull * 1'000'000 * 4;
  ASSERT_LT(est->memory.device_budget, tier / 2) << "the test needs a tier larger than the room";
  // Forward reads every shard; backward finds some of them still cached.
  EXPECT_GT(est->time.nvme_read, tier);
  EXPECT_LT(est->time.nvme_read, 2 * tier);
  StatusOr<StepSummary> measured = Train(*model, c, 2);
  ASSERT_TRUE(measured.ok()) << measured.status();
  ExpectNear(est->time.nvme_read, measured->bytes_nvme_read, 0.10, "NVMe read");
  ExpectNear(est->time.nvme_written, measured->bytes_nvme_written, 0.10, "NVMe written");
  ExpectNear(est->memory.steady_host(), measured->host_bytes, 0.10, "host bytes");
}

TEST(PlanModelTest, GptShapesMatchTheExample) {
  // The demo config's model: 0.83M parameters (README, bench/RESULTS.md).
  StatusOr<ModelSpec> m = GptModel(256, 64, 128, 4, 4, 8);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->parameter_count(), 256u * 128 + 64 * 128 + 4 * (12 * 128 * 128 + 13 * 128) + 256);
  EXPECT_EQ(m->fetch_order.size(), 2u * 4 + 3);
  EXPECT_EQ(m->fetch_order.size(), m->fetch_flops.size());
  // large.json: 1.008B parameters.
  StatusOr<ModelSpec> large = GptModel(256, 128, 2048, 20, 16, 1);
  ASSERT_TRUE(large.ok());
  EXPECT_NEAR(large->parameter_count() / 1e9, 1.008, 0.001);
}

// The demo's compute as gpt_model.cc runs it: ONEDNN_VERBOSE=1 shows 357 oneDNN calls a
// step; the recomputation stops at the GELU; the GELU runs twice forward and once backward.
TEST(PlanModelTest, GptComputeCountsTheExamplesKernels) {
  const int L = 4, T = 64, d = 128, B = 8;
  StatusOr<ModelSpec> m = GptModel(256, T, d, L, 4, B);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->kernel_calls_per_micro_batch, 357);
  const double tokens = B * T, block = tokens * (24.0 * d * d + 4.0 * T * d);
  EXPECT_DOUBLE_EQ(m->fetch_flops[1], block);
  EXPECT_DOUBLE_EQ(m->fetch_flops[L + 3], 3 * block - tokens * 8.0 * d * d);
  EXPECT_DOUBLE_EQ(m->gelu_forward_elements_per_micro_batch, 2.0 * L * tokens * 4 * d);
  EXPECT_DOUBLE_EQ(m->gelu_backward_elements_per_micro_batch, 1.0 * L * tokens * 4 * d);
  StatusOr<ModelSpec> no_recompute = GptModel(256, T, d, L, 4, B, false);
  ASSERT_TRUE(no_recompute.ok());
  EXPECT_DOUBLE_EQ(no_recompute->fetch_flops[L + 3], 2 * block);
  EXPECT_DOUBLE_EQ(no_recompute->gelu_forward_elements_per_micro_batch, L * tokens * 4 * d);

  // The profile's GELU rates, where it has them, add exactly the GELU's time.
  nlohmann::json j = MinimalProfileJson();
  j["kernel_call"] = {{{"threads", 1}, {"us", 1.0}}};
  StatusOr<MachineProfile> without = MachineProfile::FromJson(j.dump(), "p.json");
  ASSERT_TRUE(without.ok()) << without.status();  // profiles from before the GELU's figures
  j["kernel_call"][0]["gelu_forward_Gelem_per_s"] = 2.0;
  j["kernel_call"][0]["gelu_backward_Gelem_per_s"] = 1.0;
  StatusOr<MachineProfile> with = MachineProfile::FromJson(j.dump(), "p.json");
  ASSERT_TRUE(with.ok()) << with.status();
  EXPECT_EQ(with->KernelCall(4).gelu_forward_per_s, 2e9);
  EXPECT_EQ(with->KernelCall(4).gelu_backward_per_s, 1e9);
  j["kernel_call"][0]["gelu_backward_Gelem_per_s"] = "fast";
  EXPECT_NE(MachineProfile::FromJson(j.dump(), "p.json").status().message().find("gelu_backward"),
            std::string::npos);
  PlanOptions one_thread;
  one_thread.threads = 1;
  const EngineConfig c;
  StatusOr<Estimate> slow = EstimatePlacement(*m, c, *without, one_thread);
  StatusOr<Estimate> fast = EstimatePlacement(*m, c, *with, one_thread);
  ASSERT_TRUE(slow.ok() && fast.ok());
  EXPECT_NEAR(fast->time.compute - slow->time.compute,
              m->gelu_forward_elements_per_micro_batch / 2e9 +
                  m->gelu_backward_elements_per_micro_batch / 1e9,
              1e-12);
}

TEST(PlanModelTest, BadModelsAreRefusedByName) {
  EXPECT_EQ(GptModel(256, 64, 130, 4, 4, 8).status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(GptModel(256, 64, -1, 4, 4, 8).status().message().find("d_model"), std::string::npos);
  EXPECT_FALSE(UniformModel(0, 4, 8).ok());
  EXPECT_FALSE(UniformModel(100, 0, 8).ok());
  EXPECT_FALSE(MlpModel(0, 8, 8).ok());
  auto bad = ModelFromConfigText(R"({"model": {"d_model": "big"}})", "c.json", 4, 64);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("model.d_model"), std::string::npos) << bad.status();
  bad = ModelFromConfigText(R"({"model": {"layers": 3}})", "c.json", 4, 64);
  EXPECT_NE(bad.status().message().find("model.layers"), std::string::npos) << bad.status();
  bad = ModelFromConfigText("{not json", "c.json", 4, 64);
  EXPECT_NE(bad.status().message().find("c.json"), std::string::npos) << bad.status();
  bad = ModelFromConfigText(R"({"zero_optimization": {"stage": 7}})", "c.json", 4, 64);
  EXPECT_NE(bad.status().message().find("stage"), std::string::npos) << bad.status();
}

TEST(PlanModelTest, ProfileErrorsNameTheFigure) {
  EXPECT_NE(MachineProfile::FromJson("[]", "p.json").status().message().find("p.json"),
            std::string::npos);
  EXPECT_NE(MachineProfile::FromJson("{}", "p.json").status().message().find("zinf_profile"),
            std::string::npos);
  const nlohmann::json good = MinimalProfileJson();
  ASSERT_TRUE(MachineProfile::FromJson(good.dump(), "p.json").ok());
  nlohmann::json bad = good;
  bad["memory_GBps"] = -3;
  EXPECT_NE(MachineProfile::FromJson(bad.dump(), "p.json").status().message().find("memory_GBps"),
            std::string::npos);
  bad = good;
  bad.erase("matmul");
  EXPECT_NE(MachineProfile::FromJson(bad.dump(), "p.json").status().message().find("matmul"),
            std::string::npos);
  bad = good;
  bad["cpu_optimizer"][0].erase("params_per_s");
  EXPECT_NE(MachineProfile::FromJson(bad.dump(), "p.json").status().message().find("params_per_s"),
            std::string::npos);
  bad = good;
  bad["collective"] = {{"latency_us", 100}, {"loaded", {{{"compute_us", 1000}, {"wait_us", 5}}}}};
  EXPECT_NE(MachineProfile::FromJson(bad.dump(), "p.json").status().message().find("step_us"),
            std::string::npos);
  bad["collective"]["loaded"] = 3;
  EXPECT_NE(MachineProfile::FromJson(bad.dump(), "p.json").status().message().find("loaded"),
            std::string::npos);
  bad = good;
  bad["collective"] = {{"loaded_writes", {{"shards", 64}, {"memory_step_us", 500}}}};
  EXPECT_NE(MachineProfile::FromJson(bad.dump(), "p.json")
                .status()
                .message()
                .find("collective.loaded_writes.nvme_step_us"),
            std::string::npos);
}

// Note [Loaded shard writes]: the Steps' difference per shard, in seconds; none is 0.
TEST(PlanModelTest, LoadedShardWritesAreTheStepsDifferencePerShard) {
  nlohmann::json j = MinimalProfileJson();
  StatusOr<MachineProfile> none = MachineProfile::FromJson(j.dump(), "p.json");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->loaded_shard_write_s, 0.0);
  j["collective"] = {
      {"loaded_writes", {{"shards", 64}, {"memory_step_us", 600}, {"nvme_step_us", 7000}}}};
  StatusOr<MachineProfile> p = MachineProfile::FromJson(j.dump(), "p.json");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_DOUBLE_EQ(p->loaded_shard_write_s, 100e-6);
}

// Note [Loaded rendezvous]: the waits are read in microseconds, sorted by compute, and
// interpolated in log(compute), flat outside the rows measured.
TEST(PlanModelTest, LoadedWaitsInterpolateInLogCompute) {
  nlohmann::json j = MinimalProfileJson();
  j["collective"] = {{"latency_us", 100},
                     {"loaded",
                      {{{"compute_us", 4000}, {"wait_us", 100}, {"step_us", 3000}},
                       {{"compute_us", 1000}, {"wait_us", 700}, {"step_us", 1000}}}}};
  StatusOr<MachineProfile> p = MachineProfile::FromJson(j.dump(), "p.json");
  ASSERT_TRUE(p.ok()) << p.status();
  using Row = MachineProfile::LoadedWaitRow;
  EXPECT_DOUBLE_EQ(p->LoadedWait(0, &Row::wait_s), 700e-6);
  EXPECT_DOUBLE_EQ(p->LoadedWait(1e-3, &Row::wait_s), 700e-6);
  EXPECT_NEAR(p->LoadedWait(2e-3, &Row::wait_s), 400e-6, 1e-12);  // halfway in log
  EXPECT_NEAR(p->LoadedWait(2e-3, &Row::step_s), 2000e-6, 1e-12);
  EXPECT_DOUBLE_EQ(p->LoadedWait(1, &Row::wait_s), 100e-6);
  EXPECT_EQ(MachineProfile().LoadedWait(1e-3, &Row::wait_s), 0.0);
}

// The linear layers' rate depends on d_model and on the tokens of a micro-batch (a 128-token
// micro-batch runs a matmul slower than a 512-token one): interpolated in log of each, flat
// outside the rows measured; a row without "tokens" was measured at 512 (older profiles).
TEST(PlanModelTest, MatmulRateInterpolatesInLogDAndLogTokens) {
  nlohmann::json j = MinimalProfileJson();
  j["matmul"] = {{{"threads", 1}, {"d", 512}, {"tokens", 128}, {"fp32_GFLOPs", 40}},
                 {{"threads", 1}, {"d", 2048}, {"tokens", 128}, {"fp32_GFLOPs", 80}},
                 {{"threads", 1}, {"d", 512}, {"fp32_GFLOPs", 60}},
                 {{"threads", 1}, {"d", 2048}, {"fp32_GFLOPs", 100}}};
  StatusOr<MachineProfile> p = MachineProfile::FromJson(j.dump(), "p.json");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_DOUBLE_EQ(p->MatmulRate(1, false, 2048, 128), 80e9);
  EXPECT_DOUBLE_EQ(p->MatmulRate(1, false, 2048, 512), 100e9);
  EXPECT_NEAR(p->MatmulRate(1, false, 1024, 128), 60e9, 1);   // halfway in log d
  EXPECT_NEAR(p->MatmulRate(1, false, 2048, 256), 90e9, 1);   // halfway in log tokens
  EXPECT_NEAR(p->MatmulRate(1, false, 1024, 256), 70e9, 1);   // both
  EXPECT_DOUBLE_EQ(p->MatmulRate(1, false, 2048, 64), 80e9);  // flat outside
  EXPECT_DOUBLE_EQ(p->MatmulRate(1, false, 2048, 0), 100e9);  // any: the most tokens measured
  // The plan's compute follows the model's tokens: fewer a micro-batch, a lower rate.
  StatusOr<ModelSpec> few = UniformModel(20'000'000, 8, 128);
  StatusOr<ModelSpec> many = UniformModel(20'000'000, 8, 512);
  ASSERT_TRUE(few.ok() && many.ok());
  EngineConfig c;
  c.zero_stage = 3;
  StatusOr<Estimate> few_tokens = EstimatePlacement(*few, c, *p, {});
  StatusOr<Estimate> many_tokens = EstimatePlacement(*many, c, *p, {});
  ASSERT_TRUE(few_tokens.ok() && many_tokens.ok());
  // Four times the tokens at a higher rate (40 against 60 GFLOP/s at this d_model): about
  // 4 * 40 / 60 times the compute, not 4 (the rest of the compute grows with the tokens).
  const double rates = p->MatmulRate(1, false, few->hidden_size, 128) /
                       p->MatmulRate(1, false, many->hidden_size, 512);
  EXPECT_LT(rates, 0.9);
  const double ratio = many_tokens->time.compute / few_tokens->time.compute;
  EXPECT_NEAR(ratio, 4 * rates, 0.2);
}

// Two ranks whose rendezvous wait under load: each gather waits at least the loaded wait
// after the compute it hid behind, and the step waits for the ranks' skew once. One rank
// meets no other rank and is unchanged.
TEST(PlanModelTest, LoadedWaitsLengthenTwoRanksGathers) {
  StatusOr<ModelSpec> m = UniformModel(20'000'000, 8, 512);
  ASSERT_TRUE(m.ok());
  const EngineConfig c = GatherEveryFetch();
  MachineProfile idle = TwoRankProfile();
  MachineProfile loaded = idle;
  loaded.loaded_wait = {{1e-4, 2e-3, 5e-3}, {1.0, 2e-3, 5e-3}};  // 2 ms a gather, 5 ms a step
  for (int world : {1, 2}) {
    SCOPED_TRACE(world);
    StatusOr<Estimate> a = EstimatePlacement(*m, c, idle, {.world_size = world});
    StatusOr<Estimate> b = EstimatePlacement(*m, c, loaded, {.world_size = world});
    ASSERT_TRUE(a.ok() && b.ok());
    if (world == 1) {
      EXPECT_EQ(a->time.step, b->time.step);
      continue;
    }
    const double fetches = m->fetch_order.size();  // forward and backward, every one gathered
    EXPECT_GE(b->time.gather, fetches * 2e-3 * 0.99) << b->time.gather;
    EXPECT_LT(a->time.gather, fetches * 2e-3 * 0.5) << a->time.gather;
    EXPECT_NEAR(b->time.reduce - a->time.reduce, 5e-3, 1e-9);
    EXPECT_EQ(b->time.compute, a->time.compute);
  }
  // With a core to spare per rank the transfers run beside the compute; with none, each
  // gather's transfer follows the ranks' meeting.
  MachineProfile spare = loaded;
  spare.cores = 4;
  StatusOr<Estimate> shared = EstimatePlacement(*m, c, loaded, {.world_size = 2, .threads = 1});
  StatusOr<Estimate> beside = EstimatePlacement(*m, c, spare, {.world_size = 2, .threads = 1});
  ASSERT_TRUE(shared.ok() && beside.ok());
  const double transfers = static_cast<double>(shared->time.bytes_gathered) / idle.allgather_Bps;
  EXPECT_NEAR(shared->time.gather - beside->time.gather, transfers, transfers * 0.01);
}

// Parameters on NVMe, several ranks: each shard written back after the step costs what the
// profile measured two ranks pay, where that is more than the idle requests a batch at a time
// (aio.queue_depth of them); one rank writes alone and is unchanged.
TEST(PlanModelTest, LoadedShardWritesLengthenSeveralRanksWriteBack) {
  StatusOr<ModelSpec> m = UniformModel(20'000'000, 8, 512);
  ASSERT_TRUE(m.ok());
  EngineConfig c;
  c.zero_stage = 3;
  c.offload_param_device = OffloadDevice::kNvme;
  c.offload_optimizer_device = OffloadDevice::kCpu;
  MachineProfile idle = TwoRankProfile();
  MachineProfile loaded = idle;
  loaded.loaded_shard_write_s = 1e-3;
  uint64_t shards = 0;
  for (const ModuleShape& module : m->modules) shards += module.numels.size();
  for (int world : {1, 2}) {
    SCOPED_TRACE(world);
    StatusOr<Estimate> a = EstimatePlacement(*m, c, idle, {.world_size = world});
    StatusOr<Estimate> b = EstimatePlacement(*m, c, loaded, {.world_size = world});
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
    const double idle_requests =
        std::ceil(shards / static_cast<double>(c.aio.queue_depth)) * idle.nvme_write_latency_s;
    EXPECT_NEAR(b->time.nvme - a->time.nvme, world == 1 ? 0.0 : shards * 1e-3 - idle_requests,
                1e-9);
    EXPECT_EQ(b->time.gather, a->time.gather);
  }
}

// Note [Collectives' CPU]: read in microseconds and nanoseconds; with two ranks filling the
// cores, every collective's CPU (a gather a fetch, the reduce-scatter buckets) lengthens the
// compute by exactly its rates; with a core to spare, or one rank, nothing changes.
TEST(PlanModelTest, CollectivesCpuComesOutOfTheComputeWhenEveryCoreComputes) {
  nlohmann::json j = MinimalProfileJson();
  j["collective"] = {{"cpu_us_per_collective", 250}, {"cpu_ns_per_byte", 0.5}};
  StatusOr<MachineProfile> read = MachineProfile::FromJson(j.dump(), "p.json");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_DOUBLE_EQ(read->collective_cpu_s, 250e-6);
  EXPECT_DOUBLE_EQ(read->collective_cpu_s_per_byte, 0.5e-9);

  StatusOr<ModelSpec> m = UniformModel(20'000'000, 8, 512);
  ASSERT_TRUE(m.ok());
  const EngineConfig c = GatherEveryFetch();
  MachineProfile idle = TwoRankProfile();
  MachineProfile busy = idle;
  busy.collective_cpu_s = 1e-3;
  busy.collective_cpu_s_per_byte = 1e-9;
  StatusOr<Estimate> a = EstimatePlacement(*m, c, idle, {.world_size = 2});
  StatusOr<Estimate> b = EstimatePlacement(*m, c, busy, {.world_size = 2});
  ASSERT_TRUE(a.ok() && b.ok());
  double total = 0;
  for (const ModuleShape& module : m->modules) total += module.numels[0];
  const double buckets = std::ceil(total / static_cast<double>(c.reduce_bucket_size));
  const double gathers = m->fetch_order.size();  // one weight a module: one collective a fetch
  const double expected = gathers * 1e-3 + static_cast<double>(b->time.bytes_gathered) * 1e-9 +
                          buckets * 1e-3 + total * 4 * 1e-9;
  EXPECT_NEAR(b->time.compute - a->time.compute, expected, expected * 1e-9);
  EXPECT_GE(b->time.step - a->time.step, expected * 0.99);

  MachineProfile spare = busy;
  spare.cores = 4;
  for (auto [profile, options] : {std::pair{&busy, PlanOptions{.world_size = 1}},
                                  std::pair{&spare, PlanOptions{.world_size = 2, .threads = 1}}}) {
    MachineProfile quiet = *profile;
    quiet.collective_cpu_s = quiet.collective_cpu_s_per_byte = 0;
    StatusOr<Estimate> with = EstimatePlacement(*m, c, *profile, options);
    StatusOr<Estimate> without = EstimatePlacement(*m, c, quiet, options);
    ASSERT_TRUE(with.ok() && without.ok());
    EXPECT_EQ(with->time.compute, without->time.compute) << options.world_size;
  }
}

// Note [Pipelined step]: the optimizer's NVMe pass keeps reads and writes in flight together,
// so with a mixed rate in the profile it takes their bytes at that rate, never less than each
// direction alone needs; without one, the reads then the writes.
TEST(PlanModelTest, TheNvmePassMovesReadsAndWritesTogetherAtTheMixedRate) {
  StatusOr<ModelSpec> m = UniformModel(200'000'000, 8, 512);
  ASSERT_TRUE(m.ok());
  EngineConfig c;
  c.zero_stage = 3;
  c.offload_optimizer_device = OffloadDevice::kNvme;
  c.offload_optimizer_nvme_path = {"/nvme"};
  double total = 0;
  for (const ModuleShape& module : m->modules) total += module.numels[0];
  const double bytes = total * 12;  // read and again written: parameters and two moments
  auto nvme = [&](double mixed_Bps) {
    MachineProfile p = TestProfile();  // reads at 2 GB/s, writes at 1 GB/s
    p.nvme_mixed_Bps = mixed_Bps;
    StatusOr<Estimate> e = EstimatePlacement(*m, c, p, {.clipped = true});
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? e->time.nvme : 0.0;
  };
  const double sequential = nvme(0);
  EXPECT_NEAR(sequential, bytes / 2e9 + bytes / 1e9 - total / 1e8, sequential * 1e-9);
  // Mixed at 1.5 GB/s: both directions' bytes at that rate.
  EXPECT_NEAR(sequential - nvme(1.5e9), bytes / 2e9 + bytes / 1e9 - 2 * bytes / 1.5e9,
              sequential * 1e-9);
  // A mixed rate faster than the writes alone allow: the writes bound the pass.
  EXPECT_NEAR(sequential - nvme(10e9), bytes / 2e9, sequential * 1e-9);
}

TEST(PlanModelTest, WrittenConfigsParseBackToTheirPlacement) {
  const std::string base = R"({"model": {"d_model": 64}, "train_micro_batch_size_per_gpu": 8,
      "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/a"}},
      "fp16": {"enabled": true, "initial_scale_power": 12}, "aio": {"queue_depth": 16}})";
  for (const EngineConfig& c : Placements(EngineConfig(), "/nvme0")) {
    SCOPED_TRACE(PlacementName(c));
    StatusOr<std::string> json = DeepSpeedJson(c, base);
    ASSERT_TRUE(json.ok()) << json.status();
    StatusOr<EngineConfig> back = EngineConfig::FromJson(*json);
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << *json;
    EXPECT_EQ(back->offload_param_device, c.offload_param_device);
    EXPECT_EQ(back->offload_optimizer_device, c.offload_optimizer_device);
    EXPECT_EQ(back->optimizer_nvme_ratio, c.optimizer_nvme_ratio);
    EXPECT_EQ(back->gradients_on_nvme, c.gradients_on_nvme);
    EXPECT_EQ(back->bf16, c.bf16);
    EXPECT_EQ(back->fp16, c.fp16);
    EXPECT_EQ(back->micro_batch_size, 8);  // kept from the base
    EXPECT_EQ(back->aio.queue_depth, 16);  // kept from the base
    EXPECT_EQ(PlacementName(*back), PlacementName(c));
  }
}

// Steps that clip get no optimizer time hidden behind backward (Note [Overlapped step]): the
// NVMe placements' predicted step grows, by no more than the optimizer's pass; the others stay.
TEST(PlanModelTest, ClippedStepsHideNoOptimizerTime) {
  StatusOr<ModelSpec> m = UniformModel(200'000'000, 8, 512);
  ASSERT_TRUE(m.ok());
  PlanOptions clipped;
  clipped.clipped = true;
  int grew = 0;
  for (const EngineConfig& c : Placements(EngineConfig(), "/nvme")) {
    SCOPED_TRACE(PlacementName(c));
    StatusOr<Estimate> free_step = EstimatePlacement(*m, c, TestProfile(), {});
    StatusOr<Estimate> clipped_step = EstimatePlacement(*m, c, TestProfile(), clipped);
    ASSERT_TRUE(free_step.ok() && clipped_step.ok());
    const double longer = clipped_step->time.step - free_step->time.step;
    if (c.offload_optimizer_device == OffloadDevice::kNvme) {
      EXPECT_GT(longer, 0);
      EXPECT_LE(longer, clipped_step->time.optimizer + clipped_step->time.nvme + 1e-9);
      ++grew;
    } else {
      EXPECT_EQ(longer, 0.0);
    }
  }
  EXPECT_GT(grew, 0);
}

// The overlapped step takes the room beside the swap store that the disk has, as the engine
// does (SpeculativeChunks): a disk with room for the state but not for all of the new state
// beside it still fits, steps part of the chunks speculatively, and hides less of the pass.
TEST(PlanModelTest, TheOverlappedStepTakesTheRoomTheDiskHas) {
  StatusOr<ModelSpec> m = UniformModel(200'000'000, 8, 512);
  ASSERT_TRUE(m.ok());
  EngineConfig c;
  c.offload_param_device = OffloadDevice::kNvme;
  c.offload_optimizer_device = OffloadDevice::kNvme;
  c.bf16 = true;
  c.offload_param_nvme_path = c.offload_optimizer_nvme_path = {"/nvme"};
  StatusOr<Estimate> roomy = EstimatePlacement(*m, c, TestProfile(), {});
  ASSERT_TRUE(roomy.ok()) << roomy.status();
  ASSERT_TRUE(roomy->fits) << roomy->why;
  const MemoryEstimate& all = roomy->memory;
  ASSERT_GT(all.optimizer_chunks, 1u);
  EXPECT_EQ(all.speculative_chunks, all.optimizer_chunks);
  c.overlap_optimizer = false;
  StatusOr<Estimate> none = EstimatePlacement(*m, c, TestProfile(), {});
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->memory.speculative_chunks, 0u);
  c.overlap_optimizer = true;
  // Room for the state, a margin of 1 GiB and half of the overlap's room.
  PlanOptions tight;
  tight.nvme_free_bytes = none->memory.nvme + (1ull << 30) + (all.nvme - none->memory.nvme) / 2;
  StatusOr<Estimate> half = EstimatePlacement(*m, c, TestProfile(), tight);
  ASSERT_TRUE(half.ok()) << half.status();
  EXPECT_TRUE(half->fits) << half->why;
  EXPECT_GT(half->memory.speculative_chunks, 0u);
  EXPECT_LT(half->memory.speculative_chunks, all.optimizer_chunks);
  EXPECT_NEAR(static_cast<double>(half->memory.speculative_chunks), all.optimizer_chunks / 2.0,
              1.0);
  EXPECT_LE(half->memory.nvme, tight.nvme_free_bytes);
  EXPECT_GT(half->time.step, roomy->time.step) << "less of the pass hides behind backward";
  EXPECT_LT(half->time.step, none->time.step + 1e-9);
  // Less than the state itself: nothing fits.
  tight.nvme_free_bytes = none->memory.nvme / 2;
  StatusOr<Estimate> full = EstimatePlacement(*m, c, TestProfile(), tight);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_FALSE(full->fits);
  EXPECT_THAT(full->why, ::testing::HasSubstr("NVMe"));
}

// zinf.layer_major: the parameters come from NVMe once a pass of the model, one pass a step
// instead of one per micro-batch; the compute is the same; the trainer holds every
// micro-batch's activations.
TEST(PlanModelTest, LayerMajorReadsTheParametersOnceAStep) {
  StatusOr<ModelSpec> m = GptModel(256, 128, 2048, 20, 16, 1);  // large.json
  ASSERT_TRUE(m.ok());
  EngineConfig base;
  base.gradient_accumulation_steps = 4;
  base.offload_param_device = OffloadDevice::kNvme;
  base.offload_param_nvme_path = {"/nvme"};
  base.offload_optimizer_device = OffloadDevice::kNvme;
  base.offload_optimizer_nvme_path = {"/nvme"};
  base.step_beside_forward = false;
  EngineConfig layer = base;
  layer.layer_major = true;
  StatusOr<Estimate> micro_est = EstimatePlacement(*m, base, TestProfile(), {});
  StatusOr<Estimate> layer_est = EstimatePlacement(*m, layer, TestProfile(), {});
  ASSERT_TRUE(micro_est.ok() && layer_est.ok());
  EXPECT_DOUBLE_EQ(layer_est->time.compute, micro_est->time.compute);
  // The optimizer's pass reads 12 bytes an element either way; the parameters' reads shrink.
  const double optimizer_read = 12.0 * static_cast<double>(m->parameter_count());
  const double micro_params = micro_est->time.nvme_read - optimizer_read;
  const double layer_params = layer_est->time.nvme_read - optimizer_read;
  EXPECT_GT(layer_params, 0);
  EXPECT_NEAR(layer_params / micro_params, 0.25, 0.05);
  EXPECT_EQ(layer_est->memory.activations, 4 * micro_est->memory.activations);
  EXPECT_LT(layer_est->time.step, micro_est->time.step);

  // zinf.step_beside_forward, in steps that clip: the forward takes the parameters from
  // memory, so the one read a step left is backward's (less what the device tier still holds
  // from the forward's last modules), and the pass hides under the forward.
  EngineConfig beside = layer;
  beside.step_beside_forward = true;
  StatusOr<Estimate> clipped = EstimatePlacement(*m, layer, TestProfile(), {.clipped = true});
  StatusOr<Estimate> beside_est = EstimatePlacement(*m, beside, TestProfile(), {.clipped = true});
  ASSERT_TRUE(clipped.ok() && beside_est.ok());
  const double beside_params = beside_est->time.nvme_read - optimizer_read;
  EXPECT_GT(beside_params / layer_params, 0.35);
  EXPECT_LT(beside_params / layer_params, 0.5);
  EXPECT_LT(beside_est->time.step, clipped->time.step);
  EXPECT_DOUBLE_EQ(beside_est->time.compute, clipped->time.compute);
}

TEST(PlanModelTest, AModelTooLargeForTheMachineDoesNotFit) {
  StatusOr<ModelSpec> m = UniformModel(2'000'000'000, 8, 512);
  ASSERT_TRUE(m.ok());
  MachineProfile p = TestProfile();
  p.memory_bytes = 16ull << 30;
  p.nvme_free_bytes = 100ull << 30;
  int fits = 0, all = 0;
  for (const EngineConfig& c : Placements(EngineConfig(), "/nvme")) {
    StatusOr<Estimate> e = EstimatePlacement(*m, c, p, {});
    ASSERT_TRUE(e.ok());
    ++all;
    if (e->fits) {
      ++fits;
      // Only placements with the optimizer state and parameters off memory fit 16 GiB.
      EXPECT_EQ(c.offload_optimizer_device, OffloadDevice::kNvme) << PlacementName(c);
    } else {
      EXPECT_NE(e->why.find("memory"), std::string::npos) << e->why;
    }
  }
  EXPECT_GT(fits, 0);
  EXPECT_LT(fits, all);
  // No NVMe space: nothing on NVMe fits.
  PlanOptions no_disk;
  no_disk.nvme_free_bytes = 1 << 20;
  for (const EngineConfig& c : Placements(EngineConfig(), "/nvme")) {
    StatusOr<Estimate> e = EstimatePlacement(*m, c, p, no_disk);
    ASSERT_TRUE(e.ok());
    EXPECT_FALSE(e->fits) << PlacementName(c);
  }
}

}  // namespace
}  // namespace zinf::plan
