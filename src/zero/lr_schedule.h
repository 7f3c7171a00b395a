// DeepSpeed's learning-rate schedulers (deepspeed/runtime/lr_schedules.py) as one pure
// function of the number of optimizer steps taken, so that the engine needs no scheduler
// state beyond its step count (which checkpoints already keep).
//
// Note [LR schedule ordering]
// DeepSpeed's engine calls optimizer.step() and then, unless the step was skipped for an fp16
// overflow, scheduler.step(); a scheduler's constructor already writes a value into the
// optimizer. So the optimizer's first step runs with the constructor's value, and step n + 1
// with the value left by the n-th scheduler.step(), which DeepSpeed computes with
// last_batch_iteration = n - 1. ScheduleAt(s, lr, n) is that value; the engine applies
// ScheduleAt(..., 0) at Create and ScheduleAt(..., steps) after each applied step, and
// skipped steps do not advance it. What the constructors write (DeepSpeed 0.14 and later):
//   WarmupLR, WarmupDecayLR: warmup_min_lr (so steps 1 and 2 both use it: log(1) = 0 and
//     0 / warmup_num_steps = 0);
//   WarmupCosineLR: 0 (its get_lr() before the first scheduler.step());
//   OneCycle: cycle_min_lr, and betas (cycle_min_mom, 0.99) with cycle_momentum;
//   LRRangeTest: lr_range_test_min_lr.
// DeepSpeed's formulas are kept as they are, including their edges: WarmupCosineLR's cosine
// rises again past total_num_steps, and OneCycle's stair counts change nothing.
//
// Thread-safe (pure functions).
#ifndef ZINF_ZERO_LR_SCHEDULE_H_
#define ZINF_ZERO_LR_SCHEDULE_H_

#include <cstdint>
#include <optional>

#include "zinf/engine.h"

namespace zinf {

struct ScheduledHyperParams {
  double lr = 0.0;
  // Set by OneCycle with cycle_momentum only; otherwise the optimizer keeps its betas.
  std::optional<double> beta1;
  std::optional<double> beta2;
};

// The learning rate (and betas) for optimizer step number `steps_taken` + 1, i.e. after
// `steps_taken` applied steps; see Note [LR schedule ordering]. `optimizer_lr` is
// optimizer.params.lr: WarmupCosineLR scales it and WarmupLR without warmup_max_lr warms up
// to it. `schedule` must have passed EngineConfig::Validate; an empty type returns
// optimizer_lr. steps_taken >= 0.
ScheduledHyperParams ScheduleAt(const SchedulerConfig& schedule, double optimizer_lr,
                                int64_t steps_taken);

}  // namespace zinf

#endif  // ZINF_ZERO_LR_SCHEDULE_H_
