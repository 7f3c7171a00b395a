// The engine's optimizer step: Engine::Step (global norm, overflow, clipping, the update in
// host memory or pipelined over NVMe, the parameter tier written from it, loss scaling, the
// scheduler) and the NVMe optimizer's setup.
//
// Note [Delayed parameter update]
// With zinf.delayed_param_update, Step(t) computes the norm, clipping and overflow of batch
// t's gradients as always, copies them aside (grad_step) and starts the update on a thread
// of its own; batch t+1 then runs forward and backward on the parameter tier as Step(t-1)
// left it (parameters one step stale) and accumulates into grad_acc meanwhile. Step(t+1)
// waits for the update, writes the parameter tier from the new master, and applies the
// scheduler, so the tier changes only between batches and every module of a batch sees the
// same parameters. Each update is bitwise the one the same gradients would give without the
// delay; what changes is which parameters those gradients were computed at. The first
// delayed_param_update_warmup_steps steps are not delayed: early training moves fast, and
// stale gradients hurt most there (the ZeRO-Offload paper turns DPU on after 40 steps).
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "zero/engine_impl.h"
#include "zero/lr_schedule.h"

namespace zinf {

PipelinedOptimizerOptions Engine::Impl::NvmeOptimizerOptions() const {
  PipelinedOptimizerOptions options;
  options.chunk_elements = OptimizerChunkElements();
  options.host_budget_bytes = std::max<uint64_t>(
      config.nvme_staging_budget_bytes, options.num_buffers * options.chunk_elements *
                                            PipelinedOptimizerOptions::kStagingBytesPerElement);
  options.nvme_ratio = config.optimizer_nvme_ratio;
  return options;
}

Status Engine::Impl::OpenNvmeOptimizer() {
  PipelinedOptimizerOptions options = NvmeOptimizerOptions();
  // Its chunks live in the store's swap files and host tier (OpenTiers sized both for them).
  ZINF_ASSIGN_OR_RETURN(pipelined, PipelinedOptimizer::Create(optimizer.get(), *tiers, options));
  // The new parameters of each chunk the step updates go to the host master, or with none
  // straight into the parameter tier.
  ChunkVisitor updated = [this](const ChunkView& c) {
    std::memcpy(master.as<float>() + c.offset, c.params, c.count * 4);
    return OkStatus();
  };
  std::function<Status()> restart;
  // An fp32 parameter tier is the master itself: the chunks keep only the state (Note
  // [Parameters kept by the caller]), so each parameter has one copy on NVMe.
  const bool tier_is_master = ParamTierIsMaster(config);
  if (!host_master) {
    tier_writer = std::make_unique<ParamTier::ChunkWriter>(param_tier.get(), tier_is_master);
    updated = [w = tier_writer.get()](const ChunkView& c) { return w->Write(c); };
    restart = [w = tier_writer.get()] { return w->Restart(); };
  }
  // Initialization writes the parameter tier like a step does.
  if (tier_writer != nullptr) tier_writer->Begin();
  ShardSpec spec{.name = fmt::format("rank {} shard", rank()),
                 .group = group,
                 .count = shard_elements,
                 // Host accumulators are read where they are; with gradients on NVMe the
                 // shard keeps them in its chunks' tensors (Note [Gradients on NVMe]).
                 .host_grads = grad_acc.empty() ? nullptr : grad_acc.data()};
  if (tier_writer != nullptr && param_type != ElementType::kFp32) {
    // The update writes the 16-bit parameters straight into the tier, in its own pass.
    spec.param_copy_tier = ParamCopyTier::kCaller;
    spec.param_copy_type = param_type;
    spec.copy_targets = [w = tier_writer.get()](const ChunkView& c) { return w->Targets(c); };
  }
  if (tier_is_master) {
    ParamTier::ChunkWriter* w = tier_writer.get();
    spec.params = {.targets = [w](const ChunkView& c) { return w->Targets(c); },
                   .prefetch = [w](const ChunkInfo& c) { w->Prefetch(c); },
                   .read = [w](const ChunkView& c) { return w->Read(c); },
                   .write = [w](const ChunkView& c) { return w->Store(c); }};
  }
  StatusOr<int> shard = pipelined->AddShard(spec, [&](const ChunkView& c) {
    if (host_master) {
      std::memcpy(c.params, master.as<float>() + c.offset, c.count * 4);
      return OkStatus();
    }
    ZINF_RETURN_IF_ERROR(FillInitial(c.offset, c.count, c.params));
    return params_on_nvme ? tier_writer->Write(c) : OkStatus();
  });
  Status written = tier_writer != nullptr ? tier_writer->Finish() : OkStatus();
  ZINF_RETURN_IF_ERROR(shard.status());
  ZINF_RETURN_IF_ERROR(written);
  nvme_shard = *shard;
  ZINF_ASSIGN_OR_RETURN(overlap, OptimizerOverlap::Create({.optimizer = pipelined.get(),
                                                           .cpu = optimizer.get(),
                                                           .shard = nvme_shard,
                                                           .group = group,
                                                           .params = &params,
                                                           .enabled = config.overlap_optimizer,
                                                           .speculation_limit = speculative_chunks},
                                                          std::move(updated), std::move(restart)));
  if (config.gradients_on_nvme) {
    // A chunk's gradients are final when its last write of the batch is on disk.
    ZINF_ASSIGN_OR_RETURN(
        nvme_grads, NvmeGradients::Create(pipelined.get(), nvme_shard, optimizer.get(), tiers.get(),
                                          config.ReductionsPerStep(),
                                          [o = overlap.get()](size_t c) { o->MarkChunkFinal(c); }));
  }
  return OkStatus();
}

Status Engine::Impl::NonFiniteGradientError() {
  // This rank's first parameter with a non-finite element in its shard; the minimum over the
  // ranks is the first of the model's. With the gradients on NVMe they are not at hand to
  // scan, and the message says so.
  double first = static_cast<double>(params.size());
  if (nvme_grads == nullptr) {
    for (size_t i = 0; i < params.size(); ++i) {
      const float* g = static_cast<const float*>(grad_acc.data()) + params[i].flat_offset;
      const uint64_t n = params[i].shard_size;
      bool finite = true;
      for (uint64_t k = 0; k < n && finite; ++k) finite = std::isfinite(g[k]);
      if (!finite) {
        first = static_cast<double>(i);
        break;
      }
    }
  }
  ZINF_RETURN_IF_ERROR(Context(comm->AllReduce(&first, 1, ElementType::kFp64, ReduceOp::kMin),
                               "finding the first non-finite gradient"));
  const size_t index = static_cast<size_t>(first);
  const std::string which =
      index < params.size()
          ? fmt::format(
                "parameter '{}' (module '{}') is the first, in registration order, with a "
                "non-finite gradient",
                params[index].spec.name, modules[params[index].module].name)
          : std::string(
                "the gradients are on NVMe (zinf.gradients_on_nvme), where zinf does not "
                "look for the parameter");
  return DataLoss(fmt::format(
      "non-finite gradients without fp16 loss scaling; the step was not applied and the "
      "batch's gradients were dropped (the next batch trains on): {}. Check the "
      "loss and the inputs for inf/NaN, lower the learning rate or set gradient_clipping; a "
      "parameter that reads as NaN is one its module's forward did not fetch (used outside it: "
      "with the C++ or C API, fetch that module around the use; zinf.zero finds such uses "
      "itself, see Note [Module hooks])",
      which));
}

Status Engine::Impl::AddReducedGradient(uint64_t flat_offset, const float* reduced, uint64_t size) {
  if (nvme_grads != nullptr) return nvme_grads->Add(flat_offset, reduced, size);
  AccumulateFp32(grad_acc.as<float>() + flat_offset, reduced, size);
  auto it = std::upper_bound(params.begin(), params.end(), flat_offset,
                             [](uint64_t b, const Param& p) { return b < p.flat_offset; });
  GradientAdded(static_cast<int>(std::prev(it) - params.begin()));
  return OkStatus();
}

void Engine::Impl::GradientAdded(int pi) {
  if (overlap != nullptr && ++final_adds[pi] == config.ReductionsPerStep()) {
    overlap->MarkFinal(pi);
  }
}

Status Engine::Impl::BeginOverlappedStep() {
  if (overlap == nullptr || overlap->armed() || !speculate) return OkStatus();
  if (tier_writer != nullptr) tier_writer->Begin();
  // The scale of a step neither clipped nor skipped.
  return Context(overlap->Arm(static_cast<float>(MeanScale())),
                 "starting the optimizer step alongside backward");
}

Status Engine::Impl::WaitDelayedUpdate() {
  if (!delayed.valid()) return OkStatus();
  return Context(delayed.get(), "the delayed parameter update");
}

bool Engine::Impl::StepsBesideForward() const {
  return config.step_beside_forward && tier_writer != nullptr && config.zero_stage == 3;
}

Status Engine::Impl::WaitForStep(int module) {
  if (!step_in_flight) return OkStatus();
  if (module >= 0) {
    const std::vector<int>& mine = modules[module].params;
    ZINF_RETURN_IF_ERROR(overlap->WaitForParams(mine));
    return tier_writer->WritePersistent(mine);
  }
  step_in_flight = false;
  param_tier->SetWritten(nullptr);
  // No forward takes what the step writes from here on (the end of a run, a checkpoint).
  tier_writer->KeepWrittenCopies(false);
  Status stepped = overlap->Wait();
  Status written = tier_writer->Finish();
  // The next step's summary reports it: it ran during the next batch.
  pending.seconds_optimizer_compute += pipelined->last_step_stats().compute_seconds;
  pending.seconds_optimizer_overlapped += overlap->started_seconds();
  ZINF_RETURN_IF_ERROR(Context(std::move(stepped), "the optimizer step beside forward"));
  ZINF_RETURN_IF_ERROR(Context(std::move(written), "writing the parameter tier"));
  ResetGradients();
  return ApplySchedule();
}

void Engine::Impl::EndBatch() {
  if (!step_in_flight) ResetGradients();  // else the step still reads them
  std::fill(final_adds.begin(), final_adds.end(), 0);
  for (Module& module : modules) module.reductions = 0;
  param_tier->EndBatch();  // Note [Prefetch]: the first batch recorded the order
}

void Engine::Impl::ResetGradients() {
  if (nvme_grads != nullptr) {
    nvme_grads->EndBatch();
  } else {
    std::memset(grad_acc.data(), 0, shard_elements * 4);
  }
}

Status Engine::Impl::QuiesceStep(std::string_view what) {
  ZINF_RETURN_IF_ERROR(WaitForStep(-1));
  ZINF_RETURN_IF_ERROR(WaitDelayedUpdate());
  if (overlap == nullptr || !overlap->armed()) return OkStatus();
  return FailedPrecondition(fmt::format(
      "rank {}: {} while the optimizer step is under way: the batch's last micro-batch has "
      "begun reducing gradients, and the step runs alongside backward until Step "
      "(zinf.overlap_optimizer); call it before that micro-batch's first ReduceGradients or "
      "after Step",
      rank(), what));
}

Status Engine::Impl::NvmeStep(std::optional<float> grad_scale, StepSummary* summary) {
  if (tier_writer != nullptr && !overlap->armed()) tier_writer->Begin();
  if (grad_scale && StepsBesideForward() && !overlap->KeepsSpeculation(*grad_scale)) {
    // Note [Step in the next forward's order]: the parameters in the order the next forward
    // fetches their modules, as the first batch recorded it (flat order before that).
    // The step keeps the parameters it writes in memory for the forward, but only the next
    // module's (or stage3_prefetch_bucket_size elements) ahead of it, as a read-ahead would.
    std::vector<int> order;
    std::vector<char> seen(modules.size(), 0);
    uint64_t lead = config.stage3_prefetch_bucket_size;
    for (int module : param_tier->fetch_order()) {
      if (std::exchange(seen[module], 1) != 0) continue;
      const std::vector<int>& mine = modules[module].params;
      order.insert(order.end(), mine.begin(), mine.end());
      uint64_t elements = 0;
      for (int pi : mine) elements += params[pi].shard_size;
      lead = std::max(lead, elements);
    }
    tier_writer->KeepWrittenCopies(true);
    const TieredStoreStats before = tiers->stats();
    nvme_read_beside = before.nvme_to_host;
    nvme_written_beside = before.host_to_nvme;
    ZINF_RETURN_IF_ERROR(overlap->Start(grad_scale, overlap->ChunkOrder(order), lead));
    summary->seconds_optimizer_overlapped += overlap->overlapped_seconds();
    if (!overlap->in_flight()) {  // nothing was left to step
      tier_writer->KeepWrittenCopies(false);
      return tier_writer->Finish();
    }
    step_in_flight = true;
    param_tier->SetWritten(
        [this](int module) { return overlap->ParamsStepped(modules[module].params); });
    return OkStatus();
  }
  Status stepped = overlap->Finish(grad_scale);
  summary->seconds_optimizer_overlapped += overlap->overlapped_seconds();
  Status written;
  if (tier_writer != nullptr) {
    written = tier_writer->Finish();
  } else if (grad_scale && stepped.ok()) {
    written = WriteParamTierFromMaster();
  }
  summary->seconds_optimizer_compute = pipelined->last_step_stats().compute_seconds;
  // Its NVMe bytes, and the gradient accumulators', are the store's: MeasureTiers counts them.
  ZINF_RETURN_IF_ERROR(stepped);
  return written;
}

Status Engine::Impl::ApplySchedule() {
  if (config.scheduler.type.empty()) return OkStatus();
  ZINF_ASSIGN_OR_RETURN(ParamGroupState state, optimizer->group(group));
  const ScheduledHyperParams next = ScheduleAt(config.scheduler, config.optimizer.lr, steps);
  state.hyper_params.lr = next.lr;
  if (next.beta1) state.hyper_params.beta1 = *next.beta1;
  if (next.beta2) state.hyper_params.beta2 = *next.beta2;
  Status set = optimizer->SetHyperParams(group, state.hyper_params);
  if (set.ok()) return set;
  return set.WithContext(
      fmt::format("scheduler {} after {} step(s)", config.scheduler.type, steps));
}

Status Engine::Impl::FinishReductions() {
  if (buckets == nullptr) return OkStatus();
  const auto t0 = EngineClock::now();
  Status finished = Context(buckets->Finish(), "reducing gradients");
  pending.seconds_reduce += SecondsSince(t0);
  return finished;
}

StatusOr<StepSummary> Engine::Step() {
  Impl& m = *impl_;
  if (!m.initialized) return FailedPrecondition("Step before Initialize");
  ZINF_RETURN_IF_ERROR(m.WaitForStep(-1));  // a batch without backward (no Gradients call)
  for (const Module& module : m.modules) {
    if (module.reductions != m.config.ReductionsPerStep()) {
      return FailedPrecondition(fmt::format(
          "Step: module '{}' reduced its gradients {} time(s) since the last step; {} expected "
          "(gradient_accumulation_steps {}{})",
          module.name, module.reductions, m.config.ReductionsPerStep(),
          m.config.gradient_accumulation_steps,
          m.config.layer_major ? ", zinf.layer_major: once a step" : ""));
    }
  }
  ZINF_RETURN_IF_ERROR(m.FinishReductions());
  const auto t0 = EngineClock::now();
  StepSummary summary = m.pending;
  m.pending = StepSummary();
  const ParamTierCounters gathers = m.param_tier->TakeCounters();
  summary.bytes_gathered = gathers.bytes_gathered;
  summary.gather_collectives = gathers.collectives;
  summary.seconds_gather = gathers.seconds_gather;
  summary.peak_live_parameters = gathers.peak_live_parameters;
  m.param_tier->DropAll();  // prefetches past the batch's last fetch, and what the step replaces
  {
    // Note [Delayed parameter update]: the previous step's update lands now, between batches.
    ZINF_RETURN_IF_ERROR(m.WaitDelayedUpdate());
    if (std::exchange(m.delayed_tier_write, false)) {
      summary.seconds_optimizer_compute = m.delayed_seconds;
      summary.seconds_optimizer_overlapped = m.delayed_seconds;
      ZINF_RETURN_IF_ERROR(m.Context(m.WriteParamTierFromMaster(), "writing the parameter tier"));
      if (m.config.zero_stage < 3) {
        ZINF_RETURN_IF_ERROR(m.Context(m.param_tier->GatherPersistent(), "re-gathering"));
      }
      ZINF_RETURN_IF_ERROR(m.ApplySchedule());
    }
  }

  {
    ZINF_ASSIGN_OR_RETURN(ParamGroupState applied, m.optimizer->group(m.group));
    summary.learning_rate = applied.hyper_params.lr;
  }

  // Global norm and overflow over every rank's shard, in one all-reduce.
  ZINF_ASSIGN_OR_RETURN(
      GradStats stats,
      m.nvme_grads != nullptr
          ? m.nvme_grads->Stats()
          : m.optimizer->ComputeGradStats(m.grad_acc.data(), ElementType::kFp32, m.shard_elements));
  double global[2] = {stats.finite ? stats.sum_squares : 0.0, stats.finite ? 0.0 : 1.0};
  ZINF_RETURN_IF_ERROR(m.Context(m.comm->AllReduce(global, 2, ElementType::kFp64, ReduceOp::kSum),
                                 "all-reducing the gradient norm"));
  const bool overflow = global[1] > 0 || !std::isfinite(global[0]);
  const bool delay =
      m.config.delayed_param_update && m.steps >= m.config.delayed_param_update_warmup_steps;
  Status scheduled;  // reported once the batch's bookkeeping is done: the step itself was applied
  const double mean_scale = m.MeanScale();
  summary.grad_norm = overflow ? INFINITY : std::sqrt(global[0]) * mean_scale;

  if (overflow) {
    // What ran alongside backward is undone: the step is skipped or refused.
    if (m.pipelined != nullptr) {
      ZINF_RETURN_IF_ERROR(m.Context(m.NvmeStep(std::nullopt, &summary), "skipping the step"));
    }
    if (!m.config.fp16) {
      // Refused, and the batch dropped as a skipped step drops it, so that the next batch
      // trains: a refused step must not leave every later one refused.
      Status refused = m.NonFiniteGradientError();
      m.EndBatch();
      return refused;
    }
    summary.skipped = true;
  } else {
    if (m.config.gradient_clipping > 0 && summary.grad_norm > m.config.gradient_clipping) {
      summary.clip_coefficient = m.config.gradient_clipping / (summary.grad_norm + 1e-6);
    }
    const float grad_scale = static_cast<float>(mean_scale * summary.clip_coefficient);
    if (m.pipelined != nullptr) {
      ZINF_RETURN_IF_ERROR(
          m.Context(m.NvmeStep(grad_scale, &summary), "stepping the NVMe optimizer state"));
    } else if (delay) {
      // The update runs during the next batch, from a copy of these gradients.
      std::memcpy(m.grad_step.data(), m.grad_acc.data(), m.shard_elements * 4);
      OptimizerSpan span = m.WholeShard();
      span.grads = m.grad_step.data();
      m.delayed = std::async(std::launch::async, [&m, span, grad_scale] {
        const auto t0 = EngineClock::now();
        Status s = m.optimizer->Step(m.group, span, {.grad_scale = grad_scale}).status();
        m.delayed_seconds = SecondsSince(t0);
        return s;
      });
      m.delayed_tier_write = true;
    } else {
      const auto update = EngineClock::now();
      ZINF_RETURN_IF_ERROR(
          m.optimizer->Step(m.group, m.WholeShard(), {.grad_scale = grad_scale}).status());
      summary.seconds_optimizer_compute = SecondsSince(update);
      ZINF_RETURN_IF_ERROR(m.Context(m.WriteParamTierFromMaster(), "writing the parameter tier"));
    }
    ++m.steps;
    // As DeepSpeed's scheduler.step(), after the step (a delayed one, or one beside the next
    // forward: once it has run).
    if (!delay && !m.step_in_flight) scheduled = m.ApplySchedule();
    // Stages 1 and 2 keep the whole model gathered: refresh it now.
    if (m.config.zero_stage < 3 && !delay) {
      ZINF_RETURN_IF_ERROR(m.Context(m.param_tier->GatherPersistent(), "re-gathering"));
    }
  }
  m.speculate = m.config.overlap_optimizer && !overflow && summary.clip_coefficient == 1.0;
  m.scaler.Update(overflow);
  m.EndBatch();
  summary.step = m.steps;
  summary.loss_scale = m.scaler.scale;
  summary.seconds_optimizer = SecondsSince(t0);
  summary.unix_time_s =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  m.tiers->ReleaseIdleScratch();  // Note [Scratch tensors]
  m.MeasureTiers(&summary);
  ZINF_RETURN_IF_ERROR(scheduled);
  return summary;
}

}  // namespace zinf
