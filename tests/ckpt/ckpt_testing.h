// A small model and a training loop whose gradients depend on the parameters, for the
// checkpoint tests: state lost or altered by a save and load changes every later step.
#ifndef ZINF_TESTS_CKPT_CKPT_TESTING_H_
#define ZINF_TESTS_CKPT_CKPT_TESTING_H_

#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "zinf/engine.h"

namespace zinf::testing {

inline const std::vector<std::string> kCkptParams = {"a.w", "a.b", "b.w"};

// `placement`: "memory", "params_nvme", "optimizer_nvme", "all_nvme" (NVMe under nvme_dir) or
// "all_nvme_overlap" (all_nvme with the optimizer step alongside backward,
// zinf.overlap_optimizer).
// `reversed`: the modules registered in the other order, b then a (the same model, laid out
// differently).
inline StatusOr<std::unique_ptr<Engine>> MakeCkptEngine(const std::string& placement,
                                                        const std::string& nvme_dir, int rank,
                                                        int world, int port,
                                                        bool reversed = false) {
  auto offload = [&](bool nvme) {
    return nvme ? R"({"device": "nvme", "nvme_path": ")" + nvme_dir + "\"}"
                : std::string(R"({"device": "cpu"})");
  };
  const bool overlap = placement == "all_nvme_overlap";
  const bool params_nvme = placement == "params_nvme" || placement == "all_nvme" || overlap;
  const bool optimizer_nvme = placement == "optimizer_nvme" || placement == "all_nvme" || overlap;
  ZINF_ASSIGN_OR_RETURN(
      EngineConfig config,
      EngineConfig::FromJson(
          R"({"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 40,
              "offload_optimizer": )" +
          offload(optimizer_nvme) + R"(, "offload_param": )" +
          (params_nvme ? offload(true) : R"({"device": "none"})") +
          R"(}, "fp16": {"enabled": true, "initial_scale_power": 4},
              "optimizer": {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.1}},
              "zinf": {"overlap_optimizer": )" +
          (overlap ? "true" : "false") + "}}"));
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                        Engine::Create(config, {.device = "host",
                                                .rank = rank,
                                                .world_size = world,
                                                .master_port = port,
                                                .timeout = std::chrono::seconds(20),
                                                .optimizer_threads = 1}));
  if (reversed) ZINF_RETURN_IF_ERROR(engine->RegisterModule("b", {{"b.w", {5001}}}).status());
  ZINF_RETURN_IF_ERROR(engine->RegisterModule("a", {{"a.w", {37, 11}}, {"a.b", {37}}}).status());
  if (!reversed) ZINF_RETURN_IF_ERROR(engine->RegisterModule("b", {{"b.w", {5001}}}).status());
  ZINF_RETURN_IF_ERROR(engine->Initialize());
  return engine;
}

// Steps [from, to): gradients sin(3 p + step + rank) * loss_scale, one micro-batch per step.
inline Status TrainCkptEngine(Engine& e, int from, int to) {
  for (int step = from; step < to; ++step) {
    for (int id : {0, 1}) {
      ZINF_ASSIGN_OR_RETURN(FetchedModule m, e.Fetch(id));
      ZINF_ASSIGN_OR_RETURN(std::vector<float*> g, e.Gradients(id));
      const std::vector<size_t> sizes =
          id == 0 ? std::vector<size_t>{37 * 11, 37} : std::vector<size_t>{5001};
      for (size_t k = 0; k < sizes.size(); ++k) {
        for (size_t i = 0; i < sizes[k]; ++i) {
          g[k][i] =
              static_cast<float>(std::sin(3.0 * m.params[k][i] + step + e.rank()) * e.loss_scale());
        }
      }
      ZINF_RETURN_IF_ERROR(e.ReduceGradients(id));
      ZINF_RETURN_IF_ERROR(e.Release(id));
    }
    ZINF_RETURN_IF_ERROR(e.Step().status());
  }
  return OkStatus();
}

// Every parameter, gathered and concatenated in kCkptParams order (a collective).
inline StatusOr<std::vector<float>> AllCkptParams(Engine& e) {
  std::vector<float> all, one;
  for (const std::string& name : kCkptParams) {
    ZINF_RETURN_IF_ERROR(e.GatherParameter(name, &one));
    all.insert(all.end(), one.begin(), one.end());
  }
  return all;
}

}  // namespace zinf::testing

#endif  // ZINF_TESTS_CKPT_CKPT_TESTING_H_
