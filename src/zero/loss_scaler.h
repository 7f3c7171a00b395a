// LossScaler: fp16 dynamic loss scaling, as DeepSpeed's DynamicLossScaler. The scale starts at
// 2^initial_scale_power; an overflow halves it (never below min_loss_scale) once `hysteresis`
// overflows have been absorbed; loss_scale_window steps without one double it. Without fp16
// the scale stays 1 and Update does nothing.
//
// Thread-safety: plain data; one thread drives it (the engine's).
#ifndef ZINF_ZERO_LOSS_SCALER_H_
#define ZINF_ZERO_LOSS_SCALER_H_

#include <cstdint>

#include "zinf/engine.h"

namespace zinf {

struct LossScaler {
  bool enabled = false;  // fp16
  double scale = 1.0;
  int hysteresis_left = 1;
  int64_t iteration = 0;  // steps seen, skipped ones included
  int64_t last_overflow_iteration = -1;
  // From the config; not saved in checkpoints.
  int hysteresis = 2;
  int window = 1000;
  double min_scale = 1;

  static LossScaler FromConfig(const EngineConfig& config);
  // After a step: `overflow` when its gradients were not finite (the step was skipped).
  void Update(bool overflow);
};

}  // namespace zinf

#endif  // ZINF_ZERO_LOSS_SCALER_H_
