// The device conformance suite on HostDevice, with and without the link model, plus what is
// specific to it: the link model's timing (Note [Host link model] in
// offload/host/host_device.cc) and the overlap of uploads with compute that it makes testable.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tests/offload/device_conformance.h"

namespace zinf::testing {
namespace {

using Clock = std::chrono::steady_clock;

INSTANTIATE_TEST_SUITE_P(
    Host, DeviceConformanceTest,
    ::testing::Values(
        DeviceFactory{
            "host",
            [](uint64_t budget) { return CreateHostDevice({.memory_budget_bytes = budget}); }},
        // The contract holds with the link model on too (fast, so the suite stays quick).
        DeviceFactory{"host_linked",
                      [](uint64_t budget) {
                        return CreateHostDevice({.memory_budget_bytes = budget,
                                                 .link_bytes_per_second = 16'000'000'000});
                      }}),
    [](const auto& info) { return info.param.name; });

TEST(HostDeviceTest, ZeroBudgetIsRejected) {
  auto device = CreateHostDevice({.memory_budget_bytes = 0});
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(device.status().message(), "host device memory_budget_bytes must be > 0, got 0");
}

TEST(HostDeviceTest, HasNoNativeStreamsToBorrow) {
  auto device = CreateHostDevice({.memory_budget_bytes = 1 << 20});
  ASSERT_TRUE(device.ok());
  auto borrowed = (*device)->BorrowStream(nullptr);
  ASSERT_FALSE(borrowed.ok());
  EXPECT_EQ(borrowed.status().code(), StatusCode::kFailedPrecondition);
}

TEST(HostDeviceTest, NameShowsBudget) {
  auto device = CreateHostDevice({.memory_budget_bytes = 1 << 30, .ordinal = 1});
  ASSERT_TRUE(device.ok());
  EXPECT_EQ((*device)->name(), "host:1 (budget 1.00 GiB)");
  EXPECT_EQ((*device)->kind(), DeviceKind::kHost);
}

// Each host device runs its own threads, and an event of another may never complete once that
// device is gone, so streams take only their own device's events (CUDA's differ: see
// cuda_device_test.cc).
TEST(HostDeviceTest, EventsOfAnotherDeviceAreRejected) {
  auto device = CreateHostDevice({.memory_budget_bytes = 1 << 20});
  auto other = CreateHostDevice({.memory_budget_bytes = 1 << 20});
  ASSERT_TRUE(device.ok() && other.ok());
  auto stream = (*device)->CreateStream();
  auto foreign = (*other)->CreateEvent();
  ASSERT_TRUE(stream.ok() && foreign.ok());
  EXPECT_EQ((*stream)->Record(**foreign).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*stream)->Wait(**foreign).code(), StatusCode::kInvalidArgument);
}

TEST(HostDeviceTest, StreamDestructorDrainsQueuedWork) {
  auto device = CreateHostDevice({.memory_budget_bytes = 1 << 20});
  ASSERT_TRUE(device.ok());
  int ran = 0;
  {
    auto stream = (*device)->CreateStream();
    ASSERT_TRUE(stream.ok());
    for (int i = 0; i < 10; ++i) {
      ASSERT_TRUE((*stream)
                      ->HostFunc([&ran] {
                        ++ran;
                        return OkStatus();
                      })
                      .ok());
    }
  }
  EXPECT_EQ(ran, 10);
}

// A producer stream, a consumer stream and an event between them, on one host device.
class ProducerConsumerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto d = CreateHostDevice({.memory_budget_bytes = 1 << 20});
    ASSERT_TRUE(d.ok());
    device = std::move(*d);
    auto p = device->CreateStream();
    auto c = device->CreateStream();
    auto e = device->CreateEvent();
    ASSERT_TRUE(p.ok() && c.ok() && e.ok());
    producer = std::move(*p);
    consumer = std::move(*c);
    event = std::move(*e);
  }
  std::unique_ptr<Device> device;
  std::unique_ptr<Stream> producer, consumer;
  std::unique_ptr<Event> event;
};

TEST_F(ProducerConsumerTest, ErrorTravelsThroughEventToWaiter) {
  ASSERT_TRUE(producer->HostFunc([] { return DataLoss("crc mismatch in chunk 3"); }).ok());
  producer->Record(*event).IgnoreError();
  ASSERT_TRUE(consumer->Wait(*event).ok());
  bool consumed = false;
  // Queued (and then skipped), or refused at once if the wait already inherited the error.
  Status queued = consumer->HostFunc([&] {
    consumed = true;
    return OkStatus();
  });
  EXPECT_TRUE(queued.ok() || queued.code() == StatusCode::kDataLoss) << queued;
  Status s = consumer->Synchronize();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss) << "a waiter must not consume bad data silently";
  EXPECT_FALSE(consumed);
}

TEST_F(ProducerConsumerTest, RecordAfterStreamErrorStillReleasesWaiters) {
  // The order that once hung: the producer has already failed when Record() is called.
  ASSERT_TRUE(producer->HostFunc([] { return IoError("EIO on chunk 7"); }).ok());
  ASSERT_EQ(producer->Synchronize().code(), StatusCode::kIoError);
  EXPECT_EQ(producer->Record(*event).code(), StatusCode::kIoError) << "sticky error reported";
  ASSERT_TRUE(consumer->Wait(*event).ok());
  EXPECT_EQ(consumer->Synchronize().code(), StatusCode::kIoError) << "and inherited, no hang";
  EXPECT_EQ(event->Synchronize().code(), StatusCode::kIoError);
}

TEST(HostDeviceTest, NameShowsLink) {
  auto device =
      CreateHostDevice({.memory_budget_bytes = 1 << 30, .link_bytes_per_second = 12'500'000'000});
  ASSERT_TRUE(device.ok());
  EXPECT_EQ((*device)->name(), "host:0 (budget 1.00 GiB, link 12.50 GB/s)");
}

// Sets ZINF_HOST_LINK_GBPS for one test and restores what was there.
class HostDeviceEnvironmentTest : public ::testing::Test {
 protected:
  static constexpr const char* kVariable = "ZINF_HOST_LINK_GBPS";
  void SetUp() override {
    const char* v = std::getenv(kVariable);
    if (v != nullptr) saved_ = v;
    had_ = v != nullptr;
  }
  void TearDown() override {
    if (had_) {
      setenv(kVariable, saved_.c_str(), 1);
    } else {
      unsetenv(kVariable);
    }
  }

 private:
  std::string saved_;
  bool had_ = false;
};

TEST_F(HostDeviceEnvironmentTest, ReadsGigabytesPerSecond) {
  HostDeviceOptions options{.memory_budget_bytes = 1 << 20, .link_bytes_per_second = 7};
  unsetenv(kVariable);
  ASSERT_TRUE(options.ApplyEnvironment().ok());
  EXPECT_EQ(options.link_bytes_per_second, 7u) << "unset: the field is kept";
  setenv(kVariable, "", 1);
  ASSERT_TRUE(options.ApplyEnvironment().ok());
  EXPECT_EQ(options.link_bytes_per_second, 7u) << "empty: the field is kept";
  setenv(kVariable, "12.5", 1);
  ASSERT_TRUE(options.ApplyEnvironment().ok());
  EXPECT_EQ(options.link_bytes_per_second, 12'500'000'000u);
  setenv(kVariable, "0", 1);
  ASSERT_TRUE(options.ApplyEnvironment().ok());
  EXPECT_EQ(options.link_bytes_per_second, 0u) << "0 turns the model off";
}

TEST_F(HostDeviceEnvironmentTest, BadValuesAreRefused) {
  for (const char* bad : {"fast", "12GB", "-1", "nan", "inf", "2e6"}) {
    SCOPED_TRACE(bad);
    HostDeviceOptions options{.memory_budget_bytes = 1 << 20, .link_bytes_per_second = 7};
    setenv(kVariable, bad, 1);
    Status s = options.ApplyEnvironment();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message(),
              std::string("environment variable ZINF_HOST_LINK_GBPS must be a link bandwidth in "
                          "GB/s (10^9 bytes/s) in [0, 1000000], got '") +
                  bad + "'");
    EXPECT_EQ(options.link_bytes_per_second, 7u) << "unchanged on error";
  }
}

// ---------------------------------------------------------------------------------------
// The link model. Timings are asserted from below at 0.9x of the modelled time (the model
// guarantees at least that much) and from above generously, on the fastest of a few tries:
// a loaded machine only ever makes a run slower, so the fastest try is the one that says
// what the device does.

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string TwoDecimals(double v) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.2f", v);
  return text;
}

// Runs `fn` (which enqueues work and waits for it) `tries` times; the fastest, in seconds.
double FastestOf(int tries, const std::function<void()>& fn) {
  double best = 1e9;
  for (int i = 0; i < tries; ++i) {
    const Clock::time_point start = Clock::now();
    fn();
    best = std::min(best, SecondsSince(start));
  }
  return best;
}

// A device behind a link of `bytes_per_second`, with device and host buffers of `size_bytes`
// already faulted in (first-touch page faults would otherwise be timed with the copies).
class LinkedDevice {
 public:
  LinkedDevice(uint64_t bytes_per_second, size_t size_bytes, int device_buffers, int host_buffers)
      : size_bytes_(size_bytes) {
    auto d = CreateHostDevice(
        {.memory_budget_bytes = uint64_t{1} << 30, .link_bytes_per_second = bytes_per_second});
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return;
    device_ = std::move(*d);
    for (int i = 0; i < device_buffers; ++i) {
      auto b = device_->Allocate(size_bytes);
      EXPECT_TRUE(b.ok()) << b.status();
      if (!b.ok()) return;
      std::memset(b->data(), 0, size_bytes);
      dev_.push_back(std::move(*b));
    }
    for (int i = 0; i < host_buffers; ++i) {
      auto b = device_->AllocateHost(size_bytes);
      EXPECT_TRUE(b.ok()) << b.status();
      if (!b.ok()) return;
      std::memset(b->data(), i + 1, size_bytes);
      host_.push_back(std::move(*b));
    }
  }

  bool ok() const { return device_ != nullptr && !::testing::Test::HasFailure(); }
  Device& device() { return *device_; }
  void* dev(int i) { return dev_[i].data(); }
  void* host(int i) { return host_[i].data(); }
  size_t size_bytes() const { return size_bytes_; }
  // What a plain memcpy of one buffer achieves here (the fastest of three), in bytes/s.
  double MemcpyBytesPerSecond() {
    const double s = FastestOf(3, [&] { std::memcpy(dev(0), host(0), size_bytes_); });
    return static_cast<double>(size_bytes_) / s;
  }
  std::unique_ptr<Stream> NewStream() {
    auto s = device_->CreateStream();
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }

 private:
  size_t size_bytes_;
  std::unique_ptr<Device> device_;
  std::vector<DeviceBuffer> dev_;
  std::vector<HostBuffer> host_;
};

// The model times a copy as max(memcpy, bytes / bandwidth), so its timings test the model only
// where memcpy outruns the link by `factor`. Under ThreadSanitizer, which instruments every
// byte copied, memcpy runs at a third of a GB/s: the test is skipped there, saying so.
#define ZINF_SKIP_UNLESS_MEMCPY_OUTRUNS(d, link_bytes_per_second, factor)                    \
  if (const double memcpy_bps = (d).MemcpyBytesPerSecond();                                  \
      memcpy_bps < (factor) * (link_bytes_per_second)) {                                     \
    GTEST_SKIP() << "memcpy runs at " << TwoDecimals(memcpy_bps / 1e9) << " GB/s here, not " \
                 << (factor) << "x the modelled link's "                                     \
                 << TwoDecimals((link_bytes_per_second) / 1e9) << " GB/s";                   \
  }

TEST(HostDeviceLinkTest, CopyTakesSizeOverBandwidth) {
  constexpr uint64_t kLink = 1'000'000'000;  // 1 GB/s
  constexpr size_t kBytes = 32 << 20;
  constexpr double kModelled = static_cast<double>(kBytes) / kLink;  // 33.6 ms
  LinkedDevice d(kLink, kBytes, 1, 2);
  ASSERT_TRUE(d.ok());
  ZINF_SKIP_UNLESS_MEMCPY_OUTRUNS(d, kLink, 2);
  std::unique_ptr<Stream> stream = d.NewStream();
  ASSERT_NE(stream, nullptr);
  const double up = FastestOf(3, [&] {
    ASSERT_TRUE(stream->Copy(d.dev(0), d.host(0), kBytes, CopyKind::kHostToDevice).ok());
    ASSERT_TRUE(stream->Synchronize().ok());
  });
  const double down = FastestOf(3, [&] {
    ASSERT_TRUE(stream->Copy(d.host(1), d.dev(0), kBytes, CopyKind::kDeviceToHost).ok());
    ASSERT_TRUE(stream->Synchronize().ok());
  });
  EXPECT_EQ(std::memcmp(d.host(0), d.host(1), kBytes), 0) << "the bytes still arrive";
  EXPECT_GE(up, 0.9 * kModelled);
  EXPECT_LE(up, 2 * kModelled + 0.05);
  EXPECT_GE(down, 0.9 * kModelled);
  EXPECT_LE(down, 2 * kModelled + 0.05);

  // Timing events around a copy see the modelled time too.
  auto start = d.device().CreateEvent(/*enable_timing=*/true);
  auto end = d.device().CreateEvent(/*enable_timing=*/true);
  ASSERT_TRUE(start.ok() && end.ok());
  ASSERT_TRUE(stream->Record(**start).ok());
  ASSERT_TRUE(stream->Copy(d.dev(0), d.host(0), kBytes, CopyKind::kHostToDevice).ok());
  ASSERT_TRUE(stream->Record(**end).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  auto ms = (*end)->ElapsedMsSince(**start);
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_GE(*ms, 0.9 * kModelled * 1e3);
  EXPECT_LE(*ms, 2 * kModelled * 1e3 + 50);
  std::printf("link 1 GB/s, 32 MiB: H2D %.1f ms, D2H %.1f ms, events %.1f ms (modelled %.1f)\n",
              up * 1e3, down * 1e3, *ms, kModelled * 1e3);
}

TEST(HostDeviceLinkTest, BackToBackCopiesKeepTheModelledRate) {
  // Many small copies in a row: the stream thread's wake-up latency after each must not add
  // up (Note [Host link model]), or a bandwidth benchmark would print less than the model.
  constexpr uint64_t kLink = 1'000'000'000;
  constexpr size_t kBytes = 256 << 10;  // 262 us each
  constexpr int kCopies = 256;
  constexpr double kModelled = static_cast<double>(kBytes) * kCopies / kLink;  // 67 ms
  auto chain = [&](LinkedDevice& d) {
    std::unique_ptr<Stream> stream = d.NewStream();
    if (stream == nullptr) return 1e9;
    return FastestOf(3, [&] {
      for (int i = 0; i < kCopies; ++i) {
        ASSERT_TRUE(stream->Copy(d.dev(0), d.host(0), kBytes, CopyKind::kHostToDevice).ok());
      }
      ASSERT_TRUE(stream->Synchronize().ok());
    });
  };
  // Small copies cost the stream more than their memcpy: the chain itself, with no link,
  // must fit in half the modelled time (not so under ThreadSanitizer).
  LinkedDevice unlinked(/*bytes_per_second=*/0, kBytes, 1, 1);
  ASSERT_TRUE(unlinked.ok());
  const double unmodelled = chain(unlinked);
  if (unmodelled > 0.5 * kModelled) {
    GTEST_SKIP() << "the chain takes " << TwoDecimals(unmodelled * 1e3)
                 << " ms without a link, more than "
                 << "half the modelled " << TwoDecimals(kModelled * 1e3) << " ms";
  }
  LinkedDevice d(kLink, kBytes, 1, 1);
  ASSERT_TRUE(d.ok());
  const double s = chain(d);
  std::printf("%d x 256 KiB at 1 GB/s: %.1f ms (modelled %.1f, without a link %.1f)\n", kCopies,
              s * 1e3, kModelled * 1e3, unmodelled * 1e3);
  EXPECT_GE(s, 0.9 * kModelled);
  EXPECT_LE(s, 1.25 * kModelled);
}

TEST(HostDeviceLinkTest, CopiesOffTheLinkAreMemcpys) {
  constexpr uint64_t kLink = 100'000'000;  // 100 MB/s: 84 ms for 8 MiB
  constexpr size_t kBytes = 8 << 20;
  constexpr double kModelled = static_cast<double>(kBytes) / kLink;
  LinkedDevice d(kLink, kBytes, 2, 2);
  ASSERT_TRUE(d.ok());
  ZINF_SKIP_UNLESS_MEMCPY_OUTRUNS(d, kLink, 4);
  std::unique_ptr<Stream> stream = d.NewStream();
  ASSERT_NE(stream, nullptr);
  const double device_to_device = FastestOf(3, [&] {
    ASSERT_TRUE(stream->Copy(d.dev(1), d.dev(0), kBytes, CopyKind::kDeviceToDevice).ok());
    ASSERT_TRUE(stream->Synchronize().ok());
  });
  const double host_to_host = FastestOf(3, [&] {
    ASSERT_TRUE(stream->Copy(d.host(1), d.host(0), kBytes, CopyKind::kHostToHost).ok());
    ASSERT_TRUE(stream->Synchronize().ok());
  });
  EXPECT_LT(device_to_device, 0.5 * kModelled);
  EXPECT_LT(host_to_host, 0.5 * kModelled);
}

TEST(HostDeviceLinkTest, DirectionComesFromThePointers) {
  // As on CudaDevice (cudaMemcpyDefault), the CopyKind does not decide: a host-to-device copy
  // labelled device-to-device, into the middle of an allocation, is on the link.
  constexpr uint64_t kLink = 100'000'000;
  constexpr size_t kBytes = 4 << 20;  // 42 ms
  constexpr double kModelled = static_cast<double>(kBytes) / kLink;
  LinkedDevice d(kLink, 2 * kBytes, 1, 1);
  ASSERT_TRUE(d.ok());
  ZINF_SKIP_UNLESS_MEMCPY_OUTRUNS(d, kLink, 2);
  std::unique_ptr<Stream> stream = d.NewStream();
  ASSERT_NE(stream, nullptr);
  void* middle = static_cast<char*>(d.dev(0)) + kBytes;
  const Clock::time_point start = Clock::now();
  ASSERT_TRUE(stream->Copy(middle, d.host(0), kBytes, CopyKind::kDeviceToDevice).ok());
  ASSERT_TRUE(stream->Synchronize().ok());
  EXPECT_GE(SecondsSince(start), 0.9 * kModelled);
}

TEST(HostDeviceLinkTest, OneCopyEnginePerDirection) {
  constexpr uint64_t kLink = 1'000'000'000;
  constexpr size_t kBytes = 32 << 20;
  constexpr double kModelled = static_cast<double>(kBytes) / kLink;  // 33.6 ms
  LinkedDevice d(kLink, kBytes, 2, 2);
  ASSERT_TRUE(d.ok());
  ZINF_SKIP_UNLESS_MEMCPY_OUTRUNS(d, kLink, 2);
  std::unique_ptr<Stream> a = d.NewStream();
  std::unique_ptr<Stream> b = d.NewStream();
  ASSERT_TRUE(a != nullptr && b != nullptr);
  const double two_up = FastestOf(3, [&] {
    ASSERT_TRUE(a->Copy(d.dev(0), d.host(0), kBytes, CopyKind::kHostToDevice).ok());
    ASSERT_TRUE(b->Copy(d.dev(1), d.host(1), kBytes, CopyKind::kHostToDevice).ok());
    ASSERT_TRUE(a->Synchronize().ok());
    ASSERT_TRUE(b->Synchronize().ok());
  });
  const double up_and_down = FastestOf(3, [&] {
    ASSERT_TRUE(a->Copy(d.dev(0), d.host(0), kBytes, CopyKind::kHostToDevice).ok());
    ASSERT_TRUE(b->Copy(d.host(1), d.dev(1), kBytes, CopyKind::kDeviceToHost).ok());
    ASSERT_TRUE(a->Synchronize().ok());
    ASSERT_TRUE(b->Synchronize().ok());
  });
  std::printf("32 MiB at 1 GB/s on two streams: H2D+H2D %.1f ms, H2D+D2H %.1f ms (one: %.1f)\n",
              two_up * 1e3, up_and_down * 1e3, kModelled * 1e3);
  EXPECT_GE(two_up, 0.9 * 2 * kModelled) << "one engine per direction: the two H2D serialize";
  EXPECT_LE(two_up, 3 * kModelled + 0.05);
  EXPECT_GE(up_and_down, 0.9 * kModelled);
  EXPECT_LE(up_and_down, 1.5 * kModelled) << "H2D and D2H are on different engines";
}

// The overlap test: what the tiered store and the ZeRO engine exist for, in miniature. M
// modules whose weights each take X to upload over the link and X to compute with. Module i+1
// uploads on a copy stream while module i computes on the compute stream; events order each
// compute after its upload and each upload after the compute that last used its buffer (two
// buffers: a prefetch of one module ahead). Overlapped, the run takes about (M + 1) X: the
// first upload, then M computes each hiding the next upload. Serially (upload, wait, compute,
// wait) it takes about 2 M X, which shows that the bound can fail.
class HostDeviceOverlapTest : public ::testing::Test {
 protected:
  static constexpr int kModules = 8;
  static constexpr double kModuleSeconds = 0.040;  // X: one upload, and one compute
  static constexpr uint64_t kLink = 200'000'000;   // 200 MB/s
  static constexpr size_t kModuleBytes = static_cast<size_t>(kLink * kModuleSeconds);  // 8 MB

  void SetUp() override {
    d_ = std::make_unique<LinkedDevice>(kLink, kModuleBytes, /*device_buffers=*/2, kModules);
    ASSERT_TRUE(d_->ok());
    copy_ = d_->NewStream();
    compute_ = d_->NewStream();
    ASSERT_TRUE(copy_ != nullptr && compute_ != nullptr);
  }

  // Module i's compute: checks that its weights (every byte i + 1) have arrived, so a compute
  // ordered before its upload fails, then takes X in all. Sleeps: the compute must not steal
  // the core a copy needs for its memcpy on a two-core machine.
  std::function<Status()> Compute(int module) {
    const auto* weights = static_cast<const unsigned char*>(d_->dev(module % 2));
    return [weights, module] {
      const Clock::time_point start = Clock::now();
      for (size_t i = 0; i < kModuleBytes; i += 4096) {
        if (weights[i] != module + 1) {
          return DataLoss("module " + std::to_string(module) + " computed before its upload");
        }
      }
      std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                                std::chrono::duration<double>(kModuleSeconds)));
      return OkStatus();
    };
  }

  void RunOverlapped() {
    std::vector<std::unique_ptr<Event>> uploaded, computed;
    for (int i = 0; i < kModules; ++i) {
      auto u = d_->device().CreateEvent();
      auto c = d_->device().CreateEvent();
      ASSERT_TRUE(u.ok() && c.ok());
      uploaded.push_back(std::move(*u));
      computed.push_back(std::move(*c));
    }
    for (int i = 0; i < kModules; ++i) {
      // Buffer i % 2 is free once module i - 2 has computed with it.
      if (i >= 2) {
        ASSERT_TRUE(copy_->Wait(*computed[i - 2]).ok());
      }
      ASSERT_TRUE(
          copy_->Copy(d_->dev(i % 2), d_->host(i), kModuleBytes, CopyKind::kHostToDevice).ok());
      ASSERT_TRUE(copy_->Record(*uploaded[i]).ok());
      ASSERT_TRUE(compute_->Wait(*uploaded[i]).ok());
      ASSERT_TRUE(compute_->HostFunc(Compute(i)).ok());
      ASSERT_TRUE(compute_->Record(*computed[i]).ok());
    }
    ASSERT_TRUE(compute_->Synchronize().ok());
    ASSERT_TRUE(copy_->Synchronize().ok());
  }

  void RunSerially() {
    for (int i = 0; i < kModules; ++i) {
      ASSERT_TRUE(
          copy_->Copy(d_->dev(i % 2), d_->host(i), kModuleBytes, CopyKind::kHostToDevice).ok());
      ASSERT_TRUE(copy_->Synchronize().ok());
      ASSERT_TRUE(compute_->HostFunc(Compute(i)).ok());
      ASSERT_TRUE(compute_->Synchronize().ok());
    }
  }

  std::unique_ptr<LinkedDevice> d_;
  std::unique_ptr<Stream> copy_, compute_;
};

TEST_F(HostDeviceOverlapTest, UploadsHideBehindCompute) {
  constexpr double kX = kModuleSeconds;
  constexpr double kBound = 1.15 * kModules * kX + kX;  // the first upload cannot hide
  ZINF_SKIP_UNLESS_MEMCPY_OUTRUNS(*d_, kLink, 2);
  const double overlapped = FastestOf(3, [&] { RunOverlapped(); });
  const double serial = FastestOf(1, [&] { RunSerially(); });
  std::printf(
      "overlap test: %d modules, X = %.0f ms: overlapped %.1f ms (ideal %.0f, bound %.0f), "
      "serial %.1f ms (ideal %.0f)\n",
      kModules, kX * 1e3, overlapped * 1e3, (kModules + 1) * kX * 1e3, kBound * 1e3, serial * 1e3,
      2 * kModules * kX * 1e3);
  RecordProperty("overlapped_ms", std::to_string(overlapped * 1e3));
  RecordProperty("serial_ms", std::to_string(serial * 1e3));
  EXPECT_LE(overlapped, kBound) << "uploads did not overlap with compute";
  EXPECT_GE(overlapped, 0.9 * (kModules + 1) * kX) << "faster than the link allows";
  // The same work without overlap misses the bound: the test can fail.
  EXPECT_GE(serial, 0.9 * 2 * kModules * kX);
  EXPECT_GT(serial, kBound);
}

}  // namespace
}  // namespace zinf::testing
