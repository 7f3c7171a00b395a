// The Device contract of offload/device.h as one test suite, instantiated for every device
// kind: host_device_test.cc for HostDevice, cuda_device_test.cc for CudaDevice (which skips
// without a GPU). A factory returns a fresh device with the given budget, or a skip reason.
#ifndef ZINF_TESTS_OFFLOAD_DEVICE_CONFORMANCE_H_
#define ZINF_TESTS_OFFLOAD_DEVICE_CONFORMANCE_H_

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <ostream>
#include <string>

#include "zinf/device.h"

namespace zinf::testing {

struct DeviceFactory {
  std::string name;
  // Returns a device, or an error whose message is the reason to skip.
  std::function<StatusOr<std::unique_ptr<Device>>(uint64_t budget_bytes)> create;

  friend void PrintTo(const DeviceFactory& factory, std::ostream* os) { *os << factory.name; }
};

class DeviceConformanceTest : public ::testing::TestWithParam<DeviceFactory> {
 protected:
  // Creates the device under test, or skips the test with the factory's reason.
  std::unique_ptr<Device> MakeDevice(uint64_t budget_bytes = 256 << 20);
};

}  // namespace zinf::testing

#endif  // ZINF_TESTS_OFFLOAD_DEVICE_CONFORMANCE_H_
