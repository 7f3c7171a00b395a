// TcpStore on Boost.Asio. The server accepts on one thread and serves each connection on its
// own thread with blocking reads (ranks are few; a Get that waits for a key then simply
// blocks that connection's thread on a condition variable). Clients use asynchronous
// operations driven by io_context::run_for, which is how every call gets its deadline.
#include "comm/tcp_store.h"

#include <fmt/core.h>
#include <sys/socket.h>

#include <boost/asio.hpp>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "core/log.h"

namespace zinf {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using Bytes = std::vector<uint8_t>;

enum class Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kCheck = 4 };
enum class Reply : uint8_t { kOk = 0, kTimeout = 1, kMissing = 2, kBadRequest = 3 };

// Largest key or value accepted: rendezvous data is small; this rejects garbage lengths.
constexpr uint32_t kMaxFieldBytes = 64 << 20;

void PutU32(Bytes& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
uint32_t GetU32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
Bytes EncodeI64(int64_t v) {
  Bytes out(8);
  std::memcpy(out.data(), &v, 8);  // x86-64 and aarch64 are both little-endian
  return out;
}
int64_t DecodeI64(const Bytes& b) {
  int64_t v = 0;
  std::memcpy(&v, b.data(), std::min<size_t>(8, b.size()));
  return v;
}

// ---------------------------------------------------------------------------------------
// Server

class Server {
 public:
  Server() : acceptor_(io_) {}

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
    accept_thread_ = std::thread([this] { AcceptLoop(); });
    return OkStatus();
  }

  ~Server() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    boost::system::error_code ec;
    // shutdown() wakes a thread blocked in accept(); close() alone does not on Linux.
    if (acceptor_.is_open()) ::shutdown(acceptor_.native_handle(), SHUT_RDWR);
    acceptor_.close(ec);
    if (accept_thread_.joinable()) accept_thread_.join();  // not started when Listen failed
    std::vector<std::thread> threads;
    {
      std::lock_guard lock(mu_);
      for (auto& socket : sockets_) socket->shutdown(tcp::socket::shutdown_both, ec);
      threads = std::move(connection_threads_);
    }
    for (auto& t : threads) t.join();
  }

  uint16_t port() const { return port_; }

 private:
  void AcceptLoop() {
    for (;;) {
      auto socket = std::make_shared<tcp::socket>(io_);
      boost::system::error_code ec;
      acceptor_.accept(*socket, ec);
      std::lock_guard lock(mu_);
      if (stopping_) return;
      if (ec) {
        log::Debug("TcpStore accept: {}", ec.message());
        continue;
      }
      socket->set_option(tcp::no_delay(true), ec);
      sockets_.push_back(socket);
      connection_threads_.emplace_back([this, socket] { Serve(*socket); });
    }
  }

  void Serve(tcp::socket& socket) {
    for (;;) {
      uint8_t header[5];
      boost::system::error_code ec;
      if (asio::read(socket, asio::buffer(header), ec) != sizeof(header) || ec) return;
      const auto op = static_cast<Op>(header[0]);
      // Lengths are checked before anything is allocated: a garbage length loses the
      // connection, not the server's memory.
      const uint32_t key_bytes = GetU32(header + 1);
      if (key_bytes > kMaxFieldBytes) return;
      std::string key(key_bytes, '\0');
      asio::read(socket, asio::buffer(key), ec);
      uint8_t len[4];
      if (!ec) asio::read(socket, asio::buffer(len), ec);
      if (ec || GetU32(len) > kMaxFieldBytes) return;
      Bytes value(GetU32(len));
      asio::read(socket, asio::buffer(value), ec);
      if (ec) return;
      auto [reply, payload] = Handle(op, key, value);
      Bytes out{static_cast<uint8_t>(reply)};
      PutU32(out, static_cast<uint32_t>(payload.size()));
      out.insert(out.end(), payload.begin(), payload.end());
      asio::write(socket, asio::buffer(out), ec);
      if (ec) return;
    }
  }

  std::pair<Reply, Bytes> Handle(Op op, const std::string& key, const Bytes& value) {
    std::unique_lock lock(mu_);
    switch (op) {
      case Op::kSet:
        data_[key] = value;
        cv_.notify_all();
        return {Reply::kOk, {}};
      case Op::kGet: {
        const auto timeout = std::chrono::milliseconds(DecodeI64(value));
        const bool found =
            cv_.wait_for(lock, timeout, [&] { return stopping_ || data_.count(key) != 0; });
        if (!found || data_.count(key) == 0) return {Reply::kTimeout, {}};
        return {Reply::kOk, data_[key]};
      }
      case Op::kAdd: {
        auto it = data_.find(key);
        const int64_t now = (it == data_.end() ? 0 : DecodeI64(it->second)) + DecodeI64(value);
        data_[key] = EncodeI64(now);
        cv_.notify_all();
        return {Reply::kOk, EncodeI64(now)};
      }
      case Op::kCheck:
        return {data_.count(key) != 0 ? Reply::kOk : Reply::kMissing, {}};
    }
    return {Reply::kBadRequest, {}};
  }

  asio::io_context io_;
  tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  std::thread accept_thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::map<std::string, Bytes> data_;
  std::vector<std::shared_ptr<tcp::socket>> sockets_;
  std::vector<std::thread> connection_threads_;
};

}  // namespace

// ---------------------------------------------------------------------------------------
// Client

struct TcpStore::Impl {
  TcpStoreOptions options;
  std::unique_ptr<Server> server;
  asio::io_context io;
  tcp::socket socket{io};
  std::mutex mu;  // one request at a time on the connection

  std::string Address() const { return fmt::format("{}:{}", options.host, options.port); }

  // Runs the queued asynchronous work until `done` or the deadline; closes the socket on
  // timeout so that the pending operation completes (aborted) before we return.
  bool RunUntil(const bool& done, std::chrono::steady_clock::time_point deadline) {
    io.restart();
    while (!done && std::chrono::steady_clock::now() < deadline) {
      io.run_one_until(deadline);
    }
    if (done) return true;
    boost::system::error_code ec;
    socket.close(ec);
    io.restart();
    io.run();
    return false;
  }

  Status Connect() {
    const auto deadline = std::chrono::steady_clock::now() + options.timeout;
    boost::system::error_code ec;
    const auto address = asio::ip::make_address(options.host, ec);
    if (ec)
      return InvalidArgument(fmt::format("TcpStore host '{}' is not an IP address", options.host));
    const tcp::endpoint endpoint(address, options.port);
    auto backoff = std::chrono::milliseconds(10);
    std::string last_error = "no attempt";
    while (std::chrono::steady_clock::now() < deadline) {
      bool done = false;
      boost::system::error_code connect_ec;
      socket.async_connect(endpoint, [&](const boost::system::error_code& e) {
        connect_ec = e;
        done = true;
      });
      if (RunUntil(done, deadline) && !connect_ec) {
        socket.set_option(tcp::no_delay(true), ec);
        return OkStatus();
      }
      last_error = connect_ec ? connect_ec.message() : "timed out";
      socket.close(ec);
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
    }
    return DeadlineExceeded(
        fmt::format("TcpStore: cannot connect to {} within {} ms (last "
                    "error: {}); is rank 0 running?",
                    Address(), options.timeout.count(), last_error));
  }

  // Sends one request and reads its reply, within `wait` plus a grace for the round trip.
  StatusOr<std::pair<Reply, Bytes>> Request(Op op, const std::string& key, const Bytes& value,
                                            std::chrono::milliseconds wait) {
    std::lock_guard lock(mu);
    if (!socket.is_open()) {
      return Unavailable(fmt::format("TcpStore connection to {} is closed", Address()));
    }
    Bytes out{static_cast<uint8_t>(op)};
    PutU32(out, static_cast<uint32_t>(key.size()));
    out.insert(out.end(), key.begin(), key.end());
    PutU32(out, static_cast<uint32_t>(value.size()));
    out.insert(out.end(), value.begin(), value.end());

    const auto deadline = std::chrono::steady_clock::now() + wait + std::chrono::seconds(10);
    bool done = false;
    boost::system::error_code ec;
    uint8_t header[5];
    Bytes payload;
    asio::async_write(socket, asio::buffer(out), [&](const boost::system::error_code& e, size_t) {
      if (e) {
        ec = e;
        done = true;
        return;
      }
      asio::async_read(socket, asio::buffer(header),
                       [&](const boost::system::error_code& e2, size_t) {
                         if (e2) {
                           ec = e2;
                           done = true;
                           return;
                         }
                         payload.resize(GetU32(header + 1));
                         asio::async_read(socket, asio::buffer(payload),
                                          [&](const boost::system::error_code& e3, size_t) {
                                            ec = e3;
                                            done = true;
                                          });
                       });
    });
    if (!RunUntil(done, deadline)) {
      return DeadlineExceeded(
          fmt::format("TcpStore: no reply from {} for key '{}'", Address(), key));
    }
    if (ec) {
      socket.close(ec);
      return Unavailable(
          fmt::format("TcpStore: lost the connection to {} (key '{}'): {}; "
                      "rank 0 may have died",
                      Address(), key, ec.message()));
    }
    return std::pair{static_cast<Reply>(header[0]), std::move(payload)};
  }
};

TcpStore::TcpStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TcpStore::~TcpStore() {
  if (impl_ == nullptr) return;
  boost::system::error_code ec;
  impl_->socket.close(ec);
  impl_->server.reset();  // joins the server threads
}

StatusOr<std::unique_ptr<TcpStore>> TcpStore::Create(const TcpStoreOptions& options) {
  if (options.timeout.count() <= 0) {
    return InvalidArgument(
        fmt::format("TcpStore timeout must be > 0 ms, got {}", options.timeout.count()));
  }
  if (!options.is_server && options.port == 0) {
    return InvalidArgument("TcpStore client port must be in [1, 65535], got 0");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  try {
    if (options.is_server) {
      impl->server = std::make_unique<Server>();
      ZINF_RETURN_IF_ERROR(impl->server->Listen(options.host, options.port));
      impl->options.port = impl->server->port();
    }
    ZINF_RETURN_IF_ERROR(impl->Connect());
  } catch (const std::exception& e) {  // Boost.Asio throws on resource exhaustion
    return Internal(fmt::format("TcpStore: {}", e.what()));
  }
  return std::unique_ptr<TcpStore>(new TcpStore(std::move(impl)));
}

Status TcpStore::Set(const std::string& key, const std::vector<uint8_t>& value) {
  ZINF_ASSIGN_OR_RETURN(auto reply, impl_->Request(Op::kSet, key, value, impl_->options.timeout));
  if (reply.first != Reply::kOk) return Internal(fmt::format("TcpStore: set '{}' refused", key));
  return OkStatus();
}

StatusOr<std::vector<uint8_t>> TcpStore::Get(const std::string& key) {
  const auto timeout = impl_->options.timeout;
  ZINF_ASSIGN_OR_RETURN(auto reply,
                        impl_->Request(Op::kGet, key, EncodeI64(timeout.count()), timeout));
  if (reply.first == Reply::kTimeout) {
    return DeadlineExceeded(
        fmt::format("TcpStore: key '{}' was not set within {} ms", key, timeout.count()));
  }
  return std::move(reply.second);
}

StatusOr<int64_t> TcpStore::Add(const std::string& key, int64_t delta) {
  ZINF_ASSIGN_OR_RETURN(auto reply,
                        impl_->Request(Op::kAdd, key, EncodeI64(delta), impl_->options.timeout));
  return DecodeI64(reply.second);
}

Status TcpStore::Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (const std::string& key : keys) {
    const auto left = std::max(std::chrono::milliseconds(0),
                               std::chrono::duration_cast<std::chrono::milliseconds>(
                                   deadline - std::chrono::steady_clock::now()));
    ZINF_ASSIGN_OR_RETURN(auto reply, impl_->Request(Op::kGet, key, EncodeI64(left.count()), left));
    if (reply.first == Reply::kTimeout) {
      return DeadlineExceeded(
          fmt::format("TcpStore: key '{}' was not set within {} ms", key, timeout.count()));
    }
  }
  return OkStatus();
}

StatusOr<bool> TcpStore::Check(const std::vector<std::string>& keys) {
  for (const std::string& key : keys) {
    ZINF_ASSIGN_OR_RETURN(auto reply, impl_->Request(Op::kCheck, key, {}, impl_->options.timeout));
    if (reply.first != Reply::kOk) return false;
  }
  return true;
}

uint16_t TcpStore::port() const { return impl_->options.port; }
std::chrono::milliseconds TcpStore::timeout() const { return impl_->options.timeout; }

}  // namespace zinf
