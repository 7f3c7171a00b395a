// AioOptions: defaults, Validate() messages, and the JSON `aio` reader with DeepSpeed keys.
#include "nvme/aio_options.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace zinf {
namespace {

using ::testing::HasSubstr;

TEST(AioOptions, DefaultsAreValid) {
  AioOptions o;
  EXPECT_TRUE(o.Validate().ok());
  EXPECT_EQ(o.block_size, 1u << 20);
  EXPECT_EQ(o.queue_depth, 8);
  EXPECT_TRUE(o.single_submit);  // See Note [Default aio options]
}

TEST(AioOptions, ZeroOrAbsurdQueueDepthIsRejected) {
  for (int qd : {0, -1, 4097, 1 << 30}) {
    AioOptions o;
    o.queue_depth = qd;
    Status s = o.Validate();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << qd;
    EXPECT_THAT(s.message(),
                HasSubstr("aio.queue_depth must be in [1, 4096], got " + std::to_string(qd)));
  }
}

TEST(AioOptions, ZeroAbsurdOrUnalignedBlockSizeIsRejected) {
  for (uint64_t b : {uint64_t{0}, uint64_t{512}, uint64_t{4097}, uint64_t{1} << 40}) {
    AioOptions o;
    o.block_size = b;
    Status s = o.Validate();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << b;
    EXPECT_THAT(s.message(), HasSubstr("aio.block_size"));
    EXPECT_THAT(s.message(), HasSubstr("got " + std::to_string(b)));
  }
}

TEST(AioOptions, ThreadCountRange) {
  AioOptions o;
  o.thread_count = 0;
  EXPECT_THAT(o.Validate().message(), HasSubstr("aio.thread_count must be in [1, 64], got 0"));
}

TEST(AioOptions, ReadsDeepSpeedAioObject) {
  auto j = nlohmann::json::parse(R"({"block_size": 262144, "queue_depth": 8,
      "intra_op_parallelism": 2, "single_submit": true, "overlap_events": false})");
  AioOptions o;
  ASSERT_TRUE(ReadAioOptions(j, "aio", &o).ok());
  EXPECT_EQ(o.block_size, 262144u);
  EXPECT_EQ(o.queue_depth, 8);
  EXPECT_EQ(o.thread_count, 2);
  EXPECT_TRUE(o.single_submit);
  EXPECT_FALSE(o.overlap_events);
}

TEST(AioOptions, ReadsZinfKeysAndByteStrings) {
  auto j = nlohmann::json::parse(R"({"block_size": "8MiB", "thread_count": 3,
      "backend": "posix", "direct_io": "off", "register_buffers": false})");
  AioOptions o;
  ASSERT_TRUE(ReadAioOptions(j, "aio", &o).ok());
  EXPECT_EQ(o.block_size, 8u << 20);
  EXPECT_EQ(o.thread_count, 3);
  EXPECT_EQ(o.backend, IoBackend::kPosix);
  EXPECT_EQ(o.direct_io, DirectIo::kOff);
  EXPECT_FALSE(o.register_buffers);
}

TEST(AioOptions, JsonErrorsNameTheKey) {
  AioOptions o;
  Status s = ReadAioOptions(nlohmann::json::parse(R"({"queue_depth": 0})"), "aio", &o);
  EXPECT_THAT(s.message(), HasSubstr("aio.queue_depth must be in [1, 4096], got 0"));
  s = ReadAioOptions(nlohmann::json::parse(R"({"queue_dept": 8})"), "aio", &o);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("queue_dept"));
  s = ReadAioOptions(nlohmann::json::parse(R"({"backend": "libaio"})"), "aio", &o);
  EXPECT_THAT(s.message(), HasSubstr("aio.backend"));
  s = ReadAioOptions(nlohmann::json::parse(R"({"thread_count": 2, "intra_op_parallelism": 4})"),
                     "aio", &o);
  EXPECT_THAT(s.message(), HasSubstr("disagree"));
  s = ReadAioOptions(nlohmann::json::parse(R"({"use_gds": true})"), "aio", &o);
  EXPECT_THAT(s.message(), HasSubstr("aio.use_gds=true is not supported"));
  s = ReadAioOptions(nlohmann::json::parse(R"({"block_size": "lots"})"), "aio", &o);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zinf
