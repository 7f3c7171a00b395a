// ExtentAllocator: alignment, reuse, coalescing and the errors.
#include "core/extent_allocator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <random>

namespace zinf {
namespace {

using ::testing::HasSubstr;

TEST(ExtentAllocator, AlignsAndReuses) {
  ExtentAllocator a(1 << 20, 4096);
  auto x = a.Allocate(1);
  auto y = a.Allocate(5000);
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_EQ(*x, 0u);
  EXPECT_EQ(*y, 4096u);
  EXPECT_EQ(a.free_bytes(), (1u << 20) - 3 * 4096);
  ASSERT_TRUE(a.Free(*x, 1).ok());
  auto z = a.Allocate(4096);  // best fit: the freed hole
  ASSERT_TRUE(z.ok());
  EXPECT_EQ(*z, 0u);
}

// From the top: the end of the highest free range that holds the request, so that such
// ranges gather at the end of the space while best fit fills it from the start.
TEST(ExtentAllocator, TopAllocationsGatherAtTheEnd) {
  ExtentAllocator a(16 * 4096, 4096);
  auto t1 = a.Allocate(4096, /*top=*/true);
  auto t2 = a.Allocate(5000, /*top=*/true);
  auto b1 = a.Allocate(3 * 4096);
  ASSERT_TRUE(t1.ok() && t2.ok() && b1.ok());
  EXPECT_EQ(*t1, 15u * 4096);
  EXPECT_EQ(*t2, 13u * 4096);
  EXPECT_EQ(*b1, 0u);
  EXPECT_EQ(a.free_ranges(), 1u);
  EXPECT_EQ(a.largest_free_bytes(), 10u * 4096);
  // A hole below the top blocks is taken from its end: the highest one that holds it.
  ASSERT_TRUE(a.Free(*b1, 3 * 4096).ok());
  auto t3 = a.Allocate(4096, /*top=*/true);
  ASSERT_TRUE(t3.ok());
  EXPECT_EQ(*t3, 12u * 4096);
  for (auto [off, size] : {std::pair{*t1, 4096u}, {*t2, 5000u}, {*t3, 4096u}}) {
    ASSERT_TRUE(a.Free(off, size).ok());
  }
  EXPECT_EQ(a.free_ranges(), 1u);
  EXPECT_EQ(a.free_bytes(), 16u * 4096);
  EXPECT_FALSE(a.Allocate(17 * 4096, /*top=*/true).ok());
}

TEST(ExtentAllocator, CoalescesToOneRange) {
  ExtentAllocator a(64 * 4096, 4096);
  std::vector<uint64_t> offs;
  for (int i = 0; i < 64; ++i) offs.push_back(*a.Allocate(4096));
  EXPECT_EQ(a.free_bytes(), 0u);
  std::mt19937 rng(7);
  std::shuffle(offs.begin(), offs.end(), rng);
  for (uint64_t o : offs) ASSERT_TRUE(a.Free(o, 4096).ok());
  EXPECT_EQ(a.free_ranges(), 1u);
  EXPECT_EQ(a.largest_free_bytes(), 64u * 4096);
  EXPECT_TRUE(a.Allocate(64 * 4096).ok());
}

TEST(ExtentAllocator, ExhaustionSaysWhatIsFree) {
  ExtentAllocator a(8 * 4096, 4096);
  auto x = a.Allocate(4 * 4096);
  auto y = a.Allocate(2 * 4096);
  ASSERT_TRUE(x.ok() && y.ok());
  ASSERT_TRUE(a.Free(*x, 4 * 4096).ok());
  auto z = a.Allocate(5 * 4096);
  EXPECT_EQ(z.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(z.status().message(), HasSubstr("largest free range is 16.00 KiB"));
  EXPECT_EQ(a.Allocate(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a.Allocate(1 << 30).status().code(), StatusCode::kResourceExhausted);
}

TEST(ExtentAllocator, DoubleFreeIsRejectedAndHarmless) {
  ExtentAllocator a(8 * 4096, 4096);
  auto x = a.Allocate(4096);
  ASSERT_TRUE(a.Free(*x, 4096).ok());
  Status s = a.Free(*x, 4096);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("double free"));
  EXPECT_EQ(a.free_bytes(), 8u * 4096);
  EXPECT_EQ(a.Free(3, 4096).code(), StatusCode::kInvalidArgument);
}

TEST(ExtentAllocator, RandomChurnKeepsAccounting) {
  ExtentAllocator a(1 << 24, 4096);
  std::map<uint64_t, uint64_t> live;
  std::mt19937_64 rng(11);
  for (int i = 0; i < 2000; ++i) {
    if (live.empty() || rng() % 3 != 0) {
      const uint64_t size = 1 + rng() % (256 * 1024);
      auto o = a.Allocate(size);
      if (!o.ok()) continue;
      // No overlap with live extents.
      auto next = live.lower_bound(*o);
      if (next != live.end()) {
        ASSERT_GE(next->first, *o + size);
      }
      if (next != live.begin()) {
        auto prev = std::prev(next);
        ASSERT_LE(prev->first + prev->second, *o);
      }
      live[*o] = size;
    } else {
      auto it = live.begin();
      std::advance(it, rng() % live.size());
      ASSERT_TRUE(a.Free(it->first, it->second).ok());
      live.erase(it);
    }
  }
  for (auto [o, s] : live) ASSERT_TRUE(a.Free(o, s).ok());
  EXPECT_EQ(a.free_bytes(), uint64_t{1} << 24);
  EXPECT_EQ(a.free_ranges(), 1u);
}

}  // namespace
}  // namespace zinf
