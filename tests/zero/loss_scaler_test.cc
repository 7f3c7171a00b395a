// LossScaler against DeepSpeed's DynamicLossScaler: hysteresis, the growth window, the floor.
#include "zero/loss_scaler.h"

#include <gtest/gtest.h>

namespace zinf {
namespace {

TEST(LossScalerTest, FollowsDeepSpeedsDynamicLossScaler) {
  EngineConfig config;
  config.fp16 = true;
  config.initial_scale_power = 4;
  config.hysteresis = 2;
  config.loss_scale_window = 3;
  config.min_loss_scale = 4;
  LossScaler s = LossScaler::FromConfig(config);
  EXPECT_EQ(s.scale, 16);
  s.Update(true);  // absorbed by the hysteresis
  EXPECT_EQ(s.scale, 16);
  s.Update(true);
  EXPECT_EQ(s.scale, 8);
  s.Update(false);
  s.Update(false);
  EXPECT_EQ(s.scale, 8);
  s.Update(false);  // three good steps since the overflow
  EXPECT_EQ(s.scale, 16);
  EXPECT_EQ(s.hysteresis_left, 2);
  for (int i = 0; i < 6; ++i) s.Update(true);
  EXPECT_EQ(s.scale, 4) << "never below min_loss_scale";
  EXPECT_EQ(s.iteration, 11);
}

TEST(LossScalerTest, WithoutFp16TheScaleIsOne) {
  LossScaler s = LossScaler::FromConfig(EngineConfig());
  s.Update(true);
  s.Update(false);
  EXPECT_EQ(s.scale, 1);
  EXPECT_EQ(s.iteration, 0);
}

}  // namespace
}  // namespace zinf
