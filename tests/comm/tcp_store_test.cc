// TcpStore: rendezvous semantics, deadlines, and the server's defences (See Note [TcpStore
// admission]): secrets, bounded clients, bounded frames, floods, descriptor exhaustion.
#include "comm/tcp_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/tcp_store_wire.h"
#include "tests/comm/store_flood.h"

namespace zinf {
namespace {

using namespace std::chrono_literals;
namespace asio = boost::asio;
namespace wire = store_wire;

std::vector<uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }

std::unique_ptr<TcpStore> Server(std::chrono::milliseconds timeout = 5000ms,
                                 const std::string& secret = "", int max_clients = 0) {
  auto store = TcpStore::Create({.host = "127.0.0.1",
                                 .port = 0,
                                 .is_server = true,
                                 .timeout = timeout,
                                 .secret = secret,
                                 .max_clients = max_clients});
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(store).value() : nullptr;
}

std::unique_ptr<TcpStore> Client(uint16_t port, std::chrono::milliseconds timeout = 5000ms,
                                 const std::string& secret = "") {
  auto store =
      TcpStore::Create({.host = "127.0.0.1", .port = port, .timeout = timeout, .secret = secret});
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(store).value() : nullptr;
}

// A raw connection that speaks the wire format by hand.
struct RawConnection {
  asio::io_context io;
  asio::ip::tcp::socket socket{io};
  explicit RawConnection(uint16_t port) {
    socket.connect({asio::ip::make_address("127.0.0.1"), port});
  }
  // Sends `frame` and reads one reply; nullopt when the server closed instead.
  std::optional<wire::Reply> Exchange(const std::vector<uint8_t>& frame) {
    boost::system::error_code ec;
    asio::write(socket, asio::buffer(frame), ec);
    uint8_t header[wire::kHeaderBytes];
    asio::read(socket, asio::buffer(header), ec);
    if (ec) return std::nullopt;
    std::vector<uint8_t> payload(wire::DecodeU32(header + 1));
    asio::read(socket, asio::buffer(payload), ec);
    return static_cast<wire::Reply>(header[0]);
  }
  // True when the server has closed its side (reads EOF within a second).
  bool ClosedByServer() {
    socket.non_blocking(false);
    timeval tv{1, 0};
    setsockopt(socket.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    uint8_t byte;
    boost::system::error_code ec;
    socket.read_some(asio::buffer(&byte, 1), ec);
    return ec == asio::error::eof || ec == asio::error::connection_reset;
  }
};

TEST(TcpStoreTest, SetGetAddCheck) {
  auto server = Server();
  ASSERT_NE(server, nullptr);
  auto client = Client(server->port());
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(server->Set("nccl_id", Bytes("0123456789")).ok());
  auto got = client->Get("nccl_id");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, Bytes("0123456789"));
  ASSERT_TRUE(client->Set("empty", {}).ok());
  EXPECT_TRUE(server->Get("empty")->empty());
  EXPECT_EQ(*client->Add("count", 2), 2);
  EXPECT_EQ(*server->Add("count", 3), 5);
  EXPECT_EQ(*client->Add("count", -5), 0);
  EXPECT_TRUE(*client->Check({"nccl_id", "count"}));
  EXPECT_FALSE(*client->Check({"nccl_id", "absent"}));
}

TEST(TcpStoreTest, GetWaitsForALaterSet) {
  auto server = Server();
  ASSERT_NE(server, nullptr);
  std::thread setter([port = server->port()] {
    auto late = Client(port);
    std::this_thread::sleep_for(100ms);
    ASSERT_TRUE(late->Set("rank1/addr", Bytes("127.0.0.1:4000")).ok());
  });
  auto got = server->Get("rank1/addr");
  setter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, Bytes("127.0.0.1:4000"));
}

TEST(TcpStoreTest, GetAndWaitTimeOutNamingTheKey) {
  auto server = Server(200ms);
  ASSERT_NE(server, nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  auto got = server->Get("never");
  EXPECT_EQ(got.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(got.status().message().find("'never' was not set within 200 ms"), std::string::npos)
      << got.status();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  ASSERT_TRUE(server->Set("a", {}).ok());
  Status w = server->Wait({"a", "b"}, 100ms);
  EXPECT_EQ(w.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(w.message().find("'b'"), std::string::npos) << w;
  EXPECT_TRUE(server->Set("b", {}).ok()) << "the connection survives a timed-out wait";
  EXPECT_TRUE(server->Wait({"a", "b"}, 100ms).ok());
}

TEST(TcpStoreTest, ManyClientsCountToWorldSize) {
  auto server = Server();
  ASSERT_NE(server, nullptr);
  constexpr int kRanks = 8;
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r) {
    ranks.emplace_back([port = server->port()] {
      auto c = Client(port);
      for (int i = 0; i < 50; ++i) ASSERT_TRUE(c->Add("arrived", 1).ok());
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_EQ(*server->Add("arrived", 0), kRanks * 50);
}

TEST(TcpStoreTest, OtherProcessRendezvous) {
  // Fork before this process starts the server's threads (forking a threaded process is
  // unsafe); the child's client retries until the server is up.
  uint16_t port = 0;
  {
    auto probe = Server();
    ASSERT_NE(probe, nullptr);
    port = probe->port();
  }
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto c = TcpStore::Create({.host = "127.0.0.1", .port = port, .timeout = 5000ms});
    bool ok = c.ok() && (*c)->Set("child", Bytes("hello")).ok();
    auto reply = ok ? (*c)->Get("parent") : StatusOr<std::vector<uint8_t>>(Internal("x"));
    _exit(ok && reply.ok() && *reply == Bytes("world") ? 0 : 1);
  }
  auto server = TcpStore::Create({.port = port, .is_server = true, .timeout = 5000ms});
  ASSERT_TRUE(server.ok()) << server.status();
  auto got = (*server)->Get("child");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, Bytes("hello"));
  ASSERT_TRUE((*server)->Set("parent", Bytes("world")).ok());
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST(TcpStoreTest, NobodyListeningIsADeadlineNotAHang) {
  // Bind a port and close it again: nobody listens there now.
  uint16_t port = 0;
  {
    auto probe = Server();
    ASSERT_NE(probe, nullptr);
    port = probe->port();
  }
  auto c = TcpStore::Create({.host = "127.0.0.1", .port = port, .timeout = 300ms});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(c.status().message().find("is rank 0 running?"), std::string::npos) << c.status();
}

TEST(TcpStoreTest, ServerDeathIsReportedToClients) {
  auto server = Server();
  ASSERT_NE(server, nullptr);
  auto client = Client(server->port());
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Set("k", {}).ok());
  server.reset();
  auto got = client->Get("k");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kUnavailable) << got.status();
  EXPECT_NE(got.status().message().find("rank 0 may have died"), std::string::npos);
}

TEST(TcpStoreTest, GarbageFromAPeerDoesNotHurtTheServer) {
  auto server = Server();
  ASSERT_NE(server, nullptr);
  {
    boost::asio::io_context io;
    boost::asio::ip::tcp::socket s(io);
    s.connect({boost::asio::ip::make_address("127.0.0.1"), server->port()});
    const uint8_t garbage[] = {2, 0xff, 0xff, 0xff, 0xff, 1, 2, 3};  // a 4 GiB key length
    boost::asio::write(s, boost::asio::buffer(garbage));
  }
  auto client = Client(server->port());
  ASSERT_NE(client, nullptr);
  EXPECT_TRUE(client->Set("still", Bytes("fine")).ok());
  EXPECT_EQ(*server->Get("still"), Bytes("fine"));
}

TEST(TcpStoreTest, BadOptions) {
  EXPECT_EQ(TcpStore::Create({.host = "not an ip", .port = 1, .timeout = 100ms}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(TcpStore::Create({.port = 0}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(TcpStore::Create({.port = 1, .timeout = 0ms}).status().code(),
            StatusCode::kInvalidArgument);
  auto server = Server();
  ASSERT_NE(server, nullptr);
  auto clash = TcpStore::Create({.port = server->port(), .is_server = true, .timeout = 100ms});
  EXPECT_EQ(clash.status().code(), StatusCode::kUnavailable) << "port already in use";
}

// ---------------------------------------------------------------------------------------
// The wire format, without sockets.

TEST(TcpStoreWireTest, FramesParseInStagesAndRoundTrip) {
  const auto frame = wire::EncodeRequest(wire::Op::kSet, "rank0/addr", Bytes("10.0.0.1:4000"));
  // Each prefix either asks for more (never more than the frame) or yields the request.
  for (size_t n = 0; n < frame.size(); ++n) {
    auto r = wire::ParseStoreRequest(std::span(frame.data(), n), /*authenticated=*/true);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->request.has_value()) << n;
    EXPECT_GT(r->frame_bytes, n);
    EXPECT_LE(r->frame_bytes, frame.size());
  }
  auto whole = wire::ParseStoreRequest(frame, true);
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_TRUE(whole->request.has_value());
  EXPECT_EQ(whole->frame_bytes, frame.size());
  EXPECT_EQ(whole->request->op, wire::Op::kSet);
  EXPECT_EQ(whole->request->key, "rank0/addr");
  EXPECT_EQ(whole->request->value, Bytes("10.0.0.1:4000"));
  EXPECT_EQ(wire::DecodeI64(wire::EncodeI64(-1234567890123)), -1234567890123);
}

TEST(TcpStoreWireTest, LengthsAreRefusedAsSoonAsTheyAreKnown) {
  // Five bytes announcing a 64 MiB key: refused before any key byte arrives.
  const std::vector<uint8_t> huge_key = {1, 0, 0, 0, 4};
  auto r = wire::ParseStoreRequest(huge_key, true);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("key length must be at most 4096, got 67108864"),
            std::string::npos)
      << r.status();
  // A value length past the limit: refused once its four bytes are in.
  std::vector<uint8_t> huge_value = {1, 1, 0, 0, 0, 'k', 0xff, 0xff, 0xff, 0xff};
  r = wire::ParseStoreRequest(huge_value, true);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("value length must be in [0, 4194304], got 4294967295"),
            std::string::npos)
      << r.status();
  // Get and Add carry exactly eight bytes; Check none.
  EXPECT_FALSE(
      wire::ParseStoreRequest(wire::EncodeRequest(wire::Op::kGet, "k", Bytes("1")), true).ok());
  EXPECT_FALSE(
      wire::ParseStoreRequest(wire::EncodeRequest(wire::Op::kCheck, "k", Bytes("1")), true).ok());
  // Unknown ops, and anything but auth first.
  r = wire::ParseStoreRequest(std::vector<uint8_t>{9, 0, 0, 0, 0}, true);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("op must be in [1, 5], got 9"), std::string::npos);
  r = wire::ParseStoreRequest(wire::EncodeRequest(wire::Op::kSet, "k", {}), false);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("must be auth"), std::string::npos) << r.status();
  const std::string long_secret(wire::kMaxSecretBytes + 1, 's');
  EXPECT_FALSE(
      wire::ParseStoreRequest(wire::EncodeRequest(wire::Op::kAuth, long_secret, {}), false).ok());
  EXPECT_TRUE(
      wire::ParseStoreRequest(wire::EncodeRequest(wire::Op::kAuth, "secret", {}), false).ok());
}

TEST(TcpStoreWireTest, RandomBytesNeverCrashOrAskForMoreThanTheLimits) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> bytes(rng() % 64);
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng() % 8 == 0 ? rng() : rng() % 6);
    auto r = wire::ParseStoreRequest(bytes, rng() % 2 == 0);
    if (!r.ok()) continue;
    EXPECT_LE(r->frame_bytes, wire::kHeaderBytes + wire::kMaxKeyBytes + 4 + wire::kMaxValueBytes);
    if (r->request) {
      EXPECT_LE(r->frame_bytes, bytes.size());
    }
  }
}

TEST(TcpStoreWireTest, ConstantTimeEquals) {
  EXPECT_TRUE(wire::ConstantTimeEquals("", ""));
  EXPECT_TRUE(wire::ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(wire::ConstantTimeEquals("abc", "abd"));
  EXPECT_FALSE(wire::ConstantTimeEquals("abc", "abcd"));
  EXPECT_FALSE(wire::ConstantTimeEquals("", "a"));
  EXPECT_FALSE(wire::ConstantTimeEquals(std::string("a\0", 2), "a"));
}

// ---------------------------------------------------------------------------------------
// Secrets and addresses

TEST(TcpStoreSecretTest, OnlyTheJobsSecretGetsIn) {
  auto server = Server(5000ms, "job-secret");
  ASSERT_NE(server, nullptr);
  auto good = Client(server->port(), 5000ms, "job-secret");
  ASSERT_NE(good, nullptr);
  ASSERT_TRUE(good->Set("k", Bytes("v")).ok());

  for (const std::string wrong : {"job-secreT", "", "job-secret-and-more"}) {
    auto bad = TcpStore::Create(
        {.host = "127.0.0.1", .port = server->port(), .timeout = 2000ms, .secret = wrong});
    ASSERT_FALSE(bad.ok()) << "secret '" << wrong << "'";
    EXPECT_EQ(bad.status().code(), StatusCode::kFailedPrecondition) << bad.status();
    EXPECT_NE(bad.status().message().find("ZINF_STORE_SECRET"), std::string::npos) << bad.status();
  }
  // A request before the secret is refused and the connection closed.
  RawConnection raw(server->port());
  EXPECT_EQ(raw.Exchange(wire::EncodeRequest(wire::Op::kGet, "k", wire::EncodeI64(0))),
            wire::Reply::kDenied);
  EXPECT_TRUE(raw.ClosedByServer());
  RawConnection wrong(server->port());
  EXPECT_EQ(wrong.Exchange(wire::EncodeRequest(wire::Op::kAuth, "nope", {})), wire::Reply::kDenied);
  EXPECT_TRUE(wrong.ClosedByServer());
  RawConnection right(server->port());
  EXPECT_EQ(right.Exchange(wire::EncodeRequest(wire::Op::kAuth, "job-secret", {})),
            wire::Reply::kOk);
  EXPECT_EQ(right.Exchange(wire::EncodeRequest(wire::Op::kCheck, "k", {})), wire::Reply::kOk);
}

TEST(TcpStoreSecretTest, WithoutASecretOnlyLoopbackIsAllowed) {
  for (const char* host : {"10.1.2.3", "0.0.0.0", "::"}) {
    auto s = TcpStore::Create({.host = host, .port = 0, .is_server = true, .timeout = 100ms});
    ASSERT_FALSE(s.ok()) << host;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find("ZINF_STORE_SECRET"), std::string::npos) << s.status();
    EXPECT_NE(s.status().message().find(host), std::string::npos) << s.status();
    auto c = TcpStore::Create({.host = host, .port = 29500, .timeout = 100ms});
    EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument) << host;
  }
  // With a secret, a routable bind works (all interfaces; clients come in over loopback).
  auto any = TcpStore::Create(
      {.host = "0.0.0.0", .port = 0, .is_server = true, .timeout = 2000ms, .secret = "s"});
  ASSERT_TRUE(any.ok()) << any.status();
  auto c = Client((*any)->port(), 2000ms, "s");
  ASSERT_NE(c, nullptr);
  EXPECT_TRUE(c->Set("k", {}).ok());
  const std::string too_long(wire::kMaxSecretBytes + 1, 'x');
  EXPECT_EQ(TcpStore::Create({.port = 0, .is_server = true, .timeout = 100ms, .secret = too_long})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------
// Bounds

TEST(TcpStoreBoundsTest, ClientsBeyondTheLimitAreRefusedAndRetry) {
  auto server = Server(5000ms, "", /*max_clients=*/2);  // its own client and one more
  ASSERT_NE(server, nullptr);
  auto second = Client(server->port());
  ASSERT_NE(second, nullptr);
  auto third = TcpStore::Create({.host = "127.0.0.1", .port = server->port(), .timeout = 300ms});
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(third.status().message().find("busy"), std::string::npos) << third.status();
  // A slot comes free when a client leaves; a client still retrying gets it.
  std::thread leave([&] {
    std::this_thread::sleep_for(200ms);
    second.reset();
  });
  auto retried = Client(server->port(), 5000ms);
  leave.join();
  ASSERT_NE(retried, nullptr);
  EXPECT_TRUE(retried->Set("k", {}).ok());
  EXPECT_EQ(TcpStore::Create({.port = 0, .is_server = true, .timeout = 100ms, .max_clients = -1})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
}

TEST(TcpStoreBoundsTest, OversizedKeysAndValuesAreRefusedBeforeSending) {
  auto server = Server();
  ASSERT_NE(server, nullptr);
  Status s = server->Set(std::string(wire::kMaxKeyBytes + 1, 'k'), {});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("at most 4096 bytes, got 4097"), std::string::npos) << s;
  s = server->Set("big", std::vector<uint8_t>(wire::kMaxValueBytes + 1));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'big'"), std::string::npos) << s;
  EXPECT_TRUE(server->Set("largest", std::vector<uint8_t>(wire::kMaxValueBytes, 7)).ok());
  EXPECT_EQ(server->Get("largest")->size(), wire::kMaxValueBytes);
}

TEST(TcpStoreBoundsTest, IdleConnectionsCannotLockARankOut) {
  auto server = Server();
  ASSERT_NE(server, nullptr);
  RawConnection oldest(server->port());
  asio::io_context io;
  const int fds_before = testing::OpenFdCount();
  std::vector<asio::ip::tcp::socket> idle;
  for (int i = 0; i < 300; ++i) {
    idle.emplace_back(io).connect({asio::ip::make_address("127.0.0.1"), server->port()});
  }
  auto rank = Client(server->port(), 5000ms);
  ASSERT_NE(rank, nullptr) << "the oldest idle connections make room";
  EXPECT_TRUE(rank->Set("k", {}).ok());
  // This process holds 300 client sockets; the server keeps only a bounded few of the other ends.
  EXPECT_LT(testing::OpenFdCount() - fds_before, 300 + 100);
  EXPECT_TRUE(oldest.ClosedByServer()) << "the oldest idle connection was dropped";
}

TEST(TcpStoreBoundsTest, FloodLeavesTheStoreServingWithBoundedDescriptorsAndMemory) {
  auto server = Server(5000ms, "job-secret");
  ASSERT_NE(server, nullptr);
  const uint16_t port = server->port();
  auto client = Client(port, 5000ms, "job-secret");
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Set("before", Bytes("1")).ok());
  const int fds_before = testing::OpenFdCount();
  const uint64_t rss_before = testing::ResidentBytes();
  int fds_max = fds_before;
  uint64_t rss_max = rss_before;
  {
    asio::io_context io;
    std::deque<asio::ip::tcp::socket> held;
    std::mt19937_64 rng(1);
    for (int i = 0; i < 2400; ++i) {
      testing::FloodOnce(i, port, rng, held, /*max_held=*/48, io);
      if (i % 50 == 0) {
        fds_max = std::max(fds_max, testing::OpenFdCount());
        rss_max = std::max(rss_max, testing::ResidentBytes());
      }
    }
    // What is still held announced 64 MiB keys and 4 GiB values: none of it may be paid for.
    std::this_thread::sleep_for(300ms);
    rss_max = std::max(rss_max, testing::ResidentBytes());
    fds_max = std::max(fds_max, testing::OpenFdCount());
    auto during = Client(port, 5000ms, "job-secret");
    ASSERT_NE(during, nullptr);
    EXPECT_TRUE(during->Set("during", Bytes("2")).ok());
  }
  // The flood's sockets are closed now; the server lets go of its ends.
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (testing::OpenFdCount() > fds_before && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_LE(testing::OpenFdCount(), fds_before) << "a connection's socket outlived it";
  // 48 held client sockets, at most as many server ends, and a few in passing.
  EXPECT_LT(fds_max - fds_before, 2 * 48 + 32);
  EXPECT_LT(rss_max - rss_before, uint64_t{64} << 20) << "RSS grew by " << (rss_max - rss_before);
  auto got = client->Get("during");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, Bytes("2"));
  EXPECT_EQ(*client->Get("before"), Bytes("1"));
  EXPECT_EQ(*client->Add("count", 5), 5);
}

TEST(TcpStoreBoundsTest, RunningOutOfDescriptorsDoesNotSpinTheAcceptLoop) {
#if defined(__SANITIZE_ADDRESS__)
  // The sanitizers' memory checks open a pipe(); with no descriptor left they report false
  // errors (UBSan: "object has invalid vptr").
  GTEST_SKIP() << "sanitizers need free descriptors, which this test takes away";
#endif
  // In a child: this lowers its descriptor limit and fills it. Forked before this process
  // starts a server (forking a threaded process is unsafe).
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    rlimit rl{};
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = std::min<rlim_t>(rl.rlim_max, 256);
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) _exit(10);
    auto server = TcpStore::Create({.port = 0, .is_server = true, .timeout = 5000ms});
    if (!server.ok()) _exit(11);
    // The would-be client's socket exists before the process runs out of descriptors.
    const int client = socket(AF_INET, SOCK_STREAM, 0);
    if (client < 0) _exit(12);
    std::vector<int> hog;
    for (int fd; (fd = open("/dev/null", O_RDONLY)) >= 0;) hog.push_back(fd);
    if (errno != EMFILE) _exit(18);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons((*server)->port());
    if (connect(client, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) _exit(13);
    // The server cannot accept it now (EMFILE). It must wait, not burn a core retrying.
    auto cpu_seconds = [] {
      rusage ru{};
      getrusage(RUSAGE_SELF, &ru);
      return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
             static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
    };
    const double cpu0 = cpu_seconds();
    std::this_thread::sleep_for(1s);
    const double spent = cpu_seconds() - cpu0;
    for (int fd : hog) close(fd);
    if (spent > 0.3) {
      std::fprintf(stderr, "accept loop spent %.2f s of CPU in 1 s\n", spent);
      _exit(14);
    }
    // With descriptors back, the waiting connection is served.
    timeval tv{5, 0};
    setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    const auto auth = wire::EncodeRequest(wire::Op::kAuth, "", {});
    if (write(client, auth.data(), auth.size()) != static_cast<ssize_t>(auth.size())) _exit(15);
    uint8_t reply[wire::kHeaderBytes];
    if (recv(client, reply, sizeof reply, MSG_WAITALL) != sizeof reply) _exit(16);
    _exit(reply[0] == static_cast<uint8_t>(wire::Reply::kOk) ? 0 : 17);
  }
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "see the child's exit code in the test";
}

}  // namespace
}  // namespace zinf
