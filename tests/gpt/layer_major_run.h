// Note [Layer-major GPT] (examples/gpt/gpt_model.cc): the batch's micro-batches through each module
// together give, on one rank, bitwise the parameters and losses of the micro-batches one by one,
// with the step clipping; activation checkpointing on (recomputed in both) and off (stored one by
// one, recomputed layer-major). gpt_test checks it on the host, gpt_cuda_test on cuda:0.
#ifndef ZINF_TESTS_GPT_LAYER_MAJOR_RUN_H_
#define ZINF_TESTS_GPT_LAYER_MAJOR_RUN_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "examples/gpt/gpt_model.h"
#include "zinf/engine.h"

namespace gpt::testing {

// Trains three steps of three micro-batches on `device` ("host" or "cuda:0"), clipping, and
// returns every parameter after them. `losses` gets each micro-batch's loss and each step's
// clip coefficient, in order.
inline std::vector<float> TrainThreeSteps(const std::string& device, bool layer_major,
                                          bool checkpointing, std::vector<double>* losses) {
  constexpr int kMicro = 3, kBatch = 2;
  GptConfig config{.seq_len = 12, .d_model = 48, .n_layer = 3, .n_head = 3};
  config.activation_checkpointing = checkpointing;
  auto engine_config = zinf::EngineConfig::FromJson(
      std::string(R"({"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
          "gradient_accumulation_steps": 3, "gradient_clipping": 0.5,
          "optimizer": {"type": "AdamW", "params": {"lr": 0.01}}, "zinf": {"layer_major": )") +
      (layer_major ? "true" : "false") + "}}");
  EXPECT_TRUE(engine_config.ok()) << engine_config.status();
  if (!engine_config.ok()) return {};
  auto engine =
      zinf::Engine::Create(*engine_config, {.device = device, .rank = 0, .world_size = 1});
  EXPECT_TRUE(engine.ok()) << engine.status();
  if (!engine.ok()) return {};
  auto model = Gpt::Create(**engine, config);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  EXPECT_TRUE((*engine)->Initialize().ok());
  const int64_t n = int64_t{kBatch} * config.seq_len;
  for (int step = 0; step < 3; ++step) {
    std::vector<std::vector<int32_t>> tokens(kMicro, std::vector<int32_t>(n)), targets = tokens;
    for (int g = 0; g < kMicro; ++g) {
      for (int64_t i = 0; i < n; ++i) {
        tokens[g][i] = static_cast<int32_t>((i * 37 + 5 + step * 11 + g * 7) % 256);
        targets[g][i] = static_cast<int32_t>((i * 11 + 1 + step + g * 3) % 256);
      }
    }
    if (layer_major) {
      std::vector<const int32_t*> t, y;
      for (int g = 0; g < kMicro; ++g) {
        t.push_back(tokens[g].data());
        y.push_back(targets[g].data());
      }
      auto micro_losses = (*model)->TrainBatch(t, y, kBatch);
      EXPECT_TRUE(micro_losses.ok()) << micro_losses.status();
      if (micro_losses.ok())
        losses->insert(losses->end(), micro_losses->begin(), micro_losses->end());
    } else {
      for (int g = 0; g < kMicro; ++g) {
        auto loss = (*model)->TrainMicroBatch(tokens[g].data(), targets[g].data(), kBatch);
        EXPECT_TRUE(loss.ok()) << loss.status();
        losses->push_back(loss.ok() ? *loss : 0);
      }
    }
    auto summary = (*engine)->Step();
    EXPECT_TRUE(summary.ok()) << summary.status();
    if (summary.ok()) losses->push_back(summary->clip_coefficient);
  }
  std::vector<float> all, v;
  for (const std::string& name : config.parameter_names()) {
    EXPECT_TRUE((*engine)->GatherParameter(name, &v).ok()) << name;
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

// Both schedules on `device`, with and without checkpointing: the same losses, clip
// coefficients and parameters, bit for bit, in a run that clips.
inline void ExpectLayerMajorIsBitwiseTheMicroBatchesOneByOne(const std::string& device) {
  for (bool checkpointing : {true, false}) {
    std::vector<double> micro_losses, layer_losses;
    const std::vector<float> micro = TrainThreeSteps(device, false, checkpointing, &micro_losses);
    const std::vector<float> layer = TrainThreeSteps(device, true, checkpointing, &layer_losses);
    EXPECT_EQ(micro_losses, layer_losses) << "checkpointing " << checkpointing;
    ASSERT_FALSE(micro.empty());
    ASSERT_EQ(micro.size(), layer.size());
    EXPECT_EQ(std::memcmp(micro.data(), layer.data(), micro.size() * 4), 0)
        << "checkpointing " << checkpointing;
    // The clip coefficients ride along with the losses: the case clips.
    EXPECT_LT(*std::min_element(micro_losses.begin(), micro_losses.end()), 1.0);
  }
}

}  // namespace gpt::testing

#endif  // ZINF_TESTS_GPT_LAYER_MAJOR_RUN_H_
