// How the engine's tests set up an engine around their own training loops: a forked rank's
// engine on the host device, made from a JSON config, and the placement of the parameters and
// the optimizer state as that config's offload entries. Each test keeps its model, its loop
// and what it writes for the parent to check; RunRanks (fork_ranks.h) forks the ranks.
//
// Thread-safety: plain functions and values.
#ifndef ZINF_TESTS_TESTING_ENGINE_SETUP_H_
#define ZINF_TESTS_TESTING_ENGINE_SETUP_H_

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "zinf/engine.h"
#include "zinf/status.h"

namespace zinf::testing {

// The options of rank `rank` of `world` ranks forked on this machine: the host device, the
// rendezvous on loopback `port`, one optimizer thread (the ranks share the machine's cores),
// a collective that makes no progress for `timeout` fails. `data_parallel_ranks`: the rank's
// data-parallel group (empty: all ranks).
inline EngineOptions HostRankOptions(int rank, int world, int port,
                                     std::chrono::milliseconds timeout = std::chrono::seconds(20),
                                     std::vector<int> data_parallel_ranks = {}) {
  return {.device = "host",
          .rank = rank,
          .world_size = world,
          .master_port = port,
          .timeout = timeout,
          .optimizer_threads = 1,
          .data_parallel_ranks = std::move(data_parallel_ranks)};
}

// Engine::Create from the JSON config `json`. Where the config or the engine is refused it
// prints why to stderr, since a forked rank reports only an exit code, and returns the error.
inline StatusOr<std::unique_ptr<Engine>> CreateRankEngine(const std::string& json,
                                                          const EngineOptions& options) {
  StatusOr<EngineConfig> config = EngineConfig::FromJson(json);
  if (!config.ok()) {
    std::fprintf(stderr, "rank %d: config: %s\n", options.rank, config.status().ToString().c_str());
    return config.status();
  }
  StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(*config, options);
  if (!engine.ok()) {
    std::fprintf(stderr, "rank %d: engine: %s\n", options.rank, engine.status().ToString().c_str());
  }
  return engine;
}

// Where the optimizer state and the parameters live (ZeRO-Offload, ZeRO-Infinity): the
// optimizer state in host memory or on NVMe, the parameters on the compute device or on NVMe.
struct Placement {
  bool optimizer_nvme = false;
  bool params_nvme = false;
};

// The placement as the entries of the config's "zero_optimization" object:
// "offload_optimizer": {...}, "offload_param": {...}, their NVMe swap files in `nvme_dir`.
inline std::string OffloadJson(const Placement& placement, const std::string& nvme_dir) {
  const std::string nvme = R"({"device": "nvme", "nvme_path": ")" + nvme_dir + "\"}";
  return R"("offload_optimizer": )" +
         (placement.optimizer_nvme ? nvme : std::string(R"({"device": "cpu"})")) +
         R"(, "offload_param": )" +
         (placement.params_nvme ? nvme : std::string(R"({"device": "none"})"));
}

}  // namespace zinf::testing

#endif  // ZINF_TESTS_TESTING_ENGINE_SETUP_H_
