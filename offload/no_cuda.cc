// The CUDA entry points of offload/device.h for builds without CUDA (CMake picks this file
// instead of offload/cuda/).
#include "offload/cuda/cast_kernels.h"
#include "zinf/device.h"

namespace zinf {

StatusOr<std::unique_ptr<Device>> CreateCudaDevice(const CudaDeviceOptions&) {
  return Unavailable(
      "zinf was built without CUDA (configure with nvcc on PATH, or "
      "-DZINF_WITH_CUDA=ON)");
}

namespace cuda {
Status Convert(const void*, ElementType, void*, ElementType, size_t, void*) {
  return Unavailable("zinf was built without CUDA");
}
}  // namespace cuda

GpuReport ProbeGpus() {
  GpuReport report;
  report.error = "zinf was built without CUDA";
  return report;
}

}  // namespace zinf
