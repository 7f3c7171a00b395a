// TcpStoreServer on Boost.Asio: one thread running an io_context. Each connection is a
// Session whose reads, replies and Get deadlines are asynchronous, so a Get that waits for a
// key costs a timer rather than a thread, and a connection that ends is freed as soon as its
// last handler returns.
//
// Note [TcpStore admission]
// Anyone who can connect to the port is a client, so the server bounds what a connection can
// cost before it has proved anything:
// - A new connection is "pending" until its first frame, kAuth with the job's secret, checks
//   out (constant-time compare). Anything else first is kDenied and closed, and a pending
//   connection that says nothing for kAuthTimeout is closed. Pending connections are at most
//   kMaxPending; at that limit the oldest is dropped, not the newest, so that idle connections
//   cannot lock a rank out (a rank authenticates within a round trip of connecting).
// - Authenticated clients are at most max_clients; more get kBusy and retry from the client.
// - ParseStoreRequest checks each length before the server reads what it announces, and the
//   server grows its buffer only as bytes arrive: a header announcing 4 GiB costs nothing.
//   A frame that breaks a rule is kBadRequest and the connection is closed.
// - The stored keys and values together are at most store_wire::kMaxStoreBytes (kFull beyond).
// - accept() failing for lack of descriptors or memory backs off instead of spinning.
#include "comm/tcp_store_server.h"

#include <fmt/core.h>
#include <sys/resource.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <list>
#include <map>
#include <optional>
#include <thread>
#include <unordered_set>

#include "comm/tcp_store_wire.h"
#include "core/log.h"
#include "core/thread_name.h"

namespace zinf {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using Bytes = std::vector<uint8_t>;
using store_wire::Op;
using store_wire::Reply;

constexpr size_t kMaxPending = 64;
constexpr auto kAuthTimeout = std::chrono::seconds(10);
// Reads grow the buffer by at most this much at a time: memory follows the bytes that came.
constexpr size_t kReadChunkBytes = 64 << 10;
// The longest a Get may wait on the server, whatever the client asked for.
constexpr auto kMaxGetWait = std::chrono::hours(24);

size_t DefaultMaxClients() {
  rlimit rl{};
  uint64_t fds = 1024;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) fds = rl.rlim_cur;
  // Half the descriptors: the process needs the rest (Gloo's peer sockets, swap files).
  return std::clamp<uint64_t>(fds / 2, 16, 4096);
}

}  // namespace

class TcpStoreServer::Impl {
 public:
  Impl(std::string secret, size_t max_clients)
      : secret_(std::move(secret)), max_clients_(max_clients) {}

  Status Listen(const std::string& host, uint16_t port) {
    boost::system::error_code ec;
    const auto address = asio::ip::make_address(host, ec);
    if (ec) return InvalidArgument(fmt::format("TcpStore host '{}' is not an IP address", host));
    const tcp::endpoint endpoint(address, port);
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return Unavailable(
          fmt::format("TcpStore cannot listen on {}:{}: {}", host, port, ec.message()));
    }
    port_ = acceptor_.local_endpoint().port();
    Accept();
    thread_ = std::thread([this] {
      NameThisThread("zinf-store");
      Run();
    });
    return OkStatus();
  }

  ~Impl();

  uint16_t port() const { return port_; }

 private:
  class Session;

  void Run() {
    for (;;) {
      try {
        io_.run();
        return;
      } catch (const std::exception& e) {  // a handler ran out of memory: keep serving
        log::Warn("TcpStore server: {}", e.what());
      }
    }
  }

  void Accept() {
    acceptor_.async_accept([this](const boost::system::error_code& ec, tcp::socket socket) {
      if (stopping_ || ec == asio::error::operation_aborted) return;
      if (ec == asio::error::connection_aborted) {  // that peer is gone; the next may be fine
        Accept();
        return;
      }
      if (ec) {
        // EMFILE, ENFILE, ENOMEM...: the connection stays queued and accept() would fail
        // again at once. Wait for descriptors to come back instead of spinning.
        const auto now = std::chrono::steady_clock::now();
        if (now - last_accept_warning_ > std::chrono::seconds(10)) {
          last_accept_warning_ = now;
          log::Warn("TcpStore on port {}: accept: {}; retrying in 100 ms", port_, ec.message());
        }
        accept_backoff_.expires_after(std::chrono::milliseconds(100));
        accept_backoff_.async_wait([this](const boost::system::error_code& e) {
          if (!e && !stopping_) Accept();
        });
        return;
      }
      Accept();  // first: if admitting this one throws, the server still accepts the next
      Admit(std::move(socket));
    });
  }

  // See Note [TcpStore admission].
  void Admit(tcp::socket socket);
  // Answers the Gets waiting for `key`, which now has `value`.
  void WakeWaiters(const std::string& key, const Bytes& value);
  void RemoveWaiter(const std::string& key, Session* session);

  // Stores `value` at `key` unless that would pass store_wire::kMaxStoreBytes.
  bool Store(const std::string& key, Bytes value) {
    auto it = data_.find(key);
    const uint64_t old_bytes = it == data_.end() ? 0 : key.size() + it->second.size();
    const uint64_t new_bytes = key.size() + value.size();
    if (data_bytes_ - old_bytes + new_bytes > store_wire::kMaxStoreBytes) return false;
    data_bytes_ = data_bytes_ - old_bytes + new_bytes;
    data_[key] = std::move(value);
    WakeWaiters(key, data_[key]);
    return true;
  }

  // Everything below runs on the server thread only.
  asio::io_context io_;
  tcp::acceptor acceptor_{io_};
  asio::steady_timer accept_backoff_{io_};
  std::chrono::steady_clock::time_point last_accept_warning_{};
  const std::string secret_;
  const size_t max_clients_;
  uint16_t port_ = 0;
  bool stopping_ = false;
  std::list<Session*> pending_;                   // not yet authenticated, oldest first
  std::unordered_set<Session*> clients_;          // authenticated
  std::multimap<std::string, Session*> waiters_;  // Gets waiting for a key
  std::map<std::string, Bytes> data_;
  uint64_t data_bytes_ = 0;  // keys and values in data_
  std::thread thread_;       // last: starts after the rest exists
};

// One connection. Owned by the handlers of its pending operations (shared_ptr); the server
// holds plain pointers that Close() removes, so a session is freed once it is closed and its
// last handler has returned.
class TcpStoreServer::Impl::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(Impl& server, tcp::socket socket)
      : server_(server), socket_(std::move(socket)), timer_(server.io_) {}

  void Start() {
    server_.pending_.push_back(this);
    pending_it_ = std::prev(server_.pending_.end());
    timer_.expires_after(kAuthTimeout);
    timer_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec && !self->closed_ && !self->authenticated_) self->Close();
    });
    Read();
  }

  // Idempotent; leaves the server's registries and cancels whatever is in flight.
  void Close() {
    if (closed_) return;
    closed_ = true;
    if (authenticated_) {
      server_.clients_.erase(this);
    } else {
      server_.pending_.erase(pending_it_);
    }
    if (waiting_key_) server_.RemoveWaiter(*waiting_key_, this);
    waiting_key_.reset();
    timer_.cancel();
    boost::system::error_code ec;
    socket_.close(ec);
  }

  // The key a waiting Get asked for has been set.
  void Answer(const Bytes& value) {
    waiting_key_.reset();
    ++wait_id_;
    timer_.cancel();
    Send(Reply::kOk, value);
  }

 private:
  // Reads toward want_ bytes of the current frame, a chunk at a time.
  void Read() {
    if (reading_ || closed_) return;
    reading_ = true;
    const size_t have = in_.size();
    const size_t chunk = std::min(want_ - have, kReadChunkBytes);
    in_.resize(have + chunk);
    asio::async_read(socket_, asio::buffer(in_.data() + have, chunk),
                     [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                       self->OnRead(ec);
                     });
  }

  void OnRead(const boost::system::error_code& ec) {
    reading_ = false;
    if (closed_) return;
    if (ec) {  // the peer left (or the server is stopping)
      Close();
      return;
    }
    if (in_.size() < want_) {
      Read();
      return;
    }
    StatusOr<store_wire::ParseResult> parsed = store_wire::ParseStoreRequest(in_, authenticated_);
    if (!parsed.ok()) {
      log::Debug("TcpStore: refusing a connection: {}", parsed.status().ToString());
      Send(authenticated_ ? Reply::kBadRequest : Reply::kDenied, {}, /*close_after=*/true);
      return;
    }
    if (!parsed->request) {
      want_ = parsed->frame_bytes;
      Read();
      return;
    }
    want_ = store_wire::kHeaderBytes;
    if (in_.capacity() > kReadChunkBytes) {
      in_ = Bytes();  // an idle connection does not keep a large frame's buffer
    } else {
      in_.clear();
    }
    if (waiting_key_) {
      // Clients send one request at a time; one during a Get is not one of ours.
      Send(Reply::kBadRequest, {}, /*close_after=*/true);
      return;
    }
    if (writing_) {  // the answer to a Get is still going out: handle this after it
      next_ = std::move(parsed->request);
      return;
    }
    Handle(std::move(*parsed->request));
  }

  void Handle(store_wire::Request request) {
    if (!authenticated_) {
      Authenticate(request);
      return;
    }
    switch (request.op) {
      case Op::kAuth:
        Send(Reply::kBadRequest, {}, /*close_after=*/true);
        return;
      case Op::kSet:
        Send(server_.Store(request.key, std::move(request.value)) ? Reply::kOk : Reply::kFull, {});
        return;
      case Op::kAdd: {
        auto it = server_.data_.find(request.key);
        const int64_t old = it == server_.data_.end() ? 0 : store_wire::DecodeI64(it->second);
        // Wraps instead of overflowing (signed overflow is undefined).
        const auto now =
            static_cast<int64_t>(static_cast<uint64_t>(old) +
                                 static_cast<uint64_t>(store_wire::DecodeI64(request.value)));
        if (!server_.Store(request.key, store_wire::EncodeI64(now))) {
          Send(Reply::kFull, {});
          return;
        }
        Send(Reply::kOk, store_wire::EncodeI64(now));
        return;
      }
      case Op::kCheck:
        Send(server_.data_.count(request.key) != 0 ? Reply::kOk : Reply::kMissing, {});
        return;
      case Op::kGet: {
        auto it = server_.data_.find(request.key);
        if (it != server_.data_.end()) {
          Send(Reply::kOk, it->second);
          return;
        }
        WaitForKey(request.key, std::chrono::milliseconds(store_wire::DecodeI64(request.value)));
        return;
      }
    }
  }

  // The first request of a pending connection: the job's secret, or the door. See Note
  // [TcpStore admission].
  void Authenticate(const store_wire::Request& request) {
    if (request.op != Op::kAuth || !store_wire::ConstantTimeEquals(request.key, server_.secret_)) {
      log::Debug("TcpStore: refusing a connection that did not present the job's secret");
      Send(Reply::kDenied, {}, /*close_after=*/true);
      return;
    }
    if (server_.clients_.size() >= server_.max_clients_) {
      Send(Reply::kBusy, {}, /*close_after=*/true);
      return;
    }
    server_.pending_.erase(pending_it_);
    server_.clients_.insert(this);
    authenticated_ = true;
    timer_.cancel();
    Send(Reply::kOk, {});
  }

  // A Get of a key not set yet: answered by Answer() when it is set, or kTimeout after
  // `asked` (at most kMaxGetWait).
  void WaitForKey(const std::string& key, std::chrono::milliseconds asked) {
    const auto wait = std::clamp<std::chrono::milliseconds>(asked, std::chrono::milliseconds(0),
                                                            std::chrono::milliseconds(kMaxGetWait));
    waiting_key_ = key;
    server_.waiters_.emplace(key, this);
    const uint64_t id = ++wait_id_;
    timer_.expires_after(wait);
    timer_.async_wait([self = shared_from_this(), id](const boost::system::error_code& ec) {
      // A stale expiry (the key came, or another Get began) has a different id.
      if (ec || self->closed_ || !self->waiting_key_ || self->wait_id_ != id) return;
      self->server_.RemoveWaiter(*self->waiting_key_, self.get());
      self->waiting_key_.reset();
      self->Send(Reply::kTimeout, {});
    });
    // Keep reading while waiting: a client that leaves is noticed now, not at the deadline.
    Read();
  }

  void Send(Reply reply, const Bytes& payload, bool close_after = false) {
    if (closed_) return;
    if (writing_) {  // one request, one reply: a second reply now would be a bug here
      log::Warn("TcpStore: a second reply while one is being sent; closing the connection");
      Close();
      return;
    }
    writing_ = true;
    out_ = store_wire::EncodeReply(reply, payload);
    asio::async_write(
        socket_, asio::buffer(out_),
        [self = shared_from_this(), close_after](const boost::system::error_code& ec, size_t) {
          self->writing_ = false;
          if (self->closed_) return;
          if (ec || close_after) {
            self->Close();
            return;
          }
          self->out_ = Bytes();
          if (self->next_) {
            store_wire::Request next = std::move(*self->next_);
            self->next_.reset();
            self->Handle(std::move(next));
            return;
          }
          self->Read();
        });
  }

  Impl& server_;
  tcp::socket socket_;
  asio::steady_timer timer_;  // the auth deadline, then each waiting Get's
  Bytes in_;                  // the current frame, as far as it has arrived
  size_t want_ = store_wire::kHeaderBytes;
  Bytes out_;
  bool reading_ = false;
  bool writing_ = false;
  bool authenticated_ = false;
  bool closed_ = false;
  std::optional<std::string> waiting_key_;
  uint64_t wait_id_ = 0;
  std::optional<store_wire::Request> next_;  // arrived while the previous reply was going out
  std::list<Session*>::iterator pending_it_;
};

TcpStoreServer::Impl::~Impl() {
  if (!thread_.joinable()) return;  // Listen failed: nothing runs
  // Closing everything on the server thread ends every operation; run() then returns.
  asio::post(io_, [this] {
    stopping_ = true;
    boost::system::error_code ec;
    acceptor_.close(ec);
    accept_backoff_.cancel();
    std::vector<Session*> all(pending_.begin(), pending_.end());
    all.insert(all.end(), clients_.begin(), clients_.end());
    for (Session* s : all) s->Close();
  });
  thread_.join();
}

void TcpStoreServer::Impl::Admit(tcp::socket socket) {
  boost::system::error_code ec;
  if (clients_.size() >= max_clients_) {
    // A five-byte reply fits any fresh socket's send buffer: no need to wait for it.
    const Bytes busy = store_wire::EncodeReply(Reply::kBusy, {});
    socket.non_blocking(true, ec);
    socket.write_some(asio::buffer(busy), ec);
    socket.close(ec);
    return;
  }
  if (pending_.size() >= kMaxPending) pending_.front()->Close();
  socket.set_option(tcp::no_delay(true), ec);
  auto session = std::make_shared<Session>(*this, std::move(socket));
  session->Start();
}

void TcpStoreServer::Impl::WakeWaiters(const std::string& key, const Bytes& value) {
  auto [begin, end] = waiters_.equal_range(key);
  std::vector<Session*> woken;
  for (auto it = begin; it != end; ++it) woken.push_back(it->second);
  waiters_.erase(begin, end);
  for (Session* s : woken) s->Answer(value);
}

void TcpStoreServer::Impl::RemoveWaiter(const std::string& key, Session* session) {
  auto [begin, end] = waiters_.equal_range(key);
  for (auto it = begin; it != end; ++it) {
    if (it->second == session) {
      waiters_.erase(it);
      return;
    }
  }
}

TcpStoreServer::TcpStoreServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TcpStoreServer::~TcpStoreServer() = default;

StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(const std::string& host,
                                                                uint16_t port, std::string secret,
                                                                size_t max_clients) {
  try {
    auto impl = std::make_unique<Impl>(std::move(secret),
                                       max_clients > 0 ? max_clients : DefaultMaxClients());
    ZINF_RETURN_IF_ERROR(impl->Listen(host, port));
    return std::unique_ptr<TcpStoreServer>(new TcpStoreServer(std::move(impl)));
  } catch (const std::exception& e) {  // Boost.Asio throws on resource exhaustion
    return Internal(fmt::format("TcpStore server: {}", e.what()));
  }
}

uint16_t TcpStoreServer::port() const { return impl_->port(); }

}  // namespace zinf
