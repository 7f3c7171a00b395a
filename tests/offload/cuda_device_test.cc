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
