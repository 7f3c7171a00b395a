// TcpStore: the key-value store ranks rendezvous through, in the manner of torch's TCPStore.
// Rank 0 serves it on MASTER_ADDR:MASTER_PORT; every rank (rank 0 too) is a client. It
// bootstraps Gloo (as a gloo::rendezvous::Store) and carries the NCCL unique id.
//
// Every blocking call has a deadline: a peer that never arrives or a server that died gives
// DeadlineExceeded or Unavailable naming the key and the address, never a hang.
//
// Wire format (private to this file pair): a request is [u8 op][u32 key length][key]
// [u32 value length][value]; a reply is [u8 status][u32 length][payload]. Integers are
// little-endian.
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

struct TcpStoreOptions {
  std::string host = "127.0.0.1";
  // 0 with is_server: pick a free port (read it back with port()).
  uint16_t port = 29500;
  bool is_server = false;
  // How long a client keeps trying to connect, and how long Get/Wait wait for a key.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};

class TcpStore {
 public:
  // With is_server, binds and serves before returning (InvalidArgument/Unavailable when the
  // address cannot be bound). Then connects as a client, retrying until options.timeout.
  static StatusOr<std::unique_ptr<TcpStore>> Create(const TcpStoreOptions& options);
  ~TcpStore();
  TcpStore(const TcpStore&) = delete;
  TcpStore& operator=(const TcpStore&) = delete;

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
  std::chrono::milliseconds timeout() const;

 private:
  struct Impl;
  explicit TcpStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf

#endif  // ZINF_COMM_TCP_STORE_H_
