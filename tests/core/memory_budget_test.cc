#include "core/memory_budget.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace zinf {
namespace {

TEST(MemoryBudgetTest, ReserveReleaseAndPeak) {
  MemoryBudget budget("pinned pool", 1000);
  ASSERT_TRUE(budget.Reserve(600).ok());
  ASSERT_TRUE(budget.Reserve(400).ok());
  EXPECT_EQ(budget.in_use_bytes(), 1000u);
  Status over = budget.Reserve(1);
  EXPECT_EQ(over.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(over.message(),
            "pinned pool budget exceeded: budget 1000 B, in use 1000 B, requested 1 B (1 bytes)");
  budget.Release(600);
  EXPECT_EQ(budget.in_use_bytes(), 400u);
  EXPECT_EQ(budget.peak_bytes(), 1000u);
  budget.ResetPeak();
  EXPECT_EQ(budget.peak_bytes(), 400u);
}

TEST(MemoryBudgetTest, ZeroLimitIsUnlimited) {
  MemoryBudget budget("staging", 0);
  EXPECT_TRUE(budget.Reserve(uint64_t{1} << 50).ok());
}

TEST(MemoryBudgetTest, RequestLargerThanBudgetDoesNotOverflow) {
  MemoryBudget budget("device", 100);
  ASSERT_TRUE(budget.Reserve(50).ok());
  EXPECT_FALSE(budget.Reserve(UINT64_MAX - 10).ok()) << "in_use + bytes must not wrap around";
  EXPECT_EQ(budget.in_use_bytes(), 50u);
}

TEST(MemoryBudgetTest, ConcurrentReservationsNeverExceedTheLimit) {
  MemoryBudget budget("device", 64);
  std::atomic<uint64_t> max_seen{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 20000; ++i) {
        if (!budget.Reserve(8).ok()) continue;
        uint64_t now = budget.in_use_bytes();
        uint64_t seen = max_seen.load();
        while (now > seen && !max_seen.compare_exchange_weak(seen, now)) {
        }
        budget.Release(8);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LE(max_seen.load(), 64u);
  EXPECT_LE(budget.peak_bytes(), 64u);
  EXPECT_EQ(budget.in_use_bytes(), 0u);
}

}  // namespace
}  // namespace zinf
