// TcpStore: the key-value store ranks rendezvous through, in the manner of torch's TCPStore.
// Rank 0 serves it on MASTER_ADDR and zinf's port (ZINF_MASTER_PORT, else MASTER_PORT + 1: Note
// [Beside torch.distributed] in comm/environment.h); every rank (rank 0 too) is a client. It
// bootstraps Gloo (as a gloo::rendezvous::Store) and carries the NCCL unique id.
//
// Every blocking call has a deadline: a peer that never arrives or a server that died gives
// DeadlineExceeded or Unavailable naming the key and the address, never a hang.
//
// Any process that can reach the port can talk to the server, so it defends itself (See Note
// [TcpStore admission] in tcp_store_server.cc): every connection first presents the job's secret
// (ZINF_STORE_SECRET, which `zinf run` generates); keys, values and the stored total have
// limits (comm/tcp_store_wire.h) checked before anything is allocated; clients are bounded
// and a connection that ends is released at once. Without a secret the store serves loopback
// addresses only, as torchrun's does.
//
// Thread-safety: a TcpStore client may be used from several threads (calls are serialized).
#ifndef ZINF_COMM_TCP_STORE_H_
#define ZINF_COMM_TCP_STORE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zinf/status.h"

namespace zinf {

// The environment variable that hands the job's store secret to the ranks.
inline constexpr char kStoreSecretEnv[] = "ZINF_STORE_SECRET";

struct TcpStoreOptions {
  std::string host = "127.0.0.1";
  // 0 with is_server: pick a free port (read it back with port()).
  uint16_t port = 29500;
  bool is_server = false;
  // How long a client keeps trying to connect, and how long Get/Wait wait for a key.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // The job's shared secret (kStoreSecretEnv), at most 256 bytes; server and clients must
  // agree. Empty: none, which only a loopback host allows.
  std::string secret;
  // Server: the most authenticated clients (one per rank) held at once; more are refused and
  // the client retries until its timeout. 0: half the open-file limit, in [16, 4096].
  int max_clients = 0;
};

class TcpStore {
 public:
  // With is_server, binds and serves before returning (InvalidArgument/Unavailable when the
  // address cannot be bound). Then connects as a client, retrying until options.timeout.
  // InvalidArgument names kStoreSecretEnv when the host is not loopback and there is no
  // secret; FailedPrecondition when the server refuses this client's secret.
  static StatusOr<std::unique_ptr<TcpStore>> Create(const TcpStoreOptions& options);
  ~TcpStore();
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

  // Keys and values beyond the wire limits are InvalidArgument; a store at its byte limit
  // gives ResourceExhausted.
  Status Set(const std::string& key, const std::vector<uint8_t>& value);
  // Waits until `key` is set (up to the timeout), then returns its value.
  StatusOr<std::vector<uint8_t>> Get(const std::string& key);
  // Adds `delta` to the integer at `key` (0 when absent) and returns the new value.
  StatusOr<int64_t> Add(const std::string& key, int64_t delta);
  // Waits until every key is set; DeadlineExceeded names the first missing one.
  Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);
  // True when every key is set now.
  StatusOr<bool> Check(const std::vector<std::string>& keys);

  uint16_t port() const;
  // This client's end of its connection to the server: an address of the interface that
  // reaches the master ("127.0.0.1" when the master is local).
  std::string local_address() const;
  std::chrono::milliseconds timeout() const;

 private:
  struct Impl;
  explicit TcpStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf

#endif  // ZINF_COMM_TCP_STORE_H_
