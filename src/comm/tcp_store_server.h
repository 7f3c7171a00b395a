// TcpStoreServer: the server side of TcpStore (comm/tcp_store.h), which rank 0 starts before
// it connects as a client like every other rank. It holds the keys and values, answers each
// connection's requests and parks the Gets that wait for a key, defending itself against any
// process that can reach its port (Note [TcpStore admission] in tcp_store_server.cc). Private
// to src/comm: TcpStore is its only caller.
//
// Thread-safety: Start and the destructor may be called from any thread, port() from any
// thread; all serving happens on the server's own thread.
#ifndef ZINF_COMM_TCP_STORE_SERVER_H_
#define ZINF_COMM_TCP_STORE_SERVER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "zinf/status.h"

namespace zinf {

class TcpStoreServer {
 public:
  // Binds host:port (port 0: a free one, read back with port()) and serves on a thread of its
  // own before returning. Connections must first present `secret` (empty: none).
  // `max_clients` is the most authenticated clients held at once; 0: half the open-file
  // limit, in [16, 4096]. InvalidArgument when `host` is not an IP address; Unavailable when
  // the address cannot be bound; Internal when the system runs out of resources.
  static StatusOr<std::unique_ptr<TcpStoreServer>> Start(const std::string& host, uint16_t port,
                                                         std::string secret, size_t max_clients);
  // Closes every connection and joins the server thread.
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  // The port it listens on.
  uint16_t port() const;

 private:
  class Impl;
  explicit TcpStoreServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf

#endif  // ZINF_COMM_TCP_STORE_SERVER_H_
