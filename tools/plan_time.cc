// The plan's step time: EstimatePlacement (Note [Plan time] in tools/plan_model.h).
#include <fmt/core.h>

#include <algorithm>
#include <cmath>

#include "core/units.h"
#include "tools/plan_internal.h"
#include "tools/plan_model.h"

namespace zinf::plan {

using namespace internal;

int ThreadsPerRank(const MachineProfile& profile, const PlanOptions& options) {
  return options.threads > 0 ? options.threads
                             : std::max(1, profile.cores / std::max(options.world_size, 1));
}

bool ComputeTakesEveryCore(const MachineProfile& profile, const PlanOptions& options) {
  return options.world_size * ThreadsPerRank(profile, options) >= profile.cores;
}

StatusOr<Estimate> EstimatePlacement(const ModelSpec& model, const EngineConfig& c,
                                     const MachineProfile& profile, const PlanOptions& options) {
  if (options.world_size < 1) {
    return InvalidArgument(fmt::format("--world-size must be >= 1, got {}", options.world_size));
  }
  if (model.fetch_flops.size() != model.fetch_order.size()) {
    return Internal("plan: the model's fetch_flops and fetch_order differ in length");
  }
  const int world = options.world_size;
  Estimate est;
  const uint64_t nvme_free =
      options.nvme_free_bytes != 0 ? options.nvme_free_bytes : profile.nvme_free_bytes;
  est.memory = EstimateMemory(model, c, world, /*fp32_view=*/true, nvme_free / world);
  MemoryEstimate& m = est.memory;
  const Layout l = LayOut(model, c, world);
  const uint64_t e = ElementBytes(c);
  const uint64_t S = l.shard_elements;
  const bool params_nvme = c.offload_param_device == OffloadDevice::kNvme;
  const bool optim_nvme = c.offload_optimizer_device == OffloadDevice::kNvme;
  const bool host_master = !(params_nvme && optim_nvme);
  const bool uses_nvme = params_nvme || optim_nvme;
  const int threads = ThreadsPerRank(profile, options);

  // Fits (Note [Plan memory]): the engine's device is the host device today, so without a GPU
  // figure every byte is host memory.
  const uint64_t memory = options.memory_bytes != 0 ? options.memory_bytes : profile.memory_bytes;
  const uint64_t gpu =
      options.gpu_memory_bytes != 0 ? options.gpu_memory_bytes : profile.gpu_memory_bytes;
  const uint64_t ranks = static_cast<uint64_t>(world);  // all on this machine
  std::vector<std::string> why;
  if (gpu == 0) {
    const uint64_t need = (m.peak_device + m.peak_host + m.activations) * ranks;
    if (need > memory) {
      why.push_back(fmt::format("memory: needs {} of {}", FormatBytes(need), FormatBytes(memory)));
    }
  } else {
    if ((m.peak_device + m.activations) > gpu) {
      why.push_back(fmt::format("GPU: needs {} of {}", FormatBytes(m.peak_device + m.activations),
                                FormatBytes(gpu)));
    }
    if (m.peak_host * ranks > memory) {
      why.push_back(fmt::format("memory: needs {} of {}", FormatBytes(m.peak_host * ranks),
                                FormatBytes(memory)));
    }
  }
  if (uses_nvme) {
    if (m.nvme * ranks > nvme_free) {
      why.push_back(fmt::format("NVMe: needs {} of {} free", FormatBytes(m.nvme * ranks),
                                FormatBytes(nvme_free)));
    }
    if (!options.sizes_only && (profile.nvme_read_Bps <= 0 || profile.nvme_write_Bps <= 0)) {
      why.push_back("the profile has no NVMe bandwidth (profile with --path DIR)");
    }
  }
  est.fits = why.empty();
  for (size_t i = 0; i < why.size(); ++i) est.why += (i ? "; " : "") + why[i];
  if (options.sizes_only) return est;

  // Compute rate: the GPT's matmuls multiply in bf16 where the config enables it and the
  // machine has native bf16 (the profile's bf16 figure); the MLP's plain loop is one thread.
  const double rate =
      model.plain_loop_compute
          ? profile.loop_fp32_flops
          : profile.MatmulRate(threads, c.bf16, model.hidden_size, model.tokens_per_micro_batch);
  if (rate <= 0) {
    return InvalidArgument(fmt::format("the profile has no {} compute rate",
                                       model.plain_loop_compute ? "loop_fp32_GFLOPs" : "matmul"));
  }
  TimeEstimate& t = est.time;
  const int gas = c.gradient_accumulation_steps;
  // Passes of the model's fetches, and reductions of each module, per step: one per
  // micro-batch, or one with every micro-batch through each fetch (zinf.layer_major).
  const int passes = c.ReductionsPerStep();
  // Attention's matmuls at their own rate where the profile has one; std::exp on one thread.
  const MachineProfile::CallRow& kernels = profile.KernelCall(threads);
  const double attention_extra =
      kernels.attention_flops > 0 && !model.plain_loop_compute
          ? model.attention_flops_per_micro_batch * (1 / kernels.attention_flops - 1 / rate)
          : 0.0;
  const double non_matmul =
      SafeDiv(model.elementwise_bytes_per_micro_batch, profile.memory_Bps) +
      model.kernel_calls_per_micro_batch * kernels.seconds +
      SafeDiv(model.exps_per_micro_batch, profile.exp_per_s) + std::max(0.0, attention_extra) +
      SafeDiv(model.gelu_forward_elements_per_micro_batch, kernels.gelu_forward_per_s) +
      SafeDiv(model.gelu_backward_elements_per_micro_batch, kernels.gelu_backward_per_s);

  const CacheSim sim = SimulateCache(model, c, world, l, m.device_budget);
  const std::vector<int>& order = sim.order;
  std::vector<uint64_t> miss = sim.miss;
  const size_t n = order.size();
  std::vector<double> flops;
  for (int k = 0; k < passes; ++k) {
    for (double f : model.fetch_flops) flops.push_back(f * gas / passes);
  }
  // The step beside the next forward (zinf.step_beside_forward), where the overlapped step
  // does not run it beside backward (it clips, or the overlap is off): each module's first
  // fetch of the batch takes the shards the step just wrote from memory, and that forward's
  // compute is what the step's NVMe pass runs under.
  const bool beside_forward = !host_master && c.step_beside_forward && c.zero_stage == 3 &&
                              (options.clipped || !c.overlap_optimizer);
  double first_pass_compute = 0;
  if (beside_forward) {
    std::vector<bool> seen(l.modules.size(), false);
    for (size_t i = 0; i < n; ++i) {
      if (seen[order[i]]) continue;
      seen[order[i]] = true;
      miss[i] = 0;
      first_pass_compute += flops[i] / rate;
    }
  }
  std::vector<uint64_t> gathered_bytes(l.modules.size()), gathers(l.modules.size());
  uint64_t persistent_gathered = 0, persistent_count = 0;
  // The collectives that gather the persistent parameters again after a step (Note [Coalesced
  // gathers]): in stage 3 each module's first fetch, with its other parameters, so only a
  // module of persistent parameters alone adds one; in stages 1 and 2 the step's
  // ParamTier::GatherPersistent, in groups of at most stage3_prefetch_bucket_size elements.
  uint64_t persistent_collectives = 0, group_elements = 0;
  for (size_t i = 0; i < l.modules.size(); ++i) {
    bool alone = true;
    for (const Laid& p : l.modules[i]) {
      if (!p.persistent) {
        alone = false;
        continue;
      }
      persistent_gathered += p.shard * world * e;
      ++persistent_count;
      const uint64_t full = p.shard * world;
      if (c.zero_stage < 3 &&
          (persistent_collectives == 0 || group_elements + full > c.stage3_prefetch_bucket_size)) {
        ++persistent_collectives;
        group_elements = 0;
      }
      group_elements += full;
    }
    if (c.zero_stage == 3 && alone && !l.modules[i].empty()) {
      ++persistent_collectives;
    }
    gathered_bytes[i] = ShardBytes(l.modules[i], e) * world;
    gathers[i] = CountNonPersistent(l.modules[i]);
  }
  // The read-ahead window (ParamTier::ReadAhead): fetch i's shards are asked for at fetch
  // issue[i], the last fetch from which i is within stage3_prefetch_bucket_size elements.
  std::vector<uint64_t> elements(l.modules.size(), 0);
  for (size_t i = 0; i < l.modules.size(); ++i) {
    for (const Laid& p : l.modules[i]) {
      if (!p.persistent) elements[i] += p.numel;
    }
  }
  // The link a miss crosses: NVMe reads (then the host-to-device copy, which on the host device
  // is a memcpy), or the host-to-device copy alone.
  const double copy_Bps = profile.h2d_Bps > 0 ? profile.h2d_Bps : profile.memory_Bps / 2;
  // The ranks on this machine share its disks, at the same time: they run in step.
  const double nvme_read_Bps = profile.nvme_read_Bps / world;
  const double nvme_write_Bps = profile.nvme_write_Bps / world;
  const double miss_Bps = params_nvme ? nvme_read_Bps : copy_Bps;
  // Every core computes: the ranks' communication threads share them, and the CPU the
  // collectives take is time the compute does not get (Note [Collectives' CPU]).
  const bool cores_shared = world > 1 && ComputeTakesEveryCore(profile, options);
  auto collective_cpu = [&](double collectives, double bytes) {
    return cores_shared
               ? collectives * profile.collective_cpu_s + bytes * profile.collective_cpu_s_per_byte
               : 0.0;
  };
  const double total = static_cast<double>(l.total);
  const double buckets =
      std::ceil(total / static_cast<double>(std::max<uint64_t>(1, c.reduce_bucket_size)));
  // The gradients' reduce-scatters run during backward: their CPU spread over the compute.
  const double reduce_cpu = passes * collective_cpu(buckets, total * 4);
  double stolen = 0;  // compute seconds the collectives take
  // Event simulation: compute is one serial lane, reads another, all-gathers a third.
  double clock = 0, disk_free = 0, comm_free = 0;
  std::vector<double> start(n, 0);
  double wait_read = 0, wait_gather = 0;
  // The persistent parameters are gathered again at the first fetch after each step.
  if (world > 1 && persistent_count > 0) {
    const double g = persistent_collectives * profile.collective_latency_s +
                     SafeDiv(2.0 * persistent_gathered, profile.memory_Bps) +
                     SafeDiv(static_cast<double>(persistent_gathered), profile.allgather_Bps);
    clock += g;
    wait_gather += g;
    stolen += collective_cpu(persistent_collectives, persistent_gathered);
  }
  for (size_t i = 0; i < n; ++i) {
    const int mod = order[i];
    // Issued at the fetch that first has i inside its window (the step's first fetch: at the
    // previous step, which is how EndBatch reads ahead; counted here as at time 0).
    size_t from = i == 0 ? 0 : i - 1;
    uint64_t ahead = 0;
    while (from > 0) {
      ahead += elements[order[from]];  // the modules between fetch from - 1 and fetch i
      if (ahead >= c.stage3_prefetch_bucket_size) break;
      --from;
    }
    const double issue = i == 0 ? 0.0 : start[from];
    double have = issue;
    if (miss[i] > 0 && miss_Bps > 0) {
      const double begin = std::max(issue, disk_free);
      // Each shard is its own request: NVMe's per-request latency, a batch's worth at once.
      disk_free =
          begin + miss[i] / miss_Bps +
          (params_nvme ? std::ceil(gathers[mod] / RequestsInFlight(c)) * profile.nvme_read_latency_s
                       : 0.0);
      have = disk_free;
    }
    double gathered = have;
    double fetch_cpu = reduce_cpu * SafeDiv(flops[i], gas * model.matmul_flops_per_micro_batch);
    if (world > 1 && gathers[mod] > 0) {
      // The next module's all-gathers start at the fetch before (ParamTier::PrefetchGathers).
      const double begin = std::max({have, comm_free, i == 0 ? 0.0 : start[i - 1]});
      // One collective for the module's parameters; with several, their shards packed and
      // the gathered pieces unpacked through memory (Note [Coalesced gathers]).
      const double coalesce =
          gathers[mod] > 1 ? SafeDiv(2.0 * gathered_bytes[mod], profile.memory_Bps) : 0.0;
      const double transfer =
          coalesce + SafeDiv(static_cast<double>(gathered_bytes[mod]), profile.allgather_Bps);
      if (cores_shared) fetch_cpu += coalesce + collective_cpu(1, gathered_bytes[mod]);
      comm_free = begin + profile.collective_latency_s + transfer;
      // With the ranks computing, the wait measured after as much compute as there was since
      // the collective began (Note [Loaded rendezvous]).
      if (!profile.loaded_wait.empty()) {
        const double met =
            clock + profile.LoadedWait(clock - begin, &MachineProfile::LoadedWaitRow::wait_s);
        // With no core to spare, the transfer (loopback copies, packing) takes the compute's
        // cores once the ranks meet instead of running beside the compute.
        comm_free = std::max(comm_free, met + (cores_shared ? transfer : 0.0));
      }
      gathered = comm_free;
    }
    const double s = std::max(clock, gathered);
    if (s > clock) {
      // Blame the later of the two lanes.
      if (gathered > have) {
        wait_gather += s - std::max(clock, have);
        wait_read += std::max(0.0, have - clock);
      } else {
        wait_read += s - clock;
      }
    }
    start[i] = s;
    clock = s + flops[i] / rate +
            non_matmul * SafeDiv(flops[i], model.matmul_flops_per_micro_batch) + fetch_cpu;
    stolen += fetch_cpu;
    t.bytes_gathered += world > 1 ? gathered_bytes[mod] : 0;
    if (params_nvme) t.nvme_read += miss[i];
  }
  t.compute = gas * (model.matmul_flops_per_micro_batch / rate + non_matmul) + stolen;
  if (world == 1) {
    // One rank's gathered parameter is its shard: StepSummary counts its bytes as gathered.
    for (size_t i = 0; i < n; ++i) t.bytes_gathered += gathered_bytes[order[i]];
  }
  t.gather = wait_gather + (params_nvme ? 0.0 : wait_read);
  double nvme_wait = params_nvme ? wait_read : 0.0;

  // Gradients: zeroed buffers, the reduce-scatter in buckets (several ranks), and the
  // accumulation into fp32 (one rank's first micro-batch accumulates in place).
  double memory_bytes = passes * total * 4;  // zeroing every gradient buffer
  memory_bytes += (world == 1 ? (passes - 1) : passes) * static_cast<double>(S) * 12;
  // Layer-major, the trainer adds each micro-batch's gradients into the module's buffer.
  memory_bytes += (gas - passes) * total * 12;
  t.reduce = SafeDiv(memory_bytes, profile.memory_Bps);
  if (world > 1) {
    t.reduce += passes * (buckets * profile.collective_latency_s +
                          SafeDiv(total * 4, profile.reduce_scatter_Bps));
    // The ranks meet at the step's norm all-reduce, the one waiting for the other's last
    // fetches (Note [Loaded rendezvous]).
    t.reduce += profile.LoadedWait(t.compute / static_cast<double>(n),
                                   &MachineProfile::LoadedWaitRow::step_s);
  }

  // The optimizer step.
  const double update = S / profile.OptimizerRate(threads);
  double pass = 0, tier_write = 0;
  double on_nvme = 0;  // elements of the chunks homed on NVMe
  const bool master = ParamTierIsMaster(c);
  const bool params_cached = master && c.step_beside_forward && c.zero_stage == 3 &&
                             S * 4 <= Budgets(l, c, world).write_back_room_bytes;
  if (optim_nvme) {
    const uint64_t chunk = OptimizerChunkElements(S, c.nvme_staging_budget_bytes);
    const uint64_t chunks = (S + chunk - 1) / chunk;
    for (uint64_t i = 0; i < chunks; ++i) {
      if (std::floor((i + 1) * c.optimizer_nvme_ratio) > std::floor(i * c.optimizer_nvme_ratio))
        on_nvme += static_cast<double>(std::min(chunk, S - i * chunk));
    }
    double read = on_nvme * 12, written = on_nvme * 12;
    if (master) {
      // The chunks hold only the two states; the step reads the parameters from the tier
      // (and writes them there, below), from host memory where a step beside the forward kept
      // the last step's written copies and the tier fits the host tier's room for them (a
      // larger tier, read in order through a smaller room, finds none of what comes next).
      read = written = on_nvme * 8;
      if (!params_cached) read += S * 4.0;
    }
    // With the gradients on NVMe the step reads them (4 bytes an element); each micro-batch's
    // reductions also wrote them, and read them back from the second micro-batch on, through
    // the accumulators' staging (all counted in StepSummary). Those writes and read-backs run
    // during backward, but the disk spends the time.
    double backward_read = 0, backward_written = 0;
    if (c.gradients_on_nvme) {
      read += on_nvme * 4;
      backward_written = on_nvme * 4 * passes;
      backward_read = on_nvme * 4 * (passes - 1);
    }
    t.nvme_read += static_cast<uint64_t>(read + backward_read);
    t.nvme_written += static_cast<uint64_t>(written + backward_written);
    // The pass keeps reads ahead of the update and a write behind it (Note [Pipelined step]):
    // both in flight at once, at the disk's mixed rate where the profile has it, never faster
    // than each direction alone; one after the other without it.
    const double reads = SafeDiv(read + backward_read, nvme_read_Bps);
    const double writes = SafeDiv(written + backward_written, nvme_write_Bps);
    pass = profile.nvme_mixed_Bps > 0
               ? std::max({reads, writes,
                           SafeDiv(read + backward_read + written + backward_written,
                                   profile.nvme_mixed_Bps / world)})
               : reads + writes;
  }
  if (host_master) tier_write += SafeDiv(S * (4.0 + e), profile.memory_Bps);
  double tier_nvme = 0;
  if (params_nvme) {
    t.nvme_written += S * e;
    // Every shard written back in one batch, as many in flight as the aio rings hold (Note
    // [Batched write-backs] in offload/tiered_store.cc), and the persistent ones read again
    // after the step. With several ranks each request also waits for the cores the other
    // ranks' writes take (Note [Loaded shard writes]).
    uint64_t shards = 0;
    for (const auto& params : l.modules) shards += params.size();
    double requests = std::ceil(shards / RequestsInFlight(c)) * profile.nvme_write_latency_s;
    if (world > 1) requests = std::max(requests, shards * profile.loaded_shard_write_s);
    tier_nvme = SafeDiv(S * static_cast<double>(e), nvme_write_Bps) + requests +
                std::ceil(persistent_count / RequestsInFlight(c)) * profile.nvme_read_latency_s;
  }
  t.optimizer = update + tier_write;
  // The overlapped step (zinf.overlap_optimizer) runs the pass chunk by chunk while the last
  // micro-batch's backward goes on: that backward's compute hides as much of it.
  double hidden = 0;
  if (optim_nvme && c.overlap_optimizer && !options.clipped) {
    const size_t per = model.fetch_order.size();
    for (size_t i = n - per; i < n; ++i) {
      const int mod = order[i];
      bool backward = false;  // a module's second fetch in the micro-batch
      for (size_t k = n - per; k < i; ++k) backward = backward || order[k] == mod;
      if (backward) hidden += flops[i] / rate;
    }
  }
  // Beside the next forward only the pass's I/O hides under its compute: the update's CPU
  // time is the forward's cores' (or, on a GPU, what its fetches wait for).
  const double optimizer_nvme = std::max(update, pass - first_pass_compute);
  // Only the chunks the disk has room to step speculatively run beside backward.
  if (m.optimizer_chunks > 0) {
    hidden = std::min(hidden, optimizer_nvme * static_cast<double>(m.speculative_chunks) /
                                  static_cast<double>(m.optimizer_chunks));
  }
  const double exposed = std::max(optimizer_nvme - hidden, 0.0);
  if (hidden > 0 && master) {
    // The chunks stepped beside backward (as large a part as of the pass backward hides)
    // write their old parameters aside (Note [Parameters kept by the caller]), and their
    // parameters are not kept in memory for the next step.
    const double part = on_nvme * 4 * std::min(1.0, hidden / optimizer_nvme);
    t.nvme_written += static_cast<uint64_t>(part);
    if (params_cached) t.nvme_read += static_cast<uint64_t>(part);
  }
  t.optimizer = std::min(update, exposed) + tier_write;
  t.nvme = nvme_wait + std::max(0.0, exposed - update) + tier_nvme;
  t.step = t.compute + t.gather + t.reduce + t.optimizer + t.nvme;
  return est;
}

}  // namespace zinf::plan
