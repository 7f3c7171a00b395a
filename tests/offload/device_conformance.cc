#include "tests/offload/device_conformance.h"

#include <cmath>

#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "offload/device_ops.h"
#include "zinf/dtype.h"

namespace zinf::testing {

std::unique_ptr<Device> DeviceConformanceTest::MakeDevice(uint64_t budget_bytes) {
  StatusOr<std::unique_ptr<Device>> device = GetParam().create(budget_bytes);
  if (!device.ok()) {
    if (device.status().code() == StatusCode::kUnavailable) return nullptr;
    ADD_FAILURE() << device.status();
    return nullptr;
  }
  return std::move(device).value();
}

// GTEST_SKIP must be called from the test body itself.
#define ZINF_DEVICE_OR_SKIP(var, ...)                                                  \
  std::unique_ptr<Device> var = MakeDevice(__VA_ARGS__);                               \
  if (var == nullptr) {                                                                \
    GTEST_SKIP() << GetParam().name                                                    \
                 << " unavailable: " << GetParam().create(1 << 20).status().message(); \
  }

namespace {

// Fills host memory with a pattern that differs per (seed, index).
std::vector<uint32_t> Pattern(size_t n, uint32_t seed) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint32_t>(i * 2654435761u) ^ seed;
  return v;
}

}  // namespace

TEST_P(DeviceConformanceTest, RoundTripHostDeviceHost) {
  ZINF_DEVICE_OR_SKIP(device);
  constexpr size_t kWords = (3 << 20) + 7;  // not a multiple of anything nice
  auto stream = device->CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  auto src = device->AllocateHost(kWords * 4);
  auto dst = device->AllocateHost(kWords * 4);
  auto a = device->Allocate(kWords * 4);
  auto b = device->Allocate(kWords * 4);
  ASSERT_TRUE(src.ok() && dst.ok() && a.ok() && b.ok());
  const std::vector<uint32_t> pattern = Pattern(kWords, 7);
  std::memcpy(src->data(), pattern.data(), kWords * 4);
  Stream& s = **stream;
  ASSERT_TRUE(s.Copy(a->data(), src->data(), kWords * 4, CopyKind::kHostToDevice).ok());
  ASSERT_TRUE(s.Copy(b->data(), a->data(), kWords * 4, CopyKind::kDeviceToDevice).ok());
  ASSERT_TRUE(s.Copy(dst->data(), b->data(), kWords * 4, CopyKind::kDeviceToHost).ok());
  ASSERT_TRUE(s.Synchronize().ok());
  EXPECT_EQ(std::memcmp(dst->data(), pattern.data(), kWords * 4), 0);
}

// EnqueueConvert on the device gives the host conversions' bits (round to nearest even, NaN
// kept), both ways, in the stream's order.
TEST_P(DeviceConformanceTest, ConvertMatchesTheHostConversions) {
  ZINF_DEVICE_OR_SKIP(device);
  constexpr size_t kCount = 100003;
  std::vector<float> values(kCount);
  for (size_t i = 0; i < kCount; ++i) {
    values[i] = std::ldexp(static_cast<float>(i % 977) - 488.3f, static_cast<int>(i % 40) - 20);
  }
  values[7] = NAN;
  values[8] = INFINITY;
  values[9] = -0.0f;
  auto stream = device->CreateStream();
  ASSERT_TRUE(stream.ok()) << stream.status();
  auto host = device->AllocateHost(kCount * 4);
  auto fp32 = device->Allocate(kCount * 4);
  auto half = device->Allocate(kCount * 2);
  auto back = device->Allocate(kCount * 4);
  ASSERT_TRUE(host.ok() && fp32.ok() && half.ok() && back.ok());
  for (ElementType type : {ElementType::kBf16, ElementType::kFp16}) {
    SCOPED_TRACE(ElementTypeName(type));
    std::memcpy(host->data(), values.data(), kCount * 4);
    Stream& s = **stream;
    ASSERT_TRUE(s.Copy(fp32->data(), host->data(), kCount * 4, CopyKind::kHostToDevice).ok());
    ASSERT_TRUE(
        EnqueueConvert(*device, s, fp32->data(), ElementType::kFp32, half->data(), type, kCount)
            .ok());
    ASSERT_TRUE(
        EnqueueConvert(*device, s, half->data(), type, back->data(), ElementType::kFp32, kCount)
            .ok());
    ASSERT_TRUE(s.Copy(host->data(), back->data(), kCount * 4, CopyKind::kDeviceToHost).ok());
    ASSERT_TRUE(s.Synchronize().ok());
    std::vector<uint16_t> expected_half(kCount);
    std::vector<float> expected(kCount);
    ConvertFromFp32(values.data(), type, expected_half.data(), kCount);
    ConvertToFp32(expected_half.data(), type, expected.data(), kCount);
    EXPECT_EQ(std::memcmp(host->data(), expected.data(), kCount * 4), 0);
  }
  Status bad = EnqueueConvert(*device, **stream, fp32->data(), ElementType::kBf16, half->data(),
                              ElementType::kFp16, 1);
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument) << bad;
}

TEST_P(DeviceConformanceTest, MemsetAndZeroSizedWork) {
  ZINF_DEVICE_OR_SKIP(device);
  auto stream = device->CreateStream();
  auto buffer = device->Allocate(4096);
  auto host = device->AllocateHost(4096);
  ASSERT_TRUE(stream.ok() && buffer.ok() && host.ok());
  Stream& s = **stream;
  ASSERT_TRUE(s.Memset(buffer->data(), 0x3c, 4096).ok());
  ASSERT_TRUE(s.Copy(host->data(), buffer->data(), 4096, CopyKind::kDeviceToHost).ok());
  ASSERT_TRUE(s.Copy(nullptr, nullptr, 0, CopyKind::kDeviceToHost).ok()) << "0 bytes: no-op";
  ASSERT_TRUE(s.Synchronize().ok());
  EXPECT_EQ(host->as<unsigned char>()[0], 0x3c);
  EXPECT_EQ(host->as<unsigned char>()[4095], 0x3c);
}

TEST_P(DeviceConformanceTest, StreamRunsInOrder) {
  ZINF_DEVICE_OR_SKIP(device);
  auto stream = device->CreateStream();
  ASSERT_TRUE(stream.ok());
  std::vector<int> order;
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE((*stream)
                    ->HostFunc([&order, i] {
                      order.push_back(i);
                      return OkStatus();
                    })
                    .ok());
  }
  ASSERT_TRUE((*stream)->Synchronize().ok());
  std::vector<int> expected(100);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(order, expected);
}

TEST_P(DeviceConformanceTest, EventOrdersAcrossStreams) {
  ZINF_DEVICE_OR_SKIP(device);
  auto producer = device->CreateStream();
  auto consumer = device->CreateStream();
  auto ready = device->CreateEvent();
  ASSERT_TRUE(producer.ok() && consumer.ok() && ready.ok());
  std::atomic<bool> produced{false};
  bool saw_produced = false;
  ASSERT_TRUE((*producer)
                  ->HostFunc([&] {
                    std::this_thread::sleep_for(std::chrono::milliseconds(50));
                    produced = true;
                    return OkStatus();
                  })
                  .ok());
  ASSERT_TRUE((*producer)->Record(**ready).ok());
  ASSERT_TRUE((*consumer)->Wait(**ready).ok());
  ASSERT_TRUE((*consumer)
                  ->HostFunc([&] {
                    saw_produced = produced.load();
                    return OkStatus();
                  })
                  .ok());
  ASSERT_TRUE((*consumer)->Synchronize().ok());
  EXPECT_TRUE(saw_produced) << "work after Wait ran before the recorded work finished";
  auto done = (*ready)->Query();
  ASSERT_TRUE(done.ok());
  EXPECT_TRUE(*done);
}

TEST_P(DeviceConformanceTest, WaitOnUnrecordedEventIsNoOp) {
  ZINF_DEVICE_OR_SKIP(device);
  auto stream = device->CreateStream();
  auto never = device->CreateEvent();
  ASSERT_TRUE(stream.ok() && never.ok());
  auto q = (*never)->Query();
  ASSERT_TRUE(q.ok());
  EXPECT_TRUE(*q) << "an event never recorded counts as complete";
  ASSERT_TRUE((*stream)->Wait(**never).ok());
  ASSERT_TRUE((*stream)->Synchronize().ok()) << "must not deadlock";
  ASSERT_TRUE((*never)->Synchronize().ok());
}

TEST_P(DeviceConformanceTest, EventQueryTracksCompletion) {
  ZINF_DEVICE_OR_SKIP(device);
  auto stream = device->CreateStream();
  auto event = device->CreateEvent();
  ASSERT_TRUE(stream.ok() && event.ok());
  std::atomic<bool> release{false};
  ASSERT_TRUE((*stream)
                  ->HostFunc([&] {
                    while (!release.load())
                      std::this_thread::sleep_for(std::chrono::milliseconds(1));
                    return OkStatus();
                  })
                  .ok());
  ASSERT_TRUE((*stream)->Record(**event).ok());
  auto before = (*event)->Query();
  ASSERT_TRUE(before.ok());
  EXPECT_FALSE(*before);
  release = true;
  ASSERT_TRUE((*event)->Synchronize().ok());
  auto after = (*event)->Query();
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(*after);
}

TEST_P(DeviceConformanceTest, ElapsedTimeBetweenTimingEvents) {
  ZINF_DEVICE_OR_SKIP(device);
  auto stream = device->CreateStream();
  auto start = device->CreateEvent(/*enable_timing=*/true);
  auto end = device->CreateEvent(/*enable_timing=*/true);
  auto untimed = device->CreateEvent(/*enable_timing=*/false);
  ASSERT_TRUE(stream.ok() && start.ok() && end.ok() && untimed.ok());
  EXPECT_EQ((*end)->ElapsedMsSince(**start).status().code(), StatusCode::kFailedPrecondition)
      << "not recorded yet";
  ASSERT_TRUE((*stream)->Record(**start).ok());
  ASSERT_TRUE((*stream)
                  ->HostFunc([] {
                    std::this_thread::sleep_for(std::chrono::milliseconds(20));
                    return OkStatus();
                  })
                  .ok());
  ASSERT_TRUE((*stream)->Record(**end).ok());
  ASSERT_TRUE((*stream)->Record(**untimed).ok());
  ASSERT_TRUE((*stream)->Synchronize().ok());
  auto ms = (*end)->ElapsedMsSince(**start);
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_GE(*ms, 15.0);
  EXPECT_LT(*ms, 5000.0);
  EXPECT_EQ((*untimed)->ElapsedMsSince(**start).status().code(), StatusCode::kFailedPrecondition);
}

namespace {

// Blocks `stream` in a host function until `release` is set (an error after 30 s). The test
// thread, not another stream's host function, releases it: CUDA may run every host function
// of a process on one thread, so two streams' host functions cannot wait for each other.
void BlockUntilReleased(Stream& stream, std::atomic<bool>& release) {
  ASSERT_TRUE(stream
                  .HostFunc([&release] {
                    const auto deadline =
                        std::chrono::steady_clock::now() + std::chrono::seconds(30);
                    while (!release.load()) {
                      if (std::chrono::steady_clock::now() > deadline) {
                        return DeadlineExceeded("never released: the test thread was stuck");
                      }
                      std::this_thread::sleep_for(std::chrono::microseconds(100));
                    }
                    return OkStatus();
                  })
                  .ok());
}

// True once `event` completes, polled from this thread; false after 10 s.
bool CompletesWhileWaiting(Event& event) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    StatusOr<bool> done = event.Query();
    if (!done.ok() || *done) return done.ok();
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return false;
}

}  // namespace

// Work on one stream completes while another stream is blocked: if the device serialized
// streams, the event would never complete while the first stream waits (no timing threshold).
TEST_P(DeviceConformanceTest, TwoStreamsOverlap) {
  ZINF_DEVICE_OR_SKIP(device);
  auto s1 = device->CreateStream();
  auto s2 = device->CreateStream();
  auto buffer = device->Allocate(1 << 20);
  auto done = device->CreateEvent();
  ASSERT_TRUE(s1.ok() && s2.ok() && buffer.ok() && done.ok());
  std::atomic<bool> release{false};
  BlockUntilReleased(**s1, release);
  ASSERT_TRUE((*s2)->Memset(buffer->data(), 0x11, 1 << 20).ok());
  ASSERT_TRUE((*s2)->Record(**done).ok());
  EXPECT_TRUE(CompletesWhileWaiting(**done)) << "streams are serialized";
  release = true;
  EXPECT_TRUE((*s1)->Synchronize().ok());
  EXPECT_TRUE((*s2)->Synchronize().ok());
}

// Copies both ways on one stream complete, with the right bytes, while another is blocked.
TEST_P(DeviceConformanceTest, CopyRunsWhileAnotherStreamIsBusy) {
  ZINF_DEVICE_OR_SKIP(device);
  constexpr size_t kBytes = 16 << 20;
  auto host = device->AllocateHost(kBytes);
  auto back = device->AllocateHost(kBytes);
  auto dev = device->Allocate(kBytes);
  auto a = device->CreateStream();
  auto b = device->CreateStream();
  auto copied = device->CreateEvent();
  ASSERT_TRUE(host.ok() && back.ok() && dev.ok() && a.ok() && b.ok() && copied.ok());
  std::memset(host->data(), 0x5a, kBytes);
  std::memset(back->data(), 0, kBytes);
  std::atomic<bool> release{false};
  BlockUntilReleased(**a, release);
  ASSERT_TRUE((*b)->Copy(dev->data(), host->data(), kBytes, CopyKind::kHostToDevice).ok());
  ASSERT_TRUE((*b)->Copy(back->data(), dev->data(), kBytes, CopyKind::kDeviceToHost).ok());
  ASSERT_TRUE((*b)->Record(**copied).ok());
  EXPECT_TRUE(CompletesWhileWaiting(**copied)) << "the copies waited for the other stream";
  release = true;
  EXPECT_TRUE((*b)->Synchronize().ok());
  EXPECT_TRUE((*a)->Synchronize().ok());
  EXPECT_EQ(std::memcmp(back->data(), host->data(), kBytes), 0);
}

TEST_P(DeviceConformanceTest, BudgetAccounting) {
  ZINF_DEVICE_OR_SKIP(device, 1 << 20);
  DeviceMemoryStats stats = device->memory_stats();
  EXPECT_EQ(stats.budget_bytes, 1u << 20);
  EXPECT_EQ(stats.in_use_bytes, 0u);
  {
    auto a = device->Allocate(600 << 10);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ(device->memory_stats().in_use_bytes, 600u << 10);
    auto b = device->Allocate(600 << 10);
    ASSERT_FALSE(b.ok());
    EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted);
    const std::string& m = b.status().message();
    EXPECT_NE(m.find("budget 1.00 MiB"), std::string::npos) << m;
    EXPECT_NE(m.find("in use 600.00 KiB"), std::string::npos) << m;
    EXPECT_NE(m.find("requested 600.00 KiB"), std::string::npos) << m;
    auto c = device->Allocate(400 << 10);
    ASSERT_TRUE(c.ok()) << "the rest of the budget is still usable";
    EXPECT_EQ(device->memory_stats().in_use_bytes, 1000u << 10);
  }
  stats = device->memory_stats();
  EXPECT_EQ(stats.in_use_bytes, 0u) << "freed buffers return their bytes";
  EXPECT_EQ(stats.peak_bytes, 1000u << 10);
  auto whole = device->Allocate(1 << 20);
  EXPECT_TRUE(whole.ok()) << "exactly the budget fits";
}

TEST_P(DeviceConformanceTest, ConcurrentAllocationsNeverExceedBudget) {
  ZINF_DEVICE_OR_SKIP(device, 8 << 20);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        auto b = device->Allocate(1 << 20);
        if (!b.ok()) {
          failures++;
          continue;
        }
        EXPECT_LE(device->memory_stats().in_use_bytes, 8u << 20);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LE(device->memory_stats().peak_bytes, 8u << 20);
  EXPECT_EQ(device->memory_stats().in_use_bytes, 0u);
}

TEST_P(DeviceConformanceTest, HostFuncErrorIsSticky) {
  ZINF_DEVICE_OR_SKIP(device);
  auto stream = device->CreateStream();
  auto other = device->CreateStream();
  auto event = device->CreateEvent();
  ASSERT_TRUE(stream.ok() && other.ok() && event.ok());
  bool ran_after_error = false;
  ASSERT_TRUE((*stream)->HostFunc([] { return IoError("disk on fire"); }).ok());
  // Work queued behind the failure is skipped, not run on bad data.
  (*stream)
      ->HostFunc([&] {
        ran_after_error = true;
        return OkStatus();
      })
      .IgnoreError();
  Status sync = (*stream)->Synchronize();
  EXPECT_EQ(sync.code(), StatusCode::kIoError);
  EXPECT_NE(sync.message().find("disk on fire"), std::string::npos);
  EXPECT_FALSE(ran_after_error);
  Status later = (*stream)->Memset(nullptr, 0, 0);
  Status later_copy = (*stream)->HostFunc([] { return OkStatus(); });
  EXPECT_EQ(later_copy.code(), StatusCode::kIoError) << "every later call reports it";
  (void)later;
  EXPECT_TRUE((*other)->Synchronize().ok()) << "other streams are unaffected";
}

TEST_P(DeviceConformanceTest, BadArguments) {
  ZINF_DEVICE_OR_SKIP(device);
  auto stream = device->CreateStream();
  ASSERT_TRUE(stream.ok());
  auto buffer = device->Allocate(64);
  ASSERT_TRUE(buffer.ok());
  EXPECT_EQ((*stream)->Copy(nullptr, buffer->data(), 64, CopyKind::kDeviceToHost).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*stream)->Copy(buffer->data(), nullptr, 64, CopyKind::kHostToDevice).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*stream)->HostFunc(nullptr).code(), StatusCode::kInvalidArgument);
  auto zero = device->Allocate(0);
  ASSERT_TRUE(zero.ok());
  EXPECT_TRUE(zero->empty());
  EXPECT_TRUE((*stream)->Synchronize().ok()) << "rejected calls leave the stream healthy";
}

TEST_P(DeviceConformanceTest, UseAfterDeviceDestroyedIsAnError) {
  ZINF_DEVICE_OR_SKIP(device);
  auto stream = device->CreateStream();
  auto event = device->CreateEvent();
  auto buffer = device->Allocate(4096);
  ASSERT_TRUE(stream.ok() && event.ok() && buffer.ok());
  const std::string name = device->name();
  device.reset();
  Status s = (*stream)->Memset(buffer->data(), 0, 4096);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("after the device was destroyed"), std::string::npos) << s;
  EXPECT_EQ((*stream)->Synchronize().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*event)->Query().status().code(), StatusCode::kFailedPrecondition);
  buffer->Reset();  // freeing still works: no leak, no crash
  // Destroying the stream and event afterwards must not crash either.
}

}  // namespace zinf::testing
