// CRC32C: known vectors, and the SSE4.2 engine against the table engine.
#include "core/crc32c.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "tests/nvme/nvme_test_util.h"
#include "zinf/cpu_info.h"

namespace zinf {
namespace {

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(Crc32c("", 0), 0u);
  std::vector<uint8_t> zeros(32, 0);
  EXPECT_EQ(Crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);  // RFC 3720 B.4
  std::vector<uint8_t> ones(32, 0xFF);
  EXPECT_EQ(Crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  EXPECT_EQ(crc32c_internal::Crc32cTable("123456789", 9, 0), 0xE3069283u);
}

TEST(Crc32c, ChainingEqualsOneShot) {
  auto data = testing_util::RandomBytes(10000, 1);
  const uint32_t whole = Crc32c(data.data(), data.size());
  EXPECT_EQ(Crc32c(data.data() + 4321, data.size() - 4321, Crc32c(data.data(), 4321)), whole);
}

// Lengths up to several of the SSE4.2 engine's three-chain triples (24 KiB, crc32c_sse42.cc),
// the triples' edges among them.
TEST(Crc32c, Sse42MatchesTable) {
  if (!GetCpuInfo().isa.sse42) GTEST_SKIP() << "this CPU has no SSE4.2";
  auto data = testing_util::RandomBytes(1 << 18, 2);
  for (size_t len : {24575u, 24576u, 24577u, 2u * 24576u, 3u * 24576u + 13u}) {
    for (size_t off : {0u, 5u}) {
      ASSERT_EQ(crc32c_internal::Crc32cSse42(data.data() + off, len, 7),
                crc32c_internal::Crc32cTable(data.data() + off, len, 7))
          << "offset " << off << " length " << len;
    }
  }
  std::mt19937 rng(3);
  for (int i = 0; i < 200; ++i) {
    const size_t off = rng() % 64;
    const size_t len = rng() % (data.size() - off);
    const uint32_t seed = rng();
    ASSERT_EQ(crc32c_internal::Crc32cSse42(data.data() + off, len, seed),
              crc32c_internal::Crc32cTable(data.data() + off, len, seed))
        << "offset " << off << " length " << len;
  }
}

}  // namespace
}  // namespace zinf
