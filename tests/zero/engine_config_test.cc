// EngineConfig from DeepSpeed JSON as users write it: schedulers, "auto" values resolved from
// the trainer, train_batch_size against the world size, keys zinf accepts but does not act on
// (warnings, by name), element counts, the two nvme_paths and offload_optimizer.ratio; the
// engine applying the scheduler at each step; DeepSpeed's own leniencies. Published configs
// are in published_configs_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tests/zero/engine_config_testing.h"
#include "zinf/engine.h"

namespace zinf {
namespace {

using testing::ErrorOf;
using testing::WarnedKeys;

// ---- scheduler ----

TEST(EngineConfigTest, SchedulersTakeDeepSpeedsNamesAndDefaults) {
  auto c = EngineConfig::FromJson(R"({"scheduler": {"type": "WarmupDecayLR", "params": {
      "warmup_min_lr": 1e-6, "warmup_max_lr": 3e-4, "warmup_num_steps": 100,
      "warmup_type": "linear", "total_num_steps": 5000, "last_batch_iteration": -1}}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->scheduler.type, "WarmupDecayLR");
  EXPECT_EQ(c->scheduler.warmup_min_lr, 1e-6);
  EXPECT_EQ(c->scheduler.warmup_max_lr, 3e-4);
  EXPECT_EQ(c->scheduler.warmup_num_steps, 100);
  EXPECT_EQ(c->scheduler.warmup_type, "linear");
  EXPECT_EQ(c->scheduler.total_num_steps, 5000);
  EXPECT_TRUE(c->warnings.empty());

  c = EngineConfig::FromJson(R"({"scheduler": {"type": "WarmupLR"}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->scheduler.warmup_num_steps, 1000);
  EXPECT_EQ(c->scheduler.warmup_type, "log");
  EXPECT_FALSE(c->scheduler.warmup_max_lr.has_value());  // the optimizer's lr

  c = EngineConfig::FromJson(R"({"scheduler": {"type": "WarmupCosineLR", "params": {
      "total_num_steps": 2000, "warmup_min_ratio": 0.1, "warmup_num_steps": 50,
      "cos_min_ratio": 0.01, "warmup_type": "log"}}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->scheduler.cos_min_ratio, 0.01);
  EXPECT_EQ(c->scheduler.warmup_min_ratio, 0.1);

  c = EngineConfig::FromJson(R"({"scheduler": {"type": "OneCycle", "params": {
      "cycle_min_lr": 1e-5, "cycle_max_lr": 1e-3, "decay_lr_rate": 0.1,
      "cycle_first_step_size": 300, "cycle_second_step_size": 700, "decay_step_size": 50,
      "cycle_momentum": true, "cycle_min_mom": 0.85, "cycle_max_mom": 0.95,
      "decay_mom_rate": 0.0}}, "optimizer": {"type": "AdamW", "params": {"betas": [0.9, 0.99]}}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->scheduler.cycle_second_step_size, 700);
  EXPECT_EQ(c->scheduler.cycle_min_mom, 0.85);
  EXPECT_TRUE(c->warnings.empty()) << c->warnings[0];  // beta2 already 0.99

  c = EngineConfig::FromJson(R"({"scheduler": {"type": "LRRangeTest", "params": {
      "lr_range_test_min_lr": 1e-4, "lr_range_test_step_size": 100,
      "lr_range_test_step_rate": 5, "lr_range_test_staircase": true}}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->scheduler.lr_range_test_staircase);
}

TEST(EngineConfigTest, SchedulerErrorsNameTheKey) {
  EXPECT_HAS(ErrorOf(R"({"scheduler": {"type": "CosineAnnealing"}})"),
             "'scheduler.type' must be one of WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle");
  // Another type's parameter is refused, as DeepSpeed's constructor refuses it.
  EXPECT_HAS(ErrorOf(R"({"scheduler": {"type": "WarmupLR", "params": {"total_num_steps": 10}}})"),
             "'scheduler.params.total_num_steps' is not recognized");
  EXPECT_HAS(ErrorOf(R"({"scheduler": {"type": "WarmupDecayLR"}})"),
             "scheduler.params.total_num_steps must be > 0 for WarmupDecayLR");
  EXPECT_HAS(ErrorOf(R"({"scheduler": {"type": "WarmupCosineLR", "params": {
                 "total_num_steps": 100, "warmup_num_steps": 100}}})"),
             "total_num_steps must be more than warmup_num_steps");
  EXPECT_HAS(ErrorOf(R"({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.1}}})"),
             "'scheduler.params.cycle_max_lr' is missing");
  EXPECT_HAS(ErrorOf(R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "exp"}}})"),
             "'scheduler.params.warmup_type' must be one of log, linear; got \"exp\"");
  EXPECT_HAS(
      ErrorOf(R"({"scheduler": {"type": "WarmupLR", "params": {"last_batch_iteration": 99}}})"),
      "'scheduler.params.last_batch_iteration' must be -1, got 99");
  EXPECT_HAS(ErrorOf(R"({"scheduler": {"params": {"warmup_min_lr": 0}}})"),
             "'scheduler.type' is missing");
  EXPECT_HAS(ErrorOf(R"({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.1,
                 "cycle_max_lr": 1, "cycle_max_mom": 1.0}}})"),
             "scheduler.params.cycle_max_mom must be in [0, 1)");
}

TEST(EngineConfigTest, OneCycleWarnsWhereItDiffersFromTheConfig) {
  // Stair counts: stored by DeepSpeed, never used.
  auto c = EngineConfig::FromJson(R"({"scheduler": {"type": "OneCycle", "params": {
      "cycle_min_lr": 0.001, "cycle_max_lr": 0.01, "cycle_first_stair_count": 4,
      "cycle_momentum": false}}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(WarnedKeys(*c), std::vector<std::string>{"scheduler.params.cycle_first_stair_count"});
  // Momentum cycling replaces beta2 with 0.99, as DeepSpeed's does; the warning says so.
  c = EngineConfig::FromJson(R"({"scheduler": {"type": "OneCycle", "params": {
      "cycle_min_lr": 0.001, "cycle_max_lr": 0.01}}})");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->warnings.size(), 1u);
  EXPECT_HAS(c->warnings[0], "replaces optimizer.params.betas[1] (0.999) with 0.99");
  // Adagrad has no betas: momentum cycling is off, as in DeepSpeed.
  c = EngineConfig::FromJson(R"({"optimizer": {"type": "Adagrad"}, "scheduler": {"type":
      "OneCycle", "params": {"cycle_min_lr": 0.001, "cycle_max_lr": 0.01}}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->scheduler.cycle_momentum);
  EXPECT_EQ(WarnedKeys(*c), std::vector<std::string>{"scheduler.params.cycle_momentum"});
  // WarmupDecayLR with fewer total steps than warmup steps: DeepSpeed warns, so does zinf.
  c = EngineConfig::FromJson(R"({"scheduler": {"type": "WarmupDecayLR", "params": {
      "total_num_steps": 10, "warmup_num_steps": 100}}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(WarnedKeys(*c), std::vector<std::string>{"scheduler.params.total_num_steps"});
}

// ---- "auto" ----

constexpr const char* kAutoConfig = R"({
  "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
  "train_batch_size": "auto", "gradient_clipping": "auto",
  "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
  "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
    "weight_decay": "auto"}},
  "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto",
    "warmup_max_lr": "auto", "warmup_num_steps": "auto", "total_num_steps": "auto"}},
  "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
    "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
    "stage3_max_live_parameters": "auto"}})";

TEST(EngineConfigTest, AutoTakesTheTrainersValues) {
  const TrainerValues trainer = {.micro_batch_size = 4,
                                 .gradient_accumulation_steps = 2,
                                 .gradient_clipping = 1.0,
                                 .lr = 3e-5,
                                 .beta1 = 0.9,
                                 .beta2 = 0.95,
                                 .eps = 1e-6,
                                 .weight_decay = 0.1,
                                 .total_num_steps = 1000,
                                 .warmup_num_steps = 30,
                                 .fp16 = false,
                                 .bf16 = true,
                                 .hidden_size = 1024};
  auto c = EngineConfig::FromJson(kAutoConfig, trainer);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->micro_batch_size, 4);
  EXPECT_EQ(c->gradient_accumulation_steps, 2);
  EXPECT_TRUE(c->micro_batch_size_set && c->gradient_accumulation_steps_set);
  EXPECT_EQ(c->train_batch_size, 0);  // settled by ResolveBatchSize
  EXPECT_EQ(c->gradient_clipping, 1.0);
  EXPECT_TRUE(c->bf16);
  EXPECT_FALSE(c->fp16);
  EXPECT_EQ(c->optimizer.lr, 3e-5);
  EXPECT_EQ(c->optimizer.beta2, 0.95);
  EXPECT_EQ(c->optimizer.eps, 1e-6);
  EXPECT_EQ(c->optimizer.weight_decay, 0.1);
  EXPECT_EQ(c->scheduler.warmup_min_lr, 0.0);  // Hugging Face's fixed choice
  EXPECT_EQ(c->scheduler.warmup_max_lr, 3e-5);
  EXPECT_EQ(c->scheduler.warmup_num_steps, 30);
  EXPECT_EQ(c->scheduler.total_num_steps, 1000);
  EXPECT_EQ(c->reduce_bucket_size, 1024u * 1024u);                // hidden^2
  EXPECT_EQ(c->stage3_prefetch_bucket_size, 943718u);             // int(0.9 * hidden^2)
  EXPECT_EQ(c->stage3_param_persistence_threshold, 10u * 1024u);  // 10 * hidden
  EXPECT_EQ(c->stage3_max_live_parameters, 1000000000u);          // DeepSpeed's default
  ASSERT_TRUE(c->ResolveBatchSize(4).ok());
  EXPECT_EQ(c->train_batch_size, 32);  // 4 x 2 x 4 ranks
}

TEST(EngineConfigTest, AutoWithoutTheTrainerTakesTheDefaults) {
  // Everything but total_num_steps has a default; that one has nothing to come from.
  EXPECT_HAS(ErrorOf(kAutoConfig),
             "'scheduler.params.total_num_steps' is \"auto\" and the "
             "trainer gave no total_num_steps");
  auto c = EngineConfig::FromJson(kAutoConfig, {.total_num_steps = 500});
  ASSERT_TRUE(c.ok()) << c.status();
  const EngineConfig d;
  EXPECT_EQ(c->micro_batch_size, 1);
  EXPECT_FALSE(c->micro_batch_size_set);  // left for ResolveBatchSize to derive
  EXPECT_EQ(c->gradient_clipping, 0.0);
  EXPECT_FALSE(c->fp16 || c->bf16);
  EXPECT_EQ(c->optimizer.lr, d.optimizer.lr);
  EXPECT_EQ(c->optimizer.beta1, d.optimizer.beta1);
  EXPECT_EQ(c->optimizer.beta2, d.optimizer.beta2);
  EXPECT_EQ(c->scheduler.warmup_max_lr, d.optimizer.lr);  // the optimizer's (resolved) lr
  EXPECT_EQ(c->scheduler.warmup_num_steps, 1000);
  EXPECT_EQ(c->reduce_bucket_size, d.reduce_bucket_size);
  EXPECT_EQ(c->stage3_prefetch_bucket_size, d.stage3_prefetch_bucket_size);
  EXPECT_EQ(c->stage3_param_persistence_threshold, d.stage3_param_persistence_threshold);
}

TEST(EngineConfigTest, TrainerValuesMustAgreeWithSpelledOutKeys) {
  EXPECT_HAS(ErrorOf(R"({"optimizer": {"params": {"lr": 0.001}}})", {.lr = 0.002}),
             "'optimizer.params.lr' is 0.001 but the trainer's value is 0.002");
  EXPECT_HAS(ErrorOf(R"({"gradient_accumulation_steps": 4})", {.gradient_accumulation_steps = 2}),
             "'gradient_accumulation_steps' is 4 but the trainer's value is 2");
  EXPECT_HAS(ErrorOf(R"({"optimizer": {"params": {"betas": [0.9, 0.999]}}})", {.beta2 = 0.95}),
             "'optimizer.params.betas' is [0.9, 0.999] but the trainer's betas are [0.9, 0.95]");
  EXPECT_TRUE(
      EngineConfig::FromJson(R"({"optimizer": {"params": {"lr": 0.001}}})", {.lr = 0.001}).ok());
  // "auto" is only a string DeepSpeed and Hugging Face match exactly; a key that cannot be
  // "auto" says what it must be.
  EXPECT_HAS(ErrorOf(R"({"aio": {"queue_depth": "auto"}})"), "aio.queue_depth");
  EXPECT_HAS(ErrorOf("{}", {.hidden_size = 0}), "TrainerValues::hidden_size must be in [1, 2^31]");
}

// ---- train_batch_size ----

TEST(EngineConfigTest, TrainBatchSizeIsCheckedAgainstTheWorldSize) {
  auto parse = [](const char* json) {
    auto c = EngineConfig::FromJson(json);
    EXPECT_TRUE(c.ok()) << c.status();
    return *c;
  };
  // All three given: checked.
  EngineConfig c = parse(
      R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4,
          "gradient_accumulation_steps": 2})");
  EXPECT_TRUE(c.ResolveBatchSize(2).ok());
  Status s = c.ResolveBatchSize(1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(std::string(s.message()),
             "train_batch_size 16 must equal train_micro_batch_size_per_gpu x "
             "gradient_accumulation_steps x 1 data-parallel rank(s); got micro-batch 4 and "
             "accumulation 2");
  // Accumulation left out: derived, as DeepSpeed does.
  c = parse(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4})");
  ASSERT_TRUE(c.ResolveBatchSize(2).ok());
  EXPECT_EQ(c.gradient_accumulation_steps, 4);
  c = parse(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4})");
  EXPECT_HAS(std::string(c.ResolveBatchSize(3).message()), "cannot be derived");
  // Micro-batch left out: derived from the accumulation.
  c = parse(R"({"train_batch_size": 10, "gradient_accumulation_steps": 1})");
  ASSERT_TRUE(c.ResolveBatchSize(2).ok());
  EXPECT_EQ(c.micro_batch_size, 5);
  // Only the batch: accumulation 1.
  c = parse(R"({"train_batch_size": 12})");
  ASSERT_TRUE(c.ResolveBatchSize(3).ok());
  EXPECT_EQ(c.micro_batch_size, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 1);
  // No batch (or "auto"): the product.
  c = parse(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 2})");
  ASSERT_TRUE(c.ResolveBatchSize(8).ok());
  EXPECT_EQ(c.train_batch_size, 16);
}

TEST(EngineConfigTest, EngineCreateChecksTheBatchForItsRanks) {
  auto bad = EngineConfig::FromJson(
      R"({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4,
          "gradient_accumulation_steps": 2})");
  ASSERT_TRUE(bad.ok());
  auto engine = Engine::Create(*bad, {.device = "host", .rank = 0, .world_size = 1});
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), StatusCode::kInvalidArgument);
  EXPECT_HAS(std::string(engine.status().message()), "train_batch_size 16");

  auto derived = EngineConfig::FromJson(R"({"train_batch_size": 12,
      "train_micro_batch_size_per_gpu": 3})");
  ASSERT_TRUE(derived.ok());
  auto ok = Engine::Create(*derived, {.device = "host", .rank = 0, .world_size = 1});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)->config().gradient_accumulation_steps, 4);  // what the trainer must run
}

// ---- keys zinf accepts without acting on them ----

TEST(EngineConfigTest, UnimplementedKeysAreWarnedAboutByName) {
  auto c = EngineConfig::FromJson(R"({
    "steps_per_print": 10, "wall_clock_breakdown": true, "memory_breakdown": false,
    "prescale_gradients": false, "gradient_predivide_factor": 1.0,
    "communication_data_type": "fp32", "zero_allow_untested_optimizer": true,
    "tensorboard": {"enabled": false, "output_path": "log/"}, "wandb": {"enabled": true},
    "activation_checkpointing": {"partition_activations": true},
    "zero_optimization": {"stage": 3, "overlap_comm": false, "contiguous_gradients": true,
      "reduce_scatter": true, "allgather_partitions": true, "allgather_bucket_size": 5e8,
      "round_robin_gradients": false, "sub_group_size": 1e9, "stage3_max_reuse_distance": 1e9,
      "stage3_gather_16bit_weights_on_model_save": true, "load_from_fp32_weights": true,
      "aio": {"block_size": 1048576},
      "offload_param": {"device": "cpu", "pin_memory": true, "buffer_count": 5,
        "buffer_size": 1e8, "max_in_cpu": 1e9},
      "offload_optimizer": {"device": "cpu", "pin_memory": true, "buffer_count": 4,
        "fast_init": false, "pipeline_read": false, "pipeline_write": true}},
    "fp16": {"enabled": true, "auto_cast": false, "consecutive_hysteresis": true}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(WarnedKeys(*c), (std::vector<std::string>{
                                "activation_checkpointing",
                                "fp16.consecutive_hysteresis",
                                "steps_per_print",
                                "wall_clock_breakdown",
                                "wandb",
                                "zero_optimization.aio",
                                "zero_optimization.allgather_bucket_size",
                                "zero_optimization.offload_optimizer.buffer_count",
                                "zero_optimization.offload_optimizer.pipeline_read",
                                "zero_optimization.offload_param.buffer_count",
                                "zero_optimization.offload_param.buffer_size",
                                "zero_optimization.offload_param.max_in_cpu",
                                "zero_optimization.overlap_comm",
                                "zero_optimization.stage3_gather_16bit_weights_on_model_save",
                                "zero_optimization.stage3_max_reuse_distance",
                                "zero_optimization.sub_group_size",
                            }));
  // Each names the value and why zinf ignores it.
  for (const std::string& w : c->warnings) {
    if (w.find("overlap_comm") != std::string::npos) {
      EXPECT_EQ(w,
                "config key 'zero_optimization.overlap_comm' = false has no effect in zinf: "
                "zinf always overlaps the gradient reduce-scatter with backward");
    }
  }
  EXPECT_EQ(c->sub_group_size, 1000000000u);  // read and checked all the same
  EXPECT_TRUE(c->pin_memory);                 // offload_optimizer's
  // Wrong types are still errors.
  EXPECT_HAS(ErrorOf(R"({"zero_optimization": {"overlap_comm": "yes"}})"),
             "'zero_optimization.overlap_comm' must be true or false");
}

// DeepSpeed's top-level keys (deepspeed/runtime/config.py): each accepted, warned about when
// zinf ignores what it asks for, or refused when ignoring it would change the numbers.
TEST(EngineConfigTest, DeepSpeedTopLevelKeys) {
  auto c = EngineConfig::FromJson(R"({
    "comms_config": {"verbose": false}, "monitor_config": {"enabled": true},
    "disable_allgather": true, "sparse_gradients": false, "graph_harvesting": false,
    "log_level": "info", "autotuning": {"enabled": false}, "compile": {"deepcompile": true},
    "eigenvalue": {"enabled": false}, "comet": {"enabled": false},
    "managed_gradient_accumulation": true, "gradient_allreduce_op": "mean",
    "amp": {"enabled": false}, "torch_autocast": {"enabled": false},
    "communication_data_type": null, "data_types": {"grad_accum_dtype": "fp32"}, "tensor_parallel": {"autotp_size": 1},
    "progressive_layer_drop": {"enabled": false}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(WarnedKeys(*c),
            (std::vector<std::string>{"comms_config", "compile", "disable_allgather", "log_level",
                                      "monitor_config"}));
  // What would give other numbers than DeepSpeed's is refused, naming the key and the value.
  for (const char* json : {
           R"({"communication_data_type": "bf16"})",
           R"({"gradient_allreduce_op": "sum"})",
           R"({"managed_gradient_accumulation": false})",
           R"({"amp": {"enabled": true, "opt_level": "O1"}})",
           R"({"torch_autocast": {"enabled": true}})",
           R"({"data_types": {"grad_accum_dtype": "bf16"}})",
           R"({"progressive_layer_drop": {"enabled": true}})",
           R"({"curriculum_learning": {"enabled": true}})",
           R"({"sparse_attention": {"mode": "fixed"}})",
           R"({"tensor_parallel": {"autotp_size": 2}})",
       }) {
    const std::string error = ErrorOf(json);
    const std::string_view text(json);
    const std::string key(text.substr(2, text.find('"', 2) - 2));  // {"key": ...}
    EXPECT_HAS(error, "config key '" + key + "'");
    EXPECT_HAS(error, "not supported by zinf");
  }
  // A misspelt key is still refused, with the key it was probably meant to be.
  EXPECT_HAS(ErrorOf(R"({"gradient_clipings": 1.0})"),
             "config key 'gradient_clipings' is not recognized; did you mean "
             "'gradient_clipping'?");
  EXPECT_HAS(ErrorOf(R"({"zero_optimization": {"stage3_param_persitance_threshold": 10}})"),
             "did you mean 'zero_optimization.stage3_param_persistence_threshold'?");
  // Nothing near: no suggestion.
  EXPECT_EQ(ErrorOf(R"({"xyz": 1})").find("did you mean"), std::string::npos);
}

TEST(EngineConfigTest, ElementCountsRefuseByteStrings) {
  for (const char* key : {"reduce_bucket_size", "stage3_prefetch_bucket_size",
                          "stage3_param_persistence_threshold", "stage3_max_live_parameters",
                          "stage3_max_reuse_distance", "sub_group_size", "allgather_bucket_size"}) {
    const std::string json = std::string(R"({"zero_optimization": {")") + key + R"(": "500MB"}})";
    const std::string error = ErrorOf(json);
    EXPECT_HAS(error, std::string("'zero_optimization.") + key +
                          "' counts elements (parameters), not bytes");
    EXPECT_HAS(error, "\"500MB\"");
  }
  EXPECT_HAS(ErrorOf(R"({"zero_optimization": {"offload_param": {"buffer_size": "1GiB"}}})"),
             "counts elements");
  auto c = EngineConfig::FromJson(R"({"zero_optimization": {"reduce_bucket_size": 2e8,
      "stage3_prefetch_bucket_size": 50000000}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->reduce_bucket_size, 200000000u);
  EXPECT_EQ(c->stage3_prefetch_bucket_size, 50000000u);
}

// ---- offload ----

TEST(EngineConfigTest, EachOffloadHasItsOwnNvmePath) {
  auto c = EngineConfig::FromJson(R"({"zero_optimization": {"stage": 3,
      "offload_param": {"device": "nvme", "nvme_path": ["/nvme0", "/nvme1"]},
      "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme1"}}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->offload_param_nvme_path, (std::vector<std::string>{"/nvme0", "/nvme1"}));
  EXPECT_EQ(c->offload_optimizer_nvme_path, std::vector<std::string>{"/nvme1"});
  EXPECT_EQ(c->NvmePaths(), (std::vector<std::string>{"/nvme0", "/nvme1"}));
  // A device nvme without its own path is an error naming it, even when the other has one.
  EXPECT_HAS(ErrorOf(R"({"zero_optimization": {"stage": 3,
                 "offload_param": {"device": "nvme", "nvme_path": "/nvme0"},
                 "offload_optimizer": {"device": "nvme"}}})"),
             "zero_optimization.offload_optimizer.nvme_path is not set");
  EXPECT_HAS(ErrorOf(R"({"zero_optimization": {"stage": 3,
                 "offload_param": {"device": "nvme"}}})"),
             "zero_optimization.offload_param.nvme_path is not set");
}

TEST(EngineConfigTest, OffloadOptimizerRatioHasDeepSpeedsMeaning) {
  // DeepSpeed's ratio: the CPU's share of the optimizer; zinf steps all of it on the CPU.
  auto c = EngineConfig::FromJson(R"({"zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "cpu", "ratio": 0.3}}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->offload_optimizer_cpu_ratio, 0.3);
  EXPECT_EQ(c->optimizer_nvme_ratio, 1.0);
  ASSERT_EQ(WarnedKeys(*c), std::vector<std::string>{"zero_optimization.offload_optimizer.ratio"});
  EXPECT_HAS(c->warnings[0], "keep 70% of the optimizer state on the GPU");
  EXPECT_HAS(c->warnings[0], "steps all of it on the CPU, as with ratio 1.0");
  EXPECT_HAS(c->warnings[0], "zinf.optimizer_nvme_ratio");
  c = EngineConfig::FromJson(R"({"zero_optimization": {"offload_optimizer": {"ratio": 1.0}}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->warnings.empty());
  // zinf's own NVMe/host split of the offloaded state.
  c = EngineConfig::FromJson(R"({"zinf": {"optimizer_nvme_ratio": 0.25}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->optimizer_nvme_ratio, 0.25);
  EXPECT_HAS(ErrorOf(R"({"zinf": {"optimizer_nvme_ratio": 2}})"),
             "'zinf.optimizer_nvme_ratio' must be in [0, 1], got 2");
}

// DeepSpeed's "Adam" is AdamW unless adam_w_mode is false (its engine's
// effective_adam_w_mode); "AdamW" is AdamW either way.
TEST(EngineConfigTest, AdamIsAdamWUnlessAdamWModeIsFalse) {
  auto type = [](const char* json) {
    auto c = EngineConfig::FromJson(json);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? std::string(OptimizerTypeName(c->optimizer.type)) : std::string();
  };
  EXPECT_EQ(type(R"({"optimizer": {"type": "Adam"}})"), "adamw");
  EXPECT_EQ(type(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})"), "adam");
  EXPECT_EQ(type(R"({"optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}}})"), "adamw");
  EXPECT_EQ(type(R"({"optimizer": {"type": "Lion"}})"), "lion");
}

// ---- the engine applies the schedule ----

// Lion with zero weight decay moves each parameter by exactly lr * sign(update): with a
// positive gradient on zero-initialized weights, w after a step is w before minus the lr that
// step used.
class ScheduledEngine {
 public:
  explicit ScheduledEngine(const std::string& json) {
    auto config = EngineConfig::FromJson(json);
    EXPECT_TRUE(config.ok()) << config.status();
    auto engine = Engine::Create(
        *config, {.device = "host", .rank = 0, .world_size = 1, .optimizer_threads = 1});
    EXPECT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    EXPECT_TRUE(engine_->RegisterModule("m", {{"w", {4}, ParamInit::kZeros}}).ok());
    EXPECT_TRUE(engine_->Initialize().ok());
  }
  Engine& operator*() { return *engine_; }
  Engine* operator->() { return engine_.get(); }

  StatusOr<StepSummary> Step(float gradient) {
    EXPECT_TRUE(engine_->Fetch(0).ok());
    EXPECT_TRUE(engine_->Release(0).ok());
    EXPECT_TRUE(engine_->Fetch(0).ok());
    auto grads = engine_->Gradients(0);
    EXPECT_TRUE(grads.ok());
    for (int i = 0; i < 4; ++i)
      (*grads)[0][i] = gradient * static_cast<float>(engine_->loss_scale());
    EXPECT_TRUE(engine_->ReduceGradients(0).ok());
    EXPECT_TRUE(engine_->Release(0).ok());
    return engine_->Step();
  }
  float Weight() {
    std::vector<float> w;
    EXPECT_TRUE(engine_->GatherParameter("w", &w).ok());
    return w.at(0);
  }

 private:
  std::unique_ptr<Engine> engine_;
};

TEST(EngineScheduleTest, EachStepUsesTheSchedulesValue) {
  // Linear warmup from 0.001 to 0.01 over 10 steps: DeepSpeed's first two steps both use
  // warmup_min_lr (the constructor's value, then it = 0), the third 0.001 + 0.009 / 10.
  ScheduledEngine e(R"({"optimizer": {"type": "Lion", "params": {"lr": 0.5}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.001,
        "warmup_max_lr": 0.01, "warmup_num_steps": 10, "warmup_type": "linear"}}})");
  const std::vector<double> expected = {0.001,  0.001,  0.0019, 0.0028, 0.0037, 0.0046, 0.0055,
                                        0.0064, 0.0073, 0.0082, 0.0091, 0.01,   0.01};
  float w = 0.0f;
  for (size_t step = 0; step < expected.size(); ++step) {
    EXPECT_NEAR(e->learning_rate(), expected[step], 1e-15) << "before step " << step + 1;
    auto summary = e.Step(1.0f);
    ASSERT_TRUE(summary.ok()) << summary.status();
    w -= static_cast<float>(expected[step]);
    EXPECT_NEAR(e.Weight(), w, 1e-6) << "step " << step + 1 << " used another lr";
  }
  // The schedule owns the lr.
  EXPECT_EQ(e->SetLearningRate(0.1).code(), StatusCode::kFailedPrecondition);
}

TEST(EngineScheduleTest, SkippedStepsDoNotAdvanceTheSchedule) {
  // fp16: an overflow skips the step, and DeepSpeed then skips scheduler.step() too.
  ScheduledEngine e(R"({"fp16": {"enabled": true, "initial_scale_power": 4},
      "optimizer": {"type": "Lion", "params": {"lr": 0.5}},
      "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0,
        "warmup_max_lr": 0.1, "warmup_num_steps": 10, "warmup_type": "linear"}}})");
  ASSERT_TRUE(e.Step(1.0f).ok());  // lr 0
  ASSERT_TRUE(e.Step(1.0f).ok());  // lr 0 (it = 0)
  EXPECT_NEAR(e->learning_rate(), 0.01, 1e-15);
  auto skipped = e.Step(INFINITY);
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  EXPECT_TRUE(skipped->skipped);
  EXPECT_NEAR(e->learning_rate(), 0.01, 1e-15);
  ASSERT_TRUE(e.Step(1.0f).ok());
  EXPECT_NEAR(e->learning_rate(), 0.02, 1e-15);
  EXPECT_NEAR(e.Weight(), -0.01f, 1e-4);  // fp16 parameter tier; the master moved by 0.01
}

TEST(EngineScheduleTest, WithoutASchedulerTheTrainerSetsTheLr) {
  ScheduledEngine e(R"({"optimizer": {"type": "Lion", "params": {"lr": 0.5}}})");
  EXPECT_EQ(e->learning_rate(), 0.5);
  ASSERT_TRUE(e.Step(1.0f).ok());
  EXPECT_NEAR(e.Weight(), -0.5f, 1e-7);
  ASSERT_TRUE(e->SetLearningRate(0.125).ok());
  EXPECT_EQ(e->learning_rate(), 0.125);
  ASSERT_TRUE(e.Step(1.0f).ok());
  EXPECT_NEAR(e.Weight(), -0.625f, 1e-7);
  EXPECT_EQ(e->SetLearningRate(-1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(e->SetLearningRate(NAN).code(), StatusCode::kInvalidArgument);
}

// ---- DeepSpeed's own leniencies: the old bf16 name, dropped "auto", 0-sized buckets ----

TEST(EngineConfigTest, TheOldBfloat16NameIsBf16) {
  auto c = EngineConfig::FromJson(R"({"bfloat16": {"enabled": true}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->bf16);
  EXPECT_TRUE(c->warnings.empty());
  // "auto" there too, from the trainer as for bf16.
  c = EngineConfig::FromJson(R"({"bfloat16": {"enabled": "auto"}})", {.bf16 = true});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->bf16);
  // Both: DeepSpeed reads bf16 and ignores the old name; a warning says so.
  c = EngineConfig::FromJson(R"({"bf16": {"enabled": false}, "bfloat16": {"enabled": true}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->bf16);
  EXPECT_EQ(WarnedKeys(*c), std::vector<std::string>{"bfloat16"});
  // Its keys are bf16's: another is refused by name, as DeepSpeed's model refuses it.
  EXPECT_HAS(ErrorOf(R"({"bfloat16": {"enabled": true, "loss_scale": 1.0}})"),
             "'bfloat16.loss_scale' is not recognized");
}

TEST(EngineConfigTest, AutoWhereDeepSpeedDropsItKeepsTheDefaultWithAWarning) {
  const EngineConfig defaults;
  auto c = EngineConfig::FromJson(R"({"zero_optimization": {"stage": 3,
      "stage3_gather_16bit_weights_on_model_save": "auto", "overlap_comm": "auto",
      "sub_group_size": "auto", "stage3_max_reuse_distance": "auto",
      "offload_param": {"device": "auto", "pin_memory": "auto"},
      "offload_optimizer": {"device": "cpu", "ratio": "auto"}},
      "fp16": {"enabled": true, "loss_scale_window": "auto", "hysteresis": "auto"},
      "bf16": {"enabled": false}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->offload_param_device, OffloadDevice::kNone);  // DeepSpeed's default device
  EXPECT_EQ(c->offload_optimizer_device, OffloadDevice::kCpu);
  EXPECT_EQ(c->offload_optimizer_cpu_ratio, defaults.offload_optimizer_cpu_ratio);
  EXPECT_EQ(c->loss_scale_window, defaults.loss_scale_window);
  EXPECT_EQ(c->hysteresis, defaults.hysteresis);
  EXPECT_EQ(c->sub_group_size, defaults.sub_group_size);
  EXPECT_TRUE(c->pin_memory);  // the default
  EXPECT_EQ(WarnedKeys(*c), (std::vector<std::string>{
                                "fp16.hysteresis",
                                "fp16.loss_scale_window",
                                "zero_optimization.offload_optimizer.ratio",
                                "zero_optimization.offload_param.device",
                                "zero_optimization.offload_param.pin_memory",
                                "zero_optimization.overlap_comm",
                                "zero_optimization.stage3_gather_16bit_weights_on_model_save",
                                "zero_optimization.stage3_max_reuse_distance",
                                "zero_optimization.sub_group_size",
                            }));
  for (const std::string& w : c->warnings) EXPECT_HAS(w, "\"auto\"");
  // An unknown key stays an error even when its value is "auto".
  EXPECT_HAS(ErrorOf(R"({"zero_optimization": {"stage3_no_such_key": "auto"}})"),
             "'zero_optimization.stage3_no_such_key' is not recognized");
  // The stage: DeepSpeed's default is 0, which zinf does not have; never silently stage 3.
  EXPECT_HAS(ErrorOf(R"({"zero_optimization": {"stage": "auto"}})"),
             "'zero_optimization.stage' is \"auto\"");
  // Where DeepSpeed reads a key one by one, "auto" is a type error naming the key, as there.
  EXPECT_HAS(ErrorOf(R"({"aio": {"queue_depth": "auto"}})"), "aio.queue_depth");
  EXPECT_HAS(ErrorOf(R"({"steps_per_print": 10, "prescale_gradients": "auto"})"),
             "prescale_gradients");
}

TEST(EngineConfigTest, AnAutoWithoutTheTrainersValueIsAWarningNamingItsSource) {
  auto c = EngineConfig::FromJson(R"({"zero_optimization": {"reduce_bucket_size": "auto"},
      "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(WarnedKeys(*c), (std::vector<std::string>{"optimizer.params.lr",
                                                      "zero_optimization.reduce_bucket_size"}));
  for (const std::string& w : c->warnings) EXPECT_HAS(w, "the trainer gave no value");
  c = EngineConfig::FromJson(R"({"zero_optimization": {"reduce_bucket_size": "auto"},
      "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}})",
                             {.lr = 0.5, .hidden_size = 8});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->warnings.empty());
  EXPECT_EQ(c->optimizer.lr, 0.5);
  EXPECT_EQ(c->reduce_bucket_size, 64u);
}

TEST(EngineConfigTest, ZeroBucketSizesAreDeepSpeeds) {
  auto c = EngineConfig::FromJson(R"({"zero_optimization": {"reduce_bucket_size": 0,
      "stage3_prefetch_bucket_size": 0, "allgather_bucket_size": 0,
      "stage3_param_persistence_threshold": 0}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->reduce_bucket_size, 0u);
  EXPECT_EQ(c->stage3_prefetch_bucket_size, 0u);
  // A bucket per parameter trains the same numbers: reductions are exact and in rank order.
  auto run = [](const EngineConfig& config) {
    auto engine = Engine::Create(config, {.device = "host", .rank = 0, .world_size = 1});
    EXPECT_TRUE(engine.ok()) << engine.status();
    Engine& e = **engine;
    const int a = *e.RegisterModule("a", {{.name = "a.w", .shape = {4, 3}}});
    const int b = *e.RegisterModule("b", {{.name = "b.w", .shape = {5}}});
    EXPECT_TRUE(e.Initialize().ok());
    for (int step = 0; step < 3; ++step) {
      for (int m : {a, b}) {
        EXPECT_TRUE(e.Fetch(m).ok());
        std::vector<float*> grads = *e.Gradients(m);
        for (size_t i = 0; i < grads.size(); ++i) {
          for (int k = 0; k < (m == a ? 12 : 5); ++k) grads[i][k] = 0.1f * (k + 1) + step;
        }
        EXPECT_TRUE(e.ReduceGradients(m).ok());
        EXPECT_TRUE(e.Release(m).ok());
      }
      EXPECT_TRUE(e.Step().ok());
    }
    std::vector<float> out, all;
    for (const char* name : {"a.w", "b.w"}) {
      EXPECT_TRUE(e.GatherParameter(name, &out).ok());
      all.insert(all.end(), out.begin(), out.end());
    }
    return all;
  };
  EXPECT_EQ(run(*c), run(EngineConfig{}));
}

TEST(EngineConfigTest, TheHostTierIsPinnedUnlessASectionSaysFalse) {
  EXPECT_TRUE(EngineConfig{}.pin_memory);
  auto c = EngineConfig::FromJson(
      R"({"zero_optimization": {"offload_param": {"device": "cpu", "pin_memory": true}}})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->pin_memory);
  EXPECT_TRUE(c->warnings.empty());  // it is acted on: no warning that it is not
  for (const char* json :
       {R"({"zero_optimization": {"offload_param": {"device": "cpu", "pin_memory": false}}})",
        R"({"zero_optimization": {"offload_optimizer": {"device": "cpu", "pin_memory": false},
               "offload_param": {"device": "cpu", "pin_memory": true}}})",
        R"({"zero_optimization": {"cpu_offload": true, "cpu_offload_use_pin_memory": false}})"}) {
    auto off = EngineConfig::FromJson(json);
    ASSERT_TRUE(off.ok()) << off.status();
    EXPECT_FALSE(off->pin_memory) << json;
  }
}

TEST(EngineConfigTest, TheTrainersTotalStepsFillsAutoOnly) {
  auto c = EngineConfig::FromJson(R"({"scheduler": {"type": "WarmupDecayLR",
      "params": {"total_num_steps": 1000, "warmup_num_steps": 10}}})",
                                  {.total_num_steps = 300});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->scheduler.total_num_steps, 1000);  // the schedule is longer than this run
  c = EngineConfig::FromJson(R"({"scheduler": {"type": "WarmupDecayLR",
      "params": {"total_num_steps": "auto", "warmup_num_steps": 10}}})",
                             {.total_num_steps = 300});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->scheduler.total_num_steps, 300);
}

TEST(EngineConfigTest, BatchShapeSaysWhatTheEngineTrainsAt) {
  auto c = EngineConfig::FromJson(R"({"train_batch_size": 32, "gradient_accumulation_steps": 2})");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->ResolveBatchSize(2).ok());
  EXPECT_EQ(c->BatchShape(2),
            "train_batch_size 32 = micro-batch 8 x gradient accumulation 2 x 2 data-parallel "
            "rank(s)");
}

TEST(EngineNonFiniteTest, TheErrorNamesTheFirstParameterWithOne) {
  auto engine = Engine::Create(EngineConfig{}, {.device = "host", .rank = 0, .world_size = 1});
  ASSERT_TRUE(engine.ok()) << engine.status();
  Engine& e = **engine;
  const int a = *e.RegisterModule("attn", {{.name = "attn.in_proj", .shape = {4}}});
  const int b = *e.RegisterModule("attn.out_proj", {{.name = "attn.out_proj.weight", .shape = {3}},
                                                    {.name = "attn.out_proj.bias", .shape = {2}}});
  ASSERT_TRUE(e.Initialize().ok());
  for (int m : {a, b}) {
    ASSERT_TRUE(e.Fetch(m).ok());
    std::vector<float*> grads = *e.Gradients(m);
    for (size_t i = 0; i < grads.size(); ++i) {
      for (int k = 0; k < (m == a ? 4 : i == 0 ? 3 : 2); ++k) grads[i][k] = 1.0f;
    }
    if (m == b) grads[1][1] = NAN;  // the bias, not the weight before it
    ASSERT_TRUE(e.ReduceGradients(m).ok());
    ASSERT_TRUE(e.Release(m).ok());
  }
  StatusOr<StepSummary> step = e.Step();
  ASSERT_FALSE(step.ok());
  EXPECT_EQ(step.status().code(), StatusCode::kDataLoss);
  const std::string message(step.status().message());
  EXPECT_HAS(message, "parameter 'attn.out_proj.bias' (module 'attn.out_proj') is the first");
  EXPECT_HAS(message, "gradient_clipping");  // and what to do

  // The refused batch is dropped: the next one steps, from its own gradients alone.
  for (int m : {a, b}) {
    ASSERT_TRUE(e.Fetch(m).ok());
    const std::vector<float*> grads = *e.Gradients(m);
    for (float* g : grads) g[0] = 1.0f;
    ASSERT_TRUE(e.ReduceGradients(m).ok());
    ASSERT_TRUE(e.Release(m).ok());
  }
  step = e.Step();
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->step, 1);
  EXPECT_TRUE(std::isfinite(step->grad_norm));
  EXPECT_DOUBLE_EQ(step->grad_norm, std::sqrt(3.0));  // one 1 in each of the three gradients
}

}  // namespace
}  // namespace zinf
