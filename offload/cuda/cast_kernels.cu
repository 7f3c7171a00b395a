#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "offload/cuda/cast_kernels.h"
#include "offload/cuda/cuda_status.h"

namespace zinf::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void FloatToBf16Kernel(const float* __restrict__ src, __nv_bfloat16* __restrict__ dst,
                                  size_t count) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    dst[i] = __float2bfloat16_rn(src[i]);
  }
}

__global__ void Bf16ToFloatKernel(const __nv_bfloat16* __restrict__ src, float* __restrict__ dst,
                                  size_t count) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    dst[i] = __bfloat162float(src[i]);
  }
}

__global__ void FloatToHalfKernel(const float* __restrict__ src, __half* __restrict__ dst,
                                  size_t count) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    dst[i] = __float2half_rn(src[i]);
  }
}

__global__ void HalfToFloatKernel(const __half* __restrict__ src, float* __restrict__ dst,
                                  size_t count) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    dst[i] = __half2float(src[i]);
  }
}

unsigned Blocks(size_t count) {
  const size_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 * 4 ? blocks : 65535 * 4);  // grid-stride beyond
}

}  // namespace

Status CastFloatToBf16(const float* src, uint16_t* dst, size_t count, void* stream) {
  if (count == 0) return OkStatus();
  FloatToBf16Kernel<<<Blocks(count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      src, reinterpret_cast<__nv_bfloat16*>(dst), count);
  return CudaStatus(cudaGetLastError(), "CastFloatToBf16 launch");
}

Status CastBf16ToFloat(const uint16_t* src, float* dst, size_t count, void* stream) {
  if (count == 0) return OkStatus();
  Bf16ToFloatKernel<<<Blocks(count), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<const __nv_bfloat16*>(src), dst, count);
  return CudaStatus(cudaGetLastError(), "CastBf16ToFloat launch");
}

Status Convert(const void* src, ElementType from, void* dst, ElementType to, size_t count,
               void* stream) {
  if (count == 0) return OkStatus();
  auto s = static_cast<cudaStream_t>(stream);
  if (from == ElementType::kFp32 && to == ElementType::kBf16) {
    return CastFloatToBf16(static_cast<const float*>(src), static_cast<uint16_t*>(dst), count,
                           stream);
  }
  if (from == ElementType::kBf16 && to == ElementType::kFp32) {
    return CastBf16ToFloat(static_cast<const uint16_t*>(src), static_cast<float*>(dst), count,
                           stream);
  }
  if (from == ElementType::kFp32 && to == ElementType::kFp16) {
    FloatToHalfKernel<<<Blocks(count), kThreads, 0, s>>>(static_cast<const float*>(src),
                                                         static_cast<__half*>(dst), count);
    return CudaStatus(cudaGetLastError(), "fp32 to fp16 launch");
  }
  if (from == ElementType::kFp16 && to == ElementType::kFp32) {
    HalfToFloatKernel<<<Blocks(count), kThreads, 0, s>>>(static_cast<const __half*>(src),
                                                         static_cast<float*>(dst), count);
    return CudaStatus(cudaGetLastError(), "fp16 to fp32 launch");
  }
  return InvalidArgument("no such GPU conversion");
}

}  // namespace zinf::cuda
