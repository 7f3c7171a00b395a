// Training a plan's model on a real engine, for the tests that hold the plan to it.
#ifndef ZINF_TESTS_TOOLS_PLAN_TRAINING_H_
#define ZINF_TESTS_TOOLS_PLAN_TRAINING_H_

#include <algorithm>
#include <string>
#include <vector>

#include "tools/plan_model.h"
#include "zinf/engine.h"

namespace zinf::plan {

// Trains `model` for `steps` steps with one rank under `config`: each micro-batch fetches
// along model.fetch_order, the first pass over a module being forward and the second backward
// (gradients of 1e-3). Returns the last step's summary.
inline StatusOr<StepSummary> Train(const ModelSpec& model, const EngineConfig& config, int steps) {
  ZINF_ASSIGN_OR_RETURN(
      auto engine,
      Engine::Create(config,
                     {.device = "host", .rank = 0, .world_size = 1, .optimizer_threads = 1}));
  std::vector<int> ids;
  for (const ModuleShape& m : model.modules) {
    std::vector<ParamSpec> specs;
    for (size_t i = 0; i < m.numels.size(); ++i) {
      specs.push_back({m.name + "." + std::to_string(i), {static_cast<int64_t>(m.numels[i])}});
    }
    ZINF_ASSIGN_OR_RETURN(int id, engine->RegisterModule(m.name, specs));
    ids.push_back(id);
  }
  ZINF_RETURN_IF_ERROR(engine->Initialize());
  StepSummary last;
  for (int s = 0; s < steps; ++s) {
    for (int k = 0; k < config.gradient_accumulation_steps; ++k) {
      std::vector<int> seen(model.modules.size(), 0);
      for (int mod : model.fetch_order) {
        ZINF_ASSIGN_OR_RETURN(FetchedModule f, engine->Fetch(ids[mod]));
        (void)f;
        if (seen[mod]++ > 0) {
          ZINF_ASSIGN_OR_RETURN(std::vector<float*> g, engine->Gradients(ids[mod]));
          for (size_t i = 0; i < g.size(); ++i) {
            std::fill(g[i], g[i] + model.modules[mod].numels[i], 1e-3f);
          }
          ZINF_RETURN_IF_ERROR(engine->ReduceGradients(ids[mod]));
        }
        ZINF_RETURN_IF_ERROR(engine->Release(ids[mod]));
      }
    }
    ZINF_ASSIGN_OR_RETURN(last, engine->Step());
  }
  return last;
}

}  // namespace zinf::plan

#endif  // ZINF_TESTS_TOOLS_PLAN_TRAINING_H_
