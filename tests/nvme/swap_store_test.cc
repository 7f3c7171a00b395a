// SwapStore: integrity for random tensor sizes over one and several striped paths (with and
// without checksums, every backend), extent reuse, and bad input at Open: missing path, file
// instead of directory, read-only path, too little space, bad queue depth and block size.
#include "nvme/swap_store.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "tests/nvme/nvme_test_util.h"
#include "zinf/host_memory.h"

namespace zinf {
namespace {

using ::testing::HasSubstr;
using testing_util::RandomBytes;
using testing_util::ScratchDir;
using testing_util::TmpfsMount;

// Opens the unlinked file that this process has open and that was created at `path`, through
// /proc/self/fd; -1 when it has none.
int OpenUnlinked(const std::string& path) {
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(entry.path(), ec).string();
    if (!ec && target == path + " (deleted)") return open(entry.path().c_str(), O_RDONLY);
  }
  return -1;
}

// Entries in `dir` and its subdirectories that are not directories.
std::vector<std::string> FilesUnder(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (!entry.is_directory()) files.push_back(entry.path().string());
  }
  return files;
}

SwapStoreOptions SmallOptions(std::vector<std::string> paths) {
  SwapStoreOptions o;
  o.paths = std::move(paths);
  o.capacity_bytes = 32 << 20;
  o.stripe_bytes = 64 * 1024;
  o.aio.block_size = 128 * 1024;
  o.aio.queue_depth = 16;
  return o;
}

struct StoreCase {
  std::string label;
  int paths;
  bool checksum;
  IoBackend backend;
  DirectIo direct;
};
void PrintTo(const StoreCase& c, std::ostream* os) { *os << c.label; }

class SwapStoreIntegrity : public ::testing::TestWithParam<StoreCase> {};

TEST_P(SwapStoreIntegrity, RandomTensorsRoundTripAndSpaceIsReused) {
  const StoreCase& c = GetParam();
  ScratchDir dir;
  std::vector<std::string> paths;
  for (int i = 0; i < c.paths; ++i) paths.push_back(dir.Sub("nvme" + std::to_string(i)));
  SwapStoreOptions o = SmallOptions(paths);
  o.checksum = c.checksum;
  o.aio.backend = c.backend;
  o.aio.direct_io = c.direct;
  auto store = SwapStore::Open(o);
  if (!store.ok() && store.status().code() == StatusCode::kUnavailable) {
    GTEST_SKIP() << store.status();
  }
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_EQ((*store)->file_paths().size(), static_cast<size_t>(c.paths));
  for (const std::string& f : (*store)->file_paths()) {
    EXPECT_FALSE(std::filesystem::exists(f)) << f << " is unlinked once open";
    const int fd = OpenUnlinked(f);
    ASSERT_GE(fd, 0) << f << " is still open";
    struct stat st {};
    ASSERT_EQ(fstat(fd, &st), 0) << f;
    EXPECT_GE(static_cast<uint64_t>(st.st_size), (*store)->file_bytes());
    close(fd);
  }
  std::mt19937_64 rng(5);
  struct Tensor {
    SwapExtent extent;
    std::vector<uint8_t> data;
  };
  for (int round = 0; round < 3; ++round) {
    std::vector<Tensor> tensors;
    IoWaiter waiter;
    for (int i = 0; i < 24; ++i) {
      // Sizes from 1 byte to ~1 MiB, unaligned tails included.
      const uint64_t size = 1 + rng() % (1 << 20);
      auto e = (*store)->Allocate(size, "t" + std::to_string(i));
      ASSERT_TRUE(e.ok()) << e.status();
      tensors.push_back({*e, RandomBytes(size, rng())});
    }
    for (Tensor& t : tensors) {
      waiter.Add();
      (*store)->WriteAsync(t.extent, t.data.data(), waiter.Callback());
    }
    ASSERT_TRUE(waiter.Wait().ok());
    for (Tensor& t : tensors) {
      std::vector<uint8_t> back(t.data.size(), 0xEE);
      Status s = (*store)->Read(t.extent, back.data());
      ASSERT_TRUE(s.ok()) << s;
      ASSERT_EQ(back, t.data) << "tensor of " << t.data.size() << " bytes";
    }
    for (Tensor& t : tensors) ASSERT_TRUE((*store)->Free(t.extent).ok());
    EXPECT_EQ((*store)->free_bytes(), (*store)->capacity_bytes());
  }
  const std::vector<std::string> files = (*store)->file_paths();
  store->reset();
  for (const std::string& f : files) EXPECT_FALSE(std::filesystem::exists(f)) << f;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, SwapStoreIntegrity,
    ::testing::Values(StoreCase{"one_path", 1, false, IoBackend::kIoUring, DirectIo::kOn},
                      StoreCase{"three_paths_crc", 3, true, IoBackend::kIoUring, DirectIo::kOn},
                      StoreCase{"two_paths_posix", 2, true, IoBackend::kPosix, DirectIo::kOn},
                      StoreCase{"buffered", 2, false, IoBackend::kAuto, DirectIo::kOff}),
    [](const ::testing::TestParamInfo<StoreCase>& info) { return info.param.label; });

TEST(SwapStore, PageAlignedRegisteredBufferRoundTrip) {
  ScratchDir dir;
  SwapStoreOptions o = SmallOptions({dir.Sub("a"), dir.Sub("b")});
  o.checksum = true;
  auto store = SwapStore::Open(o);
  ASSERT_TRUE(store.ok()) << store.status();
  auto buffer = HostBuffer::Allocate(8 << 20);
  ASSERT_TRUE(buffer.ok());
  ASSERT_TRUE((*store)->RegisterBuffer(buffer->data(), buffer->size_bytes()).ok());
  const auto data = RandomBytes(8 << 20, 3);
  std::memcpy(buffer->data(), data.data(), data.size());
  auto e = (*store)->Allocate(data.size(), "registered");
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE((*store)->Write(*e, buffer->data()).ok());
  std::memset(buffer->data(), 0, data.size());
  ASSERT_TRUE((*store)->Read(*e, buffer->data()).ok());
  EXPECT_EQ(std::memcmp(buffer->data(), data.data(), data.size()), 0);
}

TEST(SwapStore, QueueDepthIsPerPath) {
  ScratchDir dir;
  SwapStoreOptions o = SmallOptions({dir.Sub("a"), dir.Sub("b"), dir.Sub("c")});
  auto store = SwapStore::Open(o);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->engine().options().queue_depth, 3 * o.aio.queue_depth);
  store->reset();
  o.aio.queue_depth = kMaxAioQueueDepth - 1;  // three times that is past the engine's limit
  store = SwapStore::Open(o);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->engine().options().queue_depth, kMaxAioQueueDepth);
}

TEST(SwapStore, ReadBeforeWriteAndUnknownExtents) {
  ScratchDir dir;
  auto store = SwapStore::Open(SmallOptions({dir.path()}));
  ASSERT_TRUE(store.ok()) << store.status();
  auto e = (*store)->Allocate(100, "fresh");
  ASSERT_TRUE(e.ok());
  std::vector<uint8_t> buf(100);
  Status s = (*store)->Read(*e, buf.data());
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("'fresh'"));
  EXPECT_THAT(s.message(), HasSubstr("never written"));
  EXPECT_EQ((*store)->Read(SwapExtent{12345, 100}, buf.data()).code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE((*store)->Free(*e).ok());
  EXPECT_EQ((*store)->Free(*e).code(), StatusCode::kInvalidArgument);
  auto big = (*store)->Allocate(1ull << 40, "huge");
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(big.status().message(), HasSubstr("'huge'"));
  // Past the capacity: the message says so and what to do, whoever passes it on.
  EXPECT_THAT(big.status().message(), HasSubstr("in a swap store of capacity"));
  EXPECT_THAT(big.status().message(), HasSubstr("larger capacity_bytes"));
  Status full;
  for (int i = 0; i < 1000 && full.ok(); ++i) full = (*store)->Allocate(1 << 20, "piece").status();
  EXPECT_EQ(full.code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(full.message(), HasSubstr("swap space exhausted"));
  EXPECT_THAT(full.message(), HasSubstr("larger capacity_bytes"));
}

TEST(SwapStoreOpen, MissingPath) {
  ScratchDir dir;
  auto s = SwapStore::Open(SmallOptions({dir.path() + "/nope"}));
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr(dir.path() + "/nope does not exist"));
}

TEST(SwapStoreOpen, TwoStoresOnOnePathAndRankKeepTheirOwnData) {
  // The first store's file is unlinked, so the second creates a new one under the same name.
  ScratchDir dir;
  auto first = SwapStore::Open(SmallOptions({dir.path()}));
  ASSERT_TRUE(first.ok()) << first.status();
  SwapStoreOptions options = SmallOptions({dir.path()});
  options.lock_wait_ms = 50;
  auto second = SwapStore::Open(options);
  ASSERT_TRUE(second.ok()) << second.status();
  const auto a = RandomBytes(1 << 20, 1), b = RandomBytes(1 << 20, 2);
  auto ea = (*first)->Allocate(a.size(), "a");
  auto eb = (*second)->Allocate(b.size(), "b");
  ASSERT_TRUE(ea.ok() && eb.ok());
  ASSERT_EQ(ea->id, eb->id) << "the same extent of each store";
  ASSERT_TRUE((*first)->Write(*ea, a.data()).ok());
  ASSERT_TRUE((*second)->Write(*eb, b.data()).ok());
  std::vector<uint8_t> back(a.size());
  ASSERT_TRUE((*first)->Read(*ea, back.data()).ok());
  EXPECT_EQ(back, a);
  ASSERT_TRUE((*second)->Read(*eb, back.data()).ok());
  EXPECT_EQ(back, b);
}

TEST(SwapStoreOpen, NoSwapFileIsLeftBehindEvenAfterKill9) {
  ScratchDir dir;
  const std::string path = dir.Sub("nvme");
  // A full-size file of an earlier zinf that was killed: reused, and removed with the rest.
  const std::string stale = path + "/zinf-swap-rank0-0.bin";
  std::ofstream(stale) << std::string(1 << 20, 'x');
  {
    auto store = SwapStore::Open(SmallOptions({path}));
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_EQ(FilesUnder(dir.path()), std::vector<std::string>{}) << "while the store is open";
  }
  // A rank killed while its store is open and written: nothing to clean up, nothing left.
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto store = SwapStore::Open(SmallOptions({path}));
    if (!store.ok()) _exit(1);
    const auto data = RandomBytes(1 << 20, 9);
    auto e = (*store)->Allocate(data.size(), "t");
    if (!e.ok() || !(*store)->Write(*e, data.data()).ok()) _exit(2);
    const char byte = 1;
    if (write(ready[1], &byte, 1) != 1) _exit(3);
    pause();
    _exit(0);
  }
  close(ready[1]);
  char byte = 0;
  ASSERT_EQ(read(ready[0], &byte, 1), 1) << "the child could not open and write its store";
  close(ready[0]);
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_EQ(FilesUnder(dir.path()), std::vector<std::string>{});
}

TEST(SwapStoreOpen, FileInsteadOfDirectory) {
  ScratchDir dir;
  const std::string file = dir.path() + "/plain";
  std::ofstream(file) << "x";
  auto s = SwapStore::Open(SmallOptions({file}));
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr(file + " is not a directory"));
}

TEST(SwapStoreOpen, ReadOnlyPath) {
  ScratchDir dir;
  // Root ignores permission bits, so a read-only mount is the honest test.
  TmpfsMount ro(dir, "ro", "size=4m");
  if (!ro.ok()) GTEST_SKIP() << "no read-only file system to test with: " << ro.why();
  ASSERT_TRUE(ro.MakeReadOnly());
  auto s = SwapStore::Open(SmallOptions({ro.path()}));
  EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition) << s.status();
  EXPECT_THAT(s.status().message(), HasSubstr(ro.path()));
  EXPECT_THAT(s.status().message(), HasSubstr("read-only"));
}

TEST(SwapStoreOpen, NotWritableForThisUser) {
  if (geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  ScratchDir dir;
  const std::string p = dir.Sub("locked");
  ASSERT_EQ(chmod(p.c_str(), 0500), 0);
  auto s = SwapStore::Open(SmallOptions({p}));
  EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.status().message(), HasSubstr("not writable"));
}

TEST(SwapStoreOpen, TooLittleSpaceSaysNeededAndAvailable) {
  ScratchDir dir;
  SwapStoreOptions o = SmallOptions({dir.path()});
  o.capacity_bytes = uint64_t{1} << 60;  // 1 EiB: more than any disk here
  auto s = SwapStore::Open(o);
  EXPECT_EQ(s.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(s.status().message(), HasSubstr("needs 1024.00 PiB"));
  EXPECT_THAT(s.status().message(), HasSubstr("free"));
}

TEST(SwapStoreOpen, TooLittleSpaceOnASmallFileSystem) {
  ScratchDir dir;
  TmpfsMount small(dir, "small", "size=8m");
  if (!small.ok()) GTEST_SKIP() << "cannot mount a small file system: " << small.why();
  SwapStoreOptions o = SmallOptions({small.path()});
  o.capacity_bytes = 16 << 20;
  auto s = SwapStore::Open(o);
  EXPECT_EQ(s.status().code(), StatusCode::kResourceExhausted) << s.status();
  EXPECT_THAT(s.status().message(), HasSubstr("needs 16.00 MiB"));
  EXPECT_THAT(s.status().message(), HasSubstr("it has 8.00 MiB free"));
  o.capacity_bytes = 4 << 20;  // fits
  auto ok = SwapStore::Open(o);
  EXPECT_TRUE(ok.ok()) << ok.status();
}

TEST(SwapStoreOpen, BadQueueDepthBlockSizeAndPaths) {
  ScratchDir dir;
  SwapStoreOptions o = SmallOptions({dir.path()});
  o.aio.queue_depth = 0;
  auto s = SwapStore::Open(o);
  EXPECT_THAT(s.status().message(), HasSubstr("aio.queue_depth must be in [1, 4096], got 0"));
  o.aio.queue_depth = 1000000;
  EXPECT_EQ(SwapStore::Open(o).status().code(), StatusCode::kInvalidArgument);
  o.aio.queue_depth = 8;
  o.aio.block_size = 0;
  EXPECT_THAT(SwapStore::Open(o).status().message(), HasSubstr("aio.block_size"));
  o.aio.block_size = uint64_t{1} << 40;
  EXPECT_THAT(SwapStore::Open(o).status().message(), HasSubstr("aio.block_size"));
  o = SmallOptions({dir.path(), dir.path()});
  EXPECT_THAT(SwapStore::Open(o).status().message(), HasSubstr("listed twice"));
  o = SmallOptions({});
  EXPECT_EQ(SwapStore::Open(o).status().code(), StatusCode::kInvalidArgument);
  o = SmallOptions({dir.path()});
  o.capacity_bytes = 0;
  EXPECT_THAT(SwapStore::Open(o).status().message(), HasSubstr("capacity_bytes"));
  o = SmallOptions({dir.path()});
  o.stripe_bytes = 1000;
  EXPECT_THAT(SwapStore::Open(o).status().message(), HasSubstr("stripe_bytes"));
}

TEST(SwapStoreOpen, StripesEvenlyOverPaths) {
  ScratchDir dir;
  SwapStoreOptions o = SmallOptions({dir.Sub("a"), dir.Sub("b"), dir.Sub("c")});
  o.capacity_bytes = 3 << 20;
  auto store = SwapStore::Open(o);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ((*store)->file_bytes(), 1u << 20);
  // One extent covering the whole space touches every file.
  auto e = (*store)->Allocate(3 << 20, "all");
  ASSERT_TRUE(e.ok());
  const auto data = RandomBytes(3 << 20, 4);
  ASSERT_TRUE((*store)->Write(*e, data.data()).ok());
  for (const std::string& f : (*store)->file_paths()) {
    const int fd = OpenUnlinked(f);
    ASSERT_GE(fd, 0) << f;
    std::vector<char> head(4096);
    ASSERT_EQ(pread(fd, head.data(), head.size(), 0), 4096) << f;
    close(fd);
    EXPECT_NE(std::count(head.begin(), head.end(), 0), 4096) << f << " holds no data";
  }
}

}  // namespace
}  // namespace zinf
