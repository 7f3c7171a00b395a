// DeepSpeed's schedulers as functions of the step count; see Note [LR schedule ordering] in
// lr_schedule.h. Each formula follows deepspeed/runtime/lr_schedules.py in double precision,
// with `it` standing for DeepSpeed's last_batch_iteration.
#include "zero/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

namespace zinf {
namespace {

// WarmupLR._get_gamma and WarmupCosineLR's warmup ratio: 0 at it = 0, reaching 1 at it = n.
double WarmupFraction(const SchedulerConfig& s, int64_t it, int64_t n) {
  if (s.warmup_type == "linear") return static_cast<double>(it) / static_cast<double>(n);
  return std::log(static_cast<double>(it + 1)) / std::log(static_cast<double>(n));
}

double WarmupLr(const SchedulerConfig& s, double optimizer_lr, int64_t it) {
  const bool decay = s.type == "WarmupDecayLR";
  const double max_lr = s.warmup_max_lr.value_or(decay ? 0.001 : optimizer_lr);
  if (it < 0) return s.warmup_min_lr;
  // DeepSpeed warms up over at least 2 steps (log(1) would divide by zero).
  const int64_t n = std::max<int64_t>(2, s.warmup_num_steps);
  double gamma = 1.0;
  if (it < n) {
    gamma = WarmupFraction(s, it, n);
  } else if (decay) {
    gamma = std::max(0.0, static_cast<double>(s.total_num_steps - it) /
                              std::max(1.0, static_cast<double>(s.total_num_steps - n)));
  }
  return s.warmup_min_lr + (max_lr - s.warmup_min_lr) * gamma;
}

double WarmupCosineLr(const SchedulerConfig& s, double optimizer_lr, int64_t it) {
  if (it < 0) return 0.0;  // get_lr() before the first scheduler.step()
  const int64_t n = std::max<int64_t>(2, s.warmup_num_steps);
  double ratio = 0.0;
  if (it < n) {
    ratio = s.warmup_min_ratio + WarmupFraction(s, it, n) * (1.0 - s.warmup_min_ratio);
  } else {
    const double real_last_step = static_cast<double>(it - n + 1);
    const double real_total_steps = static_cast<double>(s.total_num_steps - n);
    const double cosine =
        (1.0 + std::cos(std::numbers::pi * real_last_step / real_total_steps)) / 2.0;
    ratio = std::max(0.0, s.cos_min_ratio + (1.0 - s.cos_min_ratio) * cosine);
  }
  return optimizer_lr * ratio;
}

ScheduledHyperParams OneCycle(const SchedulerConfig& s, int64_t it) {
  ScheduledHyperParams out;
  const double first = static_cast<double>(s.cycle_first_step_size);
  const double second =
      static_cast<double>(s.cycle_second_step_size.value_or(s.cycle_first_step_size));
  const double total = first + second;
  const double step_ratio = first / total;
  if (s.cycle_momentum) out.beta2 = 0.99;
  if (it < 0) {  // the constructor's values
    out.lr = s.cycle_min_lr;
    if (s.cycle_momentum) out.beta1 = s.cycle_min_mom;
    return out;
  }
  if (static_cast<double>(it) < total) {
    // _get_scale_factor: a triangle over the cycle, 0 at both ends and 1 after `first` steps.
    const double batch = static_cast<double>(it + 1);
    const double cycle = std::floor(1.0 + batch / total);
    const double x = 1.0 + batch / total - cycle;
    const double scale = x <= step_ratio ? x / step_ratio : (x - 1.0) / (step_ratio - 1.0);
    out.lr = s.cycle_min_lr + (s.cycle_max_lr - s.cycle_min_lr) * scale;
    if (s.cycle_momentum) {
      out.beta1 = s.cycle_max_mom - (s.cycle_max_mom - s.cycle_min_mom) * scale;
    }
    return out;
  }
  // After the cycle: DeepSpeed skips a decay when decay_step_size or its rate is 0.
  const double interval = s.decay_step_size == 0 ? 0.0
                                                 : (static_cast<double>(it) - total + 1.0) /
                                                       static_cast<double>(s.decay_step_size);
  const bool lr_decay = s.decay_step_size != 0 && s.decay_lr_rate != 0.0;
  out.lr = lr_decay ? s.cycle_min_lr / (1.0 + s.decay_lr_rate * interval) : s.cycle_min_lr;
  if (s.cycle_momentum) {
    const bool mom_decay = s.decay_step_size != 0 && s.decay_mom_rate != 0.0;
    out.beta1 = mom_decay ? s.cycle_max_mom * (1.0 + s.decay_mom_rate * interval) : s.cycle_max_mom;
  }
  return out;
}

double LrRangeTest(const SchedulerConfig& s, int64_t it) {
  if (it < 0) return s.lr_range_test_min_lr;
  double interval = static_cast<double>(it) / static_cast<double>(s.lr_range_test_step_size);
  if (s.lr_range_test_staircase) interval = std::floor(interval);
  return s.lr_range_test_min_lr * (1.0 + s.lr_range_test_step_rate * interval);
}

}  // namespace

ScheduledHyperParams ScheduleAt(const SchedulerConfig& schedule, double optimizer_lr,
                                int64_t steps_taken) {
  const int64_t it = steps_taken - 1;  // DeepSpeed's last_batch_iteration
  const std::string& type = schedule.type;
  if (type == "WarmupLR" || type == "WarmupDecayLR") {
    return {.lr = WarmupLr(schedule, optimizer_lr, it)};
  }
  if (type == "WarmupCosineLR") return {.lr = WarmupCosineLr(schedule, optimizer_lr, it)};
  if (type == "OneCycle") return OneCycle(schedule, it);
  if (type == "LRRangeTest") return {.lr = LrRangeTest(schedule, it)};
  return {.lr = optimizer_lr};
}

}  // namespace zinf
