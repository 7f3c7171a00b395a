// The engine's placement on the tiered store: Engine::Impl's store, its budgets and what it
// holds (Note [Parameter tier] in param_tier.h), the host-memory check, and the per-step
// memory and NVMe figures.
#include <fmt/core.h>

#include <algorithm>
#include <cstring>

#include "core/log.h"
#include "core/units.h"
#include "nvme/path_probe.h"
#include "offload/tiered_store_internal.h"
#include "zero/engine_impl.h"
#include "zinf/cpu_info.h"

namespace zinf {
namespace {
constexpr double kGiBf = double(uint64_t{1} << 30);
}  // namespace

Status Engine::Impl::ReadMasterShard(Param& p, float* out) {
  if (host_master) {
    std::memcpy(out, Master(p), p.shard_size * 4);
    return OkStatus();
  }
  if (param_type == ElementType::kFp32) return param_tier->ReadShard(p, out);
  return pipelined->Visit(
      nvme_shard,
      [&](const ChunkView& c) {
        const auto [first, last] = Overlap(c.offset, c.count, p);
        if (first < last) {
          std::memcpy(out + (first - p.flat_offset), c.params + (first - c.offset),
                      (last - first) * 4);
        }
        return OkStatus();
      },
      /*write_back=*/false);
}

Status Engine::Impl::WriteParamTierFromMaster() {
  Status converted;
  for (Param& p : params) {
    converted = param_tier->WriteFp32(p, Master(p));
    if (!converted.ok()) break;
  }
  Status written = param_tier->FinishWrites();
  return converted.ok() ? written : converted;
}

Status Engine::Impl::CheckHostMemory() const {
  const uint64_t total = GetCpuInfo().total_memory_bytes;
  if (total == 0) return OkStatus();  // unknown: let the allocations tell
  const uint64_t shard = shard_elements * 4;
  const bool optimizer_on_nvme = config.offload_optimizer_device == OffloadDevice::kNvme;
  const uint64_t states = optimizer_on_nvme ? 0 : shard * state_count();
  const uint64_t master = host_master ? shard : 0;
  uint64_t persistent = 0;
  for (const Param& p : params) {
    if (p.persistent) persistent += p.numel * 4;
  }
  const uint64_t buckets = world() > 1 ? 2 * BucketElements() * 4 : 0;
  // The parameter tier, where the host device's memory or pinned memory holds it.
  const uint64_t tier = params_on_nvme ? 0 : shard_elements * param_bytes();
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

uint64_t Engine::Impl::OptimizerChunkElements() const {
  constexpr uint64_t kAlign = PipelinedOptimizerOptions::kChunkAlignElements;
  return std::clamp<uint64_t>((shard_elements + kAlign - 1) / kAlign * kAlign,
                              PipelinedOptimizerOptions::kMinChunkElements,
                              PipelinedOptimizerOptions().chunk_elements);
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

Status Engine::Impl::OpenTiers(const std::string& device) {
  const uint64_t element = param_bytes();
  uint64_t tier_bytes = 0, largest_tier = 0, persistent = 0, working_set = 0;
  for (const Module& module : modules) {
    uint64_t bytes = 0;
    for (int pi : module.params) {
      const Param& p = params[pi];
      // The shard's copy, the gathered parameter (with one rank, the shard itself), its fp32
      // widening (16-bit parameters, when the fp32 view is handed out) and the gradient.
      const uint64_t full = p.shard_size * world();
      const uint64_t gathered = world() > 1 ? full * element : 0;
      const uint64_t widened = element != 4 && fp32_view ? full * 4 : 0;
      (p.persistent ? persistent : bytes) += p.shard_size * element + gathered + widened + full * 4;
    }
    working_set = std::max(working_set, bytes);
  }
  for (const Param& p : params) {
    tier_bytes += p.shard_size * element;
    largest_tier = std::max(largest_tier, p.shard_size * element);
  }
  const Tier home = params_on_nvme                                       ? Tier::kNvme
                    : config.offload_param_device == OffloadDevice::kCpu ? Tier::kHost
                                                                         : Tier::kDevice;
  TieredStoreOptions options;
  options.device = device;
  // The fetched module with backward's gradients, the next one being gathered, and the
  // read-ahead window; cached shard copies use what is left and are evicted first. On the
  // host device this is host memory: no more than the working set needs (a cache of every
  // shard would hold the model twice).
  // The two gradient buckets (Note [Gradient buckets]): each grown to the largest parameter.
  uint64_t largest_shard = 0;
  for (const Param& p : params) largest_shard = std::max(largest_shard, p.shard_size);
  const uint64_t bucket_slice =
      GradientBuckets::SliceCapacity(BucketElements(), world(), largest_shard);
  const uint64_t buckets = world() > 1 ? 2 * bucket_slice * (world() + 1) * 4 : 0;
  options.device_budget_bytes = (home == Tier::kDevice ? tier_bytes : 0) + persistent +
                                2 * working_set + 2 * config.stage3_prefetch_bucket_size * element +
                                buckets + (64 << 20);
  // The flat shard's arrays (StoreArray), page-aligned; the parameter tier when it lives
  // here; room for the NVMe tier's host copies while they are written.
  const uint64_t array = (std::max<uint64_t>(shard_elements, 1) * 4 + 4095) / 4096 * 4096;
  const bool states_here = config.offload_optimizer_device != OffloadDevice::kNvme;
  const uint64_t arrays =
      array * ((config.gradients_on_nvme ? 0 : 1) + (host_master ? 1 : 0) +
               (states_here ? state_count() : 0) + (config.delayed_param_update ? 1 : 0));
  // The buckets' reduced slices, where the device's memory is not the host's.
  const uint64_t landed = 2 * bucket_slice * 4;
  // The pipelined step's staging buffers and the chunks it keeps in host memory (all of
  // them at most, with offload_optimizer.ratio < 1).
  uint64_t step_buffers = 0;
  if (config.offload_optimizer_device == OffloadDevice::kNvme) {
    const PipelinedOptimizerOptions step = NvmeOptimizerOptions();
    const uint64_t chunk = step.chunk_elements;
    step_buffers = step.num_buffers * chunk * PipelinedOptimizerOptions::kStagingBytesPerElement;
    if (step.nvme_ratio < 1) {
      const uint64_t chunks = (shard_elements + chunk - 1) / chunk;
      step_buffers += chunks * PipelinedOptimizer::ChunkBytes(chunk, state_count());
    }
  }
  // The persistent parameters' next values while the NVMe step writes the tier from its
  // chunks (ParamTier::ChunkWriter).
  uint64_t persistent_next = 0;
  for (const Param& p : params) {
    if (p.persistent) persistent_next += (p.shard_size * 4 + 4095) / 4096 * 4096;
  }
  // The staging of the gradients on NVMe (Note [Gradients on NVMe]).
  const uint64_t gradient_staging =
      config.gradients_on_nvme ? NvmeGradients::StagingBudget(OptimizerChunkElements()) : 0;
  options.host_budget_bytes = arrays + (home == Tier::kHost ? tier_bytes : 0) + landed +
                              gradient_staging + step_buffers + persistent_next +
                              std::max<uint64_t>(256 << 20, 4 * largest_tier);
  // A GPU copies at full speed only from page-locked memory; the host device copies with
  // memcpy, where pinning buys nothing.
  options.pin_host = device != "host" && config.pin_memory;
  options.piece_bytes =
      std::clamp<uint64_t>((largest_tier + 4095) / 4096 * 4096, 1 << 20, 64 << 20);
  options.staging_buffers = 4;
  options.transfer_threads = 4;
  SwapStoreOptions swap_options;
  if (params_on_nvme || config.offload_optimizer_device == OffloadDevice::kNvme) {
    swap_options.paths = config.NvmePaths();
    swap_options.rank = global_rank;  // groups of other processes may share the nvme_path
    swap_options.checksum = config.nvme_checksum;
    swap_options.aio = config.aio;
    // Each extent is rounded up to the allocator's alignment: allow a block per extent.
    const uint64_t slack = swap_options.aio.block_size;
    const uint64_t chunk = OptimizerChunkElements();
    const uint64_t chunks = (shard_elements + chunk - 1) / chunk;
    const uint64_t chunk_state = chunk * 12 + slack;  // fp32 params and two state arrays
    if (config.offload_optimizer_device == OffloadDevice::kNvme) {
      swap_options.capacity_bytes += chunks * chunk_state;
      if (config.gradients_on_nvme) swap_options.capacity_bytes += chunks * (chunk * 4 + slack);
    }
    if (params_on_nvme) {
      for (const Param& p : params) {
        const uint64_t bytes = p.shard_size * element;
        const uint64_t pieces = (bytes + options.piece_bytes - 1) / options.piece_bytes;
        swap_options.capacity_bytes += bytes + pieces * slack;
      }
    }
    speculative_chunks = 0;
    if (config.offload_optimizer_device == OffloadDevice::kNvme && config.overlap_optimizer) {
      // The overlapped step's new state goes beside the old until the step is known to stand
      // (Note [Overlapped step]): room for all of it where the disk has it, else for as many
      // chunks as fit beside everything else (this rank's share of the free space, less a
      // margin); the chunks beyond are stepped after backward.
      const uint64_t free = StripedFreeBytes(swap_options.paths) / std::max(world(), 1);
      const uint64_t margin = std::max<uint64_t>(free / 20, 1ull << 30);
      uint64_t room = free > swap_options.capacity_bytes + margin
                          ? free - swap_options.capacity_bytes - margin
                          : 0;
      if (config.overlap_optimizer_swap_bytes > 0) {
        room = std::min(room, config.overlap_optimizer_swap_bytes);
      }
      speculative_chunks = std::min<uint64_t>(chunks, room / chunk_state);
      swap_options.capacity_bytes += speculative_chunks * chunk_state;
      if (speculative_chunks < chunks) {
        log::Info(
            "rank {}: zinf.overlap_optimizer: the NVMe path has room for the new state of {} of "
            "the optimizer's {} chunks beside the old; the rest of each step runs after "
            "backward ({} more would let all of it overlap)",
            rank(), speculative_chunks, chunks,
            FormatBytes((chunks - speculative_chunks) * chunk_state));
      }
    }
  }
  ZINF_ASSIGN_OR_RETURN(tiers, internal::TieredStoreAccess::Create(options, swap_options));
  swap = internal::TieredStoreAccess::Swap(*tiers);
  host_addressable = internal::TieredStoreAccess::HostAddressable(*tiers);
  param_tier = std::make_unique<ParamTier>(
      tiers.get(), DeviceComm(), &params, &modules,
      ParamTierOptions{.param_type = param_type,
                       .shard_home = home,
                       .device_host_addressable = host_addressable,
                       .fp32_view = fp32_view,
                       .prefetch_bucket_elements = config.stage3_prefetch_bucket_size,
                       .max_live_elements = config.stage3_max_live_parameters});
  grads.assign(params.size(), GradBuffer());
  return param_tier->Create();
}

void Engine::Impl::MeasureTiers(StepSummary* summary) {
  const TieredStoreStats stats = tiers->stats();
  // The host device's memory is host memory too.
  uint64_t host =
      stats.tiers[int(Tier::kHost)].in_use_bytes + stats.tiers[int(Tier::kDevice)].in_use_bytes;
  summary->host_bytes = host;
  summary->nvme_bytes = swap == nullptr ? 0 : swap->file_bytes() * swap->file_paths().size();
  // The parameter tier's NVMe traffic since the last step (the optimizer's is counted by
  // the pipelined step).
  summary->bytes_nvme_read += stats.nvme_to_host.bytes - nvme_read_at.bytes;
  summary->bytes_nvme_written += stats.host_to_nvme.bytes - nvme_written_at.bytes;
  nvme_read_at = stats.nvme_to_host;
  nvme_written_at = stats.host_to_nvme;
}

void Engine::Impl::FreeGradient(int pi) {
  GradBuffer& g = grads[pi];
  if (g.tensor != 0) {
    tiers->Release(g.tensor, Tier::kDevice).IgnoreError();
    tiers->Free(g.tensor).IgnoreError();
  }
  g = GradBuffer();
}

}  // namespace zinf
