// The engine's process group: where this process sits (from EngineOptions and torchrun's
// environment), its data-parallel group, and the rendezvous store and communicator that
// connect the group's ranks.
//
// Thread-safety: plain data and functions; the communicator's own contract applies.
#ifndef ZINF_ZERO_PROCESS_GROUP_H_
#define ZINF_ZERO_PROCESS_GROUP_H_

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/tcp_store.h"
#include "zinf/engine.h"
#include "zinf/status.h"

namespace zinf {

// This process's place among all processes and in its data-parallel group.
struct ProcessPlace {
  int global_rank = 0;  // among all processes
  int global_size = 1;
  int local_rank = 0;  // among the processes of this node (LOCAL_RANK)
  int rank = 0;        // in the data-parallel group
  int size = 1;
  std::string name = "world";  // distinguishes the groups' rendezvous in the store
  // Rendezvous: from the options, else the environment.
  std::string master_addr;
  int master_port = 0;
  std::string store_secret;
  std::string socket_ifname;  // Gloo's interface (DistEnvironment::socket_ifname)
};

// Resolves the options against the environment. InvalidArgument for a rank outside the world
// or a data_parallel_ranks list that is not distinct ranks holding this one.
StatusOr<ProcessPlace> ResolveProcessPlace(const EngineOptions& options);

// EngineOptions::device as the tiered store names it: "host"; "cuda:N" when that GPU is
// usable, "cuda" for cuda:LOCAL_RANK (Unavailable saying why not); "auto" or "" picks
// cuda:LOCAL_RANK where this node has that GPU, else host. InvalidArgument for any other name.
StatusOr<std::string> ResolveComputeDevice(const std::string& device, int local_rank);

struct ProcessGroup {
  std::unique_ptr<TcpStore> rendezvous;  // rank 0 serves it for every group; null for one process
  std::unique_ptr<Communicator> comm;
};

// Connects the data-parallel group: a local communicator for a group of one, else Gloo over
// the TCP store. Errors: the store's and communicator's (a missing rank within `timeout`).
StatusOr<ProcessGroup> ConnectProcessGroup(const ProcessPlace& place,
                                           std::chrono::milliseconds timeout);

}  // namespace zinf

#endif  // ZINF_ZERO_PROCESS_GROUP_H_
