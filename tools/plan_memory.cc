// The plan's bytes per tier: the layout, the device tier's cache simulation and
// EstimateMemory (Note [Plan memory] in tools/plan_model.h).
#include <algorithm>
#include <cmath>
#include <map>

#include "core/units.h"
#include "offload/pipelined_optimizer.h"
#include "tools/plan_internal.h"
#include "tools/plan_model.h"

namespace zinf::plan {
namespace internal {

Layout LayOut(const ModelSpec& model, const EngineConfig& c, int world, bool fp32_view) {
  Layout l;
  l.fp32_view = fp32_view;
  for (const ModuleShape& m : model.modules) {
    std::vector<Laid> params;
    for (uint64_t n : m.numels) {
      Laid p{n, (n + world - 1) / world,
             c.zero_stage < 3 || n < c.stage3_param_persistence_threshold};
      l.shard_elements += p.shard;
      l.total += n;
      params.push_back(p);
    }
    l.modules.push_back(std::move(params));
  }
  return l;
}

TierBudgets Budgets(const Layout& l, const EngineConfig& c, int world) {
  // (A layout with the fp32 view is one for the host device, whose memory is the host's.)
  BudgetModel shapes{.world_size = world,
                     .state_count = c.optimizer.state_count(),
                     .fp32_view = l.fp32_view,
                     .device_host_addressable = l.fp32_view};
  for (const std::vector<Laid>& params : l.modules) {
    std::vector<BudgetParam>& shape = shapes.modules.emplace_back();
    for (const Laid& p : params) shape.push_back({p.shard, p.persistent});
  }
  return ComputeTierBudgets(c, shapes);
}

uint64_t LiveBeyondShards(const std::vector<Laid>& params, uint64_t element, int world,
                          bool fp32_view) {
  uint64_t bytes = 0;
  for (const Laid& p : params) {
    if (p.persistent) continue;
    const uint64_t full = p.shard * world;
    if (world > 1) bytes += full * element;
    if (element != 4 && fp32_view) bytes += full * 4;
    bytes += full * 4;  // gradient buffer
  }
  return bytes;
}

uint64_t ShardBytes(const std::vector<Laid>& params, uint64_t element) {
  uint64_t bytes = 0;
  for (const Laid& p : params) {
    if (!p.persistent) bytes += p.shard * element;
  }
  return bytes;
}

uint64_t CountNonPersistent(const std::vector<Laid>& params) {
  return std::count_if(params.begin(), params.end(), [](const Laid& p) { return !p.persistent; });
}

CacheSim SimulateCache(const ModelSpec& model, const EngineConfig& c, int world, const Layout& l,
                       uint64_t device_budget) {
  CacheSim sim;
  const uint64_t e = ElementBytes(c);
  // One pass of the model's fetches per micro-batch; layer-major, one pass a step.
  for (int k = 0; k < c.ReductionsPerStep(); ++k) {
    sim.order.insert(sim.order.end(), model.fetch_order.begin(), model.fetch_order.end());
  }
  const size_t n = sim.order.size();
  sim.miss.assign(n, 0);
  // The room: the budget less the persistent parameters' copies and the largest module's
  // gathered, widened and gradient buffers.
  uint64_t persistent_live = 0, largest_live = 0;
  std::vector<uint64_t> shard_bytes(l.modules.size(), 0);
  for (size_t i = 0; i < l.modules.size(); ++i) {
    for (const Laid& p : l.modules[i]) {
      const uint64_t full = p.shard * world;
      if (p.persistent) {
        persistent_live +=
            full * e + (world > 1 ? p.shard * e : 0) + (e != 4 && l.fp32_view ? full * 4 : 0);
      } else {
        shard_bytes[i] += PageUp(p.shard * e);
      }
    }
    largest_live = std::max(largest_live, LiveBeyondShards(l.modules[i], e, world, l.fp32_view));
  }
  const int64_t room =
      std::max<int64_t>(0, static_cast<int64_t>(device_budget) -
                               static_cast<int64_t>(persistent_live + largest_live));
  auto live_at = [&](size_t i) {
    uint64_t live =
        persistent_live + LiveBeyondShards(l.modules[sim.order[i]], e, world, l.fp32_view);
    if (world > 1 && i + 1 < n) live += ShardBytes(l.modules[sim.order[i + 1]], e) * world;
    return live;
  };
  if (c.offload_param_device == OffloadDevice::kNone) {
    for (size_t i = 0; i < n; ++i) sim.peak = std::max(sim.peak, live_at(i));
    return sim;
  }
  std::vector<size_t> next(n, n);
  std::map<int, size_t> seen;
  for (size_t i = n; i-- > 0;) {
    auto it = seen.find(sim.order[i]);
    next[i] = it == seen.end() ? n : it->second;
    seen[sim.order[i]] = i;
  }
  std::map<int, size_t> cached;  // module -> its next use
  uint64_t used = 0;
  for (size_t i = 0; i < n; ++i) {
    const int mod = sim.order[i];
    if (shard_bytes[mod] == 0) continue;
    if (cached.count(mod) == 0) {
      sim.miss[i] = shard_bytes[mod];
      used += shard_bytes[mod];
    }
    cached[mod] = next[i];
    sim.peak = std::max(sim.peak, used + live_at(i));
    while (static_cast<int64_t>(used) > room && cached.size() > 1) {
      auto victim = cached.end();
      for (auto it = cached.begin(); it != cached.end(); ++it) {
        if (it->first == mod) continue;
        if (victim == cached.end() || it->second > victim->second) victim = it;
      }
      used -= shard_bytes[victim->first];
      cached.erase(victim);
    }
  }
  sim.cached_at_end = used;
  // EndBatch reads the next batch's first modules ahead (ParamTier::ReadAhead): at least one
  // module, then up to stage3_prefetch_bucket_size elements, those not cached already.
  uint64_t ahead = 0;
  for (size_t k = 0; k < model.fetch_order.size(); ++k) {
    const int mod = model.fetch_order[k];
    if (k > 0 && ahead >= c.stage3_prefetch_bucket_size) break;
    for (const Laid& p : l.modules[mod]) {
      if (!p.persistent) ahead += p.numel;
    }
    if (cached.count(mod) == 0 && shard_bytes[mod] > 0 &&
        static_cast<int64_t>(used + shard_bytes[mod]) <=
            std::max<int64_t>(room, shard_bytes[mod])) {
      cached[mod] = n;
      used += shard_bytes[mod];
    }
  }
  sim.cached_at_end = used;
  return sim;
}

}  // namespace internal

using namespace internal;

MemoryEstimate EstimateMemory(const ModelSpec& model, const EngineConfig& c, int world,
                              bool fp32_view, uint64_t nvme_free_per_rank) {
  MemoryEstimate m;
  const Layout l = LayOut(model, c, world, fp32_view);
  // The budgets the engine gives its store (Note [Tier budgets]).
  const TierBudgets budgets = Budgets(l, c, world);
  const bool params_nvme = c.offload_param_device == OffloadDevice::kNvme;
  const bool optim_nvme = c.offload_optimizer_device == OffloadDevice::kNvme;
  const bool host_master = !(params_nvme && optim_nvme);
  const int states = c.optimizer.state_count();
  const uint64_t S = l.shard_elements;
  // Engine::Initialize: gradient accumulators, master, in-memory state, page-rounded by the
  // host tier's 4 KiB blocks.
  const uint64_t array = PageUp(std::max<uint64_t>(S, 1) * 4);
  const bool grads_nvme = optim_nvme && c.gradients_on_nvme;
  m.host_arrays = array * ((grads_nvme ? 0 : 1) + (host_master ? 1 : 0) +
                           (optim_nvme ? 0 : states) + (c.delayed_param_update ? 1 : 0));
  // The parameter tier as the store holds it: each shard in blocks of 4 KiB.
  uint64_t tier = 0;
  for (const auto& params : l.modules) {
    for (const Laid& p : params) tier += PageUp(p.shard * ElementBytes(c));
  }
  if (!params_nvme) m.param_tier = tier;
  if (optim_nvme) {
    const uint64_t chunk = OptimizerChunkElements(S, c.nvme_staging_budget_bytes);
    m.nvme_staging = budgets.step_staging_bytes;
    const uint64_t chunks = (S + chunk - 1) / chunk;
    // Host-resident chunks (fp32 params, the states and room for gradients), blocks of the
    // store's host tier.
    for (uint64_t i = 0; i < chunks; ++i) {
      const bool on_nvme =
          std::floor((i + 1) * c.optimizer_nvme_ratio) > std::floor(i * c.optimizer_nvme_ratio);
      if (!on_nvme) {
        m.host_state_pool += PipelinedOptimizer::ChunkBytes(std::min(chunk, S - i * chunk), states);
      }
    }
  }
  // The swap store reserves every chunk whatever the ratio, and for the overlapped step the
  // room beside them that the disk has (its new state beside the old, and the old parameters
  // where the parameter tier is the master, until the step stands).
  m.nvme = budgets.swap_capacity_bytes;
  m.optimizer_chunks = budgets.optimizer_chunks;
  if (optim_nvme && c.overlap_optimizer) {
    m.speculative_chunks =
        nvme_free_per_rank == 0
            ? budgets.optimizer_chunks
            : SpeculativeChunks(budgets, nvme_free_per_rank, c.overlap_optimizer_swap_bytes);
    m.nvme += m.speculative_chunks * budgets.speculative_chunk_swap_bytes;
  }
  if (m.nvme > 0) {
    // SwapStore: one file per path, each rounded up to the stripe (aio.block_size).
    const uint64_t paths = std::max<size_t>(1, c.NvmePaths().size());
    m.nvme = AlignUp((m.nvme + paths - 1) / paths, c.aio.block_size) * paths;
  }
  // Peak: the budgets OpenTiers gives the store. The two reduce-scatter buckets live in the
  // device tier (Note [Gradient buckets]).
  const uint64_t bucket_slice = budgets.bucket_slice_elements;
  const uint64_t buckets = world > 1 ? 2 * bucket_slice * (world + 1) * 4 : 0;
  if (world > 1) {  // GradientBuckets::Reserve: the send buffer and the reduced slice
    const uint64_t one = PageUp(bucket_slice * world * 4) + PageUp(bucket_slice * 4);
    m.buckets = (S * world <= c.reduce_bucket_size ? 1 : 2) * one;
  }
  m.device_budget = budgets.device_budget_bytes;
  m.host_budget = budgets.host_budget_bytes;
  if (!model.fetch_order.empty()) {
    // The buckets stay in the device tier once allocated: the cache has the rest.
    const CacheSim sim = SimulateCache(model, c, world, l, m.device_budget - buckets);
    m.device_cache = sim.cached_at_end;
    m.peak_device =
        std::min(m.device_budget,
                 sim.peak + (c.offload_param_device == OffloadDevice::kNone ? tier : 0) + buckets);
  }
  // Layer-major, the trainer holds every micro-batch of the step at once.
  m.activations = model.activation_bytes * (c.layer_major ? c.gradient_accumulation_steps : 1);
  // In host memory at the peak: the host arrays, the parameter tier where it lives there, the
  // NVMe optimizer's pools, with parameters on NVMe the host copies the step writes back
  // (within the host tier's room) and the store's staging buffers for NVMe.
  const uint64_t write_backs =
      params_nvme ? std::min<uint64_t>(tier, budgets.write_back_room_bytes) : 0;
  const uint64_t store_staging = params_nvme || optim_nvme ? 4 * budgets.piece_bytes : 0;
  m.peak_host = m.host_arrays + (c.offload_param_device == OffloadDevice::kCpu ? tier : 0) +
                m.nvme_staging + m.host_state_pool + write_backs + store_staging;
  return m;
}

}  // namespace zinf::plan
