#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "offload/cuda/cast_kernels.h"
#include "offload/cuda/cuda_status.h"

namespace zinf::cuda {
namespace {

constexpr int kThreads = 256;

// One element's conversion: round to nearest even into 16 bits, exact back to fp32, with the
// host conversions' bits (cpu_optim/kernels_scalar.cc) also for NaN, where CUDA's intrinsics
// give a canonical NaN instead: the NaN made quiet, its payload truncated (as x86's vcvtps2ph).
__device__ bool IsNan(uint32_t u) { return (u & 0x7FFFFFFFu) > 0x7F800000u; }

__device__ __nv_bfloat16 CastTo(float v, __nv_bfloat16*) {
  const uint32_t u = __float_as_uint(v);
  if (IsNan(u)) return __ushort_as_bfloat16(static_cast<unsigned short>((u >> 16) | 0x0040u));
  return __float2bfloat16_rn(v);
}
__device__ __half CastTo(float v, __half*) {
  const uint32_t u = __float_as_uint(v);
  if (IsNan(u)) {
    return __ushort_as_half(
        static_cast<unsigned short>(((u >> 16) & 0x8000u) | 0x7E00u | ((u >> 13) & 0x3FFu)));
  }
  return __float2half_rn(v);
}
__device__ float CastTo(__nv_bfloat16 v, float*) { return __bfloat162float(v); }
__device__ float CastTo(__half v, float*) {
  const uint32_t h = __half_as_ushort(v);
  if ((h & 0x7C00u) == 0x7C00u && (h & 0x3FFu) != 0) {  // NaN, made quiet
    return __uint_as_float(((h & 0x8000u) << 16) | 0x7FC00000u | ((h & 0x3FFu) << 13));
  }
  return __half2float(v);
}

template <typename Src, typename Dst>
__global__ void CastKernel(const Src* __restrict__ src, Dst* __restrict__ dst, size_t count) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    dst[i] = CastTo(src[i], static_cast<Dst*>(nullptr));
  }
}

unsigned Blocks(size_t count) {
  const size_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 * 4 ? blocks : 65535 * 4);  // grid-stride beyond
}

template <typename Src, typename Dst>
Status Launch(const void* src, void* dst, size_t count, void* stream, const char* what) {
  if (count == 0) return OkStatus();
  CastKernel<<<Blocks(count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const Src*>(src), static_cast<Dst*>(dst), count);
  return CudaStatus(cudaGetLastError(), what);
}

}  // namespace

Status CastFloatToBf16(const float* src, uint16_t* dst, size_t count, void* stream) {
  return Launch<float, __nv_bfloat16>(src, dst, count, stream, "CastFloatToBf16 launch");
}

Status CastBf16ToFloat(const uint16_t* src, float* dst, size_t count, void* stream) {
  return Launch<__nv_bfloat16, float>(src, dst, count, stream, "CastBf16ToFloat launch");
}

Status Convert(const void* src, ElementType from, void* dst, ElementType to, size_t count,
               void* stream) {
  using E = ElementType;
  if (from == E::kFp32 && to == E::kBf16) {
    return Launch<float, __nv_bfloat16>(src, dst, count, stream, "fp32 to bf16 launch");
  }
  if (from == E::kBf16 && to == E::kFp32) {
    return Launch<__nv_bfloat16, float>(src, dst, count, stream, "bf16 to fp32 launch");
  }
  if (from == E::kFp32 && to == E::kFp16) {
    return Launch<float, __half>(src, dst, count, stream, "fp32 to fp16 launch");
  }
  if (from == E::kFp16 && to == E::kFp32) {
    return Launch<__half, float>(src, dst, count, stream, "fp16 to fp32 launch");
  }
  return InvalidArgument("no such GPU conversion");
}

}  // namespace zinf::cuda
