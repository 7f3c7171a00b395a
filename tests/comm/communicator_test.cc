// Collectives over real processes: each rank is a forked child with its own Gloo
// communicator, connected through a TcpStore served by the test process.
#include "comm/communicator.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <thread>
#include <vector>

#include "comm/environment.h"
#include "comm/tcp_store.h"
#include "tests/comm/store_flood.h"
#include "tests/testing/fork_ranks.h"
#include "zinf/device.h"

namespace zinf {
namespace {

using namespace std::chrono_literals;

// A failed check inside a child prints and exits non-zero; the parent sees the exit code.
#define CHILD_CHECK(cond)                                                                  \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "rank check failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      return 1;                                                                            \
    }                                                                                      \
  } while (false)
#define CHILD_OK(expr)                                                            \
  do {                                                                            \
    Status s_ = (expr);                                                           \
    if (!s_.ok()) {                                                               \
      std::fprintf(stderr, "rank call failed at %s:%d: %s\n", __FILE__, __LINE__, \
                   s_.ToString().c_str());                                        \
      return 1;                                                                   \
    }                                                                             \
  } while (false)

using RankBody = std::function<int(Communicator& comm)>;

// Forks `world` ranks that connect a Gloo group and run `body`; returns their exit codes.
// As under `zinf run`, rank 0 serves the store; the test process forks while it has no threads
// of its own (forking a threaded process is unsafe). A rank that cannot connect exits with
// 100, or 101 when the others did not arrive in time.
std::vector<int> RunRanks(int world, const RankBody& body,
                          std::chrono::milliseconds timeout = 20000ms,
                          const std::vector<int>& absent_ranks = {}) {
  uint16_t port = 0;
  {
    auto probe = TcpStore::Create({.port = 0, .is_server = true, .timeout = 1000ms});
    EXPECT_TRUE(probe.ok()) << probe.status();
    if (!probe.ok()) return {};
    port = (*probe)->port();
  }  // closed again: rank 0 binds it
  return testing::ForkRanks(
      world,
      [&](int rank) {
        auto store = TcpStore::Create({.port = port, .is_server = rank == 0, .timeout = timeout});
        if (!store.ok()) return 100;
        auto comm = CreateGlooCommunicator(**store,
                                           {.rank = rank, .world_size = world, .timeout = timeout});
        if (!comm.ok()) {
          std::fprintf(stderr, "%s\n", comm.status().ToString().c_str());
          return comm.status().code() == StatusCode::kDeadlineExceeded ? 101 : 100;
        }
        return body(**comm);
      },
      absent_ranks);
}

int Collectives(Communicator& comm) {
  const int r = comm.rank(), w = comm.world_size();
  // All-reduce (sum, max) of float32.
  std::vector<float> a(1003);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(r + 1) * (i % 7);
  CHILD_OK(comm.AllReduce(a.data(), a.size(), ElementType::kFp32, ReduceOp::kSum));
  const float rank_sum = w * (w + 1) / 2.0f;
  for (size_t i = 0; i < a.size(); ++i) CHILD_CHECK(a[i] == rank_sum * (i % 7));
  std::vector<int64_t> m = {r, -r};
  CHILD_OK(comm.AllReduce(m.data(), 2, ElementType::kInt64, ReduceOp::kMax));
  CHILD_CHECK(m[0] == w - 1 && m[1] == 0);

  // All-gather of int64: rank order.
  std::vector<int64_t> mine(5, r * 10), all(5 * w, -1);
  CHILD_OK(comm.AllGather(mine.data(), all.data(), 5, ElementType::kInt64));
  for (int q = 0; q < w; ++q)
    for (int i = 0; i < 5; ++i) CHILD_CHECK(all[q * 5 + i] == q * 10);

  // Reduce-scatter of float64: each rank keeps its slice of the sum.
  const size_t per_rank = 257;
  std::vector<double> send(per_rank * w), recv(per_rank);
  for (size_t i = 0; i < send.size(); ++i) send[i] = static_cast<double>(i) + r;
  CHILD_OK(
      comm.ReduceScatter(send.data(), recv.data(), per_rank, ElementType::kFp64, ReduceOp::kSum));
  for (size_t i = 0; i < per_rank; ++i) {
    const double index = static_cast<double>(r * per_rank + i);
    CHILD_CHECK(recv[i] == w * index + rank_sum - w);
  }

  // Broadcast from the last rank.
  std::vector<float> b(64, static_cast<float>(r));
  CHILD_OK(comm.Broadcast(b.data(), b.size(), ElementType::kFp32, w - 1));
  for (float v : b) CHILD_CHECK(v == static_cast<float>(w - 1));

  // 16-bit parameters move as they are: all-gather of bfloat16, broadcast of float16.
  std::vector<uint16_t> half(33, static_cast<uint16_t>(0x3f80 + r)), halves(33 * w);
  CHILD_OK(comm.AllGather(half.data(), halves.data(), half.size(), ElementType::kBf16));
  for (int q = 0; q < w; ++q) CHILD_CHECK(halves[q * 33 + 32] == 0x3f80 + q);
  CHILD_OK(comm.Broadcast(half.data(), half.size(), ElementType::kFp16, 0));
  CHILD_CHECK(half[0] == 0x3f80 && half[32] == 0x3f80);

  // Two asynchronous all-reduces in flight, then a barrier.
  std::vector<float> x(100, 1.0f), y(100, 2.0f);
  auto wx = comm.AllReduceAsync(x.data(), x.size(), ElementType::kFp32, ReduceOp::kSum);
  auto wy = comm.AllReduceAsync(y.data(), y.size(), ElementType::kFp32, ReduceOp::kSum);
  CHILD_OK(wy->Wait());
  CHILD_OK(wx->Wait());
  CHILD_CHECK(x[99] == w && y[0] == 2.0f * w);
  CHILD_OK(comm.Barrier());

  // Bad arguments are errors, not crashes.
  CHILD_CHECK(comm.Broadcast(b.data(), 1, ElementType::kFp32, w).code() ==
              StatusCode::kInvalidArgument);
  return 0;
}

TEST(GlooCommunicatorTest, CollectivesOnTwoRanks) {
  EXPECT_EQ(RunRanks(2, Collectives), (std::vector<int>{0, 0}));
}

// Gloo has no bfloat16 arithmetic: a reduction of one is refused, by name.
TEST(GlooCommunicatorTest, SixteenBitReductionsAreRefused) {
  EXPECT_EQ(RunRanks(2,
                     [](Communicator& comm) {
                       // The refusal never reaches the peer: without a collective first, a
                       // rank could exit while the other still completes its connection.
                       CHILD_OK(comm.Barrier());
                       std::vector<uint16_t> v(8, 0x3f80);
                       const Status s =
                           comm.AllReduce(v.data(), v.size(), ElementType::kBf16, ReduceOp::kSum);
                       CHILD_CHECK(s.code() == StatusCode::kInvalidArgument);
                       CHILD_CHECK(s.message().find("does not reduce bf16") != std::string::npos);
                       return 0;
                     }),
            (std::vector<int>{0, 0}));
}

TEST(GlooCommunicatorTest, CollectivesOnFourRanks) {
  EXPECT_EQ(RunRanks(4, Collectives), (std::vector<int>(4, 0)));
}

TEST(GlooCommunicatorTest, CollectivesOnThreeRanks) {
  EXPECT_EQ(RunRanks(3, Collectives), (std::vector<int>(3, 0)));
}

// A value that depends on who sends it, where and when, spread over magnitudes so that a
// sum in another order, or a slice taken from the wrong place, shows in the bits.
float Contribution(int rank, size_t index, int round) {
  uint64_t h = (uint64_t(rank) * 0x9E3779B97F4A7C15ull) ^ (index * 0xBF58476D1CE4E5B9ull) ^
               (uint64_t(round) * 0x94D049BB133111EBull);
  h ^= h >> 31;
  h *= 0xD6E9E2D1B1F5A3C7ull;
  h ^= h >> 29;
  return std::ldexp(static_cast<float>(int(h % 2001) - 1000), int((h >> 16) % 24) - 12);
}

// Note [Gloo reduce-scatter]: every rank's slice must be exactly the sum of the ranks'
// contributions in rank order, for any size and however loaded the CPUs are. Slices of 4 MiB
// are larger than a loopback socket buffer, so sends are still in flight when a rank moves on,
// which is when Gloo's halving-doubling algorithm corrupted its peers' data.
int ReduceScatterIsExact(Communicator& comm) {
  const int r = comm.rank(), w = comm.world_size();
  std::atomic<bool> done{false};
  std::thread load([&] {  // keeps a core busy, as the trainer's compute would
    volatile uint64_t x = 0;
    while (!done.load(std::memory_order_relaxed)) x = x + 1;
  });
  int failures = 0;
  for (size_t count : {size_t{1000}, size_t{1} << 20}) {
    std::vector<float> send(count * w), recv(count), expected(count);
    for (int round = 0; round < 4; ++round) {
      for (size_t i = 0; i < send.size(); ++i) send[i] = Contribution(r, i, round);
      for (size_t i = 0; i < count; ++i) {
        float sum = Contribution(0, r * count + i, round);
        for (int q = 1; q < w; ++q) sum += Contribution(q, r * count + i, round);
        expected[i] = sum;
      }
      // A late last rank finds its peers' data already queued in its sockets, so it finishes
      // receiving while its own sends are still draining: the moment the race needs.
      if (r == w - 1 && round % 2 == 1) std::this_thread::sleep_for(20ms);
      if (!comm.ReduceScatter(send.data(), recv.data(), count, ElementType::kFp32, ReduceOp::kSum)
               .ok() ||
          std::memcmp(recv.data(), expected.data(), count * sizeof(float)) != 0) {
        std::fprintf(stderr, "rank %d: reduce-scatter of %zu per rank wrong in round %d\n", r,
                     count, round);
        ++failures;
      }
    }
  }
  done = true;
  load.join();
  return failures == 0 ? 0 : 1;
}

TEST(GlooCommunicatorTest, ReduceScatterIsExactUnderLoad) {
  for (int world : {2, 3, 4}) {
    EXPECT_EQ(RunRanks(world, ReduceScatterIsExact, 60000ms), std::vector<int>(world, 0))
        << "world " << world;
  }
}

TEST(GlooCommunicatorTest, DeadRankIsReportedWithinTheTimeout) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int> codes = RunRanks(
      3,
      [](Communicator& comm) {
        if (comm.Barrier().ok() && comm.rank() == 2) _exit(42);  // dies mid-run
        std::vector<float> v(1 << 16, 1.0f);
        Status s = comm.AllReduce(v.data(), v.size(), ElementType::kFp32, ReduceOp::kSum);
        CHILD_CHECK(!s.ok());
        CHILD_CHECK(s.code() == StatusCode::kUnavailable ||
                    s.code() == StatusCode::kDeadlineExceeded);
        CHILD_CHECK(s.message().find("rank " + std::to_string(comm.rank()) + " of 3") !=
                    std::string::npos);
        std::fprintf(stderr, "rank %d saw: %s\n", comm.rank(), s.ToString().c_str());
        // The failure is sticky: the group is out of step.
        CHILD_CHECK(comm.Barrier().code() == s.code());
        return 0;
      },
      3000ms);
  EXPECT_EQ(codes, (std::vector<int>{0, 0, 42}));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);
}

// A local process hammering the store (connect/close, huge headers, garbage, wrong secrets,
// idle connections) must not stop a job from connecting and training.
TEST(GlooCommunicatorTest, RanksConnectAndAllReduceWhileTheStoreIsFlooded) {
  const int port = testing::FreePort();
  const std::vector<int> codes = testing::ForkRanks(2, [port](int rank) {
    // The flood comes from rank 1's process, at rank 0's store: 3000 rounds before rank 1
    // connects, more while it trains. Rank 0 has the common default limit of 1024 open files,
    // which a store that kept every connection would run out of.
    std::unique_ptr<testing::StoreFlooder> flood;
    if (rank == 0) {
      rlimit rl{};
      getrlimit(RLIMIT_NOFILE, &rl);
      rl.rlim_cur = std::min<rlim_t>(rl.rlim_max, 1024);
      CHILD_CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
    }
    if (rank == 1) {
      flood = std::make_unique<testing::StoreFlooder>(port);
      const auto deadline = std::chrono::steady_clock::now() + 30s;
      while (flood->rounds() < 3000 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(10ms);
      }
      CHILD_CHECK(flood->rounds() >= 3000);
    }
    auto store = TcpStore::Create({.port = static_cast<uint16_t>(port),
                                   .is_server = rank == 0,
                                   .timeout = 20000ms,
                                   .secret = "flood-test-secret"});
    CHILD_OK(store.status());
    auto comm =
        CreateGlooCommunicator(**store, {.rank = rank, .world_size = 2, .timeout = 20000ms});
    CHILD_OK(comm.status());
    std::vector<float> v(4096, static_cast<float>(rank + 1));
    for (int step = 0; step < 20; ++step) {
      std::fill(v.begin(), v.end(), static_cast<float>(rank + 1));
      CHILD_OK((*comm)->AllReduce(v.data(), v.size(), ElementType::kFp32, ReduceOp::kSum));
      CHILD_CHECK(v[0] == 3.0f && v[4095] == 3.0f);
      // The store itself keeps serving, too.
      auto n = (*store)->Add("steps", 1);
      CHILD_OK(n.status());
    }
    CHILD_OK((*comm)->Barrier());
    if (flood) CHILD_CHECK(flood->rounds() > 0);
    flood.reset();
    return 0;
  });
  EXPECT_EQ(codes, (std::vector<int>{0, 0}));
}

TEST(GlooCommunicatorTest, MissingRankFailsToConnectWithinTheTimeout) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int> codes =
      RunRanks(2, [](Communicator&) { return 0; }, 1500ms, /*absent_ranks=*/{1});
  EXPECT_EQ(codes, (std::vector<int>{101})) << "rank 0 reports DeadlineExceeded";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 30s);
}

TEST(GlooCommunicatorTest, BadOptions) {
  auto server = TcpStore::Create({.port = 0, .is_server = true, .timeout = 1000ms});
  ASSERT_TRUE(server.ok());
  EXPECT_EQ(CreateGlooCommunicator(**server, {.rank = 2, .world_size = 2}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateGlooCommunicator(**server, {.rank = 0, .world_size = 0}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(LocalCommunicatorTest, CollectivesAreCopies) {
  auto comm = CreateLocalCommunicator();
  ASSERT_TRUE(comm.ok());
  std::vector<float> send = {1, 2, 3}, recv(3);
  ASSERT_TRUE((*comm)->AllReduce(send.data(), 3, ElementType::kFp32, ReduceOp::kSum).ok());
  EXPECT_EQ(send, (std::vector<float>{1, 2, 3}));
  ASSERT_TRUE((*comm)->AllGather(send.data(), recv.data(), 3, ElementType::kFp32).ok());
  EXPECT_EQ(recv, send);
  ASSERT_TRUE(
      (*comm)->ReduceScatter(send.data(), recv.data(), 3, ElementType::kFp32, ReduceOp::kSum).ok());
  EXPECT_EQ(recv, send);
  EXPECT_TRUE((*comm)->Barrier().ok());
  EXPECT_EQ((*comm)->Broadcast(send.data(), 3, ElementType::kFp32, 1).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*comm)->AllReduce(nullptr, 3, ElementType::kFp32, ReduceOp::kSum).code(),
            StatusCode::kInvalidArgument);
  EXPECT_FALSE((*comm)->status().ok()) << "a failed collective is sticky, whatever the cause";
}

// Device work that writes a collective's input: it has run once its event says so, here after
// a delay, as a packing copy on a GPU stream finishes some time after it is queued.
class LateWrite : public Event {
 public:
  explicit LateWrite(std::vector<float>* data) : data_(data) {}
  StatusOr<bool> Query() override { return written_.load(); }
  Status Synchronize() override {
    if (written_.load()) return OkStatus();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    *data_ = {4, 5, 6};
    written_ = true;
    return OkStatus();
  }
  StatusOr<double> ElapsedMsSince(const Event&) const override {
    return FailedPrecondition("not a timing event");
  }

 private:
  std::vector<float>* data_;
  std::atomic<bool> written_{false};
};

// ReduceScatterAsync after an event: the collective waits for the work that writes its input,
// on the communicator's thread, and reads what that work wrote; the caller returns at once.
TEST(LocalCommunicatorTest, ReduceScatterWaitsForTheEventItIsGiven) {
  auto comm = CreateLocalCommunicator();
  ASSERT_TRUE(comm.ok());
  std::vector<float> send = {1, 2, 3}, recv(3);
  LateWrite written(&send);
  std::shared_ptr<CommWork> work = (*comm)->ReduceScatterAsync(
      send.data(), recv.data(), 3, ElementType::kFp32, ReduceOp::kSum, &written);
  ASSERT_TRUE(work->Wait().ok());
  EXPECT_EQ(recv, (std::vector<float>{4, 5, 6}));
}

class EnvironmentTest : public ::testing::Test {
 protected:
  void TearDown() override {
    for (const char* v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                          "MASTER_PORT", "ZINF_MASTER_PORT", kStoreSecretEnv}) {
      unsetenv(v);
    }
  }
};

TEST_F(EnvironmentTest, UnsetIsOneProcess) {
  TearDown();
  auto env = ReadDistEnvironment();
  ASSERT_TRUE(env.ok());
  EXPECT_FALSE(env->launched);
  EXPECT_EQ(env->world_size, 1);
  EXPECT_TRUE(env->store_secret.empty());
}

TEST_F(EnvironmentTest, TorchrunVariables) {
  setenv("RANK", "3", 1);
  setenv("WORLD_SIZE", "8", 1);
  setenv("LOCAL_WORLD_SIZE", "4", 1);
  setenv("MASTER_ADDR", "10.0.0.1", 1);
  setenv("MASTER_PORT", "29501", 1);
  setenv(kStoreSecretEnv, "0123abcd", 1);
  auto env = ReadDistEnvironment();
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->store_secret, "0123abcd");
  EXPECT_TRUE(env->launched);
  EXPECT_EQ(env->rank, 3);
  EXPECT_EQ(env->world_size, 8);
  EXPECT_EQ(env->local_rank, 3);
  EXPECT_EQ(env->master_addr, "10.0.0.1");
  EXPECT_EQ(env->master_port, 29501);
  // zinf's store takes the next port: MASTER_PORT is torch.distributed's.
  EXPECT_EQ(env->store_port, 29502);
  setenv("ZINF_MASTER_PORT", "40000", 1);
  env = ReadDistEnvironment();
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->store_port, 40000);
  unsetenv("ZINF_MASTER_PORT");
}

TEST_F(EnvironmentTest, BadValuesNameTheVariable) {
  setenv("RANK", "2", 1);
  setenv("WORLD_SIZE", "2", 1);
  auto env = ReadDistEnvironment();
  ASSERT_FALSE(env.ok());
  EXPECT_EQ(env.status().message(),
            "environment variable RANK must be an integer in [0, 1], got '2'");
  setenv("RANK", "0", 1);
  setenv("MASTER_PORT", "http", 1);
  EXPECT_NE(ReadDistEnvironment().status().message().find("MASTER_PORT"), std::string::npos);
  unsetenv("WORLD_SIZE");
  EXPECT_NE(ReadDistEnvironment().status().message().find("RANK is set but WORLD_SIZE is not"),
            std::string::npos);
}

}  // namespace
}  // namespace zinf
