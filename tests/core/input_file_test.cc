#include "zinf/input_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/config_reader.h"
#include "tests/testing/temp_dir.h"

namespace zinf {
namespace {

class InputFileTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }
  testing::TempDir tmp_{"zinf-input"};
  const std::string dir_ = tmp_.path();
};

TEST_F(InputFileTest, ReadsARegularFileWhole) {
  const std::string path = Write("a.json", R"({"a": 1})");
  auto text = ReadInputFile(path, "--config");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, R"({"a": 1})");
}

TEST_F(InputFileTest, AnEndlessDeviceIsRefusedWithoutReadingIt) {
  auto text = ReadInputFile("/dev/zero", "--model");
  EXPECT_EQ(text.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(text.status().message().find("--model /dev/zero is not a regular file"),
            std::string::npos)
      << text.status();
}

TEST_F(InputFileTest, AFifoIsRefusedWithoutBlocking) {
  const std::string fifo = dir_ + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  const auto start = std::chrono::steady_clock::now();
  auto text = ReadInputFile(fifo, "--profile");  // no writer: a blocking open would hang
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(text.status().code(), StatusCode::kInvalidArgument) << text.status();
}

TEST_F(InputFileTest, ADirectoryIsRefused) {
  auto text = ReadInputFile(dir_, "--config");
  EXPECT_FALSE(text.ok());
}

TEST_F(InputFileTest, AFileOverTheCapIsRefusedNamingBoth) {
  const std::string path = Write("big.json", std::string(1000, ' '));
  auto text = ReadInputFile(path, "--config", 999);
  EXPECT_EQ(text.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(text.status().message().find("is 1000 bytes; zinf reads at most 999"),
            std::string::npos)
      << text.status();
  EXPECT_TRUE(ReadInputFile(path, "--config", 1000).ok());
}

TEST_F(InputFileTest, AMissingFileNamesItself) {
  auto text = ReadInputFile(dir_ + "/nope.json", "--config");
  EXPECT_FALSE(text.ok());
  EXPECT_NE(text.status().message().find("nope.json"), std::string::npos) << text.status();
}

TEST_F(InputFileTest, StandardInputIsReadUpToTheCap) {
  const std::string path = Write("in", std::string(5000, 'x'));
  const int saved = dup(STDIN_FILENO);
  const int fd = open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(dup2(fd, STDIN_FILENO), STDIN_FILENO);
  auto over = ReadInputFile("-", "--config", 4096);
  lseek(STDIN_FILENO, 0, SEEK_SET);
  auto whole = ReadInputFile("-", "--config");
  dup2(saved, STDIN_FILENO);
  close(saved);
  close(fd);
  EXPECT_EQ(over.status().code(), StatusCode::kResourceExhausted) << over.status();
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->size(), 5000u);
}

TEST_F(InputFileTest, ReadJsonFileRefusesDeepNestingBeforeParsing) {
  const std::string path = Write("deep.json", std::string(50000, '[') + std::string(50000, ']'));
  auto json = ReadJsonFile(path, "--profile");
  EXPECT_EQ(json.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(json.status().message().find("more than 128 levels"), std::string::npos)
      << json.status();
}

TEST(CheckJsonDepthTest, CountsOnlyBracketsOutsideStrings) {
  EXPECT_TRUE(CheckJsonDepth(R"({"a": "\"[[[[[[["})", "s", 1).ok());
  EXPECT_FALSE(CheckJsonDepth("[[1]]", "s", 1).ok());
  EXPECT_TRUE(CheckJsonDepth("[[1]]", "s", 2).ok());
}

TEST(ParseJsonTest, UniqueKeysRefusesAKeyGivenTwiceAtAnyDepth) {
  EXPECT_TRUE(ParseJson(R"({"a": 1, "a": 2})", "cfg").ok());  // as Python's json: last wins
  auto top = ParseJson(R"({"a": 1, "a": 2})", "hdr", /*unique_keys=*/true);
  EXPECT_EQ(top.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(top.status().message().find("names the key 'a' twice"), std::string::npos)
      << top.status();
  EXPECT_FALSE(ParseJson(R"({"x": {"b": 1, "b": 1}})", "hdr", true).ok());
  // The same key in two objects is fine.
  EXPECT_TRUE(ParseJson(R"({"x": {"b": 1}, "y": {"b": 1}})", "hdr", true).ok());
}

TEST(DescribeJsonTest, ContainersAreCountedNotDumped) {
  EXPECT_EQ(DescribeJson(nlohmann::json::array({1, 2})), "2 elements (array)");
  EXPECT_EQ(DescribeJson(nlohmann::json(std::string(100000, 'x'))).size(), 69u);
}

}  // namespace
}  // namespace zinf
