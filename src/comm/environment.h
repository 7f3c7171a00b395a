// The distributed environment as torchrun (and `zinf run`) describe it: RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, GLOO_SOCKET_IFNAME. Unset means a
// single process.
// `zinf run` adds ZINF_STORE_SECRET (kStoreSecretEnv), the rendezvous store's secret.
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
  uint16_t master_port = 29500;
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
