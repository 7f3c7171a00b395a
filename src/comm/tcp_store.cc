// TcpStore, the client every rank holds (rank 0's also owns the server,
// comm/tcp_store_server.h). It uses asynchronous Boost.Asio operations driven by
// io_context::run_one_until, which is how every call gets its deadline; calls on one client are
// serialized by a mutex, one request in flight on the connection at a time.
#include "comm/tcp_store.h"

#include <fmt/core.h>

#include <algorithm>
#include <boost/asio.hpp>
#include <mutex>
#include <string_view>
#include <thread>

#include "comm/tcp_store_server.h"
#include "comm/tcp_store_wire.h"

namespace zinf {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using Bytes = std::vector<uint8_t>;
using store_wire::Op;
using store_wire::Reply;

std::string_view ReplyName(Reply reply) {
  switch (reply) {
    case Reply::kOk:
      return "ok";
    case Reply::kTimeout:
      return "timeout";
    case Reply::kMissing:
      return "missing";
    case Reply::kBadRequest:
      return "bad request";
    case Reply::kDenied:
      return "denied";
    case Reply::kBusy:
      return "busy";
    case Reply::kFull:
      return "full";
  }
  return "unknown";
}

}  // namespace

struct TcpStore::Impl {
  TcpStoreOptions options;
  std::unique_ptr<TcpStoreServer> server;
  asio::io_context io;
  tcp::socket socket{io};
  std::mutex mu;  // one request at a time on the connection

  struct Exchanged {
    boost::system::error_code ec;
    bool timed_out = false;
    Reply reply = Reply::kOk;
    Bytes payload;
  };

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

  // Sends one frame and reads its reply by `deadline`.
  Exchanged Exchange(const Bytes& out, std::chrono::steady_clock::time_point deadline) {
    Exchanged x;
    bool done = false;
    uint8_t header[store_wire::kHeaderBytes];
    asio::async_write(socket, asio::buffer(out), [&](const boost::system::error_code& e, size_t) {
      if (e) {
        x.ec = e;
        done = true;
        return;
      }
      asio::async_read(socket, asio::buffer(header),
                       [&](const boost::system::error_code& e2, size_t) {
                         if (e2) {
                           x.ec = e2;
                           done = true;
                           return;
                         }
                         const uint32_t length = store_wire::DecodeU32(header + 1);
                         if (length > store_wire::kMaxValueBytes) {  // not our server
                           x.ec = asio::error::message_size;
                           done = true;
                           return;
                         }
                         x.reply = static_cast<Reply>(header[0]);
                         x.payload.resize(length);
                         asio::async_read(socket, asio::buffer(x.payload),
                                          [&](const boost::system::error_code& e3, size_t) {
                                            x.ec = e3;
                                            done = true;
                                          });
                       });
    });
    x.timed_out = !RunUntil(done, deadline);
    return x;
  }

  Status Connect() {
    const auto deadline = std::chrono::steady_clock::now() + options.timeout;
    boost::system::error_code ec;
    const auto address = asio::ip::make_address(options.host, ec);
    if (ec)
      return InvalidArgument(fmt::format("TcpStore host '{}' is not an IP address", options.host));
    const tcp::endpoint endpoint(address, options.port);
    const Bytes auth = store_wire::EncodeRequest(Op::kAuth, options.secret, {});
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
        Exchanged x = Exchange(auth, deadline);
        if (!x.timed_out && !x.ec && x.reply == Reply::kOk) return OkStatus();
        if (!x.timed_out && !x.ec && x.reply == Reply::kDenied) {
          socket.close(ec);
          return FailedPrecondition(fmt::format(
              "TcpStore at {} refused this process's secret: {} must hold the same value for "
              "every rank{}",
              Address(), kStoreSecretEnv, options.secret.empty() ? " (it is unset here)" : ""));
        }
        // Busy, or dropped while pending: both pass, so try again.
        last_error = x.timed_out ? "timed out"
                     : x.ec      ? x.ec.message()
                                 : fmt::format("the server replied '{}'", ReplyName(x.reply));
      } else {
        last_error = connect_ec ? connect_ec.message() : "timed out";
      }
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
    if (key.size() > store_wire::kMaxKeyBytes) {
      return InvalidArgument(fmt::format("TcpStore key must be at most {} bytes, got {} ('{}...')",
                                         store_wire::kMaxKeyBytes, key.size(), key.substr(0, 64)));
    }
    if (value.size() > store_wire::kMaxValueBytes) {
      return InvalidArgument(
          fmt::format("TcpStore value for key '{}' must be at most {} bytes, "
                      "got {}",
                      key, store_wire::kMaxValueBytes, value.size()));
    }
    std::lock_guard lock(mu);
    if (!socket.is_open()) {
      return Unavailable(fmt::format("TcpStore connection to {} is closed", Address()));
    }
    const auto deadline = std::chrono::steady_clock::now() + wait + std::chrono::seconds(10);
    Exchanged x = Exchange(store_wire::EncodeRequest(op, key, value), deadline);
    if (x.timed_out) {
      return DeadlineExceeded(
          fmt::format("TcpStore: no reply from {} for key '{}'", Address(), key));
    }
    if (x.ec) {
      boost::system::error_code ec;
      socket.close(ec);
      return Unavailable(
          fmt::format("TcpStore: lost the connection to {} (key '{}'): {}; "
                      "rank 0 may have died",
                      Address(), key, x.ec.message()));
    }
    switch (x.reply) {
      case Reply::kOk:
      case Reply::kTimeout:
      case Reply::kMissing:
        return std::pair{x.reply, std::move(x.payload)};
      case Reply::kFull:
        return ResourceExhausted(fmt::format(
            "TcpStore at {} holds its limit of {} bytes; cannot store key '{}' ({} bytes)",
            Address(), store_wire::kMaxStoreBytes, key, value.size()));
      default:
        break;
    }
    boost::system::error_code ec;
    socket.close(ec);  // the server closes after these
    return Internal(fmt::format("TcpStore at {} answered '{}' for key '{}'", Address(),
                                ReplyName(x.reply), key));
  }
};

TcpStore::TcpStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TcpStore::~TcpStore() {
  if (impl_ == nullptr) return;
  boost::system::error_code ec;
  impl_->socket.close(ec);
  impl_->server.reset();  // joins the server thread
}

StatusOr<std::unique_ptr<TcpStore>> TcpStore::Create(const TcpStoreOptions& options) {
  if (options.timeout.count() <= 0) {
    return InvalidArgument(
        fmt::format("TcpStore timeout must be > 0 ms, got {}", options.timeout.count()));
  }
  if (!options.is_server && options.port == 0) {
    return InvalidArgument("TcpStore client port must be in [1, 65535], got 0");
  }
  if (options.max_clients < 0) {
    return InvalidArgument(fmt::format("TcpStore max_clients must be >= 0 (0: automatic), got {}",
                                       options.max_clients));
  }
  if (options.secret.size() > store_wire::kMaxSecretBytes) {
    return InvalidArgument(fmt::format("{} must be at most {} bytes, got {}", kStoreSecretEnv,
                                       store_wire::kMaxSecretBytes, options.secret.size()));
  }
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(options.host, ec);
  if (ec) {
    return InvalidArgument(fmt::format("TcpStore host '{}' is not an IP address", options.host));
  }
  if (!address.is_loopback() && options.secret.empty()) {
    return InvalidArgument(fmt::format(
        "TcpStore host {} is not a loopback address, so the store needs a secret: set {} to "
        "the same random value for every rank (zinf run does), or use 127.0.0.1",
        options.host, kStoreSecretEnv));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  try {
    if (options.is_server) {
      ZINF_ASSIGN_OR_RETURN(impl->server,
                            TcpStoreServer::Start(options.host, options.port, options.secret,
                                                  static_cast<size_t>(options.max_clients)));
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
  ZINF_ASSIGN_OR_RETURN(
      auto reply, impl_->Request(Op::kGet, key, store_wire::EncodeI64(timeout.count()), timeout));
  if (reply.first == Reply::kTimeout) {
    return DeadlineExceeded(
        fmt::format("TcpStore: key '{}' was not set within {} ms", key, timeout.count()));
  }
  return std::move(reply.second);
}

StatusOr<int64_t> TcpStore::Add(const std::string& key, int64_t delta) {
  ZINF_ASSIGN_OR_RETURN(auto reply, impl_->Request(Op::kAdd, key, store_wire::EncodeI64(delta),
                                                   impl_->options.timeout));
  return store_wire::DecodeI64(reply.second);
}

Status TcpStore::Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (const std::string& key : keys) {
    const auto left = std::max(std::chrono::milliseconds(0),
                               std::chrono::duration_cast<std::chrono::milliseconds>(
                                   deadline - std::chrono::steady_clock::now()));
    ZINF_ASSIGN_OR_RETURN(auto reply,
                          impl_->Request(Op::kGet, key, store_wire::EncodeI64(left.count()), left));
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

std::string TcpStore::local_address() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  boost::system::error_code ec;
  const tcp::endpoint local = impl_->socket.local_endpoint(ec);
  return ec ? impl_->options.host : local.address().to_string();
}
std::chrono::milliseconds TcpStore::timeout() const { return impl_->options.timeout; }

}  // namespace zinf
