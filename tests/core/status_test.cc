#include "zinf/status.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <memory>

namespace zinf {
namespace {

TEST(StatusTest, OkHasNoMessage) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.ToString(), "OK");
  EXPECT_EQ(Status(StatusCode::kOk, "ignored").message(), "");
}

TEST(StatusTest, ErrorCarriesCodeAndMessage) {
  Status s = InvalidArgument("aio.queue_depth must be in [1, 4096], got 0");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.ToString(), "InvalidArgument: aio.queue_depth must be in [1, 4096], got 0");
}

TEST(StatusTest, WithContextPrefixes) {
  Status s = IoError("No space left on device").WithContext("writing /nvme/swap.0");
  EXPECT_EQ(s.message(), "writing /nvme/swap.0: No space left on device");
  EXPECT_TRUE(OkStatus().WithContext("anything").ok());
}

TEST(StatusTest, ErrnoMapsToCodes) {
  EXPECT_EQ(ErrnoStatus(ENOSPC, "write").code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoStatus(EIO, "write").code(), StatusCode::kIoError);
  EXPECT_EQ(ErrnoStatus(EINVAL, "open").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ErrnoStatus(ENOSYS, "io_uring_setup").code(), StatusCode::kUnavailable);
  EXPECT_EQ(ErrnoStatus(EIO, "reading x").message(), "reading x: Input/output error");
}

StatusOr<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgument("odd");
  return x / 2;
}

Status Quarter(int x, int* out) {
  ZINF_ASSIGN_OR_RETURN(int h, Half(x));
  ZINF_ASSIGN_OR_RETURN(*out, Half(h));
  return OkStatus();
}

TEST(StatusOrTest, ValueAndErrorPropagate) {
  int out = 0;
  EXPECT_TRUE(Quarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  EXPECT_EQ(Quarter(6, &out).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(*Half(10), 5);
}

TEST(StatusOrTest, MoveOnlyValues) {
  StatusOr<std::unique_ptr<int>> p = std::make_unique<int>(7);
  ASSERT_TRUE(p.ok());
  std::unique_ptr<int> taken = std::move(p).value();
  EXPECT_EQ(*taken, 7);
}

TEST(StatusOrTest, OkStatusBecomesInternal) {
  StatusOr<int> s = OkStatus();
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInternal);
}

TEST(StatusOrDeathTest, ValueOfErrorAborts) {
  StatusOr<int> s = DataLoss("crc mismatch");
  EXPECT_DEATH((void)s.value(), "DataLoss: crc mismatch");
}

Status ReturnIfErrorCtx() {
  ZINF_RETURN_IF_ERROR_CTX(IoError("EIO"), "reading chunk 3");
  return OkStatus();
}

TEST(StatusTest, ReturnIfErrorAddsContext) {
  EXPECT_EQ(ReturnIfErrorCtx().message(), "reading chunk 3: EIO");
}

}  // namespace
}  // namespace zinf
