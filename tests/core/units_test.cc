#include "core/units.h"

#include <gtest/gtest.h>

namespace zinf {
namespace {

TEST(UnitsTest, ParsesSizes) {
  EXPECT_EQ(*ParseBytes("4096"), 4096u);
  EXPECT_EQ(*ParseBytes("512K"), 512 * kKiB);
  EXPECT_EQ(*ParseBytes("64MiB"), 64 * kMiB);
  EXPECT_EQ(*ParseBytes("4G"), 4 * kGiB);
  EXPECT_EQ(*ParseBytes("1.5G"), 3 * kGiB / 2);
  EXPECT_EQ(*ParseBytes("2GB"), 2000000000u);
  EXPECT_EQ(*ParseBytes("8 MiB"), 8 * kMiB);
  EXPECT_EQ(*ParseBytes("1k"), 1024u);
}

TEST(UnitsTest, RejectsNonSizes) {
  for (const char* bad : {"", "G", "-1", "4X", "1.5", "abc", "1e3"}) {
    StatusOr<uint64_t> r = ParseBytes(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_NE(r.status().message().find("is not a byte size"), std::string::npos);
    }
  }
}

TEST(UnitsTest, Formats) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(4096), "4.00 KiB");
  EXPECT_EQ(FormatBytes(3 * kGiB / 2), "1.50 GiB");
}

TEST(UnitsTest, Align) {
  EXPECT_EQ(AlignUp(0, 4096), 0u);
  EXPECT_EQ(AlignUp(1, 4096), 4096u);
  EXPECT_EQ(AlignUp(4096, 4096), 4096u);
  EXPECT_TRUE(IsPowerOfTwo(4096));
  EXPECT_FALSE(IsPowerOfTwo(0));
  EXPECT_FALSE(IsPowerOfTwo(48));
}

}  // namespace
}  // namespace zinf
