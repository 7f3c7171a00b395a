// The device conformance suite on CudaDevice. Every test skips, with the reason, where no GPU
// is usable (always in CI).
#include "tests/offload/device_conformance.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "offload/cuda/cast_kernels.h"

namespace zinf::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(Cuda, DeviceConformanceTest,
                         ::testing::Values(DeviceFactory{"cuda",
                                                         [](uint64_t budget) {
                                                           return CreateCudaDevice(
                                                               {.ordinal = 0,
                                                                .memory_budget_bytes = budget});
                                                         }}),
                         [](const auto& info) { return info.param.name; });

TEST(CudaDeviceTest, BadOrdinalOrNoGpu) {
  auto device = CreateCudaDevice({.ordinal = 4096});
  ASSERT_FALSE(device.ok());
  // Without a GPU: Unavailable naming the driver problem; with one: the ordinal is bad.
  EXPECT_TRUE(device.status().code() == StatusCode::kUnavailable ||
              device.status().code() == StatusCode::kInvalidArgument)
      << device.status();
}

// Two CudaDevice objects on one GPU (the engine's and a trainer's own, as the GPT example
// has) order their streams by each other's events (Note [Events across CudaDevices]): the
// second device's copy reads what the first device's copy wrote.
TEST(CudaDeviceTest, EventsOrderStreamsOfTwoDevicesOnOneGpu) {
  auto engine_device = CreateCudaDevice({.ordinal = 0, .memory_budget_bytes = 64 << 20});
  if (!engine_device.ok()) GTEST_SKIP() << engine_device.status().message();
  auto trainer_device = CreateCudaDevice({.ordinal = 0, .memory_budget_bytes = 64 << 20});
  ASSERT_TRUE(trainer_device.ok()) << trainer_device.status();
  constexpr size_t kBytes = 32 << 20;
  auto source = (*engine_device)->AllocateHost(kBytes);
  auto result = (*trainer_device)->AllocateHost(kBytes);
  auto staged = (*engine_device)->Allocate(kBytes);
  auto copied = (*trainer_device)->Allocate(kBytes);
  auto producer = (*engine_device)->CreateStream();
  auto consumer = (*trainer_device)->CreateStream();
  auto ready = (*engine_device)->CreateEvent();
  auto consumed = (*trainer_device)->CreateEvent();
  ASSERT_TRUE(source.ok() && result.ok() && staged.ok() && copied.ok() && producer.ok() &&
              consumer.ok() && ready.ok() && consumed.ok());
  std::memset(source->data(), 0x3c, kBytes);
  std::memset(result->data(), 0, kBytes);
  Stream& p = **producer;
  Stream& c = **consumer;
  ASSERT_TRUE(p.Copy(staged->data(), source->data(), kBytes, CopyKind::kHostToDevice).ok());
  ASSERT_TRUE(p.Record(**ready).ok());
  ASSERT_TRUE(c.Wait(**ready).ok());
  ASSERT_TRUE(c.Copy(copied->data(), staged->data(), kBytes, CopyKind::kDeviceToDevice).ok());
  ASSERT_TRUE(c.Copy(result->data(), copied->data(), kBytes, CopyKind::kDeviceToHost).ok());
  // And the other way: the engine's stream records the trainer's event.
  ASSERT_TRUE(p.Record(**consumed).ok());
  ASSERT_TRUE(c.Synchronize().ok());
  ASSERT_TRUE(p.Synchronize().ok());
  EXPECT_EQ(std::memcmp(result->data(), source->data(), kBytes), 0);
  StatusOr<bool> ready_done = (*ready)->Query();
  EXPECT_TRUE(ready_done.ok() && *ready_done) << ready_done.status();
}

// A borrowed stream (Device::BorrowStream: PyTorch's current stream, as zinf.zero orders it)
// queues on the native stream and leaves it alive and unsynchronized when it goes: the owner
// keeps using it after, and events order it with the device's own streams.
TEST(CudaDeviceTest, BorrowedStreamQueuesOnTheNativeOneAndLeavesItAlive) {
  auto device = CreateCudaDevice({.ordinal = 0, .memory_budget_bytes = 64 << 20});
  if (!device.ok()) GTEST_SKIP() << device.status().message();
  constexpr size_t kBytes = 16 << 20;
  auto owner = (*device)->CreateStream();  // stands in for the other library's stream
  auto engine = (*device)->CreateStream();
  auto source = (*device)->AllocateHost(kBytes);
  auto result = (*device)->AllocateHost(kBytes);
  auto staged = (*device)->Allocate(kBytes);
  auto ready = (*device)->CreateEvent();
  ASSERT_TRUE(owner.ok() && engine.ok() && source.ok() && result.ok() && staged.ok() && ready.ok());
  std::memset(source->data(), 0x5a, kBytes);
  std::memset(result->data(), 0, kBytes);
  {
    auto borrowed = (*device)->BorrowStream((*owner)->native_handle());
    ASSERT_TRUE(borrowed.ok()) << borrowed.status();
    EXPECT_EQ((*borrowed)->native_handle(), (*owner)->native_handle());
    ASSERT_TRUE(
        (*borrowed)->Copy(staged->data(), source->data(), kBytes, CopyKind::kHostToDevice).ok());
    ASSERT_TRUE((*borrowed)->Record(**ready).ok());
  }  // gone: the native stream stays
  ASSERT_TRUE((*engine)->Wait(**ready).ok());
  ASSERT_TRUE(
      (*engine)->Copy(result->data(), staged->data(), kBytes, CopyKind::kDeviceToHost).ok());
  ASSERT_TRUE((*engine)->Synchronize().ok());
  EXPECT_EQ(std::memcmp(result->data(), source->data(), kBytes), 0);
  ASSERT_TRUE((*owner)->Memset(staged->data(), 0, kBytes).ok());  // still a live stream
  EXPECT_TRUE((*owner)->Synchronize().ok());
  // The legacy default stream borrows too.
  auto legacy = (*device)->BorrowStream(nullptr);
  EXPECT_TRUE(legacy.ok()) << legacy.status();
}

TEST(CudaDeviceTest, CastKernelsRoundTrip) {
  auto device = CreateCudaDevice({});
  if (!device.ok()) GTEST_SKIP() << device.status().message();
  constexpr size_t kCount = 1000003;
  std::vector<float> values(kCount);
  for (size_t i = 0; i < kCount; ++i) values[i] = static_cast<float>(i) * 0.37f - 1000.0f;
  auto stream = (*device)->CreateStream();
  auto host = (*device)->AllocateHost(kCount * 4);
  auto f32 = (*device)->Allocate(kCount * 4);
  auto bf16 = (*device)->Allocate(kCount * 2);
  ASSERT_TRUE(stream.ok() && host.ok() && f32.ok() && bf16.ok());
  std::memcpy(host->data(), values.data(), kCount * 4);
  Stream& s = **stream;
  ASSERT_TRUE(s.Copy(f32->data(), host->data(), kCount * 4, CopyKind::kHostToDevice).ok());
  ASSERT_TRUE(
      cuda::CastFloatToBf16(f32->as<float>(), bf16->as<uint16_t>(), kCount, s.native_handle())
          .ok());
  ASSERT_TRUE(
      cuda::CastBf16ToFloat(bf16->as<uint16_t>(), f32->as<float>(), kCount, s.native_handle())
          .ok());
  ASSERT_TRUE(s.Copy(host->data(), f32->data(), kCount * 4, CopyKind::kDeviceToHost).ok());
  ASSERT_TRUE(s.Synchronize().ok());
  for (size_t i = 0; i < kCount; i += 997) {
    const float got = host->as<float>()[i];
    EXPECT_NEAR(got, values[i], std::abs(values[i]) / 128 + 1e-6) << i;  // bf16: 8 bits
  }
}

}  // namespace
}  // namespace zinf::testing
