// The bytes the engine gives each tier of its store for a placement: one pure function of the
// config and the model's parameter shapes, called by the engine (Engine::Impl::OpenTiers) and
// by `zinf plan` (tools/plan_memory.cc), so that what the plan predicts is what the engine
// reserves.
//
// Note [Tier budgets]
// The device tier holds the parameter tier when it lives there, the persistent parameters
// (their shard, gathered copy, fp32 widening and gradient), twice the largest module's working
// set (the fetched module with backward's gradients, and the next one being gathered), the
// read-ahead window twice, the two gradient buckets with a bucket's bytes of gradients on their
// way into them (Note [Gradient buckets]; none with one rank on host-addressable memory) and
// 64 MiB of slack; or zinf.device_budget, when the config gives it, if that holds all but the slack
// (CheckDeviceBudget). The host tier holds the flat shard's page-aligned arrays (gradient
// accumulators, fp32 master, in-memory optimizer state, the delayed update's copy), the parameter
// tier when it lives there, the buckets' reduced slices or one rank's buckets (where the device's
// memory is not the host's), the NVMe gradients' staging, the pipelined step's staging buffers and
// host-resident chunks, the persistent parameters' next values and room for the NVMe tier's
// write-backs (which also keeps the shards a step beside the next forward has just written, until
// that forward reads them); the tails small tensors leave in the host tier's arenas are the
// store's to allow for (Note [Arena slack] in offload/memory_pool.h), not this budget's, which a
// cache would fill. The swap store holds every optimizer chunk's fp32 parameters and two states
// (and gradients, with zinf.gradients_on_nvme) and the parameter tier on NVMe, each extent with a
// block of alignment slack; where the parameter tier is the fp32 master (ParamTierIsMaster) the
// chunks hold only the two states. The overlapped step's room beside it depends on the disk's free
// space: SpeculativeChunks, given that free space (OpenTiers asks the disk; the plan its profile).
//
// Thread-safety: pure functions.
#ifndef ZINF_ZERO_TIER_BUDGETS_H_
#define ZINF_ZERO_TIER_BUDGETS_H_

#include <cstdint>
#include <vector>

#include "zinf/engine.h"

namespace zinf {

// A parameter as Partition lays it out on one rank.
struct BudgetParam {
  uint64_t shard_elements = 0;  // this rank's shard: numel / world, rounded up
  bool persistent = false;      // gathered once and kept (stage3_param_persistence_threshold)
  bool trainable = true;        // else no gradient, master or state (Note [Frozen parameters])
};

// What the budgets depend on beyond the config.
struct BudgetModel {
  std::vector<std::vector<BudgetParam>> modules;  // each registered module's parameters
  int world_size = 1;
  int state_count = 2;  // optimizer state arrays per element (AdamW: 2)
  // 16-bit parameters are also handed out widened to fp32 (EngineOptions::fp32_view, which
  // the engine honours on the host device only).
  bool fp32_view = true;
  // The device's memory is the host's (the host device without a modelled link): the
  // buckets' reduced slices land where they are, with no host copy (Note [Gradient buckets]).
  bool device_host_addressable = false;
};

struct TierBudgets {
  uint64_t param_tier_bytes = 0;     // every shard in the compute precision
  uint64_t largest_shard_bytes = 0;  // the largest parameter's shard, compute precision
  uint64_t shard_elements = 0;       // the rank's flat shard: its trainable parameters'
  uint64_t bucket_slice_elements = 0;
  uint64_t device_budget_bytes = 0;
  // The least device tier the engine computes in: device_budget_bytes without the slack.
  uint64_t device_need_bytes = 0;
  uint64_t host_budget_bytes = 0;
  uint64_t piece_bytes = 0;  // the store's unit of NVMe and staging transfers
  // The NVMe optimizer's chunks (zero without the optimizer on NVMe) and the swap store's room
  // for one chunk's fp32 parameters (unless the parameter tier is the master) and two states,
  // slack included; and for one chunk stepped speculatively: its new state beside the old (and
  // its old parameters, where the parameter tier is the master).
  uint64_t optimizer_chunk_elements = 0;
  uint64_t optimizer_chunks = 0;
  uint64_t chunk_swap_bytes = 0;
  uint64_t speculative_chunk_swap_bytes = 0;
  // The pipelined step's staging buffers in the host tier (with their buffers for the old
  // parameters, where the parameter tier is the master).
  uint64_t step_staging_bytes = 0;
  // The host tier's room for the NVMe tier's write-backs and the copies kept after them.
  uint64_t write_back_room_bytes = 0;
  // The swap store's capacity before the overlapped step's room (zero without NVMe).
  uint64_t swap_capacity_bytes = 0;
};

// Elements per chunk of the NVMe optimizer step: the whole shard when it is small, at most
// the default chunk (1M elements), and small enough that the step's staging buffers fit
// `staging_budget_bytes` (zinf.host_budget), down to PipelinedOptimizerOptions'
// kMinChunkElements.
uint64_t OptimizerChunkElements(uint64_t shard_elements, uint64_t staging_budget_bytes);

// Whether the parameter tier holds the fp32 master the NVMe optimizer steps, so that its
// chunks keep only the optimizer state (Note [Parameters kept by the caller] in
// offload/pipelined_optimizer.h): parameters and optimizer both on NVMe, fp32 compute.
bool ParamTierIsMaster(const EngineConfig& config);

// Note [Tier budgets].
TierBudgets ComputeTierBudgets(const EngineConfig& config, const BudgetModel& model);

// ResourceExhausted, naming both and what to change, when zinf.device_budget is below what the
// engine computes in (TierBudgets::device_need_bytes).
Status CheckDeviceBudget(const EngineConfig& config, const TierBudgets& budgets);

// The optimizer chunks the overlapped step may step speculatively (Note [Overlapped step]):
// as many as the new state of fits beside the swap store's capacity in `free_bytes` (this
// rank's share of the NVMe path's free space) less a margin (a twentieth, at least 1 GiB),
// and within `limit_bytes` when > 0 (zinf.overlap_optimizer_swap_bytes). The chunks beyond
// are stepped after backward. The engine reserves that room; the plan counts it.
uint64_t SpeculativeChunks(const TierBudgets& budgets, uint64_t free_bytes, uint64_t limit_bytes);

}  // namespace zinf

#endif  // ZINF_ZERO_TIER_BUDGETS_H_
