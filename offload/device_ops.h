// Element-wise work on device memory, enqueued on a stream of the device that holds it, so
// that the engine's precision conversions run where the data lives: a CUDA kernel on a GPU
// (offload/cuda/cast_kernels.cu), a host function in the stream's order on HostDevice. One
// call site serves both, which is how the GPU path is the path CI runs.
//
// Thread-safety: as Stream.
#ifndef ZINF_OFFLOAD_DEVICE_OPS_H_
#define ZINF_OFFLOAD_DEVICE_OPS_H_

#include <cstdint>

#include "zinf/device.h"
#include "zinf/dtype.h"
#include "zinf/status.h"

namespace zinf {

// Converts `count` elements of type `from` at `src` into type `to` at `dst`, both in
// `device`'s memory, after the work already on `stream`. fp32 to and from bf16/fp16
// (round to nearest even, as ConvertFromFp32), and any type to itself (a copy).
// InvalidArgument for other pairs. `src` and `dst` must stay valid until the work has run.
Status EnqueueConvert(const Device& device, Stream& stream, const void* src, ElementType from,
                      void* dst, ElementType to, uint64_t count);

}  // namespace zinf

#endif  // ZINF_OFFLOAD_DEVICE_OPS_H_
