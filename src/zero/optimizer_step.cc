// The optimizer step in host memory, the gradients' way in, and what the engine reads and
// writes of the master and the state (see optimizer_step.h). The NVMe step is in
// optimizer_step_nvme.cc.
//
// Note [Delayed parameter update]
// With zinf.delayed_param_update, Step(t) computes the norm, clipping and overflow of batch
// t's gradients as always, copies them aside (grad_step_) and starts the update on a thread
// of its own; batch t+1 then runs forward and backward on the parameter tier as Step(t-1)
// left it (parameters one step stale) and accumulates into the accumulators meanwhile.
// Step(t+1) waits for the update, writes the parameter tier from the new master, and applies
// the scheduler, so the tier changes only between batches and every module of a batch sees
// the same parameters. Each update is bitwise the one the same gradients would give without
// the delay; what changes is which parameters those gradients were computed at. The first
// delayed_param_update_warmup_steps steps are not delayed: early training moves fast, and
// stale gradients hurt most there (the ZeRO-Offload paper turns DPU on after 40 steps).
//
// Note [Parameter groups]
// A trainer's parameters may fall into optimizer groups with their own lr, weight decay,
// betas and eps (torch's param_groups: Hugging Face's Trainer always makes a group without
// weight decay for biases and norms). Each group is a group of the CpuOptimizer, all of one
// type (the kernels' state layout is the type's); the flat shard is cut into runs of
// consecutive elements of one group (runs_, from each parameter's flat_offset), and a step is
// BeginStep once per group and an Update per run, or per part of a run in one NVMe chunk
// (ShardSpec::runs). The update is element-wise, so this is bitwise what separate optimizers
// over each group's parameters give; a model of one group steps the whole shard in one call as
// before. The config's scheduler sets every group's lr, as DeepSpeed's schedulers do: a fixed
// value (WarmupLR's warmup_max_lr) is every group's, a ratio (WarmupCosineLR) scales each
// group's own lr. Checkpoints keep every group's hyper-parameters and step count in the
// "optimizer" section (CpuOptimizer::SaveState), and refuse a load into another group count.
#include "zero/optimizer_step.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <span>
#include <string>
#include <utility>

#include "core/elapsed.h"
#include "zero/lr_schedule.h"
#include "zero/tier_budgets.h"

namespace zinf {
namespace {

using Clock = SteadyClock;

}  // namespace

StatusOr<std::unique_ptr<OptimizerStep>> OptimizerStep::Create(const EngineConfig& config,
                                                               int optimizer_threads) {
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<CpuOptimizer> optimizer,
                        CpuOptimizer::Create({.threads = optimizer_threads}));
  std::unique_ptr<OptimizerStep> step(new OptimizerStep(config, std::move(optimizer)));
  ZINF_RETURN_IF_ERROR(step->AddParamGroup(config.optimizer).status());
  return step;
}

OptimizerStep::OptimizerStep(const EngineConfig& config, std::unique_ptr<CpuOptimizer> optimizer)
    : config_(config), optimizer_(std::move(optimizer)) {}

StatusOr<int> OptimizerStep::AddParamGroup(const OptimizerHyperParams& hyper_params) {
  if (placement_.params != nullptr) {
    return FailedPrecondition("a parameter group added after the engine was initialized");
  }
  if (hyper_params.type != config_.optimizer.type) {
    return InvalidArgument(fmt::format(
        "parameter group {} is {}, but the optimizer is {}: every group steps with one type",
        num_groups(), OptimizerTypeName(hyper_params.type),
        OptimizerTypeName(config_.optimizer.type)));
  }
  ZINF_ASSIGN_OR_RETURN(const int group, optimizer_->AddParamGroup(hyper_params));
  initial_lrs_.push_back(hyper_params.lr);
  ZINF_RETURN_IF_ERROR(ApplySchedule());  // the first step's lr is the schedule's
  return group;
}

OptimizerStep::~OptimizerStep() {
  // A step beside the forward uses the parts below; its result would go with them, so it
  // stops at its next chunk.
  if (beside_ != nullptr) beside_->Cancel();
  if (delayed_.valid()) delayed_.wait();
}

PipelinedOptimizerOptions OptimizerStep::NvmeOptions(const EngineConfig& config,
                                                     uint64_t shard_elements) {
  PipelinedOptimizerOptions options;
  options.chunk_elements = OptimizerChunkElements(shard_elements, config.nvme_staging_budget_bytes);
  options.host_budget_bytes = std::max<uint64_t>(
      config.nvme_staging_budget_bytes, options.num_buffers * options.chunk_elements *
                                            PipelinedOptimizerOptions::kStagingBytesPerElement);
  options.nvme_ratio = config.optimizer_nvme_ratio;
  return options;
}

Status OptimizerStep::Open(const OptimizerPlacement& placement, const ShardFill& initial) {
  placement_ = placement;
  // Note [Parameter groups]: the shard's runs, from the parameters' places in it.
  runs_ = {{0, 0}};
  for (const Param& p : Trained(*placement.params)) {
    const int group = p.spec.optimizer_group;
    if (group < 0 || group >= num_groups()) {
      return InvalidArgument(
          fmt::format("parameter '{}' is in optimizer group {}, but the engine has groups 0 to {}",
                      p.spec.name, group, num_groups() - 1));
    }
    if (p.shard_size == 0 || group == runs_.back().group) continue;
    if (p.flat_offset == runs_.back().begin) {
      runs_.back().group = group;  // the run begun here had no element yet
    } else {
      runs_.push_back({p.flat_offset, group});
    }
  }
  TieredStore* store = placement.store;
  const uint64_t bytes = std::max<uint64_t>(placement.shard_elements, 1) * 4;
  if (!config_.gradients_on_nvme) {
    ZINF_ASSIGN_OR_RETURN(grad_acc_, StoreArray::Create(store, "gradient accumulators", bytes));
  }
  final_adds_.assign(placement.params->size(), 0);
  speculate_ = config_.overlap_optimizer;
  if (placement.host_master) {
    ZINF_ASSIGN_OR_RETURN(master_, StoreArray::Create(store, "fp32 master", bytes));
    ZINF_RETURN_IF_ERROR(
        Context(initial(0, placement.shard_elements, master_.as<float>()), "initial values"));
  }
  // Without a host master the NVMe optimizer's initialization also fills the parameter tier.
  // A model of frozen parameters alone has no state to put there (Note [Frozen parameters]).
  if (config_.offload_optimizer_device == OffloadDevice::kNvme && placement.shard_elements > 0) {
    ZINF_RETURN_IF_ERROR(Context(OpenNvme(initial), "opening the NVMe optimizer state"));
  } else {
    // The optimizer state lives in host memory only when it is not on NVMe.
    ZINF_ASSIGN_OR_RETURN(state0_, StoreArray::Create(store, "optimizer state 0", bytes));
    if (state_count() > 1) {
      ZINF_ASSIGN_OR_RETURN(state1_, StoreArray::Create(store, "optimizer state 1", bytes));
    }
    ZINF_RETURN_IF_ERROR(ForEachGroupRun(
        runs_, 0, placement.shard_elements, [&](int group, uint64_t begin, uint64_t n) {
          return optimizer_->InitState(group, WholeShard().Slice(begin, n));
        }));
    if (config_.delayed_param_update) {
      ZINF_ASSIGN_OR_RETURN(grad_step_,
                            StoreArray::Create(store, "gradients of the delayed update", bytes));
    }
  }
  if (placement.host_master) {
    ZINF_RETURN_IF_ERROR(Context(WriteParamTierFromMaster(), "writing the parameter tier"));
  }
  return OkStatus();
}

Status OptimizerStep::Context(Status s, std::string_view what) const {
  return s.ok() ? s : std::move(s).WithContext(fmt::format("rank {}: {}", placement_.rank, what));
}

OptimizerSpan OptimizerStep::WholeShard() {
  return {.params = master_.as<float>(),
          .grads = grad_acc_.data(),
          .state0 = state0_.as<float>(),
          .state1 = state1_.empty() ? nullptr : state1_.as<float>(),
          .count = placement_.shard_elements};
}

// ---- Hyper-parameters ----

StatusOr<OptimizerHyperParams> OptimizerStep::hyper_params(int group) const {
  ZINF_ASSIGN_OR_RETURN(ParamGroupState state, optimizer_->group(group));
  return state.hyper_params;
}

int OptimizerStep::state_count() const { return optimizer_->group(0)->hyper_params.state_count(); }

double OptimizerStep::learning_rate(int group) const {
  if (group < 0 || group >= num_groups()) return std::nan("");
  // A step beside the forward applies its schedule once done; the rate is already this.
  if (step_in_flight() && !config_.scheduler.type.empty()) {
    return ScheduleAt(config_.scheduler, initial_lrs_[group], steps_).lr;
  }
  StatusOr<ParamGroupState> state = optimizer_->group(group);
  return state.ok() ? state->hyper_params.lr : std::nan("");
}

Status OptimizerStep::SetLearningRate(double lr) {
  for (int group = 0; group < num_groups(); ++group) {
    ZINF_RETURN_IF_ERROR(SetGroupLearningRate(group, lr));
  }
  return OkStatus();
}

Status OptimizerStep::SetGroupLearningRate(int group, double lr) {
  if (!std::isfinite(lr) || lr < 0) {
    return InvalidArgument(
        fmt::format("SetLearningRate: lr must be a finite number >= 0, got {}", lr));
  }
  if (!config_.scheduler.type.empty()) {
    return FailedPrecondition(fmt::format(
        "SetLearningRate: the config's scheduler ({}) sets the learning rate after every step; "
        "remove \"scheduler\" from the config to drive it from the trainer",
        config_.scheduler.type));
  }
  if (group < 0 || group >= num_groups()) {
    return InvalidArgument(
        fmt::format("SetLearningRate: no optimizer group {}; the engine has groups 0 to {}", group,
                    num_groups() - 1));
  }
  ZINF_ASSIGN_OR_RETURN(ParamGroupState state, optimizer_->group(group));
  state.hyper_params.lr = lr;
  return optimizer_->SetHyperParams(group, state.hyper_params);
}

std::string OptimizerStep::SaveHyperState() const { return optimizer_->SaveState(); }

Status OptimizerStep::LoadHyperState(const std::string& blob, int64_t steps) {
  const std::string mine = optimizer_->SaveState();
  ZINF_RETURN_IF_ERROR(optimizer_->LoadState(blob));
  if (optimizer_->num_groups() != num_groups()) {
    const int saved = optimizer_->num_groups();
    ZINF_RETURN_IF_ERROR(optimizer_->LoadState(mine));  // as it was
    return FailedPrecondition(fmt::format(
        "the checkpoint's optimizer has {} parameter group(s), this engine {}: register the "
        "parameters in the groups they were saved with",
        saved, num_groups()));
  }
  steps_ = steps;
  return OkStatus();
}

Status OptimizerStep::ApplySchedule() {
  if (config_.scheduler.type.empty()) return OkStatus();
  for (int group = 0; group < num_groups(); ++group) {
    ZINF_ASSIGN_OR_RETURN(ParamGroupState state, optimizer_->group(group));
    const ScheduledHyperParams next = ScheduleAt(config_.scheduler, initial_lrs_[group], steps_);
    state.hyper_params.lr = next.lr;
    if (next.beta1) state.hyper_params.beta1 = *next.beta1;
    if (next.beta2) state.hyper_params.beta2 = *next.beta2;
    Status set = optimizer_->SetHyperParams(group, state.hyper_params);
    if (!set.ok()) {
      return set.WithContext(
          fmt::format("scheduler {} after {} step(s)", config_.scheduler.type, steps_));
    }
  }
  return OkStatus();
}

// ---- Gradients ----

// Note [First gradient copied]
// The accumulators are not zeroed between batches: the batch's first reduced gradient of a
// parameter is copied into its accumulator, and only the later micro-batches add (acc + g,
// AccumulateFp32), as torch assigns .grad in the first backward and adds in the later ones.
// final_adds_ says, per parameter, what its accumulator holds of this batch (0: nothing, what
// is there is an earlier batch's); EndBatch sets it back to 0 instead of a memset of the whole
// array. Every reader of the accumulators in a step runs after GradientStats, which zeroes
// those of parameters that got no gradient in the batch (none, when every module was reduced
// as Step requires; the batch of a failed step may leave some), and ReadGradient reads such a
// parameter as zeros. Bit for bit this is 0 + g but for the sign of a zero: -0.0 copied stays
// -0.0 where 0 + -0.0 gave +0.0. No value an optimizer computes changes but a zero's sign (a
// zero gradient enters the norm squared, and the state as x + g, which is x unless x is a
// zero itself; the state starts at +0.0, and +0.0 + -0.0 is +0.0). Gradients on
// NVMe copy the first micro-batch the same way (Note [Gradients on NVMe]); a backward that
// writes the accumulator itself gets it zeroed only when it adds into it (Engine::Gradients).
Status OptimizerStep::Add(uint64_t flat_offset, const float* reduced, uint64_t size) {
  if (nvme_grads_ != nullptr) return nvme_grads_->Add(flat_offset, reduced, size);
  // A parameter's reduced shard comes whole: [flat_offset, flat_offset + size) is its own.
  const std::vector<Param>& params = *placement_.params;
  auto it = std::upper_bound(params.begin(), params.end(), flat_offset,
                             [](uint64_t b, const Param& p) { return b < p.flat_offset; });
  const int pi = static_cast<int>(std::prev(it) - params.begin());
  // On the optimizer's threads: a large model's gradients are gigabytes a micro-batch.
  const bool first = final_adds_[pi] == 0;  // Note [First gradient copied]
  ZINF_RETURN_IF_ERROR(
      optimizer_->Accumulate(grad_acc_.as<float>() + flat_offset, reduced, size, first));
  if (first) placement_.store->transfer_counters().CountHostCopy(size * 4);
  GradientWritten(pi);
  return OkStatus();
}

std::pair<int, int> OptimizerStep::ParamsCovering(uint64_t first, uint64_t count) const {
  const std::vector<Param>& params = *placement_.params;
  auto it = std::lower_bound(params.begin(), params.end(), first,
                             [](const Param& p, uint64_t b) { return p.flat_offset < b; });
  const int begin = static_cast<int>(it - params.begin());
  int end = begin;
  uint64_t at = first;
  while (end < static_cast<int>(params.size()) && at < first + count &&
         params[end].flat_offset == at) {
    at += params[end++].shard_size;
  }
  return at == first + count && count > 0 ? std::pair{begin, end} : std::pair{begin, begin};
}

float* OptimizerStep::LandingFor(uint64_t first, uint64_t count) {
  if (grad_acc_.empty() || nvme_grads_ != nullptr) return nullptr;
  const auto [begin, end] = ParamsCovering(first, count);
  if (begin == end) return nullptr;
  for (int pi = begin; pi < end; ++pi) {
    if (final_adds_[pi] != 0) return nullptr;  // added to, not copied over
  }
  return grad_acc_.as<float>() + first;
}

Status OptimizerStep::Landed(uint64_t first, uint64_t count) {
  const auto [begin, end] = ParamsCovering(first, count);
  if (begin == end) {
    return Internal(
        fmt::format("gradients landed on flat elements [{}, {}), which are not "
                    "whole parameters' shards",
                    first, first + count));
  }
  for (int pi = begin; pi < end; ++pi) GradientWritten(pi);
  return OkStatus();
}

float* OptimizerStep::Accumulator(const Param& p) {
  return grad_acc_.empty() ? nullptr : grad_acc_.as<float>() + p.flat_offset;
}

void OptimizerStep::ZeroAccumulator(const Param& p) {
  std::memset(Accumulator(p), 0, p.shard_size * 4);
  placement_.store->transfer_counters().CountHostSet(p.shard_size * 4);
}

void OptimizerStep::GradientWritten(int pi) {
  if (++final_adds_[pi] == config_.ReductionsPerStep() && overlap_ != nullptr) {
    overlap_->MarkFinal(pi);
  }
}

void OptimizerStep::ZeroGradientsNotWritten() {
  const std::span<const Param> params = Trained(*placement_.params);
  for (size_t pi = 0; pi < params.size(); ++pi) {
    // Left at 0: a gradient copied over these zeros later is what adding it would give.
    if (final_adds_[pi] == 0 && params[pi].shard_size > 0) ZeroAccumulator(params[pi]);
  }
}

Status OptimizerStep::ReadGradient(const Param& p, float* out) {
  if (!grad_acc_.empty()) {
    const size_t pi = &p - placement_.params->data();
    if (final_adds_[pi] == 0) {  // nothing of this batch yet: Note [First gradient copied]
      std::fill(out, out + p.shard_size, 0.0f);
    } else {
      std::memcpy(out, grad_acc_.as<float>() + p.flat_offset, p.shard_size * 4);
    }
    return OkStatus();
  }
  // The accumulated micro-batches, read back from their chunks.
  return pipelined_->Visit(
      nvme_shard_,
      [&](const ChunkView& c) {
        const auto [first, last] = Overlap(c.offset, c.count, p);
        if (first < last) {
          std::memcpy(out + (first - p.flat_offset),
                      static_cast<const float*>(c.grads) + (first - c.offset), (last - first) * 4);
        }
        return OkStatus();
      },
      /*write_back=*/false);
}

StatusOr<GradStats> OptimizerStep::GradientStats() {
  if (nvme_grads_ != nullptr) return nvme_grads_->Stats();
  ZeroGradientsNotWritten();  // the step's first read of the accumulators
  return optimizer_->ComputeGradStats(grad_acc_.data(), ElementType::kFp32,
                                      placement_.shard_elements);
}

size_t OptimizerStep::FirstNonFinite() const {
  const size_t none = placement_.params->size();
  if (grad_acc_.empty()) return none;
  const std::span<const Param> params = Trained(*placement_.params);
  for (size_t i = 0; i < params.size(); ++i) {
    const float* g = grad_acc_.as<const float>() + params[i].flat_offset;
    for (uint64_t k = 0; k < params[i].shard_size; ++k) {
      if (!std::isfinite(g[k])) return i;
    }
  }
  return none;
}

// ---- The batch ----

Status OptimizerStep::BeginLastMicroBatch(double mean_scale) {
  if (overlap_ == nullptr || overlap_->armed() || !speculate_) return OkStatus();
  if (tier_writer_ != nullptr) tier_writer_->Begin();
  return Context(overlap_->Arm(static_cast<float>(mean_scale)),
                 "starting the optimizer step alongside backward");
}

Status OptimizerStep::BeforeFetch(int module) {
  // Note [Step in the next forward's order]: only this module's parameters need be stepped.
  if (beside_ == nullptr) return OkStatus();
  return Context(beside_->WaitForModule(module), "the optimizer step beside forward");
}

Status OptimizerStep::BeforeGradients() { return FinishStepBesideForward(); }

Status OptimizerStep::WaitDelayedUpdate() {
  if (!delayed_.valid()) return OkStatus();
  return Context(delayed_.get(), "the delayed parameter update");
}

Status OptimizerStep::Quiesce(std::string_view what) {
  ZINF_RETURN_IF_ERROR(FinishStepBesideForward());
  ZINF_RETURN_IF_ERROR(WaitDelayedUpdate());
  if (overlap_ == nullptr || !overlap_->armed()) return OkStatus();
  return FailedPrecondition(fmt::format(
      "rank {}: {} while the optimizer step is under way: the batch's last micro-batch has "
      "begun reducing gradients, and the step runs alongside backward until Step "
      "(zinf.overlap_optimizer); call it before that micro-batch's first ReduceGradients or "
      "after Step",
      placement_.rank, what));
}

Status OptimizerStep::LandLastStep(StepSummary* summary) {
  if (beside_ != nullptr) beside_->TakeTimes(summary);
  ZINF_RETURN_IF_ERROR(WaitDelayedUpdate());
  if (!std::exchange(delayed_tier_write_, false)) return OkStatus();
  summary->seconds_optimizer_compute = delayed_seconds_;
  summary->seconds_optimizer_overlapped = delayed_seconds_;
  ZINF_RETURN_IF_ERROR(Context(WriteParamTierFromMaster(), "writing the parameter tier"));
  if (config_.zero_stage < 3) {
    ZINF_RETURN_IF_ERROR(Context(placement_.param_tier->GatherPersistent(), "re-gathering"));
  }
  return ApplySchedule();
}

Status OptimizerStep::Run(std::optional<float> grad_scale, bool delay, StepSummary* summary,
                          Status* scheduled) {
  if (!grad_scale) {
    // What ran alongside backward is undone: the step is skipped or refused.
    if (pipelined_ != nullptr) {
      ZINF_RETURN_IF_ERROR(Context(RunNvme(std::nullopt, summary), "skipping the step"));
    }
    return OkStatus();
  }
  if (pipelined_ != nullptr) {
    ZINF_RETURN_IF_ERROR(
        Context(RunNvme(grad_scale, summary), "stepping the NVMe optimizer state"));
  } else if (delay) {
    // The update runs during the next batch, from a copy of these gradients.
    std::memcpy(grad_step_.data(), grad_acc_.data(), placement_.shard_elements * 4);
    placement_.store->transfer_counters().CountHostCopy(placement_.shard_elements * 4);
    OptimizerSpan span = WholeShard();
    span.grads = grad_step_.data();
    const float scale = *grad_scale;
    delayed_ = std::async(std::launch::async, [this, span, scale] {
      const auto t0 = Clock::now();
      Status s = StepHost(span, scale);
      delayed_seconds_ = SecondsSince(t0);
      return s;
    });
    delayed_tier_write_ = true;
  } else {
    const auto update = Clock::now();
    ZINF_RETURN_IF_ERROR(StepHost(WholeShard(), *grad_scale));
    summary->seconds_optimizer_compute = SecondsSince(update);
    ZINF_RETURN_IF_ERROR(Context(WriteParamTierFromMaster(), "writing the parameter tier"));
  }
  ++steps_;
  // As DeepSpeed's scheduler.step(), after the step (a delayed one, or one beside the next
  // forward: once it has run).
  if (!delay && !step_in_flight()) *scheduled = ApplySchedule();
  // Stages 1 and 2 keep the whole model gathered: refresh it now.
  if (config_.zero_stage < 3 && !delay) {
    ZINF_RETURN_IF_ERROR(Context(placement_.param_tier->GatherPersistent(), "re-gathering"));
  }
  return OkStatus();
}

Status OptimizerStep::StepHost(const OptimizerSpan& span, float grad_scale) {
  if (runs_.size() == 1) {
    return optimizer_->Step(runs_[0].group, span, {.grad_scale = grad_scale}).status();
  }
  for (int group : GroupsOf(runs_)) ZINF_RETURN_IF_ERROR(optimizer_->BeginStep(group).status());
  return ForEachGroupRun(runs_, 0, span.count, [&](int group, uint64_t begin, uint64_t n) {
    return optimizer_->Update(group, span.Slice(begin, n), grad_scale);
  });
}

void OptimizerStep::EndBatch() {
  if (!step_in_flight()) ResetGradients();  // else the step still reads them
  std::fill(final_adds_.begin(), final_adds_.end(), 0);
}

void OptimizerStep::ResetGradients() {
  // Host accumulators need nothing: the next batch's first gradient of each parameter is
  // copied over what they hold (Note [First gradient copied]).
  if (nvme_grads_ != nullptr) nvme_grads_->EndBatch();
}

// ---- The master ----

Status OptimizerStep::ReadMaster(const Param& p, float* out) {
  if (placement_.host_master) {
    std::memcpy(out, Master(p), p.shard_size * 4);
    return OkStatus();
  }
  if (placement_.param_type == ElementType::kFp32) {
    return placement_.param_tier->ReadShard(p, out);
  }
  return pipelined_->Visit(
      nvme_shard_,
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

Status OptimizerStep::WriteMaster(const Param& p, const float* shard) {
  if (placement_.host_master) std::memcpy(Master(p), shard, p.shard_size * 4);
  if (pipelined_ == nullptr || ParamTierIsMaster(config_)) return OkStatus();
  // A whole pass over the NVMe state: fine for loading weights, too slow for every step.
  // (Where the parameter tier is the master, the caller's write of it is all.)
  auto store = [&](const ChunkView& c) {
    const auto [first, last] = Overlap(c.offset, c.count, p);
    if (first < last) {
      std::memcpy(c.params + (first - c.offset), shard + (first - p.flat_offset),
                  (last - first) * 4);
    }
    return OkStatus();
  };
  return pipelined_->Visit(nvme_shard_, store, /*write_back=*/true);
}

Status OptimizerStep::WriteParamTierFromMaster() {
  Status converted;
  for (const Param& p : Trained(*placement_.params)) {
    converted = placement_.param_tier->WriteFp32(p, Master(p));
    if (!converted.ok()) break;
  }
  Status written = placement_.param_tier->FinishWrites();
  return converted.ok() ? written : converted;
}

// ---- Checkpoints ----

Status OptimizerStep::VisitArrays(const ShardArraysVisitor& visit, bool write_back) {
  if (pipelined_ == nullptr) {
    return visit({.offset = 0,
                  .count = placement_.shard_elements,
                  .arrays = {master_.as<float>(), state0_.as<float>(),
                             state1_.empty() ? nullptr : state1_.as<float>()}});
  }
  const bool copy_to_master = write_back && placement_.host_master;
  ZINF_RETURN_IF_ERROR(pipelined_->Visit(
      nvme_shard_,
      [&](const ChunkView& c) {
        ZINF_RETURN_IF_ERROR(visit(
            {.offset = c.offset, .count = c.count, .arrays = {c.params, c.state0, c.state1}}));
        if (copy_to_master) std::memcpy(master_.as<float>() + c.offset, c.params, c.count * 4);
        return OkStatus();
      },
      write_back));
  // Where the parameter tier is the master the visit stored into it: done with those writes.
  if (write_back && tier_writer_ != nullptr) ZINF_RETURN_IF_ERROR(tier_writer_->Finish());
  return OkStatus();
}

Status OptimizerStep::LoadMaster(const ShardFill& read) {
  if (pipelined_ != nullptr && !ParamTierIsMaster(config_)) {
    ZINF_RETURN_IF_ERROR(pipelined_->Visit(
        nvme_shard_, [&](const ChunkView& c) { return read(c.offset, c.count, c.params); },
        /*write_back=*/true));
  }
  if (placement_.host_master) {
    ZINF_RETURN_IF_ERROR(read(0, placement_.shard_elements, master_.as<float>()));
  }
  return OkStatus();
}

}  // namespace zinf
