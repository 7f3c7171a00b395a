// Public DeepSpeed configs as their projects ship them (tests/data/deepspeed_configs/, sources in
// SOURCES.md): each accepted with DeepSpeed's meaning and the warnings it should give, or
// refused with a message naming its key.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tests/zero/engine_config_testing.h"
#include "zinf/engine.h"

namespace zinf {
namespace {

using testing::ErrorOf;
using testing::WarnedKeys;

std::string ReadConfig(const char* name) {
  const std::filesystem::path path =
      std::filesystem::path(ZINF_SOURCE_DIR) / "tests/data/deepspeed_configs" / name;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void ExpectNoDuplicateWarnings(const EngineConfig& c) {
  std::vector<std::string> keys = WarnedKeys(c);
  EXPECT_EQ(std::adjacent_find(keys.begin(), keys.end()), keys.end()) << "warned twice";
}

// DeepSpeed's ZeRO-Infinity tutorial: parameters and optimizer on NVMe, aio tuned.
TEST(PublishedDeepSpeedConfigsTest, ZeroInfinityNvme) {
  auto c = EngineConfig::FromJson(ReadConfig("zero_infinity_nvme.json"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->zero_stage, 3);
  EXPECT_EQ(c->offload_param_device, OffloadDevice::kNvme);
  EXPECT_EQ(c->offload_optimizer_device, OffloadDevice::kNvme);
  EXPECT_EQ(c->NvmePaths(), std::vector<std::string>{"/local_nvme"});
  EXPECT_EQ(c->reduce_bucket_size, 10000000u);
  EXPECT_EQ(c->stage3_prefetch_bucket_size, 10000000u);
  EXPECT_EQ(c->optimizer.type,
            OptimizerType::kAdamW);  // DeepSpeed's "Adam" without adam_w_mode: false
  EXPECT_TRUE(c->fp16);
  EXPECT_TRUE(c->pin_memory);
  EXPECT_EQ(WarnedKeys(*c), (std::vector<std::string>{
                                "steps_per_print",
                                "zero_optimization.offload_optimizer.buffer_count",
                                "zero_optimization.offload_param.buffer_count",
                                "zero_optimization.offload_param.buffer_size",
                                "zero_optimization.offload_param.max_in_cpu",
                                "zero_optimization.stage3_max_reuse_distance",
                                "zero_optimization.sub_group_size",
                            }));
  ExpectNoDuplicateWarnings(*c);
  // train_batch_size 8 with micro-batch 1: the accumulation follows from the ranks.
  ASSERT_TRUE(c->ResolveBatchSize(2).ok());
  EXPECT_EQ(c->gradient_accumulation_steps, 4);
}

// Hugging Face's ZeRO-3 config: "auto" everywhere, AdamW and WarmupDecayLR.
TEST(PublishedDeepSpeedConfigsTest, HuggingFaceZero3Auto) {
  const TrainerValues trainer = {.micro_batch_size = 8,
                                 .gradient_accumulation_steps = 4,
                                 .gradient_clipping = 1.0,
                                 .lr = 5e-5,
                                 .beta1 = 0.9,
                                 .beta2 = 0.999,
                                 .eps = 1e-8,
                                 .weight_decay = 0.0,
                                 .total_num_steps = 3000,
                                 .warmup_num_steps = 300,
                                 .fp16 = false,
                                 .bf16 = true,
                                 .hidden_size = 768};
  auto c = EngineConfig::FromJson(ReadConfig("hf_zero3_auto.json"), trainer);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->optimizer.type, OptimizerType::kAdamW);
  EXPECT_EQ(c->optimizer.lr, 5e-5);
  EXPECT_TRUE(c->bf16);
  EXPECT_EQ(c->scheduler.type, "WarmupDecayLR");
  EXPECT_EQ(c->scheduler.total_num_steps, 3000);
  EXPECT_EQ(c->scheduler.warmup_num_steps, 300);
  EXPECT_EQ(c->scheduler.warmup_max_lr, 5e-5);
  EXPECT_EQ(c->reduce_bucket_size, 768u * 768u);
  EXPECT_EQ(c->offload_param_device, OffloadDevice::kCpu);
  EXPECT_EQ(WarnedKeys(*c), (std::vector<std::string>{
                                "steps_per_print",
                                "zero_optimization.stage3_gather_16bit_weights_on_model_save",
                                "zero_optimization.stage3_max_reuse_distance",
                                "zero_optimization.sub_group_size",
                            }));
  ExpectNoDuplicateWarnings(*c);
  ASSERT_TRUE(c->ResolveBatchSize(2).ok());
  EXPECT_EQ(c->train_batch_size, 64);
  // Without the trainer, total_num_steps has nothing to come from.
  EXPECT_HAS(ErrorOf(ReadConfig("hf_zero3_auto.json")), "total_num_steps");
}

// DeepSpeed's ZeRO-Offload tutorial: stage 2, optimizer on the CPU, fp16, WarmupLR.
TEST(PublishedDeepSpeedConfigsTest, ZeroOffloadCpuFp16) {
  auto c = EngineConfig::FromJson(ReadConfig("zero_offload_cpu_fp16.json"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->zero_stage, 2);
  EXPECT_EQ(c->offload_optimizer_device, OffloadDevice::kCpu);
  EXPECT_TRUE(c->fp16);
  EXPECT_EQ(c->scheduler.type, "WarmupLR");
  EXPECT_EQ(c->scheduler.warmup_max_lr, 0.00015);
  EXPECT_EQ(c->reduce_bucket_size, 200000000u);
  EXPECT_EQ(WarnedKeys(*c), (std::vector<std::string>{
                                "steps_per_print",
                                "wall_clock_breakdown",
                                "zero_optimization.allgather_bucket_size",
                            }));
  ExpectNoDuplicateWarnings(*c);
  EngineConfig two = *c;
  ASSERT_TRUE(two.ResolveBatchSize(2).ok());
  EXPECT_EQ(two.micro_batch_size, 5);  // train_batch_size 10 over 2 ranks, accumulation 1
  EXPECT_HAS(std::string(c->ResolveBatchSize(3).message()), "train_batch_size 10");
  // And the engine runs it.
  auto engine = Engine::Create(*c, {.device = "host", .rank = 0, .world_size = 1});
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->config().micro_batch_size, 10);
  EXPECT_EQ((*engine)->learning_rate(), 0.0);  // warmup_min_lr
}

// ---- more published configs: HF transformers, Accelerate, DeepSpeedExamples, Megatron ----

// Hugging Face's Trainer fills these for every config it is given.
const TrainerValues kHfTrainer = {.micro_batch_size = 4,
                                  .gradient_accumulation_steps = 1,
                                  .gradient_clipping = 1.0,
                                  .lr = 5e-5,
                                  .beta1 = 0.9,
                                  .beta2 = 0.999,
                                  .eps = 1e-8,
                                  .weight_decay = 0.0,
                                  .total_num_steps = 100,
                                  .warmup_num_steps = 10,
                                  .fp16 = false,
                                  .bf16 = true,
                                  .hidden_size = 64};

TEST(PublishedDeepSpeedConfigsTest, EachIsAcceptedOrRefusedNamingItsKey) {
  struct Case {
    const char* file;
    const char* refused_key;  // nullptr: accepted
  };
  const Case cases[] = {
      {"hf_transformers_ds_config_zero2.json", nullptr},
      {"hf_transformers_ds_config_zero3_bf16.json", nullptr},
      {"accelerate_zero_stage2_config.json", nullptr},
      {"accelerate_zero_stage3_offload_config.json", nullptr},
      {"llamafactory_ds_z3_offload_config.json", nullptr},
      {"dsexamples_cifar_ds_config.json", nullptr},
      {"megatron_ds_sequence_parallel_gbs16_mbs1_zero3.json", nullptr},
      // A misspelt key (DeepSpeed's pydantic model refuses it too).
      {"dsexamples_megatron_zero3_infinity_config.json",
       "'zero_optimization.stage3_param_persitance_threshold' is not recognized"},
      // DeepSpeed's long-gone CPU Adam name.
      {"dsexamples_megatron_zero_offload_config.json", "'optimizer.type'"},
      // Gradients reduced in bf16, where zinf reduces in fp32 (and loss_scale is not a bf16
      // key, which DeepSpeed's bf16 model refuses too).
      {"megatron_ds_zero2_config_bf16.json", "'communication_data_type' = \"bfp16\""},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.file);
    const std::string text = ReadConfig(k.file);
    // Hugging Face's and Accelerate's templates come with the trainer's values; the others are
    // complete as they stand.
    const std::string_view name(k.file);
    const bool hf = name.rfind("hf_", 0) == 0 || name.rfind("accelerate_", 0) == 0 ||
                    name.rfind("llamafactory_", 0) == 0;
    TrainerValues trainer = hf ? kHfTrainer : TrainerValues{};
    // A template that spells out its precision is run as it says.
    if (text.find("\"enabled\": true") != std::string::npos) trainer.fp16 = trainer.bf16 = {};
    auto c = EngineConfig::FromJson(text, trainer);
    if (k.refused_key != nullptr) {
      ASSERT_FALSE(c.ok());
      EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
      EXPECT_HAS(std::string(c.status().message()), k.refused_key);
      continue;
    }
    ASSERT_TRUE(c.ok()) << c.status();
    ExpectNoDuplicateWarnings(*c);
    auto engine = Engine::Create(*c, {.device = "host", .rank = 0, .world_size = 1});
    ASSERT_TRUE(engine.ok()) << engine.status();
  }
}

TEST(PublishedDeepSpeedConfigsTest, WhatTheyMeanIsWhatDeepSpeedMeans) {
  // The old section name: bf16 from the trainer.
  auto c =
      EngineConfig::FromJson(ReadConfig("hf_transformers_ds_config_zero3_bf16.json"), kHfTrainer);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->bf16);
  EXPECT_TRUE(c->pin_memory);
  EXPECT_EQ(c->reduce_bucket_size, 64u * 64u);
  // Accelerate's WarmupDecayLR takes its total from the trainer; "auto" for the 16-bit save
  // keeps DeepSpeed's default (off), which zinf does anyway.
  c = EngineConfig::FromJson(ReadConfig("accelerate_zero_stage3_offload_config.json"),
                             {.micro_batch_size = 4,
                              .gradient_clipping = 1.0,
                              .lr = 1e-3,
                              .weight_decay = 0.0,
                              .total_num_steps = 100,
                              .warmup_num_steps = 10});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->scheduler.type, "WarmupDecayLR");
  EXPECT_EQ(c->scheduler.total_num_steps, 100);
  EXPECT_EQ(c->scheduler.warmup_max_lr, 1e-3);
  EXPECT_TRUE(c->fp16);
  EXPECT_EQ(WarnedKeys(*c),
            (std::vector<std::string>{
                "steps_per_print",
                "zero_optimization.reduce_bucket_size",  // no hidden_size from this trainer
                "zero_optimization.stage3_gather_16bit_weights_on_model_save",
                "zero_optimization.stage3_max_reuse_distance",
                "zero_optimization.stage3_param_persistence_threshold",
                "zero_optimization.stage3_prefetch_bucket_size",
                "zero_optimization.sub_group_size",
            }));
  // Without the trainer's total the template is refused, naming the key.
  EXPECT_HAS(ErrorOf(ReadConfig("accelerate_zero_stage2_config.json")),
             "scheduler.params.total_num_steps");
  // DeepSpeedExamples' CIFAR: the deprecated cpu_offload puts the optimizer on the CPU, and
  // the fp16 master weights it asks for are a warning (zinf keeps fp32 masters).
  c = EngineConfig::FromJson(ReadConfig("dsexamples_cifar_ds_config.json"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->offload_optimizer_device, OffloadDevice::kCpu);
  EXPECT_EQ(c->optimizer.type, OptimizerType::kAdamW);
  EXPECT_EQ(c->optimizer.beta1, 0.8);
  const std::vector<std::string> cifar = WarnedKeys(*c);
  EXPECT_NE(std::find(cifar.begin(), cifar.end(), "fp16.fp16_master_weights_and_grads"),
            cifar.end());
  // LLaMA-Factory's ZeRO-3 offload config (its trainer is Hugging Face's): both offloads on
  // the CPU, and the two top-level keys DeepSpeed does not read either are warnings.
  c = EngineConfig::FromJson(ReadConfig("llamafactory_ds_z3_offload_config.json"), kHfTrainer);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->offload_param_device, OffloadDevice::kCpu);
  EXPECT_EQ(c->offload_optimizer_device, OffloadDevice::kCpu);
  EXPECT_TRUE(c->bf16);
  EXPECT_EQ(WarnedKeys(*c), (std::vector<std::string>{
                                "comms_config",
                                "monitor_config",
                                "zero_optimization.overlap_comm",
                                "zero_optimization.stage3_gather_16bit_weights_on_model_save",
                                "zero_optimization.stage3_max_reuse_distance",
                                "zero_optimization.sub_group_size",
                            }));
  // Megatron-DeepSpeed's sequence parallel config: 16 = 1 x 16 accumulation on one rank.
  c = EngineConfig::FromJson(ReadConfig("megatron_ds_sequence_parallel_gbs16_mbs1_zero3.json"));
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->ResolveBatchSize(1).ok());
  EXPECT_EQ(c->gradient_accumulation_steps, 16);
  EXPECT_EQ(c->micro_batch_size, 1);
}

}  // namespace
}  // namespace zinf
