#include "core/log.h"

#include <gtest/gtest.h>

namespace zinf {
namespace {

TEST(LogTest, LevelFiltersMessages) {
  log::SetLevel(log::Level::kWarn);
  EXPECT_FALSE(log::Enabled(log::Level::kInfo));
  EXPECT_TRUE(log::Enabled(log::Level::kWarn));
  EXPECT_TRUE(log::Enabled(log::Level::kError));
  log::SetLevel(log::Level::kOff);
  EXPECT_FALSE(log::Enabled(log::Level::kError));
  EXPECT_FALSE(log::Enabled(log::Level::kOff));
  log::SetLevel(log::Level::kInfo);
}

TEST(LogTest, WritesToStderrWithPrefix) {
  ::testing::internal::CaptureStderr();
  log::Warn("swap file {} is {}", "/nvme/zinf-swap-rank0-0.bin", IoError("short write"));
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("[zinf] [warning] swap file /nvme/zinf-swap-rank0-0.bin is IoError: short "
                     "write"),
            std::string::npos)
      << err;
}

}  // namespace
}  // namespace zinf
