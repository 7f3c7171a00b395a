// See offload/device_ops.h.
#include "offload/device_ops.h"

#include <fmt/core.h>

#include "offload/cuda/cast_kernels.h"
#include "zinf/dtype.h"

namespace zinf {

Status EnqueueConvert(const Device& device, Stream& stream, const void* src, ElementType from,
                      void* dst, ElementType to, uint64_t count) {
  // The 2-byte types are bf16 and fp16.
  const bool supported = from == to || (from == ElementType::kFp32 && ElementSize(to) == 2) ||
                         (to == ElementType::kFp32 && ElementSize(from) == 2);
  if (!supported) {
    return InvalidArgument(fmt::format("no device conversion from {} to {}", ElementTypeName(from),
                                       ElementTypeName(to)));
  }
  if (count == 0) return OkStatus();
  if (from == to) return stream.Copy(dst, src, count * ElementSize(to), CopyKind::kDeviceToDevice);
  if (device.kind() == DeviceKind::kCuda) {
    return cuda::Convert(src, from, dst, to, count, stream.native_handle());
  }
  return stream.HostFunc([=] {
    if (from == ElementType::kFp32) {
      ConvertFromFp32(static_cast<const float*>(src), to, dst, count);
    } else {
      ConvertToFp32(src, from, static_cast<float*>(dst), count);
    }
    return OkStatus();
  });
}

}  // namespace zinf
