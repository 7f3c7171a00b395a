// See src/zero/tier_budgets.h, Note [Tier budgets].
#include "zero/tier_budgets.h"

#include <fmt/core.h>

#include <algorithm>

#include "core/units.h"
#include "offload/pipelined_optimizer.h"
#include "zero/gradient_buckets.h"
#include "zero/nvme_gradients.h"

namespace zinf {
namespace {
uint64_t PageUp(uint64_t bytes) { return (bytes + 4095) / 4096 * 4096; }
}  // namespace

uint64_t OptimizerChunkElements(uint64_t shard_elements, uint64_t staging_budget_bytes) {
  constexpr uint64_t kAlign = PipelinedOptimizerOptions::kChunkAlignElements;
  constexpr uint64_t kMin = PipelinedOptimizerOptions::kMinChunkElements;
  const PipelinedOptimizerOptions defaults;
  // The largest chunk whose num_buffers staging buffers fit the budget (not below the least
  // the step takes), and not above the default chunk.
  uint64_t fit = staging_budget_bytes /
                 (defaults.num_buffers * PipelinedOptimizerOptions::kStagingBytesPerElement);
  fit -= fit % kAlign;
  const uint64_t most = std::clamp<uint64_t>(fit, kMin, defaults.chunk_elements);
  return std::clamp<uint64_t>((shard_elements + kAlign - 1) / kAlign * kAlign, kMin, most);
}

bool ParamTierIsMaster(const EngineConfig& config) {
  return config.offload_param_device == OffloadDevice::kNvme &&
         config.offload_optimizer_device == OffloadDevice::kNvme && !config.bf16 && !config.fp16;
}

namespace {

uint64_t ElementBytes(const EngineConfig& config) { return config.bf16 || config.fp16 ? 2 : 4; }

// What the device tier's room is made of, from the modules' shapes.
struct ModuleBytes {
  uint64_t persistent = 0;       // the persistent parameters' bytes on the device
  uint64_t working_set = 0;      // the largest module's, fetched for backward
  uint64_t persistent_next = 0;  // the persistent parameters' next values (host)
  uint64_t all_elements = 0;     // the rank's shard elements, the frozen parameters' too
  uint64_t largest_shard = 0;    // elements
};

// Walks the modules, filling b's shard figures, and returns what the budgets are made of.
ModuleBytes MeasureModules(const EngineConfig& config, const BudgetModel& model, TierBudgets& b) {
  ModuleBytes m;
  const uint64_t world = static_cast<uint64_t>(std::max(model.world_size, 1));
  const uint64_t element = ElementBytes(config);
  for (const std::vector<BudgetParam>& module : model.modules) {
    uint64_t bytes = 0;
    for (const BudgetParam& p : module) {
      // The shard's copy, the gathered parameter (with one rank, the shard itself), its fp32
      // widening (16-bit parameters, when the fp32 view is handed out) and the gradient, each
      // a block of both tiers' pools, rounded to their page (Note [Runs of blocks]).
      const uint64_t full = p.shard_elements * world;
      const uint64_t shard = PageUp(p.shard_elements * element);
      const uint64_t gathered = world > 1 ? PageUp(full * element) : 0;
      const uint64_t widened = element != 4 && model.fp32_view ? PageUp(full * 4) : 0;
      const uint64_t gradient = p.trainable ? PageUp(full * 4) : 0;
      (p.persistent ? m.persistent : bytes) += shard + gathered + widened + gradient;
      if (p.trainable) b.shard_elements += p.shard_elements;
      m.all_elements += p.shard_elements;
      b.param_tier_bytes += shard;
      m.largest_shard = std::max(m.largest_shard, p.shard_elements);
      // The persistent parameters' next values while the NVMe step writes the tier from its
      // chunks (ParamTier::ChunkWriter).
      if (p.persistent) m.persistent_next += PageUp(p.shard_elements * 4);
    }
    m.working_set = std::max(m.working_set, bytes);
  }
  b.largest_shard_bytes = m.largest_shard * element;
  return m;
}

void ComputeDeviceBudget(const EngineConfig& config, const BudgetModel& model, const ModuleBytes& m,
                         TierBudgets& b) {
  const uint64_t world = static_cast<uint64_t>(std::max(model.world_size, 1));
  const uint64_t element = ElementBytes(config);
  // The two gradient buckets (Note [Gradient buckets]): each grown to the largest parameter,
  // with several ranks its reduced slice beside it, and a bucket's bytes of gradients whose
  // packing is in flight. One rank on host-addressable device memory needs none of these.
  const uint64_t bucket_elements =
      std::min<uint64_t>(config.reduce_bucket_size, b.shard_elements * world);
  b.bucket_slice_elements =
      GradientBuckets::SliceCapacity(bucket_elements, static_cast<int>(world), m.largest_shard);
  const uint64_t bucket_bytes = b.bucket_slice_elements * world * 4;
  const uint64_t in_flight = model.device_host_addressable ? 0 : bucket_bytes;
  const uint64_t buckets =
      world > 1 || !model.device_host_addressable
          ? 2 * bucket_bytes + (world > 1 ? 2 * b.bucket_slice_elements * 4 : 0) + in_flight
          : 0;
  // The fetched module with backward's gradients, the next one being gathered, and the
  // read-ahead window; cached shard copies use what is left and are evicted first. The window
  // is an upper bound, as DeepSpeed reads stage3_prefetch_bucket_size: never more than the
  // model (1e15 asks for the whole model ahead, not for petabytes).
  const uint64_t prefetch_elements =
      std::min<uint64_t>(config.stage3_prefetch_bucket_size, m.all_elements * world);
  const bool params_on_device = config.offload_param_device == OffloadDevice::kNone;
  b.device_need_bytes = (params_on_device ? b.param_tier_bytes : 0) + m.persistent +
                        2 * m.working_set + 2 * prefetch_elements * element + buckets;
  b.device_budget_bytes = config.device_budget_bytes > 0 ? config.device_budget_bytes
                                                         : b.device_need_bytes + (64 << 20);
}

// `chunk`: the NVMe optimizer's chunk, in elements (OptimizerChunkElements).
void ComputeHostBudget(const EngineConfig& config, const BudgetModel& model, const ModuleBytes& m,
                       uint64_t chunk, TierBudgets& b) {
  const bool optimizer_on_nvme = config.offload_optimizer_device == OffloadDevice::kNvme;
  const bool host_master =
      !(config.offload_param_device == OffloadDevice::kNvme && optimizer_on_nvme);
  // The flat shard's arrays (StoreArray), page-aligned.
  const uint64_t array = PageUp(std::max<uint64_t>(b.shard_elements, 1) * 4);
  const uint64_t arrays =
      array * ((config.gradients_on_nvme ? 0 : 1) + (host_master ? 1 : 0) +
               (optimizer_on_nvme ? 0 : model.state_count) + (config.delayed_param_update ? 1 : 0));
  // The buckets' reduced slices, where the device's memory is not the host's.
  const uint64_t landed = model.device_host_addressable ? 0 : 2 * b.bucket_slice_elements * 4;
  // The pipelined step's staging buffers and the chunks it keeps in host memory (all of them
  // at most, with offload_optimizer.ratio < 1).
  uint64_t step_buffers = 0;
  if (optimizer_on_nvme) {
    const PipelinedOptimizerOptions step;
    b.step_staging_bytes =
        step.num_buffers * chunk *
        (PipelinedOptimizerOptions::kStagingBytesPerElement +
         (ParamTierIsMaster(config) ? PipelinedOptimizerOptions::kOldParamBytesPerElement : 0));
    step_buffers = b.step_staging_bytes;
    if (config.optimizer_nvme_ratio < 1) {
      const uint64_t chunks = (b.shard_elements + chunk - 1) / chunk;
      step_buffers += chunks * PipelinedOptimizer::ChunkBytes(chunk, model.state_count);
    }
  }
  // The staging of the gradients on NVMe (Note [Gradients on NVMe]).
  const uint64_t gradient_staging =
      config.gradients_on_nvme ? NvmeGradients::StagingBudget(chunk) : 0;
  // Where the parameter tier is the master, the step also holds the parameters it updates in
  // place and those it prefetches for the next chunks: twice the room, in whole shards.
  b.write_back_room_bytes = std::max<uint64_t>(256 << 20, 4 * b.largest_shard_bytes) *
                            (ParamTierIsMaster(config) ? 2 : 1);
  const bool params_on_host = config.offload_param_device == OffloadDevice::kCpu;
  b.host_budget_bytes = arrays + (params_on_host ? b.param_tier_bytes : 0) + landed +
                        gradient_staging + step_buffers + m.persistent_next +
                        b.write_back_room_bytes;
}

void ComputeSwapCapacity(const EngineConfig& config, const BudgetModel& model, uint64_t chunk,
                         TierBudgets& b) {
  const bool params_on_nvme = config.offload_param_device == OffloadDevice::kNvme;
  const bool optimizer_on_nvme = config.offload_optimizer_device == OffloadDevice::kNvme;
  if (!params_on_nvme && !optimizer_on_nvme) return;
  // Each extent is rounded up to the allocator's alignment: allow a block per extent.
  const uint64_t slack = config.aio.block_size;
  if (optimizer_on_nvme) {
    b.optimizer_chunk_elements = chunk;
    b.optimizer_chunks = (b.shard_elements + chunk - 1) / chunk;
    const bool master = ParamTierIsMaster(config);
    b.chunk_swap_bytes = chunk * (master ? 8 : 12) + slack;  // [fp32 params,] two states
    b.speculative_chunk_swap_bytes = b.chunk_swap_bytes + (master ? chunk * 4 + slack : 0);
    b.swap_capacity_bytes += b.optimizer_chunks * b.chunk_swap_bytes;
    if (config.gradients_on_nvme) {
      b.swap_capacity_bytes += b.optimizer_chunks * (chunk * 4 + slack);
    }
  }
  if (params_on_nvme) {
    for (const std::vector<BudgetParam>& module : model.modules) {
      for (const BudgetParam& p : module) {
        const uint64_t bytes = p.shard_elements * ElementBytes(config);
        const uint64_t pieces = (bytes + b.piece_bytes - 1) / b.piece_bytes;
        b.swap_capacity_bytes += bytes + pieces * slack;
      }
    }
  }
}

}  // namespace

TierBudgets ComputeTierBudgets(const EngineConfig& config, const BudgetModel& model) {
  TierBudgets b;
  const ModuleBytes m = MeasureModules(config, model, b);
  ComputeDeviceBudget(config, model, m, b);
  const uint64_t chunk = OptimizerChunkElements(b.shard_elements, config.nvme_staging_budget_bytes);
  ComputeHostBudget(config, model, m, chunk, b);
  b.piece_bytes = std::clamp<uint64_t>(PageUp(b.largest_shard_bytes), 1 << 20, 64 << 20);
  ComputeSwapCapacity(config, model, chunk, b);
  return b;
}

Status CheckDeviceBudget(const EngineConfig& config, const TierBudgets& budgets) {
  if (config.device_budget_bytes == 0 || config.device_budget_bytes >= budgets.device_need_bytes) {
    return OkStatus();
  }
  return ResourceExhausted(fmt::format(
      "zinf.device_budget {} is below the {} the engine computes in on the device: twice the "
      "largest module's working set (its parameters gathered, with their gradients), the "
      "read-ahead window twice (stage3_prefetch_bucket_size), the gradient buckets "
      "(reduce_bucket_size), the persistent parameters (stage3_param_persistence_threshold){}; "
      "lower those, or raise zinf.device_budget",
      FormatBytes(config.device_budget_bytes), FormatBytes(budgets.device_need_bytes),
      config.offload_param_device == OffloadDevice::kNone
          ? " and every parameter's shard (offload_param puts them elsewhere)"
          : ""));
}

uint64_t SpeculativeChunks(const TierBudgets& budgets, uint64_t free_bytes, uint64_t limit_bytes) {
  if (budgets.speculative_chunk_swap_bytes == 0) return 0;
  const uint64_t margin = std::max<uint64_t>(free_bytes / 20, 1ull << 30);
  uint64_t room = free_bytes > budgets.swap_capacity_bytes + margin
                      ? free_bytes - budgets.swap_capacity_bytes - margin
                      : 0;
  if (limit_bytes > 0) room = std::min(room, limit_bytes);
  return std::min<uint64_t>(budgets.optimizer_chunks, room / budgets.speculative_chunk_swap_bytes);
}

}  // namespace zinf
