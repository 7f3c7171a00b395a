// DeepSpeed's schedulers as ScheduleAt computes them, against values worked out by hand from
// deepspeed/runtime/lr_schedules.py. ScheduleAt(s, lr, n) is the value after n calls of
// scheduler.step(), i.e. DeepSpeed's get_lr() at last_batch_iteration = n - 1, and n = 0 is
// what the constructor writes (Note [LR schedule ordering]).
#include "zero/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

namespace zinf {
namespace {

constexpr double kTol = 1e-15;

double Lr(const SchedulerConfig& s, int64_t steps, double optimizer_lr = 0.5) {
  return ScheduleAt(s, optimizer_lr, steps).lr;
}

TEST(LrScheduleTest, NoSchedulerKeepsTheOptimizerLr) {
  const ScheduledHyperParams v = ScheduleAt(SchedulerConfig(), 0.25, 7);
  EXPECT_EQ(v.lr, 0.25);
  EXPECT_FALSE(v.beta1.has_value());
  EXPECT_FALSE(v.beta2.has_value());
}

// Log warmup: min + (max - min) * ln(it + 1) / ln(N). With N = 1000 the values at it = 9, 99
// and 999 are exactly a third, two thirds and all of the way.
TEST(LrScheduleTest, WarmupLrLog) {
  SchedulerConfig s;
  s.type = "WarmupLR";
  s.warmup_min_lr = 0.0;
  s.warmup_max_lr = 0.001;
  s.warmup_num_steps = 1000;
  EXPECT_EQ(Lr(s, 0), 0.0);  // the constructor writes warmup_min_lr
  EXPECT_EQ(Lr(s, 1), 0.0);  // it = 0: ln(1) = 0, so the second step too
  EXPECT_NEAR(Lr(s, 10), 0.001 / 3, kTol);
  EXPECT_NEAR(Lr(s, 100), 0.002 / 3, kTol);
  EXPECT_NEAR(Lr(s, 1000), 0.001, kTol);  // it = 999: ln(1000) / ln(1000)
  EXPECT_EQ(Lr(s, 5000), 0.001);          // past warmup: gamma = 1
  // Without warmup_max_lr, WarmupLR warms up to optimizer.params.lr.
  s.warmup_max_lr.reset();
  EXPECT_NEAR(Lr(s, 10, 0.03), 0.01, kTol);
}

// Linear warmup: min + (max - min) * it / N.
TEST(LrScheduleTest, WarmupLrLinear) {
  SchedulerConfig s;
  s.type = "WarmupLR";
  s.warmup_type = "linear";
  s.warmup_min_lr = 0.0001;
  s.warmup_max_lr = 0.0011;
  s.warmup_num_steps = 10;
  EXPECT_EQ(Lr(s, 0), 0.0001);
  EXPECT_EQ(Lr(s, 1), 0.0001);           // it = 0
  EXPECT_NEAR(Lr(s, 6), 0.0006, kTol);   // it = 5: half way
  EXPECT_NEAR(Lr(s, 11), 0.0011, kTol);  // it = 10 = N: done
  s.warmup_num_steps = 0;                // DeepSpeed warms up over at least 2 steps
  EXPECT_NEAR(Lr(s, 2), 0.0006, kTol);   // it = 1 of 2
}

// WarmupDecayLR: warmup, then max * (T - it) / (T - N), never below 0.
TEST(LrScheduleTest, WarmupDecayLr) {
  SchedulerConfig s;
  s.type = "WarmupDecayLR";
  s.warmup_type = "linear";
  s.warmup_min_lr = 0.0;
  s.warmup_max_lr = 0.01;
  s.warmup_num_steps = 10;
  s.total_num_steps = 110;
  EXPECT_EQ(Lr(s, 0), 0.0);
  EXPECT_NEAR(Lr(s, 6), 0.005, kTol);    // it = 5: warming up
  EXPECT_NEAR(Lr(s, 11), 0.01, kTol);    // it = 10: (110 - 10) / (110 - 10)
  EXPECT_NEAR(Lr(s, 61), 0.005, kTol);   // it = 60: 50 / 100
  EXPECT_NEAR(Lr(s, 101), 0.001, kTol);  // it = 100: 10 / 100
  EXPECT_EQ(Lr(s, 111), 0.0);            // it = 110 = T
  EXPECT_EQ(Lr(s, 500), 0.0);            // past T: clamped at 0
  // Without warmup_max_lr, WarmupDecayLR's default is 0.001 (not the optimizer's lr).
  s.warmup_max_lr.reset();
  EXPECT_NEAR(Lr(s, 61, 0.5), 0.0005, kTol);
}

// WarmupCosineLR: lr * ratio; the ratio warms up from warmup_min_ratio to 1 over N, then is
// cos_min_ratio + (1 - cos_min_ratio) * (1 + cos(pi * (it - N + 1) / (T - N))) / 2.
TEST(LrScheduleTest, WarmupCosineLr) {
  SchedulerConfig s;
  s.type = "WarmupCosineLR";
  s.warmup_type = "linear";
  s.warmup_num_steps = 10;
  s.total_num_steps = 20;
  s.warmup_min_ratio = 0.2;
  s.cos_min_ratio = 0.1;
  const double lr = 0.1;
  EXPECT_EQ(Lr(s, 0, lr), 0.0);             // DeepSpeed's constructor writes get_lr() = 0
  EXPECT_NEAR(Lr(s, 1, lr), 0.02, kTol);    // it = 0: ratio 0.2
  EXPECT_NEAR(Lr(s, 6, lr), 0.06, kTol);    // it = 5: 0.2 + 0.5 * 0.8
  EXPECT_NEAR(Lr(s, 10, lr), 0.092, kTol);  // it = 9: 0.2 + 0.9 * 0.8
  // it = 10: (1 + cos(pi / 10)) / 2 = 0.975528258..., ratio 0.1 + 0.9 * that.
  EXPECT_NEAR(Lr(s, 11, lr), 0.1 * (0.1 + 0.9 * (1 + 0.9510565162951535) / 2), kTol);
  EXPECT_NEAR(Lr(s, 15, lr), 0.055, kTol);     // it = 14: cos(pi / 2) = 0
  EXPECT_NEAR(Lr(s, 20, lr), 0.01, kTol);      // it = 19 reaches T: cos(pi) = -1
  EXPECT_NEAR(Lr(s, 30, lr), 0.1, kTol);       // DeepSpeed's cosine rises again past T
  s.warmup_type = "log";                       // ln(it + 1) / ln(N), N = 10
  EXPECT_NEAR(Lr(s, 10, lr), lr * 1.0, kTol);  // it = 9: ln(10) / ln(10) = 1
}

// OneCycle: a triangle from cycle_min_lr up to cycle_max_lr over cycle_first_step_size steps
// and back over cycle_second_step_size, then cycle_min_lr / (1 + rate * (it - total + 1) /
// decay_step_size); beta1 moves the other way and beta2 is 0.99.
TEST(LrScheduleTest, OneCycle) {
  SchedulerConfig s;
  s.type = "OneCycle";
  s.cycle_min_lr = 0.01;
  s.cycle_max_lr = 0.1;
  s.cycle_first_step_size = 10;  // second: the same; total 20
  s.decay_step_size = 5;
  s.decay_lr_rate = 0.5;
  s.cycle_min_mom = 0.8;
  s.cycle_max_mom = 0.9;
  ScheduledHyperParams v = ScheduleAt(s, 0.5, 0);  // the constructor's values
  EXPECT_EQ(v.lr, 0.01);
  EXPECT_EQ(v.beta1, 0.8);
  EXPECT_EQ(v.beta2, 0.99);
  v = ScheduleAt(s, 0.5, 1);  // it = 0: batch 1, x = 1/20, scale 0.1
  EXPECT_NEAR(v.lr, 0.019, kTol);
  EXPECT_NEAR(*v.beta1, 0.89, kTol);
  v = ScheduleAt(s, 0.5, 10);  // it = 9: x = 0.5, the top
  EXPECT_NEAR(v.lr, 0.1, kTol);
  EXPECT_NEAR(*v.beta1, 0.8, kTol);
  v = ScheduleAt(s, 0.5, 15);  // it = 14: x = 0.75, scale (0.75 - 1) / (0.5 - 1) = 0.5
  EXPECT_NEAR(v.lr, 0.055, kTol);
  EXPECT_NEAR(*v.beta1, 0.85, kTol);
  v = ScheduleAt(s, 0.5, 20);  // it = 19: batch 20 starts cycle 2, x = 0
  EXPECT_NEAR(v.lr, 0.01, kTol);
  EXPECT_NEAR(*v.beta1, 0.9, kTol);
  v = ScheduleAt(s, 0.5, 21);  // it = 20: decay interval 1/5, 0.01 / 1.1
  EXPECT_NEAR(v.lr, 0.01 / 1.1, kTol);
  EXPECT_EQ(v.beta1, 0.9);              // no momentum decay: cycle_max_mom
  EXPECT_NEAR(Lr(s, 30), 0.005, kTol);  // it = 29: interval 2, 0.01 / 2
  // An asymmetric cycle: 4 up, 12 down (total 16, step_ratio 0.25).
  s.cycle_first_step_size = 4;
  s.cycle_second_step_size = 12;
  EXPECT_NEAR(Lr(s, 2), 0.01 + 0.09 * 0.5, kTol);   // it = 1: x = 2/16, scale 0.5
  EXPECT_NEAR(Lr(s, 10), 0.01 + 0.09 * 0.5, kTol);  // it = 9: x = 10/16, scale 0.5
  s.cycle_momentum = false;
  EXPECT_FALSE(ScheduleAt(s, 0.5, 3).beta1.has_value());
  EXPECT_FALSE(ScheduleAt(s, 0.5, 3).beta2.has_value());
  s.decay_step_size = 0;  // no decay after the cycle
  EXPECT_EQ(Lr(s, 100), 0.01);
}

// LRRangeTest: min * (1 + rate * it / step_size), the quotient floored with staircase.
TEST(LrScheduleTest, LrRangeTest) {
  SchedulerConfig s;
  s.type = "LRRangeTest";
  s.lr_range_test_min_lr = 0.001;
  s.lr_range_test_step_size = 10;
  s.lr_range_test_step_rate = 2.0;
  EXPECT_EQ(Lr(s, 0), 0.001);
  EXPECT_NEAR(Lr(s, 16), 0.004, kTol);  // it = 15: 1 + 2 * 1.5
  s.lr_range_test_staircase = true;
  EXPECT_NEAR(Lr(s, 16), 0.003, kTol);  // floor(1.5) = 1
  EXPECT_EQ(Lr(s, 5), 0.001);           // floor(0.4) = 0
}

}  // namespace
}  // namespace zinf
