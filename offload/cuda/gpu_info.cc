// ProbeGpus() for CUDA builds: runtime, driver and NCCL versions and each visible GPU.
#include <cuda_runtime.h>
#include <fmt/core.h>

#include "zinf/device.h"

// ZINF_HAVE_NCCL is set by CMake when it found NCCL beside the toolkit.
#ifdef ZINF_HAVE_NCCL
#include "offload/cuda/nccl_library.h"
#endif

namespace zinf {

GpuReport ProbeGpus() {
  GpuReport report;
  report.cuda_built = true;
  int runtime = 0;
  if (cudaRuntimeGetVersion(&runtime) == cudaSuccess) {
    report.runtime_version = fmt::format("{}.{}", runtime / 1000, (runtime % 1000) / 10);
  }
  int driver = 0;
  if (cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0) {
    report.driver_version = fmt::format("{}.{}", driver / 1000, (driver % 1000) / 10);
  }
#ifdef ZINF_HAVE_NCCL
  // The NCCL this process loads (Note [NCCL loaded on first use]); none: no version.
  int nccl = 0;
  if (auto library = LoadNccl(); library.ok() && (*library)->GetVersion(&nccl) == ncclSuccess) {
    report.nccl_version = fmt::format("{}.{}.{}", nccl / 10000, (nccl % 10000) / 100, nccl % 100);
  }
#endif
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();
    report.error = cudaGetErrorString(err);
    return report;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    GpuDescription gpu;
    gpu.ordinal = i;
    gpu.name = prop.name;
    gpu.total_memory_bytes = prop.totalGlobalMem;
    gpu.compute_capability_major = prop.major;
    gpu.compute_capability_minor = prop.minor;
    gpu.pci_bus_id = prop.pciBusID;
    gpu.multiprocessors = prop.multiProcessorCount;
    size_t free_bytes = 0, total = 0;
    if (cudaSetDevice(i) == cudaSuccess && cudaMemGetInfo(&free_bytes, &total) == cudaSuccess) {
      gpu.free_memory_bytes = free_bytes;
    }
    report.gpus.push_back(std::move(gpu));
  }
  return report;
}

}  // namespace zinf
