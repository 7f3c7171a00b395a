// See src/zero/loss_scaler.h.
#include "zero/loss_scaler.h"

#include <algorithm>
#include <cmath>

namespace zinf {

LossScaler LossScaler::FromConfig(const EngineConfig& config) {
  LossScaler s;
  s.enabled = config.fp16;
  s.hysteresis = config.hysteresis;
  s.window = config.loss_scale_window;
  s.min_scale = config.min_loss_scale;
  if (s.enabled) {
    s.scale = std::pow(2.0, config.initial_scale_power);
    s.hysteresis_left = config.hysteresis;
  }
  return s;
}

void LossScaler::Update(bool overflow) {
  if (!enabled) return;
  if (overflow) {
    if (hysteresis_left <= 1) {
      scale = std::max(scale / 2, min_scale);
    } else {
      --hysteresis_left;
    }
    last_overflow_iteration = iteration;
  } else if ((iteration - last_overflow_iteration) % window == 0) {
    scale *= 2;
    hysteresis_left = hysteresis;
  }
  ++iteration;
}

}  // namespace zinf
