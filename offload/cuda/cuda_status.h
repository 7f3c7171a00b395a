// CUDA runtime errors as zinf Status values (private to offload/cuda).
#ifndef ZINF_OFFLOAD_CUDA_CUDA_STATUS_H_
#define ZINF_OFFLOAD_CUDA_CUDA_STATUS_H_

#include <cuda_runtime.h>

#include <string>
#include <string_view>

#include "zinf/status.h"

namespace zinf {

// OK for cudaSuccess; otherwise "<what>: <cudaGetErrorString>" with a code that says whether
// retrying can help (ResourceExhausted for out-of-memory, Unavailable for a missing driver).
inline Status CudaStatus(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return OkStatus();
  std::string m(what);
  m += ": ";
  m += cudaGetErrorString(err);
  switch (err) {
    case cudaErrorMemoryAllocation:
      return ResourceExhausted(std::move(m));
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
      return Unavailable(std::move(m));
    case cudaErrorInvalidValue:
      return InvalidArgument(std::move(m));
    default:
      return Internal(std::move(m));
  }
}

}  // namespace zinf

#endif  // ZINF_OFFLOAD_CUDA_CUDA_STATUS_H_
