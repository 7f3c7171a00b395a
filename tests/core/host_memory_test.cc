#include "zinf/host_memory.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace zinf {
namespace {

TEST(HostBufferTest, AlignedAndWritable) {
  for (size_t alignment : {64, 4096, 2 * 1024 * 1024}) {
    auto buffer = HostBuffer::Allocate(12345, {.alignment = alignment});
    ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buffer->data()) % alignment, 0u);
    EXPECT_EQ(buffer->size_bytes(), 12345u);
    std::memset(buffer->data(), 0xab, buffer->size_bytes());
    EXPECT_EQ(buffer->as<unsigned char>()[12344], 0xab);
  }
}

TEST(HostBufferTest, ZeroSizeIsEmpty) {
  auto buffer = HostBuffer::Allocate(0);
  ASSERT_TRUE(buffer.ok());
  EXPECT_TRUE(buffer->empty());
  EXPECT_EQ(buffer->data(), nullptr);
}

TEST(HostBufferTest, BadOptionsAreRejected) {
  auto a = HostBuffer::Allocate(100, {.alignment = 48});
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("power of two"), std::string::npos);
  auto b = HostBuffer::Allocate(100, {.numa_node = -5});
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
}

TEST(HostBufferTest, PinnedWithMlock) {
  auto buffer = HostBuffer::Allocate(1 << 20, {.pinned = true});
  if (!buffer.ok()) {
    // Unprivileged with a small RLIMIT_MEMLOCK: the error must say what to do.
    EXPECT_EQ(buffer.status().code(), StatusCode::kResourceExhausted);
    EXPECT_NE(buffer.status().message().find("RLIMIT_MEMLOCK"), std::string::npos);
    GTEST_SKIP() << "mlock refused here: " << buffer.status().ToString();
  }
  EXPECT_TRUE(buffer->pinned());
}

TEST(HostBufferTest, NumaNodeZeroBinds) {
  auto buffer = HostBuffer::Allocate(1 << 20, {.numa_node = 0});
  if (!buffer.ok() && buffer.status().code() == StatusCode::kUnavailable) {
    GTEST_SKIP() << "mbind not supported: " << buffer.status().ToString();
  }
  ASSERT_TRUE(buffer.ok()) << buffer.status().ToString();
  std::memset(buffer->data(), 1, 1 << 20);
}

TEST(HostBufferTest, MoveTransfersOwnership) {
  auto a = HostBuffer::Allocate(4096);
  ASSERT_TRUE(a.ok());
  void* p = a->data();
  HostBuffer b = std::move(*a);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(a->data(), nullptr);
  HostBuffer c;
  c = std::move(b);
  EXPECT_EQ(c.data(), p);
}

class CountingPinner final : public HostPinner {
 public:
  std::string_view name() const override { return "counting"; }
  Status Pin(void*, size_t) override {
    ++pins;
    return fail ? ResourceExhausted("driver said no") : OkStatus();
  }
  void Unpin(void*, size_t) override { ++unpins; }
  int pins = 0, unpins = 0;
  bool fail = false;
};

TEST(HostBufferTest, InstalledPinnerIsUsedAndUnpinned) {
  CountingPinner pinner;
  SetHostPinner(&pinner);
  {
    auto buffer = HostBuffer::Allocate(8192, {.pinned = true});
    ASSERT_TRUE(buffer.ok());
    EXPECT_EQ(pinner.pins, 1);
  }
  EXPECT_EQ(pinner.unpins, 1);
  pinner.fail = true;
  auto refused = HostBuffer::Allocate(8192, {.pinned = true});
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(pinner.unpins, 1);  // a failed pin is not unpinned
  SetHostPinner(nullptr);
}

}  // namespace
}  // namespace zinf
