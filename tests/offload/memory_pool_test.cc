// Tests for offload/memory_pool.h: exact sizing, coalescing, budgets, stats, device pools.
#include "offload/memory_pool.h"

#include <gtest/gtest.h>

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/units.h"

namespace zinf {
namespace {

PinnedPoolOptions Pinned(uint64_t budget, uint64_t arena = 0) {
  PinnedPoolOptions options;
  options.budget_bytes = budget;
  options.arena_bytes = arena;
  options.pinned = false;  // accounting is the same; keeps the test within RLIMIT_MEMLOCK
  return options;
}

TEST(MemoryPoolTest, RequestCostsItsSizeRoundedToAlignmentOnly) {
  // 1.1 GiB of address space is reserved but never touched: pages are mapped on first write.
  const uint64_t request = kGiB + kGiB / 10 + 123;
  auto pool = MemoryPool::CreatePinned(Pinned(request + 4096));
  ASSERT_TRUE(pool.ok()) << pool.status();
  auto block = (*pool)->Allocate(request);
  ASSERT_TRUE(block.ok()) << block.status();
  EXPECT_EQ(block->size_bytes(), request);
  MemoryPoolStats stats = (*pool)->stats();
  EXPECT_EQ(stats.in_use_bytes, AlignUp(request, 4096));
  EXPECT_LT(stats.arena_bytes, request + 8192);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(block->data()) % 4096, 0u);
}

TEST(MemoryPoolTest, FreedNeighboursCoalesce) {
  auto pool = MemoryPool::CreatePinned(Pinned(16 * kMiB));
  ASSERT_TRUE(pool.ok());
  std::vector<PoolBlock> blocks;
  for (int i = 0; i < 4; ++i) {
    auto b = (*pool)->Allocate(4 * kMiB);
    ASSERT_TRUE(b.ok()) << b.status();
    blocks.push_back(std::move(*b));
  }
  EXPECT_FALSE((*pool)->Allocate(4096).ok());  // full
  blocks[0].Reset();
  blocks[2].Reset();
  MemoryPoolStats stats = (*pool)->stats();
  EXPECT_EQ(stats.free_bytes, 8 * kMiB);
  EXPECT_EQ(stats.largest_free_bytes, 4 * kMiB);
  EXPECT_NEAR(stats.fragmentation, 0.5, 1e-9);
  auto big = (*pool)->Allocate(8 * kMiB);
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted);
  blocks[1].Reset();  // 0,1,2 merge into 12 MiB
  stats = (*pool)->stats();
  EXPECT_EQ(stats.largest_free_bytes, 12 * kMiB);
  EXPECT_EQ(stats.fragmentation, 0.0);
  big = (*pool)->Allocate(12 * kMiB);
  EXPECT_TRUE(big.ok()) << big.status();
  EXPECT_EQ((*pool)->stats().peak_in_use_bytes, 16 * kMiB);
}

// Note [Small blocks at the top]: a layer's large buffers live while the next layer's are
// made (a cache of two layers), and each layer leaves small blocks that persist (its biases).
// Placed best-fit beside the large ones, the small blocks would cut the arena into holes of two
// layers' size (28 of 64 MiB, in a model of the allocator); from the top of the arena they
// leave the freed space one range, and a block of three quarters of the arena fits.
// Note [Runs of blocks]: a run's blocks follow one another at their rounded sizes, and each
// is freed on its own, as any block.
TEST(MemoryPoolTest, ARunIsBlocksEndToEndEachFreedOnItsOwn) {
  auto pool = MemoryPool::CreatePinned(Pinned(4 * kMiB));
  ASSERT_TRUE(pool.ok());
  auto before = (*pool)->Allocate(8192);  // the run is not where the pool starts
  ASSERT_TRUE(before.ok());
  const std::vector<uint64_t> sizes = {3 * 4096, 100, 2 * kMiB + 1, 4096};
  auto run = (*pool)->AllocateRun(sizes);
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->size(), sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ((*run)[i].size_bytes(), sizes[i]);
    EXPECT_EQ((*run)[i].reserved_bytes(), AlignUp(sizes[i], 4096));
    if (i > 0) {
      EXPECT_EQ((*run)[i].as<char>(), (*run)[i - 1].as<char>() + (*run)[i - 1].reserved_bytes())
          << "block " << i;
    }
  }
  MemoryPoolStats stats = (*pool)->stats();
  EXPECT_EQ(stats.blocks, 5u);
  EXPECT_EQ(stats.in_use_bytes, 8192 + 3 * 4096 + 4096 + AlignUp(2 * kMiB + 1, 4096) + 4096);
  (*run)[1].Reset();  // a hole in the middle of the run
  (*run)[3].Reset();
  stats = (*pool)->stats();
  EXPECT_EQ(stats.blocks, 3u);
  EXPECT_EQ(stats.free_ranges, 2u) << "the second block's hole, and the last's joined to the tail";
  run->clear();
  before->Reset();
  stats = (*pool)->stats();
  EXPECT_EQ(stats.blocks, 0u);
  EXPECT_EQ(stats.in_use_bytes, 0u);
  EXPECT_EQ(stats.free_ranges, 1u) << "the run's blocks coalesce again";
}

TEST(MemoryPoolTest, ARunThatDoesNotFitTakesNothing) {
  auto pool = MemoryPool::CreatePinned(Pinned(kMiB));
  ASSERT_TRUE(pool.ok());
  auto run = (*pool)->AllocateRun(std::vector<uint64_t>{512 * kKiB, 512 * kKiB + 1});
  EXPECT_EQ(run.status().code(), StatusCode::kResourceExhausted) << run.status();
  EXPECT_EQ((*pool)->stats().in_use_bytes, 0u);
  EXPECT_EQ((*pool)->stats().blocks, 0u);
  EXPECT_EQ((*pool)->AllocateRun(std::vector<uint64_t>{4096, 0}).status().code(),
            StatusCode::kInvalidArgument);
  auto empty = (*pool)->AllocateRun({});
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->empty());
  EXPECT_TRUE((*pool)->AllocateRun(std::vector<uint64_t>{512 * kKiB, 512 * kKiB}).ok());
}

TEST(MemoryPoolTest, SmallBlocksThatOutliveTheirNeighboursLeaveTheLargeHolesWhole) {
  auto pool = MemoryPool::CreatePinned(Pinned(64 * kMiB));
  ASSERT_TRUE(pool.ok());
  std::vector<PoolBlock> persistent;
  std::vector<std::vector<PoolBlock>> layers;
  for (int layer = 0; layer < 8; ++layer) {
    layers.emplace_back();
    for (int k = 0; k < 2; ++k) {
      auto large = (*pool)->Allocate(6 * kMiB);
      auto small = (*pool)->Allocate(8 * kKiB);
      ASSERT_TRUE(large.ok() && small.ok()) << large.status() << small.status();
      layers.back().push_back(std::move(*large));
      persistent.push_back(std::move(*small));
    }
    if (layers.size() > 2) layers.erase(layers.begin());
  }
  layers.clear();
  const MemoryPoolStats stats = (*pool)->stats();
  EXPECT_EQ(stats.free_ranges, 1u);
  EXPECT_EQ(stats.largest_free_bytes, 64 * kMiB - persistent.size() * 8 * kKiB);
  auto big = (*pool)->Allocate(48 * kMiB);
  EXPECT_TRUE(big.ok()) << big.status();
}

TEST(MemoryPoolTest, BudgetErrorNamesPoolUseAndRequest) {
  PinnedPoolOptions options = Pinned(8 * kMiB);
  options.name = "staging pool";
  auto pool = MemoryPool::CreatePinned(options);
  ASSERT_TRUE(pool.ok());
  auto a = (*pool)->Allocate(6 * kMiB);
  ASSERT_TRUE(a.ok());
  auto b = (*pool)->Allocate(3 * kMiB);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(b.status().message().find("staging pool"), std::string::npos) << b.status();
  EXPECT_EQ((*pool)->stats().in_use_bytes, 6 * kMiB);  // the failed request left nothing behind
}

TEST(MemoryPoolTest, ArenasGrowOnDemandAndTrim) {
  auto pool = MemoryPool::CreatePinned(Pinned(12 * kMiB, 4 * kMiB));
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ((*pool)->stats().arenas, 0u);
  auto a = (*pool)->Allocate(3 * kMiB);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*pool)->stats().arena_bytes, 4 * kMiB);
  auto b = (*pool)->Allocate(6 * kMiB);  // larger than an arena: gets one of its own size
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*pool)->stats().arenas, 2u);
  EXPECT_EQ((*pool)->stats().arena_bytes, 10 * kMiB);
  b->Reset();
  EXPECT_EQ((*pool)->Trim(), 6 * kMiB);
  EXPECT_EQ((*pool)->stats().arena_bytes, 4 * kMiB);
  std::memset(a->data(), 1, a->size_bytes());  // the surviving block is intact
}

// Note [Arena slack]: small blocks first (the parameter tier's shards) leave a tail in their
// arena that the large blocks after them (the flat arrays) cannot use. With arenas held to a
// budget of exactly what the blocks need, the last large block finds no room; with an arena of
// slack it does, and still the blocks in use never exceed the budget.
TEST(MemoryPoolTest, AnArenaOfSlackHoldsWhatSmallBlocksLeaveBehind) {
  const uint64_t arena = 4 * kMiB, small = 256 * 1024, large = 9 * kMiB;
  const int smalls = 20, larges = 4;  // 5 MiB of small blocks: an arena and a quarter
  const uint64_t budget = smalls * small + larges * large;
  for (const uint64_t slack : {uint64_t{0}, arena}) {
    SCOPED_TRACE(slack);
    PinnedPoolOptions options = Pinned(budget, arena);
    options.arena_slack_bytes = slack;
    auto pool = MemoryPool::CreatePinned(options);
    ASSERT_TRUE(pool.ok()) << pool.status();
    std::vector<PoolBlock> blocks;
    for (int i = 0; i < smalls; ++i) blocks.push_back(std::move(*(*pool)->Allocate(small)));
    Status last;
    for (int i = 0; i < larges && last.ok(); ++i) {
      auto b = (*pool)->Allocate(large);
      if (b.ok()) blocks.push_back(std::move(*b));
      last = b.status();
    }
    if (slack == 0) {
      EXPECT_EQ(last.code(), StatusCode::kResourceExhausted) << last;
      EXPECT_NE(last.message().find("fully assigned to arenas"), std::string::npos) << last;
      continue;
    }
    EXPECT_TRUE(last.ok()) << last;
    EXPECT_GT((*pool)->stats().arena_bytes, budget) << "the slack is the arenas'";
    // The budget is full: the slack holds no block of its own.
    auto more = (*pool)->Allocate(4096);
    EXPECT_EQ(more.status().code(), StatusCode::kResourceExhausted) << more.status();
    EXPECT_EQ((*pool)->stats().in_use_bytes, budget);
  }
}

TEST(MemoryPoolTest, BadOptionsAreInvalidArgument) {
  EXPECT_EQ(MemoryPool::CreatePinned(Pinned(0)).status().code(), StatusCode::kInvalidArgument);
  PinnedPoolOptions options = Pinned(kMiB);
  options.alignment = 100;
  EXPECT_EQ(MemoryPool::CreatePinned(options).status().code(), StatusCode::kInvalidArgument);
  options = Pinned(kMiB);
  options.numa_node = 4000;
  options.preallocate = true;
  EXPECT_FALSE(MemoryPool::CreatePinned(options).ok());
  auto pool = MemoryPool::CreatePinned(Pinned(kMiB));
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ((*pool)->Allocate(0).status().code(), StatusCode::kInvalidArgument);
}

// Where the kernel answers get_mempolicy, a pool on node 0 must hand out memory bound to node
// 0 (MPOL_BIND, the page on node 0); where it refuses NUMA calls (no NUMA support, or a
// container's seccomp profile), creating the pool must fail saying it could not bind.
TEST(MemoryPoolTest, NumaNodeZeroBindsItsMemoryOrSaysWhyNot) {
  PinnedPoolOptions options = Pinned(4 * kMiB);
  options.numa_node = 0;
  options.preallocate = true;
  auto pool = MemoryPool::CreatePinned(options);
  int probe_mode = -1;
  const bool numa_calls = syscall(SYS_get_mempolicy, &probe_mode, nullptr, 0, nullptr, 0) == 0;
  if (!numa_calls) {
    ASSERT_FALSE(pool.ok()) << "get_mempolicy is refused here, yet mbind succeeded";
    EXPECT_NE(pool.status().message().find("NUMA node 0"), std::string::npos) << pool.status();
    return;
  }
  ASSERT_TRUE(pool.ok()) << pool.status();
  auto block = (*pool)->Allocate(kMiB);
  ASSERT_TRUE(block.ok());
  std::memset(block->data(), 7, kMiB);
  constexpr int kMpolBind = 2, kMpolFNode = 1, kMpolFAddr = 2;
  int mode = -1, node = -1;
  ASSERT_EQ(syscall(SYS_get_mempolicy, &mode, nullptr, 0, block->data(), kMpolFAddr), 0);
  EXPECT_EQ(mode, kMpolBind) << "the pool's memory is not bound";
  ASSERT_EQ(syscall(SYS_get_mempolicy, &node, nullptr, 0, block->data(), kMpolFNode | kMpolFAddr),
            0);
  EXPECT_EQ(node, 0);
}

// The process's locked memory (VmLck), in bytes.
uint64_t LockedBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmLck:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

// A pinned pool's arena is locked while the pool lives and unlocked after, where mlock is
// allowed; where it is not (RLIMIT_MEMLOCK without CAP_IPC_LOCK), creating the pool fails
// naming the limit and how to raise it.
TEST(MemoryPoolTest, PinnedArenaIsLockedOrTheRefusalNamesTheLimit) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer makes mlock a no-op: pinning cannot be observed here";
#endif
  PinnedPoolOptions options;
  options.budget_bytes = 2 * kMiB;
  options.preallocate = true;
  const uint64_t before = LockedBytes();
  // Whether this process may lock 2 MiB more, asked of the kernel directly.
  std::vector<char> probe(2 * kMiB + 4096);
  char* page = reinterpret_cast<char*>(AlignUp(reinterpret_cast<uintptr_t>(probe.data()), 4096));
  const bool may_lock = mlock(page, 2 * kMiB) == 0;
  if (may_lock) munlock(page, 2 * kMiB);
  {
    auto pool = MemoryPool::CreatePinned(options);
    if (!may_lock) {
      ASSERT_FALSE(pool.ok()) << "mlock of 2 MiB is refused here, yet the pinned pool was made";
      EXPECT_NE(pool.status().message().find("RLIMIT_MEMLOCK"), std::string::npos) << pool.status();
      return;
    }
    ASSERT_TRUE(pool.ok()) << pool.status();
    auto block = (*pool)->Allocate(kMiB);
    ASSERT_TRUE(block.ok());
    EXPECT_GE(LockedBytes(), before + 2 * kMiB);
  }
  EXPECT_EQ(LockedBytes(), before);
}

TEST(MemoryPoolTest, ConcurrentRandomBlocksNeverOverlapOrExceedBudget) {
  const uint64_t budget = 32 * kMiB;
  auto pool_or = MemoryPool::CreatePinned(Pinned(budget, 8 * kMiB));
  ASSERT_TRUE(pool_or.ok());
  MemoryPool& pool = **pool_or;
  std::atomic<bool> failed{false};
  auto worker = [&](int seed) {
    std::mt19937 rng(seed);
    std::vector<std::pair<PoolBlock, uint8_t>> held;
    for (int i = 0; i < 2000; ++i) {
      if (held.size() < 6 && rng() % 2 == 0) {
        uint64_t size = 1 + rng() % (3 * kMiB);
        auto b = pool.Allocate(size);
        if (!b.ok()) {
          if (b.status().code() != StatusCode::kResourceExhausted) failed = true;
          continue;
        }
        uint8_t tag = static_cast<uint8_t>(rng());
        std::memset(b->data(), tag, b->size_bytes());
        held.emplace_back(std::move(*b), tag);
      } else if (!held.empty()) {
        size_t k = rng() % held.size();
        const auto& [block, tag] = held[k];
        const uint8_t* p = block.as<uint8_t>();
        for (uint64_t j = 0; j < block.size_bytes(); j += 4093) {
          if (p[j] != tag) failed = true;
        }
        if (p[block.size_bytes() - 1] != tag) failed = true;
        held.erase(held.begin() + k);
      }
      if (pool.stats().in_use_bytes > budget) failed = true;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) threads.emplace_back(worker, t + 1);
  for (auto& t : threads) t.join();
  EXPECT_FALSE(failed.load());
  EXPECT_EQ(pool.stats().in_use_bytes, 0u);
  EXPECT_LE(pool.stats().peak_in_use_bytes, budget);
  EXPECT_LE(pool.stats().arena_bytes, budget);
}

TEST(MemoryPoolTest, DevicePoolCarvesDeviceMemoryUnderItsBudget) {
  HostDeviceOptions device_options;
  device_options.memory_budget_bytes = 64 * kMiB;
  auto device = CreateHostDevice(device_options);
  ASSERT_TRUE(device.ok());
  DevicePoolOptions options;
  options.budget_bytes = 16 * kMiB;
  auto pool = MemoryPool::CreateOnDevice(**device, options);
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_TRUE((*pool)->is_device());
  auto a = (*pool)->Allocate(10 * kMiB + 1);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*device)->memory_stats().in_use_bytes, 16 * kMiB);  // one arena of the budget
  auto b = (*pool)->Allocate(6 * kMiB);
  EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted);
  auto stream = (*device)->CreateStream();
  ASSERT_TRUE(stream.ok());
  ASSERT_TRUE((*stream)->Memset(a->data(), 3, a->size_bytes()).ok());
  ASSERT_TRUE((*stream)->Synchronize().ok());
  EXPECT_EQ(a->as<uint8_t>()[10 * kMiB], 3);

  options.budget_bytes = 128 * kMiB;  // more than the device has
  EXPECT_EQ(MemoryPool::CreateOnDevice(**device, options).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zinf
