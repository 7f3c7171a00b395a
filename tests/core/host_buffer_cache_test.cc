#include "core/host_buffer_cache.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>
#include <vector>

namespace zinf {
namespace {

TEST(HostBufferCacheTest, ReusesABufferOfTheSameSizeOnly) {
  HostBufferCache cache(1 << 20);
  auto a = cache.Take(4096);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  void* first = a->data();
  cache.Give(std::move(*a));
  EXPECT_EQ(cache.cached_bytes(), 4096u);

  auto other_size = cache.Take(8192);
  ASSERT_TRUE(other_size.ok());
  EXPECT_NE(other_size->data(), first);
  auto same_size = cache.Take(4096);
  ASSERT_TRUE(same_size.ok());
  EXPECT_EQ(same_size->data(), first);
  EXPECT_EQ(same_size->size_bytes(), 4096u);
  EXPECT_EQ(cache.cached_bytes(), 0u);
  EXPECT_EQ(cache.hits(), 1u);
  EXPECT_EQ(cache.misses(), 2u);
}

TEST(HostBufferCacheTest, TakeZeroedClearsAReusedBuffer) {
  HostBufferCache cache(1 << 20);
  auto a = cache.TakeZeroed(10000);
  ASSERT_TRUE(a.ok());
  std::memset(a->data(), 0x5a, a->size_bytes());
  cache.Give(std::move(*a));
  auto b = cache.TakeZeroed(10000);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(cache.hits(), 1u);
  const auto* bytes = b->as<unsigned char>();
  for (size_t i = 0; i < b->size_bytes(); ++i) ASSERT_EQ(bytes[i], 0) << "byte " << i;
}

TEST(HostBufferCacheTest, StaysWithinItsLimitDroppingTheOldestFirst) {
  HostBufferCache cache(3 * 4096);
  std::vector<void*> given;
  for (size_t size : {4096, 8192, 4096}) {
    auto b = cache.Take(size);
    ASSERT_TRUE(b.ok());
    given.push_back(b->data());
    cache.Give(std::move(*b));
  }
  // The third Give needed room: the 4 KiB buffer given first was freed, the others stay.
  EXPECT_EQ(cache.cached_bytes(), 3 * 4096u);
  auto small = cache.Take(4096);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(small->data(), given[2]);
  auto large = cache.Take(8192);
  ASSERT_TRUE(large.ok());
  EXPECT_EQ(large->data(), given[1]);
  const uint64_t misses = cache.misses();
  ASSERT_TRUE(cache.Take(4096).ok());  // the first one is gone
  EXPECT_EQ(cache.misses(), misses + 1);

  // Larger than the whole limit, or empty: freed at once.
  auto huge = HostBuffer::Allocate(4 * 4096);
  ASSERT_TRUE(huge.ok());
  cache.Give(std::move(*huge));
  cache.Give(HostBuffer());
  EXPECT_EQ(cache.cached_bytes(), 0u);
}

TEST(HostBufferCacheTest, ClearFreesEverything) {
  HostBufferCache cache(1 << 20);
  for (int i = 0; i < 3; ++i) cache.Give(HostBuffer::Allocate(4096).value());
  EXPECT_EQ(cache.cached_bytes(), 3 * 4096u);
  cache.Clear();
  EXPECT_EQ(cache.cached_bytes(), 0u);
  EXPECT_TRUE(cache.Take(4096).ok());
  EXPECT_EQ(cache.hits(), 0u);
}

TEST(HostBufferCacheTest, ZeroLimitCachesNothing) {
  HostBufferCache cache(0);
  cache.Give(HostBuffer::Allocate(4096).value());
  EXPECT_EQ(cache.cached_bytes(), 0u);
}

TEST(HostBufferCacheTest, ConcurrentTakeAndGiveKeepTheAccounting) {
  HostBufferCache cache(64 * 4096);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&cache, t] {
      for (int i = 0; i < 500; ++i) {
        const size_t size = 4096 * (1 + (i + t) % 5);
        auto b = cache.Take(size);
        ASSERT_TRUE(b.ok());
        ASSERT_EQ(b->size_bytes(), size);
        b->as<unsigned char>()[size - 1] = static_cast<unsigned char>(t);
        cache.Give(std::move(*b));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LE(cache.cached_bytes(), 64 * 4096u);
  EXPECT_EQ(cache.hits() + cache.misses(), 2000u);
  EXPECT_GT(cache.hits(), 0u);
}

}  // namespace
}  // namespace zinf
