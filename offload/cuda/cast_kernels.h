// Precision casts on the GPU: fp32 master values to the bf16/fp16 compute copy and back.
// Asynchronous on `stream` (a cudaStream_t passed as void* so callers need no CUDA headers).
#ifndef ZINF_OFFLOAD_CUDA_CAST_KERNELS_H_
#define ZINF_OFFLOAD_CUDA_CAST_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "zinf/status.h"

namespace zinf::cuda {

// Round-to-nearest-even, NaN preserved.
Status CastFloatToBf16(const float* src, uint16_t* dst, size_t count, void* stream);
Status CastBf16ToFloat(const uint16_t* src, float* dst, size_t count, void* stream);

}  // namespace zinf::cuda

#endif  // ZINF_OFFLOAD_CUDA_CAST_KERNELS_H_
