// The distributed environment as torchrun (and `zinf run`) describe it: RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, GLOO_SOCKET_IFNAME. Unset means a
// single process.
// `zinf run` adds ZINF_STORE_SECRET (kStoreSecretEnv), the rendezvous store's secret.
//
// Note [Beside torch.distributed]
// MASTER_PORT belongs to torch.distributed: init_process_group's TCPStore binds it on rank 0.
// zinf's own rendezvous store (TcpStore) takes ZINF_MASTER_PORT when set, else the port after
// MASTER_PORT, so a process can run both, initialized in either order, without one failing to
// bind the other's port. The port after may be taken by a connection (a launcher's probed
// MASTER_PORT lies in the ephemeral range), so `zinf run` sets ZINF_MASTER_PORT to a second
// probed port, and zinf.zero, when torch.distributed is initialized first, agrees on a free
// port through torch's own store and passes it as EngineOptions::master_port.
#ifndef ZINF_COMM_ENVIRONMENT_H_
#define ZINF_COMM_ENVIRONMENT_H_

#include <cstdint>
#include <string>

#include "zinf/status.h"

namespace zinf {

struct DistEnvironment {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  uint16_t master_port = 29500;  // MASTER_PORT: torch.distributed's
  // zinf's rendezvous store: ZINF_MASTER_PORT, else master_port + 1 (Note [Beside
  // torch.distributed]).
  uint16_t store_port = 29501;
  std::string store_secret;  // ZINF_STORE_SECRET; empty when unset (see TcpStoreOptions::secret)
  // The network interface for Gloo's connections: GLOO_SOCKET_IFNAME, else NCCL_SOCKET_IFNAME
  // (the first name of a comma-separated list, as torch uses it; NCCL's "^" exclusion lists
  // name no interface and are ignored). Empty: the one that reaches MASTER_ADDR.
  std::string socket_ifname;
  bool launched = false;  // true when RANK and WORLD_SIZE were set
};

// Reads the variables. InvalidArgument names the variable, its value and what is allowed
// (e.g. RANK set without WORLD_SIZE, RANK outside [0, WORLD_SIZE), a port outside 1..65535).
StatusOr<DistEnvironment> ReadDistEnvironment();

}  // namespace zinf

#endif  // ZINF_COMM_ENVIRONMENT_H_
