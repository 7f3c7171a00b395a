// Engine::Step: the decisions of a step, made over every rank (the global gradient norm, an
// fp16 overflow, clipping, the loss scale), around the update, which is OptimizerStep's (see
// optimizer_step.h); and the end of the batch.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "zero/engine_impl.h"

namespace zinf {

Status Engine::Impl::NonFiniteGradientError() {
  // This rank's first parameter with a non-finite element in its shard; the minimum over the
  // ranks is the first of the model's. With the gradients on NVMe they are not at hand to
  // scan, and the message says so.
  double first = static_cast<double>(optimizer_step->FirstNonFinite());
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

void Engine::Impl::EndBatch() {
  optimizer_step->EndBatch();
  for (Module& module : modules) module.reductions = 0;
  param_tier->EndBatch();  // Note [Prefetch]: the first batch recorded the order
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
  OptimizerStep& step = *m.optimizer_step;
  // A batch without backward (no Gradients call) may find the last step still reading the
  // accumulators.
  ZINF_RETURN_IF_ERROR(step.BeforeGradients());
  // Note [Short last window]: a trainer's last window of an epoch may hold fewer than
  // gradient_accumulation_steps micro-batches (transformers' Trainer, Accelerate at the end of
  // the data loader). DeepSpeed steps at that boundary with what was accumulated, each
  // micro-batch's gradient scaled as in a full window (1 / gradient_accumulation_steps), and so
  // does zinf: every module must have been reduced the same number of times, at least once.
  // A module of frozen parameters alone has no gradient to reduce (Note [Frozen parameters]).
  const auto first = std::find_if(m.modules.begin(), m.modules.end(),
                                  [](const Module& module) { return module.trains; });
  if (first == m.modules.end()) {
    return FailedPrecondition(
        "Step: the model has no trainable parameter (every ParamSpec::trainable is false): "
        "there is nothing to step");
  }
  const int expected = m.config.ReductionsPerStep();
  const int reduced = first->reductions;
  const bool short_window = !m.config.layer_major && reduced >= 1 && reduced < expected;
  for (const Module& module : m.modules) {
    if (module.trains && module.reductions != (short_window ? reduced : expected)) {
      return FailedPrecondition(fmt::format(
          "Step: module '{}' reduced its gradients {} time(s) since the last step; {} expected "
          "(gradient_accumulation_steps {}{}), as module '{}' was",
          module.name, module.reductions, short_window ? reduced : expected,
          m.config.gradient_accumulation_steps,
          m.config.layer_major ? ", zinf.layer_major: once a step"
                               : "; fewer in a short last window, the same for every module",
          first->name));
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
  // What the previous step left for this one lands now, between batches.
  ZINF_RETURN_IF_ERROR(step.LandLastStep(&summary));
  summary.learning_rate = step.learning_rate();

  // Global norm and overflow over every rank's shard, in one all-reduce.
  ZINF_ASSIGN_OR_RETURN(GradStats stats, step.GradientStats());
  double global[2] = {stats.finite ? stats.sum_squares : 0.0, stats.finite ? 0.0 : 1.0};
  ZINF_RETURN_IF_ERROR(m.Context(m.comm->AllReduce(global, 2, ElementType::kFp64, ReduceOp::kSum),
                                 "all-reducing the gradient norm"));
  const bool overflow = global[1] > 0 || !std::isfinite(global[0]);
  const bool delay =
      m.config.delayed_param_update && step.steps() >= m.config.delayed_param_update_warmup_steps;
  Status scheduled;  // reported once the batch's bookkeeping is done: the step itself was applied
  const double mean_scale = m.MeanScale();
  summary.grad_norm = overflow ? INFINITY : std::sqrt(global[0]) * mean_scale;

  if (overflow) {
    ZINF_RETURN_IF_ERROR(step.Run(std::nullopt, delay, &summary, &scheduled));
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
    ZINF_RETURN_IF_ERROR(step.Run(grad_scale, delay, &summary, &scheduled));
  }
  step.SpeculateNext(m.config.overlap_optimizer && !overflow && summary.clip_coefficient == 1.0);
  m.scaler.Update(overflow);
  m.EndBatch();
  summary.step = step.steps();
  summary.loss_scale = m.scaler.scale;
  summary.seconds_optimizer = SecondsSince(t0);
  summary.unix_time_s =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  m.store->ReleaseIdleScratch();  // Note [Scratch tensors]
  m.MeasureTiers(&summary);
  ZINF_RETURN_IF_ERROR(scheduled);
  return summary;
}

}  // namespace zinf
