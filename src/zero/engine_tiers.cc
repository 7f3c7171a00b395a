// The engine's placement on the tiered store: Engine::Impl's store, its budgets and what it
// holds (Note [Parameter tier] in param_tier.h), the host-memory check, and the per-step
// memory and NVMe figures.
#include <fmt/core.h>

#include <algorithm>
#include <cstring>

#include "core/log.h"
#include "core/units.h"
#include "nvme/path_probe.h"
#include "zero/engine_impl.h"
#include "zero/tier_budgets.h"
#include "zinf/cpu_info.h"

namespace zinf {
namespace {
constexpr double kGiBf = double(uint64_t{1} << 30);
}  // namespace

Status Engine::Impl::CheckHostMemory() const {
  const uint64_t total = GetCpuInfo().total_memory_bytes;
  if (total == 0) return OkStatus();  // unknown: let the allocations tell
  const uint64_t shard = shard_elements * 4;
  const bool optimizer_on_nvme = config.offload_optimizer_device == OffloadDevice::kNvme;
  const uint64_t states = optimizer_on_nvme ? 0 : shard * optimizer_step->state_count();
  const uint64_t master = host_master ? shard : 0;
  uint64_t persistent = 0;
  for (const Param& p : params) {
    if (p.persistent) persistent += p.numel * 4;
  }
  const uint64_t buckets = world() > 1 ? 2 * BucketElements() * 4 : 0;
  // The parameter tier, where the host device's memory or pinned memory holds it.
  const uint64_t tier = params_on_nvme ? 0 : FlatEnd(params) * param_bytes();
  const uint64_t accumulators = config.gradients_on_nvme ? 0 : shard;
  const uint64_t need = accumulators + master + states + persistent + buckets + tier;
  if (need <= total) return OkStatus();
  return ResourceExhausted(fmt::format(
      "{} parameter elements ({} per rank) need {:.1f} GiB of host memory on this rank, and "
      "this machine has {:.1f} GiB: gradient accumulators {:.1f}, fp32 master {:.1f}, "
      "optimizer state {:.1f}, persistent parameters {:.1f}, reduce buckets {:.1f}, "
      "parameter tier {:.1f} GiB. Offload the optimizer and parameters to NVMe, shard over "
      "more ranks, or shrink the model",
      registered_elements, shard_elements, need / kGiBf, total / kGiBf, accumulators / kGiBf,
      master / kGiBf, states / kGiBf, persistent / kGiBf, buckets / kGiBf, tier / kGiBf));
}

namespace {

// Free bytes on the filesystems of `paths` for a store striped evenly over them: the
// smallest, once per path (0 when one cannot be read).
uint64_t StripedFreeBytes(const std::vector<std::string>& paths) {
  uint64_t least = UINT64_MAX;
  for (const std::string& path : paths) {
    StatusOr<uint64_t> free = FreeBytes(path);
    if (!free.ok()) return 0;
    least = std::min(least, *free);
  }
  return paths.empty() ? 0 : least * paths.size();
}

}  // namespace

Status Engine::Impl::OpenTiers(const std::string& device, uint64_t* speculative_chunks) {
  // The budgets are the plan's too (Note [Tier budgets] in zero/tier_budgets.h).
  BudgetModel shapes{
      .world_size = world(), .state_count = optimizer_step->state_count(), .fp32_view = fp32_view};
  for (const Module& module : modules) {
    std::vector<BudgetParam>& shape = shapes.modules.emplace_back();
    for (int pi : module.params) {
      const Param& p = params[pi];
      shape.push_back({p.shard_size, p.persistent, p.trainable()});
    }
  }
  TierBudgets budgets = ComputeTierBudgets(config, shapes);
  // The device's own budget is the same either way; the host tier's depends on whether the
  // device's memory is the host's, which only the device knows.
  ZINF_ASSIGN_OR_RETURN(compute, CreateDevice(device, budgets.device_budget_bytes));
  shapes.device_host_addressable = compute->host_addressable();
  budgets = ComputeTierBudgets(config, shapes);
  ZINF_RETURN_IF_ERROR(CheckDeviceBudget(config, budgets));
  const Tier home = params_on_nvme                                       ? Tier::kNvme
                    : config.offload_param_device == OffloadDevice::kCpu ? Tier::kHost
                                                                         : Tier::kDevice;
  TieredStoreOptions options;
  options.device = device;
  options.device_budget_bytes = budgets.device_budget_bytes;
  options.host_budget_bytes = budgets.host_budget_bytes;
  // A GPU copies at full speed only from page-locked memory; the host device copies with
  // memcpy, where pinning buys nothing.
  options.pin_host = device != "host" && config.pin_memory;
  options.piece_bytes = budgets.piece_bytes;
  options.staging_buffers = 4;
  options.transfer_threads = 4;
  if (params_on_nvme || config.offload_optimizer_device == OffloadDevice::kNvme) {
    options.nvme_paths = config.NvmePaths();
    options.nvme_rank = global_rank;  // groups of other processes may share the nvme_path
    options.nvme_checksum = config.nvme_checksum;
    options.nvme_aio = config.aio;
    options.nvme_capacity_bytes = budgets.swap_capacity_bytes;
    const uint64_t chunks = budgets.optimizer_chunks;
    const uint64_t chunk_state = budgets.speculative_chunk_swap_bytes;
    *speculative_chunks = 0;
    if (config.offload_optimizer_device == OffloadDevice::kNvme && config.overlap_optimizer) {
      // The overlapped step's new state goes beside the old until the step is known to stand
      // (Note [Overlapped step]): room for all of it where the disk has it, else for as many
      // chunks as fit beside everything else; the chunks beyond are stepped after backward.
      *speculative_chunks =
          SpeculativeChunks(budgets, StripedFreeBytes(options.nvme_paths) / std::max(world(), 1),
                            config.overlap_optimizer_swap_bytes);
      options.nvme_capacity_bytes += *speculative_chunks * chunk_state;
      if (*speculative_chunks < chunks) {
        log::Info(
            "rank {}: zinf.overlap_optimizer: the NVMe path has room for the new state of {} of "
            "the optimizer's {} chunks beside the old; the rest of each step runs after "
            "backward ({} more would let all of it overlap)",
            rank(), *speculative_chunks, chunks,
            FormatBytes((chunks - *speculative_chunks) * chunk_state));
      }
    }
  }
  ZINF_ASSIGN_OR_RETURN(store, TieredStore::Create(options, compute.get()));
  host_addressable = compute->host_addressable();
  param_tier = std::make_unique<ParamTier>(
      store.get(), DeviceComm(), &params, &modules,
      ParamTierOptions{.param_type = param_type,
                       .shard_home = home,
                       .device_host_addressable = host_addressable,
                       .fp32_view = fp32_view,
                       .prefetch_bucket_elements = config.stage3_prefetch_bucket_size,
                       .max_live_elements = config.stage3_max_live_parameters});
  grads.assign(params.size(), GradBuffer());
  return param_tier->Create(compute.get());
}

void Engine::Impl::MeasureTiers(StepSummary* summary) {
  const TieredStoreStats stats = store->stats();
  // The host device's memory is host memory too.
  uint64_t host =
      stats.tiers[int(Tier::kHost)].in_use_bytes + stats.tiers[int(Tier::kDevice)].in_use_bytes;
  summary->host_bytes = host;
  summary->nvme_bytes = stats.nvme_file_bytes;
  summary->device_budget_bytes = stats.tiers[int(Tier::kDevice)].budget_bytes;
  summary->device_peak_bytes = stats.tiers[int(Tier::kDevice)].peak_bytes;
  summary->host_budget_bytes = stats.tiers[int(Tier::kHost)].budget_bytes;
  summary->nvme_capacity_bytes = stats.tiers[int(Tier::kNvme)].budget_bytes;
  summary->store_entries = stats.bookkeeping_entries;
  // Every NVMe byte of this step: the parameter tier's, the optimizer's chunks' and the
  // gradient accumulators' all move through the store.
  LinkStats read, written;
  optimizer_step->NvmeMetersAtStepEnd(stats, &read, &written);
  summary->bytes_nvme_read += read.bytes - nvme_read_at.bytes;
  summary->bytes_nvme_written += written.bytes - nvme_written_at.bytes;
  nvme_read_at = read;
  nvme_written_at = written;
  // The device's counts since the last step (Note [Transfer counters] in
  // offload/tiered_store.cc).
  const TransferCounts now = store->transfer_counters().counts();
  const TransferCounts& at = transfers_at;
  summary->host_waits = now.host_waits - at.host_waits;
  summary->worker_waits = now.worker_waits - at.worker_waits;
  summary->copies_down = now.copies_down - at.copies_down;
  summary->bytes_down = now.bytes_down - at.bytes_down;
  summary->copies_up = now.copies_up - at.copies_up;
  summary->bytes_up = now.bytes_up - at.bytes_up;
  summary->copies_on_device = now.copies_on_device - at.copies_on_device;
  summary->bytes_on_device = now.bytes_on_device - at.bytes_on_device;
  summary->copies_host = now.copies_host - at.copies_host;
  summary->bytes_host = now.bytes_host - at.bytes_host;
  summary->device_bytes_set = now.device_bytes_set - at.device_bytes_set;
  summary->host_bytes_set = now.host_bytes_set - at.host_bytes_set;
  summary->host_bytes_copied = now.host_bytes_copied - at.host_bytes_copied;
  transfers_at = now;
}

void Engine::Impl::FreeGradient(int pi) {
  GradBuffer& g = grads[pi];
  if (g.tensor != 0) {
    store->Release(g.tensor, Tier::kDevice).IgnoreError();
    store->Free(g.tensor).IgnoreError();
  }
  g = GradBuffer();
}

}  // namespace zinf
