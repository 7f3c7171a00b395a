// Precision casts on the GPU: fp32 master values to the bf16/fp16 compute copy and back.
// Declared for every build; a build without CUDA answers Unavailable.
// Asynchronous on `stream` (a cudaStream_t passed as void* so callers need no CUDA headers).
#ifndef ZINF_OFFLOAD_CUDA_CAST_KERNELS_H_
#define ZINF_OFFLOAD_CUDA_CAST_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "zinf/dtype.h"
#include "zinf/status.h"

namespace zinf::cuda {

// Round-to-nearest-even, NaN preserved.
Status CastFloatToBf16(const float* src, uint16_t* dst, size_t count, void* stream);
Status CastBf16ToFloat(const uint16_t* src, float* dst, size_t count, void* stream);
// fp32 to bf16/fp16 and back (offload/device_ops.h's EnqueueConvert on a GPU); the pair is
// checked by the caller. Unavailable in a build without CUDA (offload/no_cuda.cc).
Status Convert(const void* src, ElementType from, void* dst, ElementType to, size_t count,
               void* stream);

}  // namespace zinf::cuda

#endif  // ZINF_OFFLOAD_CUDA_CAST_KERNELS_H_
