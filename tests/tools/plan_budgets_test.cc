// The engine and `zinf plan` give the store's tiers the same budgets: both call
// ComputeTierBudgets (Note [Tier budgets] in src/zero/tier_budgets.h).
//
// Before that function, the arithmetic was written twice and the plan's copy had drifted from
// the engine's: it widened 16-bit parameters to fp32 whatever EngineOptions::fp32_view, counted
// the parameter tier page by page in the device budget where the engine counts its bytes, left
// out of the host budget the reduce buckets' landed slices, the pipelined step's staging
// buffers and host-resident chunks (8 x chunk x 18 bytes: 144 MiB at the default chunk), the
// NVMe gradients' staging and the persistent parameters' next values, and sized the swap
// store's optimizer chunks after fitting them to zinf.host_budget where the engine does not.
// These tests hold the engine's reported budgets (StepSummary) to the plan's, exactly.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "offload/pipelined_optimizer.h"
#include "tests/testing/temp_dir.h"
#include "tests/tools/plan_training.h"
#include "tools/plan_model.h"
#include "zero/tier_budgets.h"

namespace zinf::plan {
namespace {

class PlanBudgetsTest : public ::testing::Test {
 protected:
  testing::TempDir tmp_{"zinf-plan-budgets"};
  const std::string dir_ = tmp_.path();
};

// Every placement of the plan (fp32, bf16; parameters and optimizer in memory, in host memory,
// on NVMe; part of the optimizer on NVMe; gradients on NVMe) for a model with persistent
// parameters and for one of equal modules: the engine's three budgets are the plan's.
TEST_F(PlanBudgetsTest, TheEnginesBudgetsAreThePlans) {
  for (int kind = 0; kind < 2; ++kind) {
    StatusOr<ModelSpec> model = kind == 0 ? MlpModel(3, 512, 4) : UniformModel(3'000'000, 6, 16);
    ASSERT_TRUE(model.ok()) << model.status();
    EngineConfig base;
    base.stage3_param_persistence_threshold = 1000;  // the MLP's biases persist
    base.stage3_prefetch_bucket_size = 500'000;
    base.nvme_checksum = false;
    std::vector<EngineConfig> configs = Placements(base, dir_);
    // zinf.host_budget below the default staging shrinks the NVMe optimizer's chunks.
    for (EngineConfig c : Placements(base, dir_)) {
      if (c.offload_optimizer_device != OffloadDevice::kNvme || c.fp16) continue;
      c.nvme_staging_budget_bytes = 24 << 20;
      configs.push_back(c);
    }
    for (const EngineConfig& c : configs) {
      if (c.fp16) continue;  // the same bytes as bf16
      SCOPED_TRACE(model->description + ": " + PlacementName(c));
      StatusOr<StepSummary> engine = Train(*model, c, 1);
      ASSERT_TRUE(engine.ok()) << engine.status();
      // The overlapped step's room is what the disk has, for both (SpeculativeChunks).
      const MemoryEstimate plan =
          EstimateMemory(*model, c, 1, /*fp32_view=*/true, std::filesystem::space(dir_).available);
      EXPECT_EQ(engine->device_budget_bytes, plan.device_budget);
      EXPECT_EQ(engine->host_budget_bytes, plan.host_budget);
      EXPECT_EQ(engine->nvme_capacity_bytes, plan.nvme);
    }
  }
}

// The budgets follow the config: a 16-bit placement without the fp32 view needs no widened
// copies, and the host budget of an NVMe optimizer holds its staging buffers.
TEST(TierBudgetsTest, BudgetsFollowThePlacement) {
  BudgetModel shapes{.world_size = 1, .state_count = 2, .fp32_view = true};
  shapes.modules = {{{1 << 20, false}, {1024, true}}, {{1 << 20, false}}};
  EngineConfig c;
  c.bf16 = true;
  const TierBudgets viewed = ComputeTierBudgets(c, shapes);
  shapes.fp32_view = false;
  const TierBudgets plain = ComputeTierBudgets(c, shapes);
  // The largest module's widened copy, twice (the fetched module and the next), and the
  // persistent parameter's.
  EXPECT_EQ(viewed.device_budget_bytes - plain.device_budget_bytes,
            2 * (uint64_t{1} << 20) * 4 + 1024 * 4);
  EngineConfig nvme = c;
  nvme.offload_optimizer_device = OffloadDevice::kNvme;
  nvme.offload_optimizer_nvme_path = {"/tmp"};
  const TierBudgets on_nvme = ComputeTierBudgets(nvme, shapes);
  const uint64_t array = (2 * (uint64_t{1} << 20) + 1024) * 4;
  const uint64_t rounded = (array + 4095) / 4096 * 4096;
  // Two fewer state arrays in memory, and the staging buffers of 8 chunks.
  EXPECT_EQ(on_nvme.host_budget_bytes + 2 * rounded,
            plain.host_budget_bytes + 8 * on_nvme.optimizer_chunk_elements * 18);
  EXPECT_EQ(on_nvme.optimizer_chunks, 3u);  // 2M + 1024 elements in chunks of 1M
  EXPECT_EQ(on_nvme.swap_capacity_bytes, 3 * on_nvme.chunk_swap_bytes);
}

// zinf.host_budget bounds the NVMe step's staging: below the default chunk's 144 MiB of
// buffers the chunks shrink to fit, down to the step's least; above it nothing changes.
TEST(TierBudgetsTest, HostBudgetBoundsTheStagingBuffers) {
  BudgetModel shapes{.world_size = 1, .state_count = 2, .fp32_view = true};
  shapes.modules = {{{4 << 20, false}}};
  EngineConfig c;
  c.offload_optimizer_device = OffloadDevice::kNvme;
  c.offload_optimizer_nvme_path = {"/tmp"};
  const TierBudgets standard = ComputeTierBudgets(c, shapes);
  EXPECT_EQ(standard.optimizer_chunk_elements, uint64_t{1} << 20);
  c.nvme_staging_budget_bytes = 24 << 20;
  const TierBudgets small = ComputeTierBudgets(c, shapes);
  // 24 MiB / (8 buffers x 18 bytes) = 174762 elements, down to a multiple of 2048.
  EXPECT_EQ(small.optimizer_chunk_elements, 174080u);
  EXPECT_LE(8 * small.optimizer_chunk_elements * 18, uint64_t{24} << 20);
  EXPECT_EQ(standard.host_budget_bytes - small.host_budget_bytes,
            8 * (standard.optimizer_chunk_elements - small.optimizer_chunk_elements) * 18);
  c.nvme_staging_budget_bytes = 1 << 20;  // below 8 chunks of the least: the least
  EXPECT_EQ(ComputeTierBudgets(c, shapes).optimizer_chunk_elements,
            PipelinedOptimizerOptions::kMinChunkElements);
  c.nvme_staging_budget_bytes = uint64_t{4} << 30;  // above the default: the default
  EXPECT_EQ(ComputeTierBudgets(c, shapes).optimizer_chunk_elements, uint64_t{1} << 20);
}

// zinf.device_budget replaces the computed device budget when it holds what the engine computes
// in (the slack may go), and is refused below that, naming both and what to lower.
TEST(TierBudgetsTest, DeviceBudgetCapsTheDeviceTierOrIsRefused) {
  BudgetModel shapes{.world_size = 1, .state_count = 2, .fp32_view = true};
  shapes.modules = {{{1 << 20, false}}, {{1 << 20, false}}, {{1 << 20, false}}};
  EngineConfig c;
  c.offload_param_device = OffloadDevice::kCpu;
  c.stage3_prefetch_bucket_size = 1 << 20;
  c.reduce_bucket_size = 1 << 20;
  const TierBudgets computed = ComputeTierBudgets(c, shapes);
  // Twice a module's shard and gradient (fp32, one rank), the read-ahead window twice, and on
  // a device the host cannot address the two gradient buckets with a bucket of gradients on
  // their way into them.
  EXPECT_EQ(computed.device_need_bytes, 2 * (8u << 20) + 2 * (4u << 20) + 3 * (4u << 20));
  EXPECT_EQ(computed.device_budget_bytes, computed.device_need_bytes + (64u << 20));
  EXPECT_TRUE(CheckDeviceBudget(c, computed).ok());

  c.device_budget_bytes = computed.device_need_bytes;  // no slack: taken
  const TierBudgets capped = ComputeTierBudgets(c, shapes);
  EXPECT_EQ(capped.device_budget_bytes, computed.device_need_bytes);
  EXPECT_TRUE(CheckDeviceBudget(c, capped).ok());

  c.device_budget_bytes = computed.device_need_bytes - 1;
  const Status refused = CheckDeviceBudget(c, ComputeTierBudgets(c, shapes));
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("zinf.device_budget"), std::string::npos) << refused;
  EXPECT_NE(refused.message().find("stage3_prefetch_bucket_size"), std::string::npos) << refused;
}

}  // namespace
}  // namespace zinf::plan
