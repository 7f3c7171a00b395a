#include "core/log.h"

#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "zinf/log_sink.h"

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

TEST(LogTest, ASinkTakesTheLinesOfEveryThreadUntilRemoved) {
  std::mutex mu;
  std::vector<std::pair<LogLevel, std::string>> lines;
  SetLogSink([&](LogLevel level, std::string_view message) {
    std::lock_guard<std::mutex> lock(mu);
    lines.emplace_back(level, std::string(message));
  });
  ::testing::internal::CaptureStderr();
  log::Warn("from the {} thread", "main");
  std::thread([] { log::Error("from a worker: {}", 7); }).join();
  log::Debug("below the level: not formatted, not written");
  SetLogSink(nullptr);
  log::Warn("after the sink is removed");
  const std::string err = ::testing::internal::GetCapturedStderr();
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], std::make_pair(LogLevel::kWarn, std::string("from the main thread")));
  EXPECT_EQ(lines[1], std::make_pair(LogLevel::kError, std::string("from a worker: 7")));
  EXPECT_EQ(err.find("from the main thread"), std::string::npos) << err;
  EXPECT_NE(err.find("[zinf] [warning] after the sink is removed"), std::string::npos) << err;
}

TEST(LogTest, SetLogLevelIsThePublicSetLevel) {
  const LogLevel before = GetLogLevel();
  SetLogLevel(LogLevel::kError);
  EXPECT_FALSE(log::Enabled(log::Level::kWarn));
  EXPECT_EQ(GetLogLevel(), LogLevel::kError);
  SetLogLevel(before);
}

}  // namespace
}  // namespace zinf
