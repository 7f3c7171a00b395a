// IoEngine conformance, run on every backend: io_uring (one ring, several rings, without
// registration, single_submit), POSIX, and buffered I/O. Data integrity for random sizes,
// offsets and unaligned tails; many concurrent requests; reads past the end of a file fail.
#include "nvme/io_engine.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstring>
#include <functional>
#include <random>

#include "core/units.h"
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
// Names the case in test listings instead of dumping its bytes.
void PrintTo(const Backend& b, std::ostream* os) { *os << b.label; }

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

// One request far larger than the queue, from and into memory that is not page-aligned:
// its pieces are staged a few at a time through the queue's slots (Note [Staging unaligned
// direct I/O]), and a read writes the request's bytes and not one more, though the disk
// moves whole pages.
TEST_P(IoEngineTest, LargeUnalignedRequestTouchesOnlyItsBytes) {
  const uint64_t block = GetParam().block;
  const uint64_t length = 40 * block + 123;  // pieces: five times the queue depth, and a tail
  constexpr uint64_t kGuard = 64;
  ASSERT_EQ(ftruncate(file_.fd(), static_cast<off_t>(AlignUp(length, 4096))), 0);
  const auto data = RandomBytes(length, 11);
  std::vector<uint8_t> src(length + 7);
  std::memcpy(src.data() + 7, data.data(), length);
  IoWaiter waiter;
  engine_->Submit(IoRequest{IoOp::kWrite, id_, 0, src.data() + 7, length}, &waiter);
  ASSERT_TRUE(waiter.Wait().ok());

  std::vector<uint8_t> dst(kGuard + length + kGuard, 0xA5);
  engine_->Submit(IoRequest{IoOp::kRead, id_, 0, dst.data() + kGuard, length}, &waiter);
  Status s = waiter.Wait();
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_EQ(std::memcmp(dst.data() + kGuard, data.data(), length), 0);
  for (uint64_t i = 0; i < kGuard; ++i) {
    ASSERT_EQ(dst[i], 0xA5) << "byte " << kGuard - i << " before the buffer was written";
    ASSERT_EQ(dst[kGuard + length + i], 0xA5) << "byte " << i << " past the buffer was written";
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
  Status written = waiter.Wait();
  ASSERT_TRUE(written.ok()) << written;
  EXPECT_EQ(ok.load(), kRequests);
  std::memset(mem, 0, data.size());
  std::thread t3(submit, 0, IoOp::kRead), t4(submit, 1, IoOp::kRead);
  t3.join();
  t4.join();
  Status read = waiter.Wait();
  ASSERT_TRUE(read.ok()) << read;
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

// Runs `body` in a child process whose kernel refuses io_uring_setup with EPERM (as seccomp
// profiles of container runtimes do) and/or refuses O_DIRECT opens with EINVAL (as file systems
// without direct I/O do). Returns the child's exit code; 77 means the filter could not be set.
int RunRefused(bool refuse_uring, bool refuse_direct, const std::function<int()>& body) {
  const pid_t pid = fork();
  if (pid == 0) {
    std::vector<sock_filter> f;
    f.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)));
    if (refuse_uring) {
      f.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1));
      f.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM));
    }
    if (refuse_direct) {
      f.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_openat, 0, 3));
      // The low 32 bits of openat's flags (little-endian).
      f.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[2])));
      f.push_back(BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, O_DIRECT, 0, 1));
      f.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EINVAL));
    }
    f.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
    sock_fprog prog{static_cast<unsigned short>(f.size()), f.data()};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
      _exit(77);
    }
    _exit(body());
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

TEST(CreateIoEngine, FallsBackToPosixWhenIoUringIsRefused) {
  ScratchDir dir;
  const int rc = RunRefused(true, false, [&] {
    AioOptions o;
    auto uring = CreateUringEngine(o);
    if (uring.ok() || uring.status().code() != StatusCode::kUnavailable) return 2;
    auto e = CreateIoEngine(o);  // auto: must pick posix and work
    if (!e.ok() || (*e)->name() != "posix") return 3;
    auto f = OpenIoFile(dir.path() + "/x.bin", true, DirectIo::kAuto);
    if (!f.ok()) return 4;
    auto id = (*e)->AddFile(*f);
    auto buffer = HostBuffer::Allocate(1 << 20);
    if (!id.ok() || !buffer.ok()) return 5;
    std::memset(buffer->data(), 0x3c, 1 << 20);
    IoWaiter w;
    (*e)->Submit(IoRequest{IoOp::kWrite, *id, 0, buffer->data(), 1 << 20}, &w);
    if (!w.Wait().ok()) return 6;
    o.backend = IoBackend::kIoUring;  // required: an error, not a silent fallback
    if (CreateIoEngine(o).status().code() != StatusCode::kUnavailable) return 7;
    return 0;
  });
  if (rc == 77) GTEST_SKIP() << "cannot install a seccomp filter here";
  EXPECT_EQ(rc, 0);
}

TEST(OpenIoFile, BufferedWhenTheFileSystemRefusesODirect) {
  ScratchDir dir;
  const int rc = RunRefused(false, true, [&] {
    auto f = OpenIoFile(dir.path() + "/auto.bin", true, DirectIo::kAuto);
    if (!f.ok() || f->direct()) return 2;  // auto: buffered, with a warning
    auto on = OpenIoFile(dir.path() + "/on.bin", true, DirectIo::kOn);
    if (on.ok() || on.status().code() != StatusCode::kUnavailable) return 3;
    if (on.status().message().find("O_DIRECT") == std::string::npos) return 4;
    // A swap store over such a path still works (buffered).
    auto e = CreateIoEngine(AioOptions());
    if (!e.ok()) return 5;
    auto id = (*e)->AddFile(*f);
    std::vector<char> data(10000, 'z'), back(10000);
    IoWaiter w;
    (*e)->Submit(IoRequest{IoOp::kWrite, *id, 0, data.data(), data.size()}, &w);
    if (!w.Wait().ok()) return 6;
    (*e)->Submit(IoRequest{IoOp::kRead, *id, 0, back.data(), back.size()}, &w);
    if (!w.Wait().ok() || back != data) return 7;
    return 0;
  });
  if (rc == 77) GTEST_SKIP() << "cannot install a seccomp filter here";
  EXPECT_EQ(rc, 0);
}

}  // namespace
}  // namespace zinf
