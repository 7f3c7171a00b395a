// IoEngine conformance, run on every backend: io_uring (one ring, several rings, without
// registration, single_submit), POSIX, and buffered I/O. Data integrity for random sizes,
// offsets and unaligned tails; many concurrent requests; reads past the end of a file fail.
#include "nvme/io_engine.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <random>

#include "nvme/posix_engine.h"
#include "nvme/uring_engine.h"
#include "tests/nvme/nvme_test_util.h"
#include "zinf/host_memory.h"

namespace zinf {
namespace {

using ::testing::HasSubstr;
using testing_util::RandomBytes;
using testing_util::ScratchDir;

struct Backend {
  std::string label;
  IoBackend backend;
  DirectIo direct;
  int threads = 1;
  bool register_all = true;
  bool single_submit = false;
  uint64_t block = 64 * 1024;  // small, so that requests split into many pieces
  int queue_depth = 8;
};

class IoEngineTest : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    const Backend& b = GetParam();
    AioOptions o;
    o.backend = b.backend;
    o.direct_io = b.direct;
    o.thread_count = b.threads;
    o.register_buffers = b.register_all;
    o.register_files = b.register_all;
    o.single_submit = b.single_submit;
    o.block_size = b.block;
    o.queue_depth = b.queue_depth;
    auto engine = CreateIoEngine(o);
    if (!engine.ok() && engine.status().code() == StatusCode::kUnavailable) {
      GTEST_SKIP() << "backend unavailable here: " << engine.status();
    }
    ASSERT_TRUE(engine.ok()) << engine.status();
    engine_ = std::move(*engine);
    if (b.backend == IoBackend::kIoUring) {
      ASSERT_EQ(engine_->name(), "io_uring");
    }
    auto f = OpenIoFile(dir_.path() + "/data.bin", true, b.direct);
    ASSERT_TRUE(f.ok()) << f.status();
    file_ = std::move(*f);
    auto id = engine_->AddFile(file_);
    ASSERT_TRUE(id.ok()) << id.status();
    id_ = *id;
  }

  ScratchDir dir_;
  std::unique_ptr<IoEngine> engine_;
  IoFile file_;
  int id_ = -1;
};

TEST_P(IoEngineTest, RandomSizesOffsetsAndUnalignedTailsRoundTrip) {
  constexpr uint64_t kFile = 8 << 20;
  ASSERT_EQ(ftruncate(file_.fd(), kFile), 0);
  auto buffer = HostBuffer::Allocate(kFile);
  ASSERT_TRUE(buffer.ok());
  ASSERT_TRUE(engine_->RegisterBuffer(buffer->data(), kFile).ok());
  std::mt19937_64 rng(42);
  // Non-overlapping regions at aligned offsets (O_DIRECT needs that) with random lengths,
  // unaligned tails and unaligned buffer addresses included.
  struct Region {
    uint64_t offset, length, buf_off;
  };
  std::vector<Region> regions;
  for (uint64_t off = 0; off < kFile;) {
    uint64_t len = 1 + rng() % (700 * 1024);
    len = std::min(len, kFile - off);
    const uint64_t buf_off = (rng() % 4 == 0) ? 1 + rng() % 100 : 0;
    if (off + buf_off + len > kFile) break;
    regions.push_back({off, len, buf_off});
    off = (off + len + 4095) & ~uint64_t{4095};
  }
  ASSERT_GT(regions.size(), 10u);
  const auto data = RandomBytes(kFile, 7);
  auto* mem = buffer->as<uint8_t>();
  std::memcpy(mem, data.data(), kFile);
  IoWaiter waiter;
  for (const Region& r : regions) {
    engine_->Submit(IoRequest{IoOp::kWrite, id_, r.offset, mem + r.offset + r.buf_off, r.length},
                    &waiter);
  }
  ASSERT_TRUE(waiter.Wait().ok());
  std::memset(mem, 0, kFile);
  for (const Region& r : regions) {
    engine_->Submit(IoRequest{IoOp::kRead, id_, r.offset, mem + r.offset + r.buf_off, r.length},
                    &waiter);
  }
  Status s = waiter.Wait();
  ASSERT_TRUE(s.ok()) << s;
  for (const Region& r : regions) {
    ASSERT_EQ(std::memcmp(mem + r.offset + r.buf_off, data.data() + r.offset + r.buf_off, r.length),
              0)
        << "region at " << r.offset << " length " << r.length;
  }
}

TEST_P(IoEngineTest, ManyConcurrentRequestsWithCallbacks) {
  constexpr int kRequests = 512;
  constexpr uint64_t kSize = 16 * 1024;
  auto buffer = HostBuffer::Allocate(kRequests * kSize);
  ASSERT_TRUE(buffer.ok());
  auto* mem = buffer->as<uint8_t>();
  const auto data = RandomBytes(kRequests * kSize, 9);
  std::memcpy(mem, data.data(), data.size());
  std::atomic<int> ok{0};
  IoWaiter waiter;
  // Submit from two threads at once.
  auto submit = [&](int first, IoOp op) {
    for (int i = first; i < kRequests; i += 2) {
      waiter.Add();
      engine_->Submit(IoRequest{op, id_, i * kSize, mem + i * kSize, kSize}, [&](Status s) {
        if (s.ok()) ok.fetch_add(1);
        waiter.Done(std::move(s));
      });
    }
  };
  std::thread t1(submit, 0, IoOp::kWrite), t2(submit, 1, IoOp::kWrite);
  t1.join();
  t2.join();
  ASSERT_TRUE(waiter.Wait().ok());
  EXPECT_EQ(ok.load(), kRequests);
  std::memset(mem, 0, data.size());
  std::thread t3(submit, 0, IoOp::kRead), t4(submit, 1, IoOp::kRead);
  t3.join();
  t4.join();
  ASSERT_TRUE(waiter.Wait().ok());
  EXPECT_EQ(std::memcmp(mem, data.data(), data.size()), 0);
  engine_->Drain();
}

TEST_P(IoEngineTest, ReadPastEndOfFileFailsInsteadOfReturningPartialData) {
  auto buffer = HostBuffer::Allocate(1 << 20);
  ASSERT_TRUE(buffer.ok());
  std::memset(buffer->data(), 0x11, 1 << 20);
  IoWaiter waiter;
  engine_->Submit(IoRequest{IoOp::kWrite, id_, 0, buffer->data(), 40960}, &waiter);
  ASSERT_TRUE(waiter.Wait().ok());
  // The file holds 40 KiB; asking for 1 MiB gets a short read, then end of file.
  engine_->Submit(IoRequest{IoOp::kRead, id_, 0, buffer->data(), 1 << 20}, &waiter);
  Status s = waiter.Wait();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << s;
  EXPECT_THAT(s.message(), HasSubstr("end of file"));
  EXPECT_THAT(s.message(), HasSubstr(file_.path()));
}

TEST_P(IoEngineTest, BadRequestsCompleteWithInvalidArgument) {
  auto buffer = HostBuffer::Allocate(8192);
  ASSERT_TRUE(buffer.ok());
  IoWaiter waiter;
  engine_->Submit(IoRequest{IoOp::kRead, 99, 0, buffer->data(), 4096}, &waiter);
  Status s = waiter.Wait();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("file id 99"));
  engine_->Submit(IoRequest{IoOp::kWrite, id_, 0, nullptr, 4096}, &waiter);
  EXPECT_EQ(waiter.Wait().code(), StatusCode::kInvalidArgument);
  engine_->Submit(IoRequest{IoOp::kWrite, id_, 0, buffer->data(), 0}, &waiter);
  EXPECT_EQ(waiter.Wait().code(), StatusCode::kInvalidArgument);
  if (file_.direct()) {
    engine_->Submit(IoRequest{IoOp::kWrite, id_, 100, buffer->data(), 4096}, &waiter);
    s = waiter.Wait();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("multiples of 4096"));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Backends, IoEngineTest,
    ::testing::Values(Backend{"uring", IoBackend::kIoUring, DirectIo::kOn},
                      Backend{"uring_4rings", IoBackend::kIoUring, DirectIo::kOn, 4},
                      Backend{"uring_unregistered_single_submit", IoBackend::kIoUring,
                              DirectIo::kOn, 1, false, true},
                      Backend{"uring_qd1", IoBackend::kIoUring, DirectIo::kOn, 1, true, false, 4096,
                              1},
                      Backend{"uring_buffered", IoBackend::kIoUring, DirectIo::kOff},
                      Backend{"posix", IoBackend::kPosix, DirectIo::kOn},
                      Backend{"posix_buffered", IoBackend::kPosix, DirectIo::kOff}),
    [](const ::testing::TestParamInfo<Backend>& info) { return info.param.label; });

TEST(OpenIoFile, MissingDirectoryAndDirectoryInsteadOfFile) {
  ScratchDir dir;
  auto f = OpenIoFile(dir.path() + "/no/such/dir/x.bin", true, DirectIo::kAuto);
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(f.status().message(), HasSubstr("does not exist"));
  f = OpenIoFile(dir.path(), false, DirectIo::kOff);
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(f.status().message(), HasSubstr(dir.path()));
}

TEST(CreateIoEngine, RejectsBadOptions) {
  AioOptions o;
  o.queue_depth = 0;
  EXPECT_EQ(CreateIoEngine(o).status().code(), StatusCode::kInvalidArgument);
  o = AioOptions();
  o.block_size = 0;
  EXPECT_EQ(CreateUringEngine(o).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(CreatePosixEngine(o).status().code(), StatusCode::kInvalidArgument);
}

TEST(CreateIoEngine, AutoPicksAWorkingBackend) {
  auto e = CreateIoEngine(AioOptions());
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_TRUE((*e)->name() == "io_uring" || (*e)->name() == "posix");
}

}  // namespace
}  // namespace zinf
