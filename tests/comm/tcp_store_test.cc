#include "comm/tcp_store.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio.hpp>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace zinf {
namespace {

using namespace std::chrono_literals;

std::vector<uint8_t> Bytes(const std::string& s) { return {s.begin(), s.end()}; }

std::unique_ptr<TcpStore> Server(std::chrono::milliseconds timeout = 5000ms) {
  auto store =
      TcpStore::Create({.host = "127.0.0.1", .port = 0, .is_server = true, .timeout = timeout});
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(store).value() : nullptr;
}

std::unique_ptr<TcpStore> Client(uint16_t port, std::chrono::milliseconds timeout = 5000ms) {
  auto store = TcpStore::Create({.host = "127.0.0.1", .port = port, .timeout = timeout});
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? std::move(store).value() : nullptr;
}

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

}  // namespace
}  // namespace zinf
