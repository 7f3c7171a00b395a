// EngineConfig once parsed: its checks (Validate names the bad key, its value and what is
// allowed), the batch-size arithmetic that needs the world size, and what is derived from it.
// The parsing from DeepSpeed JSON is in engine_config.cc.
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "zinf/engine.h"

namespace zinf {

std::string_view OffloadDeviceName(OffloadDevice device) {
  switch (device) {
    case OffloadDevice::kNone:
      return "none";
    case OffloadDevice::kCpu:
      return "cpu";
    case OffloadDevice::kNvme:
      return "nvme";
  }
  return "unknown";
}

namespace {

Status ValidateScheduler(const SchedulerConfig& s) {
  const std::string& t = s.type;
  if (t.empty()) return OkStatus();
  if (t != "WarmupLR" && t != "WarmupDecayLR" && t != "WarmupCosineLR" && t != "OneCycle" &&
      t != "LRRangeTest") {
    return InvalidArgument(fmt::format(
        "scheduler.type must be one of WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, "
        "LRRangeTest; got \"{}\"",
        t));
  }
  auto rate = [](const char* key, double v) -> Status {
    if (std::isfinite(v) && v >= 0) return OkStatus();
    return InvalidArgument(
        fmt::format("scheduler.params.{} must be a finite number >= 0, got {}", key, v));
  };
  if (s.warmup_type != "log" && s.warmup_type != "linear") {
    return InvalidArgument(fmt::format(
        "scheduler.params.warmup_type must be \"log\" or \"linear\", got \"{}\"", s.warmup_type));
  }
  if (s.warmup_num_steps < 0) {
    return InvalidArgument(
        fmt::format("scheduler.params.warmup_num_steps must be >= 0, got {}", s.warmup_num_steps));
  }
  const int64_t warmup = std::max<int64_t>(2, s.warmup_num_steps);
  if (t == "WarmupLR" || t == "WarmupDecayLR") {
    ZINF_RETURN_IF_ERROR(rate("warmup_min_lr", s.warmup_min_lr));
    if (s.warmup_max_lr) ZINF_RETURN_IF_ERROR(rate("warmup_max_lr", *s.warmup_max_lr));
  }
  if ((t == "WarmupDecayLR" || t == "WarmupCosineLR") && s.total_num_steps <= 0) {
    return InvalidArgument(fmt::format(
        "scheduler.params.total_num_steps must be > 0 for {} (DeepSpeed requires it), got {}", t,
        s.total_num_steps));
  }
  if (t == "WarmupCosineLR") {
    // The cosine divides by the steps after warmup.
    if (s.total_num_steps <= warmup) {
      return InvalidArgument(fmt::format(
          "scheduler.params.total_num_steps must be more than warmup_num_steps (at least 2) for "
          "WarmupCosineLR, got {} and {}",
          s.total_num_steps, s.warmup_num_steps));
    }
    for (auto [key, v] : {std::pair{"warmup_min_ratio", s.warmup_min_ratio},
                          std::pair{"cos_min_ratio", s.cos_min_ratio}}) {
      if (!(v >= 0 && v <= 1)) {
        return InvalidArgument(
            fmt::format("scheduler.params.{} must be in [0, 1], got {}", key, v));
      }
    }
  }
  if (t == "OneCycle") {
    ZINF_RETURN_IF_ERROR(rate("cycle_min_lr", s.cycle_min_lr));
    ZINF_RETURN_IF_ERROR(rate("cycle_max_lr", s.cycle_max_lr));
    ZINF_RETURN_IF_ERROR(rate("decay_lr_rate", s.decay_lr_rate));
    ZINF_RETURN_IF_ERROR(rate("decay_mom_rate", s.decay_mom_rate));
    if (s.cycle_first_step_size < 1 || s.cycle_second_step_size.value_or(1) < 0 ||
        s.decay_step_size < 0) {
      return InvalidArgument(fmt::format(
          "scheduler.params.cycle_first_step_size must be >= 1 and cycle_second_step_size and "
          "decay_step_size >= 0, got {}, {} and {}",
          s.cycle_first_step_size, s.cycle_second_step_size.value_or(s.cycle_first_step_size),
          s.decay_step_size));
    }
    for (auto [key, v] : {std::pair{"cycle_min_mom", s.cycle_min_mom},
                          std::pair{"cycle_max_mom", s.cycle_max_mom}}) {
      if (!(v >= 0 && v < 1)) {
        return InvalidArgument(fmt::format(
            "scheduler.params.{} must be in [0, 1) (it becomes beta1), got {}", key, v));
      }
    }
  }
  if (t == "LRRangeTest") {
    ZINF_RETURN_IF_ERROR(rate("lr_range_test_min_lr", s.lr_range_test_min_lr));
    ZINF_RETURN_IF_ERROR(rate("lr_range_test_step_rate", s.lr_range_test_step_rate));
    if (s.lr_range_test_step_size < 1) {
      return InvalidArgument(
          fmt::format("scheduler.params.lr_range_test_step_size must be >= 1, got {}",
                      s.lr_range_test_step_size));
    }
  }
  return OkStatus();
}

}  // namespace

Status EngineConfig::Validate() const {
  if (zero_stage < 1 || zero_stage > 3) {
    return InvalidArgument(
        fmt::format("zero_optimization.stage must be 1, 2 or 3, got {}", zero_stage));
  }
  if (fp16 && bf16) return InvalidArgument("fp16.enabled and bf16.enabled are both true");
  if (gradients_on_nvme && offload_optimizer_device != OffloadDevice::kNvme) {
    return InvalidArgument(
        "zinf.gradients_on_nvme needs offload_optimizer.device nvme: the gradients live beside "
        "the optimizer state there");
  }
  if (delayed_param_update && offload_optimizer_device == OffloadDevice::kNvme) {
    return InvalidArgument(
        "zinf.delayed_param_update needs offload_optimizer.device cpu or none: with the "
        "optimizer state on NVMe the step overlaps backward instead (zinf.overlap_optimizer)");
  }
  if (micro_batch_size < 1 || gradient_accumulation_steps < 1 || train_batch_size < 0) {
    return InvalidArgument(fmt::format(
        "train_micro_batch_size_per_gpu and gradient_accumulation_steps must be >= 1 and "
        "train_batch_size >= 0, got {}, {} and {}",
        micro_batch_size, gradient_accumulation_steps, train_batch_size));
  }
  for (auto [key, v] : {std::pair{"optimizer.params.lr", optimizer.lr},
                        std::pair{"optimizer.params.eps", optimizer.eps},
                        std::pair{"optimizer.params.weight_decay", optimizer.weight_decay},
                        std::pair{"gradient_clipping", gradient_clipping}}) {
    if (!(std::isfinite(v) && v >= 0)) {
      return InvalidArgument(fmt::format("{} must be a finite number >= 0, got {}", key, v));
    }
  }
  if (!(optimizer.beta1 >= 0 && optimizer.beta1 < 1) ||
      !(optimizer.beta2 >= 0 && optimizer.beta2 < 1)) {
    return InvalidArgument(fmt::format("optimizer.params.betas must be in [0, 1), got [{}, {}]",
                                       optimizer.beta1, optimizer.beta2));
  }
  if (offload_param_device == OffloadDevice::kNvme && offload_param_nvme_path.empty()) {
    return InvalidArgument(
        "zero_optimization.offload_param.device is \"nvme\" but "
        "zero_optimization.offload_param.nvme_path is not set");
  }
  if (offload_optimizer_device == OffloadDevice::kNvme && offload_optimizer_nvme_path.empty()) {
    return InvalidArgument(
        "zero_optimization.offload_optimizer.device is \"nvme\" but "
        "zero_optimization.offload_optimizer.nvme_path is not set");
  }
  for (auto [key, v] :
       {std::pair{"zero_optimization.offload_optimizer.ratio", offload_optimizer_cpu_ratio},
        std::pair{"zinf.optimizer_nvme_ratio", optimizer_nvme_ratio}}) {
    if (!(v >= 0 && v <= 1)) {
      return InvalidArgument(fmt::format("{} must be in [0, 1], got {}", key, v));
    }
  }
  if (offload_param_device != OffloadDevice::kNone && zero_stage != 3) {
    return InvalidArgument(fmt::format(
        "zero_optimization.offload_param needs stage 3 (parameters are whole on every rank "
        "in stage {})",
        zero_stage));
  }
  return ValidateScheduler(scheduler);
}

Status EngineConfig::ResolveBatchSize(int world_size) {
  if (world_size < 1) {
    return InvalidArgument(fmt::format("world size must be >= 1, got {}", world_size));
  }
  const int64_t world = world_size;
  const int64_t tbs = train_batch_size;
  auto mismatch = [&](std::string_view what) {
    return InvalidArgument(fmt::format(
        "train_batch_size {} must equal train_micro_batch_size_per_gpu x "
        "gradient_accumulation_steps x {} data-parallel rank(s){}; got micro-batch {} and "
        "accumulation {}",
        tbs, world, what, micro_batch_size, gradient_accumulation_steps));
  };
  if (tbs == 0) {  // not given, or "auto": the product is the batch
    train_batch_size = int64_t{micro_batch_size} * gradient_accumulation_steps * world;
    micro_batch_size_set = gradient_accumulation_steps_set = true;  // settled: a second call checks
    return OkStatus();
  }
  // DeepSpeed's order: given the batch and the micro-batch, derive the accumulation; given the
  // batch and the accumulation, the micro-batch; given the batch alone, accumulation 1.
  if (!gradient_accumulation_steps_set) {
    const int64_t micro = micro_batch_size_set ? micro_batch_size : tbs / world;
    if (micro < 1 || tbs % (micro * world) != 0 || tbs / (micro * world) > (1 << 20)) {
      return mismatch(" (gradient_accumulation_steps, not set, cannot be derived)");
    }
    gradient_accumulation_steps = static_cast<int>(tbs / (micro * world));
    if (!micro_batch_size_set) {
      if (micro > (1 << 30)) return mismatch("");
      micro_batch_size = static_cast<int>(micro);
    }
  } else if (!micro_batch_size_set) {
    const int64_t per_micro = int64_t{gradient_accumulation_steps} * world;
    if (tbs % per_micro != 0 || tbs / per_micro > (1 << 30)) {
      return mismatch(" (train_micro_batch_size_per_gpu, not set, cannot be derived)");
    }
    micro_batch_size = static_cast<int>(tbs / per_micro);
  }
  if (int64_t{micro_batch_size} * gradient_accumulation_steps * world != tbs) return mismatch("");
  micro_batch_size_set = gradient_accumulation_steps_set = true;
  return OkStatus();
}

std::string EngineConfig::BatchShape(int world_size) const {
  return fmt::format(
      "train_batch_size {} = micro-batch {} x gradient accumulation {} x {} data-parallel "
      "rank(s)",
      train_batch_size, micro_batch_size, gradient_accumulation_steps, world_size);
}

std::vector<std::string> EngineConfig::NvmePaths() const {
  std::vector<std::string> paths;
  for (const auto* list : {&offload_param_nvme_path, &offload_optimizer_nvme_path}) {
    for (const std::string& p : *list) {
      if (std::find(paths.begin(), paths.end(), p) == paths.end()) paths.push_back(p);
    }
  }
  return paths;
}

}  // namespace zinf
