// See src/zero/process_group.h.
#include "zero/process_group.h"

#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include "comm/environment.h"
#include "core/log.h"
#include "zinf/device.h"

namespace zinf {

StatusOr<ProcessPlace> ResolveProcessPlace(const EngineOptions& options) {
  ZINF_ASSIGN_OR_RETURN(DistEnvironment env, ReadDistEnvironment());
  ProcessPlace place;
  place.global_rank = options.rank >= 0 ? options.rank : env.rank;
  place.global_size = options.world_size >= 0 ? options.world_size : env.world_size;
  place.local_rank = env.local_rank;
  place.master_addr = options.master_addr.empty() ? env.master_addr : options.master_addr;
  // zinf's own store, never MASTER_PORT itself: Note [Beside torch.distributed].
  place.master_port = options.master_port > 0 ? options.master_port : env.store_port;
  place.store_secret = env.store_secret;
  place.socket_ifname = env.socket_ifname;
  const int rank = place.global_rank, world = place.global_size;
  if (world < 1 || rank < 0 || rank >= world) {
    return InvalidArgument(fmt::format("rank must be in [0, world_size={}), got {}", world, rank));
  }
  const std::vector<int>& ranks = options.data_parallel_ranks;
  place.rank = rank;
  place.size = world;
  if (ranks.empty()) return place;
  place.rank = -1;
  place.size = static_cast<int>(ranks.size());
  place.name = "dp";
  std::vector<bool> seen(world);
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int r = ranks[i];
    if (r < 0 || r >= world || seen[r]) {
      return InvalidArgument(
          fmt::format("data_parallel_ranks {}: each must be a distinct rank in [0, world_size={})",
                      nlohmann::json(ranks).dump(), world));
    }
    seen[r] = true;
    if (r == rank) place.rank = static_cast<int>(i);
    place.name += "-" + std::to_string(r);
  }
  if (place.rank < 0) {
    return InvalidArgument(fmt::format("data_parallel_ranks {} does not hold this rank ({})",
                                       nlohmann::json(ranks).dump(), rank));
  }
  return place;
}

StatusOr<std::string> ResolveComputeDevice(const std::string& device, int local_rank) {
  if (device == "host") return device;
  const bool pick = device.empty() || device == "auto";
  int ordinal = local_rank;
  if (!pick && device != "cuda") {
    const std::string digits = device.rfind("cuda:", 0) == 0 ? device.substr(5) : std::string();
    if (digits.empty() || digits.size() > 4 ||
        digits.find_first_not_of("0123456789") != std::string::npos) {
      return InvalidArgument(fmt::format(
          "compute device \"{}\": expected \"host\", \"cuda\", \"cuda:N\" or \"auto\"", device));
    }
    ordinal = std::stoi(digits);
  }
  const GpuReport gpus = ProbeGpus();
  if (ordinal < static_cast<int>(gpus.gpus.size())) return fmt::format("cuda:{}", ordinal);
  const std::string why = !gpus.error.empty() ? gpus.error
                                              : fmt::format("this node has {} GPU(s), no GPU {}",
                                                            gpus.gpus.size(), ordinal);
  if (pick) {
    log::Info("compute device: host ({})", why);
    return std::string("host");
  }
  const std::string named =
      device == "cuda" ? fmt::format("\"cuda\" (LOCAL_RANK {}: \"cuda:{}\")", local_rank, ordinal)
                       : fmt::format("\"{}\"", device);
  return Unavailable(fmt::format("compute device {}: {}", named, why));
}

StatusOr<ProcessGroup> ConnectProcessGroup(const ProcessPlace& place,
                                           std::chrono::milliseconds timeout) {
  ProcessGroup group;
  // Rank 0 serves the store for every group, its own may be a group of one.
  if (place.global_size > 1 && (place.size > 1 || place.global_rank == 0)) {
    ZINF_ASSIGN_OR_RETURN(group.rendezvous,
                          TcpStore::Create({.host = place.master_addr,
                                            .port = static_cast<uint16_t>(place.master_port),
                                            .is_server = place.global_rank == 0,
                                            .timeout = timeout,
                                            .secret = place.store_secret}));
  }
  if (place.size == 1) {
    ZINF_ASSIGN_OR_RETURN(group.comm, CreateLocalCommunicator());
  } else {
    ZINF_ASSIGN_OR_RETURN(group.comm,
                          CreateGlooCommunicator(*group.rendezvous, {.rank = place.rank,
                                                                     .world_size = place.size,
                                                                     .iface = place.socket_ifname,
                                                                     .timeout = timeout,
                                                                     .group_name = place.name}));
  }
  return group;
}

}  // namespace zinf
