// EngineConfig from DeepSpeed JSON: DeepSpeed's key names and defaults, unknown keys refused,
// keys zinf accepts without acting on them warned about by name, and "auto" values resolved
// from the trainer as Hugging Face's integration resolves them.
#include <fmt/core.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "core/config_reader.h"
#include "core/log.h"
#include "nvme/aio_options.h"
#include "zinf/engine.h"

// Note [Dropped "auto"]
// "auto" means two things in DeepSpeed configs. Where Hugging Face's or Accelerate's
// integration fills a key from the trainer (the batch keys, gradient_clipping, the optimizer's
// and scheduler's params, fp16/bf16.enabled, the hidden-size bucket sizes), zinf takes the
// value from TrainerValues, as they do, and without one falls back to the key's default with
// a warning naming where the value came from. Everywhere else in the sections DeepSpeed reads
// through its pydantic models (zero_optimization with its offload objects, fp16, bf16),
// DeepSpeed itself drops a key whose value is "auto" before validating, so the key keeps its
// default; ConfigReader::DropAuto does the same here, and each dropped key is a warning.
// zero_optimization.stage is the exception: DeepSpeed's default there is stage 0, which zinf
// does not have, so "auto" is refused rather than silently run as stage 3. Elsewhere (aio, the
// top-level keys DeepSpeed reads one by one) DeepSpeed would fail on the string, and so does
// zinf, naming the key.

namespace zinf {
namespace {

std::string Shown(const nlohmann::json& value) {
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return text.size() > 60 ? text.substr(0, 57) + "..." : text;
}

std::string KeyPath(const ConfigReader& r, std::string_view key) {
  return r.path().empty() ? std::string(key) : fmt::format("{}.{}", r.path(), key);
}

// One FromJson: the config being filled, the trainer's values, and the warnings.
class Parser {
 public:
  Parser(const TrainerValues& trainer, EngineConfig* c) : t_(trainer), c_(*c) {}

  // A key whose value zinf does not act on: a warning naming it, unless the value is one
  // that asks for what zinf does anyway (`harmless`).
  void Unused(ConfigReader& r, std::string_view key, std::string_view why,
              const std::optional<nlohmann::json>& harmless = std::nullopt) {
    const nlohmann::json* v = r.Raw(key);
    if (v == nullptr || (harmless && *v == *harmless)) return;
    Warn(fmt::format("config key '{}' = {} has no effect in zinf: {}", KeyPath(r, key), Shown(*v),
                     why));
  }
  // As Unused, for a key that must be true or false.
  void UnusedBool(ConfigReader& r, std::string_view key, std::optional<bool> harmless,
                  std::string_view why) {
    bool value = false;
    r.Bool(key, &value);
    if (!r.Has(key) || (harmless && value == *harmless)) return;
    Unused(r, key, why);
  }
  // As Unused, for an element count (checked, "auto" allowed).
  void UnusedElements(ConfigReader& r, std::string_view key, std::string_view why,
                      uint64_t* out = nullptr) {
    uint64_t ignored = 0;
    if (!r.IsAuto(key)) r.Elements(key, out != nullptr ? out : &ignored);
    Unused(r, key, why);
  }

  void Warn(std::string text) { c_.warnings.push_back(std::move(text)); }

  // A section with DeepSpeed's "enabled" flag that zinf does not act on: a warning naming it,
  // unless it is off (null, false, {} or "enabled": false).
  void UnusedSection(ConfigReader& r, std::string_view key, std::string_view why) {
    const nlohmann::json* v = r.Raw(key);
    if (v == nullptr || AsksForNothing(*v)) return;
    Unused(r, key, why);
  }
  // A key of DeepSpeed's that changes what is computed and that zinf does not implement:
  // accepted while its value asks for nothing (AsksForNothing, or `harmless`), refused naming
  // it otherwise, because running without it would give other numbers than DeepSpeed's
  // without a word.
  void Unsupported(ConfigReader& r, std::string_view key, std::string_view why,
                   const std::vector<nlohmann::json>& harmless = {}) {
    const nlohmann::json* v = r.Raw(key);
    if (v == nullptr || AsksForNothing(*v) ||
        std::find(harmless.begin(), harmless.end(), *v) != harmless.end()) {
      return;
    }
    r.Fail(InvalidArgument(fmt::format("config key '{}' = {} is not supported by zinf: {}",
                                       KeyPath(r, key), Shown(*v), why)));
  }
  static bool AsksForNothing(const nlohmann::json& v) {
    if (v.is_null() || (v.is_boolean() && !v.get<bool>())) return true;
    if (!v.is_object()) return false;
    const auto enabled = v.find("enabled");
    return v.empty() || (enabled != v.end() && enabled->is_boolean() && !enabled->get<bool>());
  }

  // For a key that may be "auto": the trainer's value when it has one, else `fallback`
  // (described by `fallback_what`). Returns whether the key was "auto".
  template <typename T>
  bool Auto(ConfigReader& r, std::string_view key, const std::optional<T>& trainer, T fallback,
            std::string_view fallback_what, T* out) {
    if (!r.IsAuto(key)) return false;
    *out = trainer.has_value() ? *trainer : fallback;
    // The trainer's value is what "auto" asks for; a default in its place may not be what the
    // user meant, so that one is a warning naming where the value came from.
    if (trainer.has_value()) {
      log::Info("config key '{}' is \"auto\": {} (from the trainer)", KeyPath(r, key), *out);
    } else {
      Warn(fmt::format("config key '{}' is \"auto\" and the trainer gave no value: {} ({})",
                       KeyPath(r, key), *out, fallback_what));
    }
    return true;
  }
  // For a key the config spells out: the trainer's value, when given, must agree (Hugging
  // Face refuses the mismatch too: one of the two is not what the user meant).
  template <typename T>
  void Match(ConfigReader& r, std::string_view key, const std::optional<T>& trainer, T value) {
    if (!trainer.has_value() || !r.Has(key) || *trainer == value) return;
    r.Fail(InvalidArgument(
        fmt::format("config key '{}' is {} but the trainer's value is {}; make them agree or set "
                    "the key to \"auto\"",
                    KeyPath(r, key), value, *trainer)));
  }

  void Root(ConfigReader& root);
  void TopLevelKeys(ConfigReader& root);
  void Zero(ConfigReader& z);
  void OffloadParam(ConfigReader& o);
  void OffloadOptimizer(ConfigReader& o);
  void Fp16(ConfigReader& f);
  void Optimizer(ConfigReader& o);
  void Scheduler(ConfigReader& s);
  void SchedulerParams(ConfigReader& p);
  void WarmupParams(ConfigReader& p, bool max_lr);
  void TotalNumSteps(ConfigReader& p);
  void OneCycleParams(ConfigReader& p);

 private:
  const TrainerValues& t_;
  EngineConfig& c_;
};

void Parser::Root(ConfigReader& root) {
  if (!Auto(root, "train_micro_batch_size_per_gpu", t_.micro_batch_size, 1,
            "the default; ResolveBatchSize derives it from train_batch_size if that is set",
            &c_.micro_batch_size)) {
    root.Int("train_micro_batch_size_per_gpu", &c_.micro_batch_size, 1, 1 << 30);
    Match(root, "train_micro_batch_size_per_gpu", t_.micro_batch_size, c_.micro_batch_size);
  }
  c_.micro_batch_size_set =
      root.Has("train_micro_batch_size_per_gpu") &&
      (!root.IsAuto("train_micro_batch_size_per_gpu") || t_.micro_batch_size.has_value());
  if (!Auto(root, "gradient_accumulation_steps", t_.gradient_accumulation_steps, 1,
            "the default; ResolveBatchSize derives it from train_batch_size if that is set",
            &c_.gradient_accumulation_steps)) {
    root.Int("gradient_accumulation_steps", &c_.gradient_accumulation_steps, 1, 1 << 20);
    Match(root, "gradient_accumulation_steps", t_.gradient_accumulation_steps,
          c_.gradient_accumulation_steps);
  }
  c_.gradient_accumulation_steps_set =
      root.Has("gradient_accumulation_steps") &&
      (!root.IsAuto("gradient_accumulation_steps") || t_.gradient_accumulation_steps.has_value());
  if (root.IsAuto("train_batch_size")) {
    log::Info(
        "config key 'train_batch_size' is \"auto\": micro-batch x accumulation x data-parallel "
        "ranks, settled when the engine knows the number of ranks");
  } else {
    root.Int("train_batch_size", &c_.train_batch_size, 1, int64_t{1} << 50);
  }
  if (!Auto(root, "gradient_clipping", t_.gradient_clipping, 0.0, "the default: no clipping",
            &c_.gradient_clipping)) {
    root.Double("gradient_clipping", &c_.gradient_clipping, 0.0);
    Match(root, "gradient_clipping", t_.gradient_clipping, c_.gradient_clipping);
  }
  Unused(root, "steps_per_print",
         "it prints nothing per step; Engine::Step returns a StepSummary for the trainer to log");
  UnusedBool(root, "wall_clock_breakdown", false,
             "it prints no timers; StepSummary has seconds_gather, seconds_reduce and "
             "seconds_optimizer for every step");
  UnusedBool(root, "memory_breakdown", false,
             "it prints no memory report; StepSummary has host_bytes and nvme_bytes");
  UnusedBool(root, "dump_state", false, "it prints no state dump");
  // Permission to run an optimizer DeepSpeed has not tested with ZeRO: every optimizer zinf
  // offers is its own and tested, so either value means the same here.
  bool allow_untested = false;
  root.Bool("zero_allow_untested_optimizer", &allow_untested);
  UnusedBool(root, "zero_force_ds_cpu_optimizer", true,
             "zinf always steps offloaded state with its own CPU optimizer");
  UnusedBool(root, "prescale_gradients", false,
             "zinf sums gradients in fp32 and divides once, after the reduction");
  Unused(root, "gradient_predivide_factor",
         "zinf sums gradients in fp32 and divides once, after the reduction", 1.0);
  Unsupported(root, "communication_data_type",
              "DeepSpeed would reduce gradients in that precision; zinf reduce-scatters them in "
              "fp32, which gives other numbers: remove the key or set it to \"fp32\"",
              {nlohmann::json("fp32")});
  Unused(root, "activation_checkpointing",
         "activation checkpointing is the trainer's; zinf sees parameters and gradients only");
  Unused(root, "checkpoint",
         "zinf's checkpoints are its own (Engine::SaveCheckpoint, `zinf ckpt export`)");
  TopLevelKeys(root);
  for (const char* monitor :
       {"tensorboard", "wandb", "csv_monitor", "comet", "comms_logger", "flops_profiler"}) {
    const nlohmann::json* v = root.Raw(monitor);
    if (v == nullptr) continue;
    const auto enabled = v->is_object() ? v->find("enabled") : v->end();
    const bool off =
        v->is_object() && enabled != v->end() && enabled->is_boolean() && !enabled->get<bool>();
    if (!off) {
      Warn(
          fmt::format("config key '{}' = {} has no effect in zinf: it has no built-in monitors; "
                      "StepSummary carries each step's figures for the trainer to log",
                      monitor, Shown(*v)));
    }
  }
}

// The rest of the top-level keys DeepSpeed's config reads (deepspeed/runtime/config.py), and
// two that shipped configs carry and DeepSpeed does not read: a key whose absence cannot change
// the numbers is a warning when it asks for something, one that would change them is refused
// (Parser::Unsupported), so that a DeepSpeed config runs here as it is, or not at all.
void Parser::TopLevelKeys(ConfigReader& root) {
  // LLaMA-Factory's ZeRO configs carry these; DeepSpeed reads neither (its communication
  // logger is "comms_logger", its monitors the top-level "tensorboard", "wandb", "csv_monitor"
  // and "comet"), so they ask for nothing there either.
  Unused(root, "comms_config",
         "DeepSpeed does not read it either (its communication logger is 'comms_logger')");
  Unused(root, "monitor_config",
         "DeepSpeed does not read it either (its monitors are the top-level 'tensorboard', "
         "'wandb', 'csv_monitor' and 'comet' keys)");
  UnusedBool(root, "disable_allgather", false,
             "zinf all-gathers each module's parameters itself at every fetch");
  UnusedBool(root, "sparse_gradients", false,
             "zinf reduces embedding gradients dense, to the same values");
  UnusedBool(root, "graph_harvesting", false, "zinf captures no CUDA graphs");
  UnusedBool(root, "use_data_before_expert_parallelism", false, "zinf has no expert parallelism");
  Unused(root, "log_level", "zinf logs through Python's logging (logger \"zinf\")");
  Unused(root, "vocabulary_size", "DeepSpeed uses it for its sparse embedding gradients only");
  Unused(root, "seq_parallel_communication_data_type", "zinf has no sequence parallelism",
         nlohmann::json("fp32"));
  UnusedSection(root, "autotuning", "autotuning is DeepSpeed's launcher's; zinf plan sizes zinf");
  UnusedSection(root, "eigenvalue", "zinf computes no Hessian eigenvalues");
  UnusedSection(root, "compile", "compiling the model is the trainer's (torch.compile)");
  UnusedSection(root, "timers", "zinf's StepSummary times every step");
  UnusedSection(root, "nebula",
                "zinf's checkpoints are its own (Engine::SaveCheckpoint, `zinf ckpt export`)");
  UnusedSection(root, "datastates",
                "zinf's checkpoints are its own (Engine::SaveCheckpoint, `zinf ckpt export`)");
  UnusedSection(root, "pipeline", "zinf has no pipeline parallelism");
  // What would change the numbers without it.
  bool managed = true;
  root.Bool("managed_gradient_accumulation", &managed);
  if (!managed) {
    root.Fail(InvalidArgument(
        "config key 'managed_gradient_accumulation' = false is not supported by zinf: the "
        "engine updates at the gradient accumulation boundary only (a trainer that owns the "
        "boundary calls set_gradient_accumulation_boundary)"));
  }
  Unsupported(root, "gradient_allreduce_op", "zinf averages gradients over ranks (\"mean\")",
              {nlohmann::json("mean")});
  Unsupported(root, "amp", "zinf has no Apex AMP; use the \"bf16\" or \"fp16\" section");
  Unsupported(root, "torch_autocast",
              "zinf does not autocast the forward; wrap it in torch.autocast in the trainer, or "
              "use the \"bf16\" or \"fp16\" section");
  // What zinf does anyway: every dtype fp32 (or left to DeepSpeed's default).
  const nlohmann::json* data_types = root.Raw("data_types");
  const bool all_fp32 =
      data_types != nullptr && data_types->is_object() &&
      std::all_of(data_types->begin(), data_types->end(),
                  [](const nlohmann::json& v) { return v.is_null() || v == "fp32"; });
  if (!all_fp32) {
    Unsupported(root, "data_types",
                "zinf accumulates gradients and keeps its master weights in fp32");
  }
  Unsupported(root, "sparse_attention", "zinf does not replace the model's attention");
  Unsupported(root, "progressive_layer_drop", "zinf drops no layers");
  Unsupported(root, "curriculum_learning", "zinf does not schedule the data");
  Unsupported(root, "data_efficiency", "zinf does not sample or route the data");
  Unsupported(root, "compression_training", "zinf does not compress the model");
  Unsupported(root, "quantize_training", "zinf does not quantize the model in training");
  Unsupported(root, "weight_quantization", "zinf does not quantize the weights");
  Unsupported(root, "hybrid_engine", "zinf has no inference kernels for generation");
  Unsupported(root, "expert_parallel", "zinf is data-parallel only");
  Unsupported(
      root, "tensor_parallel", "zinf is data-parallel only",
      {nlohmann::json::object({{"autotp_size", 1}}), nlohmann::json::object({{"autotp_size", 0}})});
}

// "none" | "cpu" | "nvme" (ConfigReader::Enum has checked it) as an OffloadDevice.
OffloadDevice ToOffloadDevice(const std::string& name) {
  return name == "nvme"  ? OffloadDevice::kNvme
         : name == "cpu" ? OffloadDevice::kCpu
                         : OffloadDevice::kNone;
}

void Parser::OffloadParam(ConfigReader& o) {
  std::string device(OffloadDeviceName(c_.offload_param_device));
  o.Enum("device", &device, {"none", "cpu", "nvme"})
      .Strings("nvme_path", &c_.offload_param_nvme_path);
  c_.offload_param_device = ToOffloadDevice(device);
  // The parameters' host copies and the optimizer's staging share the store's host tier:
  // pinned by default, and either section's pin_memory false unpins it (EngineConfig).
  bool pin = true;
  o.Bool("pin_memory", &pin);
  c_.pin_memory = c_.pin_memory && pin;
  // Sizing hints for DeepSpeed's own buffer scheme; zinf sizes its pools from budgets.
  int64_t count = 0;
  o.Int("buffer_count", &count, 0, 1 << 20);
  Unused(o, "buffer_count",
         "zinf reads parameters ahead within stage3_prefetch_bucket_size and "
         "stage3_max_live_parameters, not into a fixed buffer pool");
  UnusedElements(o, "buffer_size",
                 "zinf reads each parameter whole, not through fixed-size buffers");
  UnusedElements(o, "max_in_cpu",
                 "zinf keeps no host cache of NVMe-resident parameters beyond the gathered and "
                 "prefetched ones (stage3_max_live_parameters bounds those)");
}

void Parser::OffloadOptimizer(ConfigReader& o) {
  std::string device(OffloadDeviceName(c_.offload_optimizer_device));
  o.Enum("device", &device, {"none", "cpu", "nvme"});
  c_.offload_optimizer_device = ToOffloadDevice(device);
  bool pin = true;
  o.Bool("pin_memory", &pin);
  c_.pin_memory = c_.pin_memory && pin;
  o.Strings("nvme_path", &c_.offload_optimizer_nvme_path)
      .Double("ratio", &c_.offload_optimizer_cpu_ratio, 0.0, 1.0);
  if (o.Has("ratio") && c_.offload_optimizer_cpu_ratio < 1.0) {
    Warn(fmt::format(
        "config key '{}' = {} has no effect in zinf: DeepSpeed would keep {:.3g}% of the optimizer "
        "state on the GPU and step it there; zinf has no GPU optimizer and steps all of it on "
        "the CPU, as with ratio 1.0 (zinf's split of offloaded state between NVMe and host "
        "memory is zinf.optimizer_nvme_ratio)",
        KeyPath(o, "ratio"), c_.offload_optimizer_cpu_ratio,
        100.0 * (1.0 - c_.offload_optimizer_cpu_ratio)));
  }
  int64_t count = 0;
  o.Int("buffer_count", &count, 0, 1 << 20);
  Unused(o, "buffer_count",
         "zinf's NVMe optimizer step sizes its staging buffers from zinf.host_budget");
  UnusedBool(o, "pipeline_read", true,
             "zinf always reads the next chunk of optimizer state while stepping this one");
  UnusedBool(o, "pipeline_write", true,
             "zinf always writes the previous chunk of optimizer state while stepping this one");
  UnusedBool(o, "fast_init", false, "zinf initializes NVMe optimizer state in one pass anyway");
}

void Parser::Zero(ConfigReader& z) {
  // DeepSpeed drops "auto" in this section (its pydantic model's rule), so the stage falls to
  // its default 0, no ZeRO, which zinf does not have: refused rather than run as stage 3.
  if (z.IsAuto("stage")) {
    z.Fail(InvalidArgument(
        "config key 'zero_optimization.stage' is \"auto\": DeepSpeed drops it and runs stage 0 "
        "(no ZeRO), which zinf does not have; give 1, 2 or 3"));
    return;
  }
  // Every other "auto" here keeps its default, as in DeepSpeed (See Note [Dropped "auto"]).
  z.DropAuto();
  z.Int("stage", &c_.zero_stage, 0, 3);
  // Element counts; "auto" as Hugging Face fills them from the model's hidden size.
  const std::optional<int64_t> h = t_.hidden_size;
  const std::optional<uint64_t> h2 =
      h ? std::optional<uint64_t>(static_cast<uint64_t>(*h) * static_cast<uint64_t>(*h))
        : std::nullopt;
  if (!Auto(z, "reduce_bucket_size", h2, c_.reduce_bucket_size,
            "DeepSpeed's default; the trainer's hidden_size^2 when given",
            &c_.reduce_bucket_size)) {
    // 0 is DeepSpeed's "one parameter per bucket": buckets grow to the largest parameter.
    z.Elements("reduce_bucket_size", &c_.reduce_bucket_size);
  }
  if (!Auto(z, "stage3_prefetch_bucket_size",
            h2 ? std::optional<uint64_t>(static_cast<uint64_t>(0.9 * static_cast<double>(*h2)))
               : std::nullopt,
            c_.stage3_prefetch_bucket_size,
            "DeepSpeed's default; 0.9 x the trainer's hidden_size^2 when given",
            &c_.stage3_prefetch_bucket_size)) {
    z.Elements("stage3_prefetch_bucket_size", &c_.stage3_prefetch_bucket_size);
  }
  if (!Auto(z, "stage3_param_persistence_threshold",
            h ? std::optional<uint64_t>(10 * static_cast<uint64_t>(*h)) : std::nullopt,
            c_.stage3_param_persistence_threshold,
            "DeepSpeed's default; 10 x the trainer's hidden_size when given",
            &c_.stage3_param_persistence_threshold)) {
    z.Elements("stage3_param_persistence_threshold", &c_.stage3_param_persistence_threshold);
  }
  if (!Auto(z, "stage3_max_live_parameters", std::optional<uint64_t>(),
            c_.stage3_max_live_parameters, "DeepSpeed's default", &c_.stage3_max_live_parameters)) {
    z.Elements("stage3_max_live_parameters", &c_.stage3_max_live_parameters);
  }
  UnusedElements(z, "stage3_module_granularity_threshold",
                 "zinf.zero acts on it as it registers a PyTorch model's modules (small modules "
                 "fetched whole with their parent); a C++ or C trainer registers its own modules");
  UnusedElements(z, "stage3_max_reuse_distance",
                 "zinf releases a gathered parameter after its module unless it is under "
                 "stage3_param_persistence_threshold; it keeps no reuse window");
  UnusedElements(z, "sub_group_size",
                 "zinf's NVMe optimizer step works in chunks sized from zinf.host_budget, not "
                 "in sub-groups",
                 &c_.sub_group_size);
  UnusedElements(z, "allgather_bucket_size",
                 "zinf all-gathers each parameter whole; stage3_prefetch_bucket_size bounds "
                 "what is in flight");
  z.Object("offload_param", [&](ConfigReader& o) {
     OffloadParam(o);
   }).Object("offload_optimizer", [&](ConfigReader& o) { OffloadOptimizer(o); });
  // DeepSpeed's deprecated spellings of the offload objects.
  bool cpu_offload = false, cpu_offload_param = false, pin = true;
  z.Bool("cpu_offload", &cpu_offload)
      .Bool("cpu_offload_param", &cpu_offload_param)
      .Bool("cpu_offload_use_pin_memory", &pin);
  if (cpu_offload && !z.Has("offload_optimizer")) c_.offload_optimizer_device = OffloadDevice::kCpu;
  if (cpu_offload_param && !z.Has("offload_param")) c_.offload_param_device = OffloadDevice::kCpu;
  if (!pin) c_.pin_memory = false;
  // Hugging Face's documentation once showed "aio" here; DeepSpeed reads it at the top level.
  Unused(z, "aio", "DeepSpeed and zinf read \"aio\" at the top level of the config");
  // DeepSpeed's switches for what zinf always does; the other value is a warning.
  UnusedBool(z, "overlap_comm", true,
             "zinf always overlaps the gradient reduce-scatter with backward");
  UnusedBool(z, "contiguous_gradients", true,
             "zinf always accumulates gradients into one contiguous shard");
  UnusedBool(z, "reduce_scatter", true, "zinf always reduce-scatters gradients");
  UnusedBool(z, "allgather_partitions", true, "zinf always all-gathers parameters");
  UnusedBool(z, "load_from_fp32_weights", true,
             "zinf's checkpoints hold the fp32 master weights and always load from them");
  UnusedBool(z, "round_robin_gradients", false,
             "a stage 1 and 2 copy-order optimization of DeepSpeed's that zinf does not have");
  UnusedBool(z, "ignore_unused_parameters", false,
             "zinf needs every registered module's gradients reduced each micro-batch (Step "
             "names a module that was not)");
  UnusedBool(z, "elastic_checkpoint", false,
             "`zinf ckpt export` consolidates a checkpoint for any world size instead");
  // Read by the Python package's engine (save_16bit_model, zinf/engine.py), which takes the
  // key out before the config comes here; a trainer of the C++ engine saves a 16-bit model
  // with `zinf ckpt export --dtype bf16`.
  for (const char* key :
       {"stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save"}) {
    UnusedBool(z, key, false,
               "the engine checkpoints fp32 shards; zinf.initialize's engine reads it for "
               "save_16bit_model, and `zinf ckpt export --dtype bf16` writes the consolidated "
               "16-bit model");
  }
}

void Parser::Fp16(ConfigReader& f) {
  if (!Auto(f, "enabled", t_.fp16, false, "the default: off", &c_.fp16)) {
    f.Bool("enabled", &c_.fp16);
    Match(f, "enabled", t_.fp16, c_.fp16);
  }
  f.DropAuto();  // DeepSpeed's fp16 model drops "auto" too
  double fixed_scale = 0;
  f.Double("loss_scale", &fixed_scale, 0.0)
      .Double("initial_scale_power", &c_.initial_scale_power, 0.0, 64.0)
      .Int("loss_scale_window", &c_.loss_scale_window, 1, 1 << 30)
      .Int("hysteresis", &c_.hysteresis, 1, 1 << 20)
      .Double("min_loss_scale", &c_.min_loss_scale, 0.0);
  if (fixed_scale != 0) {
    f.Fail(
        InvalidArgument("config key 'fp16.loss_scale' (a fixed scale) is not supported; "
                        "use 0 for dynamic loss scaling"));
  }
  UnusedBool(f, "consecutive_hysteresis", false,
             "zinf refills the hysteresis only when the scale grows (DeepSpeed's default)");
  UnusedBool(f, "auto_cast", false, "casting the model's inputs is the trainer's");
  UnusedBool(f, "fp16_master_weights_and_grads", false,
             "zinf keeps fp32 master weights and gradients");
}

void Parser::Optimizer(ConfigReader& o) {
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
  c_.optimizer.type = lower == "adam"      ? OptimizerType::kAdam
                      : lower == "adagrad" ? OptimizerType::kAdagrad
                      : lower == "lion"    ? OptimizerType::kLion
                                           : OptimizerType::kAdamW;
  bool adam_w_mode = true;
  o.Object("params", [&](ConfigReader& p) {
    if (!Auto(p, "lr", t_.lr, c_.optimizer.lr, "zinf's default", &c_.optimizer.lr)) {
      p.Double("lr", &c_.optimizer.lr, 0.0);
      Match(p, "lr", t_.lr, c_.optimizer.lr);
    }
    if (p.IsAuto("betas")) {
      c_.optimizer.beta1 = t_.beta1.value_or(c_.optimizer.beta1);
      c_.optimizer.beta2 = t_.beta2.value_or(c_.optimizer.beta2);
      log::Info("config key 'optimizer.params.betas' is \"auto\": [{}, {}] ({})",
                c_.optimizer.beta1, c_.optimizer.beta2,
                t_.beta1 || t_.beta2 ? "from the trainer" : "the defaults");
    } else {
      std::vector<double> betas = {c_.optimizer.beta1, c_.optimizer.beta2};
      p.Doubles("betas", &betas, 2);
      c_.optimizer.beta1 = betas[0];
      c_.optimizer.beta2 = betas[1];
      if (p.Has("betas") && ((t_.beta1 && *t_.beta1 != c_.optimizer.beta1) ||
                             (t_.beta2 && *t_.beta2 != c_.optimizer.beta2))) {
        p.Fail(InvalidArgument(fmt::format(
            "config key 'optimizer.params.betas' is [{}, {}] but the trainer's betas are [{}, {}]; "
            "make them agree or set the key to \"auto\"",
            c_.optimizer.beta1, c_.optimizer.beta2, t_.beta1.value_or(c_.optimizer.beta1),
            t_.beta2.value_or(c_.optimizer.beta2))));
      }
    }
    if (!Auto(p, "eps", t_.eps, c_.optimizer.eps, "the default", &c_.optimizer.eps)) {
      p.Double("eps", &c_.optimizer.eps, 0.0);
      Match(p, "eps", t_.eps, c_.optimizer.eps);
    }
    if (!Auto(p, "weight_decay", t_.weight_decay, c_.optimizer.weight_decay, "the default",
              &c_.optimizer.weight_decay)) {
      p.Double("weight_decay", &c_.optimizer.weight_decay, 0.0);
      Match(p, "weight_decay", t_.weight_decay, c_.optimizer.weight_decay);
    }
    p.Bool("bias_correction", &c_.optimizer.bias_correction).Bool("adam_w_mode", &adam_w_mode);
    // torch_adam asks for torch's implementation; zinf's kernels compute torch's formulas
    // (cpu_optimizer.h), so either value gives the same numbers.
    bool torch_adam = false;
    p.Bool("torch_adam", &torch_adam);
  });
  // DeepSpeed's "Adam" is AdamW unless adam_w_mode is false (adam_w_mode defaults to true in
  // its engine); "AdamW" stays AdamW either way.
  if (c_.optimizer.type == OptimizerType::kAdam && adam_w_mode) {
    c_.optimizer.type = OptimizerType::kAdamW;
  }
}

void Parser::Scheduler(ConfigReader& s) {
  s.Enum("type", &c_.scheduler.type,
         {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest"});
  if (!s.Has("type") && s.Has("params")) {
    s.Fail(InvalidArgument(
        "config key 'scheduler.type' is missing; it must be one of WarmupLR, WarmupDecayLR, "
        "WarmupCosineLR, OneCycle, LRRangeTest"));
  }
  s.Object("params", [&](ConfigReader& p) { SchedulerParams(p); });
}

void Parser::SchedulerParams(ConfigReader& p) {
  SchedulerConfig& s = c_.scheduler;
  const std::string& type = s.type;
  const bool cosine = type == "WarmupCosineLR";
  // Only the parameters of this type are read: another type's is "not recognized", as
  // DeepSpeed's constructor refuses an unexpected argument.
  if (type == "WarmupLR" || type == "WarmupDecayLR" || cosine) {
    WarmupParams(p, /*max_lr=*/!cosine);
  }
  if (type == "WarmupDecayLR" || cosine) TotalNumSteps(p);
  if (cosine) {
    p.Double("warmup_min_ratio", &s.warmup_min_ratio, 0.0, 1.0)
        .Double("cos_min_ratio", &s.cos_min_ratio, 0.0, 1.0);
  }
  if (type == "OneCycle") OneCycleParams(p);
  if (type == "LRRangeTest") {
    p.Double("lr_range_test_min_lr", &s.lr_range_test_min_lr, 0.0)
        .Int("lr_range_test_step_size", &s.lr_range_test_step_size, 1, INT64_MAX / 2)
        .Double("lr_range_test_step_rate", &s.lr_range_test_step_rate, 0.0)
        .Bool("lr_range_test_staircase", &s.lr_range_test_staircase);
  }
  if (!type.empty()) {
    int64_t last = -1;
    p.Int("last_batch_iteration", &last);
    if (last != -1) {
      p.Fail(InvalidArgument(fmt::format(
          "config key 'scheduler.params.last_batch_iteration' must be -1, got {}; zinf resumes a "
          "schedule from the step count its checkpoints keep",
          last)));
    }
  }
  if (type == "WarmupDecayLR" && s.total_num_steps > 0 &&
      s.total_num_steps < std::max<int64_t>(2, s.warmup_num_steps)) {
    Warn(fmt::format(
        "config key 'scheduler.params.total_num_steps' = {} is less than warmup_num_steps ({}): "
        "the learning rate decays from the end of warmup and is 0 past {} steps",
        s.total_num_steps, s.warmup_num_steps, s.total_num_steps));
  }
}

// The warmup of WarmupLR, WarmupDecayLR (with `max_lr`: its learning rates) and WarmupCosineLR.
void Parser::WarmupParams(ConfigReader& p, bool max_lr) {
  SchedulerConfig& s = c_.scheduler;
  if (max_lr) {
    // Hugging Face's integration always fills it with 0: that is the trainer's value here.
    if (!Auto(p, "warmup_min_lr", std::optional<double>(0.0), 0.0, "", &s.warmup_min_lr)) {
      p.Double("warmup_min_lr", &s.warmup_min_lr, 0.0);
    }
    double lr = 0;
    if (Auto(p, "warmup_max_lr", t_.lr, c_.optimizer.lr, "optimizer.params.lr", &lr)) {
      s.warmup_max_lr = lr;
    } else if (p.Has("warmup_max_lr")) {
      p.Double("warmup_max_lr", &lr, 0.0);
      s.warmup_max_lr = lr;
      Match(p, "warmup_max_lr", t_.lr, lr);
    }
  }
  if (!Auto(p, "warmup_num_steps", t_.warmup_num_steps, s.warmup_num_steps, "DeepSpeed's default",
            &s.warmup_num_steps)) {
    p.Int("warmup_num_steps", &s.warmup_num_steps, 0, INT64_MAX / 2);
    Match(p, "warmup_num_steps", t_.warmup_num_steps, s.warmup_num_steps);
  }
  p.Enum("warmup_type", &s.warmup_type, {"log", "linear"});
}

// The schedule's length, of WarmupDecayLR and WarmupCosineLR.
void Parser::TotalNumSteps(ConfigReader& p) {
  SchedulerConfig& s = c_.scheduler;
  if (!p.IsAuto("total_num_steps")) {
    // Not matched against the trainer's: a schedule may be longer than one run (a run that
    // stops at step 300 of a 1000-step schedule and is resumed later).
    p.Int("total_num_steps", &s.total_num_steps, 1, INT64_MAX / 2);
    return;
  }
  if (t_.total_num_steps.has_value()) {
    s.total_num_steps = *t_.total_num_steps;
    log::Info("config key 'scheduler.params.total_num_steps' is \"auto\": {} (from the trainer)",
              s.total_num_steps);
  } else {
    p.Fail(InvalidArgument(
        "config key 'scheduler.params.total_num_steps' is \"auto\" and the trainer gave no "
        "total_num_steps (TrainerValues); set the number of optimizer steps"));
  }
}

void Parser::OneCycleParams(ConfigReader& p) {
  SchedulerConfig& s = c_.scheduler;
  for (const char* required : {"cycle_min_lr", "cycle_max_lr"}) {
    if (!p.Has(required)) {
      p.Fail(InvalidArgument(fmt::format(
          "config key 'scheduler.params.{}' is missing; OneCycle needs cycle_min_lr and "
          "cycle_max_lr",
          required)));
    }
  }
  int64_t second = 0;
  p.Double("cycle_min_lr", &s.cycle_min_lr, 0.0)
      .Double("cycle_max_lr", &s.cycle_max_lr, 0.0)
      .Double("decay_lr_rate", &s.decay_lr_rate, 0.0)
      .Int("cycle_first_step_size", &s.cycle_first_step_size, 1, INT64_MAX / 4)
      .Int("cycle_second_step_size", &second, 0, INT64_MAX / 4)
      .Int("decay_step_size", &s.decay_step_size, 0, INT64_MAX / 4)
      .Bool("cycle_momentum", &s.cycle_momentum)
      .Double("cycle_min_mom", &s.cycle_min_mom, 0.0)
      .Double("cycle_max_mom", &s.cycle_max_mom, 0.0)
      .Double("decay_mom_rate", &s.decay_mom_rate, 0.0);
  if (p.Has("cycle_second_step_size")) s.cycle_second_step_size = second;
  for (const char* stairs : {"cycle_first_stair_count", "cycle_second_stair_count"}) {
    int64_t count = 0;
    p.Int(stairs, &count, 0, INT64_MAX / 4);
    if (p.Has(stairs) && count != 0) {
      Unused(p, stairs,
             "DeepSpeed's OneCycle stores it but computes no stairs from it, and zinf "
             "computes the same learning rates");
    }
  }
  if (s.cycle_momentum && c_.optimizer.type == OptimizerType::kAdagrad) {
    s.cycle_momentum = false;
    Warn(
        "config key 'scheduler.params.cycle_momentum' has no effect with optimizer Adagrad, "
        "which has no betas (DeepSpeed turns it off too)");
  } else if (s.cycle_momentum && c_.optimizer.beta2 != 0.99) {
    Warn(
        fmt::format("config key 'scheduler.params.cycle_momentum' = true replaces "
                    "optimizer.params.betas[1] ({}) with 0.99, as DeepSpeed's OneCycle does",
                    c_.optimizer.beta2));
  }
}

}  // namespace

StatusOr<EngineConfig> EngineConfig::FromJson(std::string_view json_text,
                                              const TrainerValues& trainer) {
  ZINF_ASSIGN_OR_RETURN(nlohmann::json json, ParseJson(json_text, "config"));
  if (trainer.hidden_size.has_value() &&
      (*trainer.hidden_size <= 0 || *trainer.hidden_size > (int64_t{1} << 31))) {
    return InvalidArgument(fmt::format("TrainerValues::hidden_size must be in [1, 2^31], got {}",
                                       *trainer.hidden_size));
  }
  EngineConfig c;
  Parser parser(trainer, &c);
  ConfigReader root(json, "");
  parser.Root(root);
  root.Object("zero_optimization", [&](ConfigReader& z) { parser.Zero(z); });
  root.Object("fp16", [&](ConfigReader& f) { parser.Fp16(f); });
  // "bfloat16" is DeepSpeed's old name of the section; it reads "bf16" when both are there.
  const bool both_bf16 = json.is_object() && json.contains("bf16") && json.contains("bfloat16");
  if (both_bf16) {
    parser.Warn(
        "config key 'bfloat16' has no effect: 'bf16' is given too, and DeepSpeed reads 'bf16' "
        "('bfloat16' is its old name)");
  }
  for (const char* section : {"bf16", "bfloat16"}) {
    if (both_bf16 && std::string_view(section) == "bfloat16") {
      root.Ignore(section);
      continue;
    }
    root.Object(section, [&](ConfigReader& b) {
      if (!parser.Auto(b, "enabled", trainer.bf16, false, "the default: off", &c.bf16)) {
        b.Bool("enabled", &c.bf16);
        parser.Match(b, "enabled", trainer.bf16, c.bf16);
      }
      b.DropAuto();
      // DeepSpeed's bf16 options for its own optimizer wrapper: zinf keeps fp32 master weights
      // and accumulates gradients in fp32 whatever they say.
      parser.Unused(b, "immediate_grad_update",
                    "zinf accumulates gradients in fp32 and applies them at the step");
      parser.UnusedBool(b, "check_grad_overflow", false,
                        "zinf checks for non-finite gradients at every step");
    });
  }
  // The optimizer before the scheduler: warmup_max_lr "auto" and WarmupCosineLR use its lr.
  root.Object("optimizer", [&](ConfigReader& o) { parser.Optimizer(o); });
  root.Object("scheduler", [&](ConfigReader& s) { parser.Scheduler(s); });
  root.Ignore("aio");  // read and checked in full by the NVMe layer's own reader:
  if (json.is_object() && json.contains("aio"))
    root.Fail(ReadAioOptions(json["aio"], "aio", &c.aio));
  root.Object("zinf", [&](ConfigReader& z) {
    z.Int("seed", &c.seed, 0, INT64_MAX)
        .Bytes("host_budget", &c.nvme_staging_budget_bytes, 1 << 20)
        .Bytes("device_budget", &c.device_budget_bytes, 0)
        .Bool("nvme_checksum", &c.nvme_checksum)
        .Bool("overlap_optimizer", &c.overlap_optimizer)
        .Bytes("overlap_optimizer_swap_bytes", &c.overlap_optimizer_swap_bytes, 0)
        .Bool("step_beside_forward", &c.step_beside_forward)
        .Bool("delayed_param_update", &c.delayed_param_update)
        .Bool("gradients_on_nvme", &c.gradients_on_nvme)
        .Bool("layer_major", &c.layer_major)
        .Int("delayed_param_update_warmup_steps", &c.delayed_param_update_warmup_steps, 0,
             INT64_MAX)
        .Double("optimizer_nvme_ratio", &c.optimizer_nvme_ratio, 0.0, 1.0);
  });
  for (const std::string& key : root.dropped()) {
    parser.Warn(fmt::format(
        "config key '{}' is \"auto\": it keeps its default, as in DeepSpeed, which drops "
        "\"auto\" in this section (no trainer value fills it)",
        key));
  }
  ZINF_RETURN_IF_ERROR(root.Finish());
  ZINF_RETURN_IF_ERROR(c.Validate());
  for (const std::string& warning : c.warnings) log::Warn("{}", warning);
  return c;
}

StatusOr<EngineConfig> EngineConfig::FromJsonFile(const std::string& path,
                                                  const TrainerValues& trainer) {
  ZINF_ASSIGN_OR_RETURN(nlohmann::json json, ReadJsonFile(path));
  StatusOr<EngineConfig> c = FromJson(json.dump(), trainer);
  if (!c.ok()) return c.status().WithContext(path);
  return c;
}

}  // namespace zinf
