// EngineConfig from DeepSpeed JSON: DeepSpeed's key names and defaults, unknown keys refused.
#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

#include "core/config_reader.h"
#include "nvme/aio_options.h"
#include "zinf/engine.h"

namespace zinf {
namespace {

// `ratio` is read for offload_optimizer only (DeepSpeed's offload_param has none).
void ReadOffload(ConfigReader& r, std::string* device, double* ratio, EngineConfig* c) {
  r.Enum("device", device, {"none", "cpu", "nvme"})
      .Strings("nvme_path", &c->nvme_path)
      .Bool("pin_memory", &c->pin_memory);
  if (ratio != nullptr) r.Double("ratio", ratio, 0.0, 1.0);
  // Sizing hints for DeepSpeed's own buffer scheme; zinf sizes its pools from budgets.
  r.Ignore("buffer_count")
      .Ignore("buffer_size")
      .Ignore("max_in_cpu")
      .Ignore("fast_init")
      .Ignore("pipeline_read")
      .Ignore("pipeline_write");
}

}  // namespace

StatusOr<EngineConfig> EngineConfig::FromJson(std::string_view json_text) {
  ZINF_ASSIGN_OR_RETURN(nlohmann::json json, ParseJson(json_text, "config"));
  EngineConfig c;
  ConfigReader root(json, "");
  root.Int("train_micro_batch_size_per_gpu", &c.micro_batch_size, 1, 1 << 30)
      .Ignore("train_batch_size")
      .Int("gradient_accumulation_steps", &c.gradient_accumulation_steps, 1, 1 << 20)
      .Double("gradient_clipping", &c.gradient_clipping, 0.0)
      .Ignore("steps_per_print")
      .Ignore("wall_clock_breakdown")
      .Ignore("zero_allow_untested_optimizer");
  root.Object("zero_optimization", [&](ConfigReader& z) {
    z.Int("stage", &c.zero_stage, 0, 3)
        .Bytes("reduce_bucket_size", &c.reduce_bucket_size, 1)
        .Bytes("stage3_param_persistence_threshold", &c.stage3_param_persistence_threshold)
        .Bytes("stage3_prefetch_bucket_size", &c.stage3_prefetch_bucket_size)
        .Bytes("stage3_max_live_parameters", &c.stage3_max_live_parameters)
        .Object("offload_param",
                [&](ConfigReader& o) { ReadOffload(o, &c.offload_param_device, nullptr, &c); })
        .Object("offload_optimizer",
                [&](ConfigReader& o) {
                  ReadOffload(o, &c.offload_optimizer_device, &c.offload_optimizer_ratio, &c);
                })
        // DeepSpeed's scheduling switches; zinf always overlaps and buckets.
        .Ignore("overlap_comm")
        .Ignore("contiguous_gradients")
        .Ignore("reduce_scatter")
        .Ignore("allgather_partitions")
        .Ignore("allgather_bucket_size")
        .Ignore("round_robin_gradients")
        .Ignore("sub_group_size")
        .Ignore("stage3_max_reuse_distance")
        .Ignore("stage3_gather_16bit_weights_on_model_save");
  });
  root.Object("fp16", [&](ConfigReader& f) {
    double fixed_scale = 0;
    f.Bool("enabled", &c.fp16)
        .Double("loss_scale", &fixed_scale, 0.0)
        .Double("initial_scale_power", &c.initial_scale_power, 0.0, 64.0)
        .Int("loss_scale_window", &c.loss_scale_window, 1, 1 << 30)
        .Int("hysteresis", &c.hysteresis, 1, 1 << 20)
        .Double("min_loss_scale", &c.min_loss_scale, 0.0);
    if (fixed_scale != 0) {
      f.Fail(
          InvalidArgument("config key 'fp16.loss_scale' (a fixed scale) is not supported; "
                          "use 0 for dynamic loss scaling"));
    }
  });
  root.Object("bf16", [&](ConfigReader& b) { b.Bool("enabled", &c.bf16); });
  root.Object("optimizer", [&](ConfigReader& o) {
    std::string type = "AdamW";
    o.String("type", &type);
    std::string lower = type;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char ch) { return std::tolower(ch); });
    if (lower != "adamw" && lower != "adam" && lower != "adagrad" && lower != "lion") {
      o.Fail(InvalidArgument(fmt::format(
          "config key 'optimizer.type' must be one of AdamW, Adam, Adagrad, Lion; got \"{}\"",
          type)));
    }
    c.optimizer_type = lower;
    o.Object("params", [&](ConfigReader& p) {
      std::vector<double> betas = {c.beta1, c.beta2};
      bool adam_w_mode = true;
      p.Double("lr", &c.lr, 0.0)
          .Doubles("betas", &betas, 2)
          .Double("eps", &c.eps, 0.0)
          .Double("weight_decay", &c.weight_decay, 0.0)
          .Bool("bias_correction", &c.bias_correction)
          .Bool("adam_w_mode", &adam_w_mode)
          .Ignore("torch_adam");
      c.beta1 = betas[0];
      c.beta2 = betas[1];
      if (p.Has("adam_w_mode") && c.optimizer_type == "adam" && adam_w_mode) {
        c.optimizer_type = "adamw";  // DeepSpeed's Adam with adam_w_mode is AdamW
      }
    });
  });
  root.Ignore("aio");  // checked in full by the NVMe layer's own reader:
  if (json.is_object() && json.contains("aio")) {
    AioOptions aio;
    root.Fail(ReadAioOptions(json["aio"], "aio", &aio));
    c.aio_json = json["aio"].dump();
  }
  root.Object("zinf", [&](ConfigReader& z) {
    z.Int("seed", &c.seed, 0, INT64_MAX)
        .Bytes("host_budget", &c.nvme_staging_budget_bytes, 1 << 20)
        .Bool("nvme_checksum", &c.nvme_checksum);
  });
  ZINF_RETURN_IF_ERROR(root.Finish());
  ZINF_RETURN_IF_ERROR(c.Validate());
  return c;
}

StatusOr<EngineConfig> EngineConfig::FromJsonFile(const std::string& path) {
  ZINF_ASSIGN_OR_RETURN(nlohmann::json json, ReadJsonFile(path));
  StatusOr<EngineConfig> c = FromJson(json.dump());
  if (!c.ok()) return c.status().WithContext(path);
  return c;
}

Status EngineConfig::Validate() const {
  if (zero_stage < 1 || zero_stage > 3) {
    return InvalidArgument(
        fmt::format("zero_optimization.stage must be 1, 2 or 3, got {}", zero_stage));
  }
  if (fp16 && bf16) return InvalidArgument("fp16.enabled and bf16.enabled are both true");
  if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1)) {
    return InvalidArgument(
        fmt::format("optimizer.params.betas must be in [0, 1), got [{}, {}]", beta1, beta2));
  }
  for (const std::string* device : {&offload_param_device, &offload_optimizer_device}) {
    if (*device == "nvme" && nvme_path.empty()) {
      return InvalidArgument("offload device nvme needs nvme_path");
    }
  }
  if (offload_param_device != "none" && zero_stage != 3) {
    return InvalidArgument(fmt::format(
        "zero_optimization.offload_param needs stage 3 (parameters are whole on every rank "
        "in stage {})",
        zero_stage));
  }
  return OkStatus();
}

}  // namespace zinf
