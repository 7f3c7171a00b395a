// The GPT example's custom CUDA kernels; see gpt_kernels_cuda.h. Row-wise reductions (LayerNorm,
// softmax, cross-entropy) take one block per row and reduce in a fixed tree; column sums (bias,
// LayerNorm parameter and embedding gradients) take one thread per column and add the rows in
// order. fp32 throughout, with the same formulas as the CPU backend; ConvertKernel makes the
// bf16 operands of bf16 matmuls.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "examples/gpt/gpt_kernels_cuda.h"

namespace gpt::cuda {
namespace {

constexpr int kRowThreads = 256;  // threads of a one-block-per-row kernel
constexpr int kThreads = 256;

cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }

unsigned Blocks(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

// The sum (or max) of v over the block, the same in every thread. `shared` holds a float per
// warp; the leading barrier lets calls follow one another.
template <bool kMax>
__device__ float BlockReduce(float v, float* shared) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, offset);
    v = kMax ? fmaxf(v, other) : v + other;
  }
  __syncthreads();
  if ((threadIdx.x & 31) == 0) shared[threadIdx.x >> 5] = v;
  __syncthreads();
  float total = shared[0];
  for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) {
    total = kMax ? fmaxf(total, shared[w]) : total + shared[w];
  }
  return total;
}

// One thread per element, in the logical [batch, rows, cols] order.
template <typename In, typename Out>
__global__ void ConvertKernel(const In* src, Out* dst, ConvertShape shape, int64_t total) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= total) return;
  const int64_t c = i % shape.dims[2], r = i / shape.dims[2] % shape.dims[1],
                b = i / (shape.dims[2] * shape.dims[1]);
  const In v = src[b * shape.src_strides[0] + r * shape.src_strides[1] + c * shape.src_strides[2]];
  Out& out = dst[b * shape.dst_strides[0] + r * shape.dst_strides[1] + c * shape.dst_strides[2]];
  if constexpr (std::is_same_v<In, Out>) {
    out = v;
  } else if constexpr (std::is_same_v<Out, __nv_bfloat16>) {
    out = __float2bfloat16_rn(v);
  } else {
    out = __bfloat162float(v);
  }
}

__global__ void BroadcastBiasKernel(float* c, const float* bias, int64_t rows, int64_t cols,
                                    int64_t ldc, bool accumulate) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= rows * cols) return;
  const int64_t r = i / cols, j = i % cols;
  float* out = c + r * ldc + j;
  *out = (accumulate ? *out : 0.0f) + bias[j];
}

__global__ void EmbeddingForwardKernel(const int32_t* tokens, const float* wte, const float* wpe,
                                       float* x, int64_t n, int64_t t, int64_t d) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= n * d) return;
  const int64_t r = i / d, j = i % d;
  x[i] = wte[tokens[r] * d + j] + wpe[(r % t) * d + j];
}

// Grid: (distinct tokens, column blocks).
__global__ void TokenEmbeddingBackwardKernel(const int32_t* unique, const int32_t* offsets,
                                             const int32_t* rows, const float* dx, float* dwte,
                                             int64_t d) {
  const int64_t u = blockIdx.x;
  const int64_t j = blockIdx.y * int64_t{blockDim.x} + threadIdx.x;
  if (j >= d) return;
  float sum = 0;
  for (int32_t k = offsets[u]; k < offsets[u + 1]; ++k) sum += dx[rows[k] * d + j];
  dwte[unique[u] * d + j] += sum;
}

__global__ void PositionEmbeddingBackwardKernel(const float* dx, float* dwpe, int64_t n, int64_t t,
                                                int64_t d) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= t * d) return;
  float sum = 0;
  for (int64_t r = i / d; r < n; r += t) sum += dx[r * d + i % d];
  dwpe[i] += sum;
}

__global__ void LayerNormForwardKernel(const float* x, const float* gamma, const float* beta,
                                       float* y, float* mean, float* var, int64_t cols, float eps) {
  __shared__ float shared[kRowThreads / 32];
  const int64_t r = blockIdx.x;
  const float* xr = x + r * cols;
  float sum = 0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) sum += xr[j];
  const float m = BlockReduce<false>(sum, shared) / cols;
  float squares = 0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float c = xr[j] - m;
    squares += c * c;
  }
  const float v = BlockReduce<false>(squares, shared) / cols;
  const float rstd = 1.0f / sqrtf(v + eps);
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    y[r * cols + j] = (xr[j] - m) * rstd * gamma[j] + beta[j];
  }
  if (threadIdx.x == 0) {
    mean[r] = m;
    var[r] = v;
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma.
__global__ void LayerNormBackwardInputKernel(const float* x, const float* gamma, const float* mean,
                                             const float* var, const float* dy, float* dx,
                                             int64_t cols, float eps) {
  __shared__ float shared[kRowThreads / 32];
  const int64_t r = blockIdx.x;
  const float* xr = x + r * cols;
  const float* dyr = dy + r * cols;
  const float m = mean[r], rstd = 1.0f / sqrtf(var[r] + eps);
  float sum_g = 0, sum_gx = 0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float g = dyr[j] * gamma[j];
    sum_g += g;
    sum_gx += g * (xr[j] - m) * rstd;
  }
  const float mean_g = BlockReduce<false>(sum_g, shared) / cols;
  const float mean_gx = BlockReduce<false>(sum_gx, shared) / cols;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float xhat = (xr[j] - m) * rstd;
    dx[r * cols + j] = rstd * (dyr[j] * gamma[j] - mean_g - xhat * mean_gx);
  }
}

__global__ void LayerNormBackwardParamsKernel(const float* x, const float* mean, const float* var,
                                              const float* dy, float* dgamma, float* dbeta,
                                              int64_t rows, int64_t cols, float eps) {
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (j >= cols) return;
  float sum_gamma = 0, sum_beta = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float g = dy[r * cols + j];
    sum_gamma += g * (x[r * cols + j] - mean[r]) / sqrtf(var[r] + eps);
    sum_beta += g;
  }
  dgamma[j] += sum_gamma;
  dbeta[j] += sum_beta;
}

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

__global__ void GeluForwardKernel(const float* x, float* y, int64_t n) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= n) return;
  const float v = x[i];
  y[i] = 0.5f * v * (1.0f + tanhf(kSqrt2OverPi * (v + kGeluCubic * v * v * v)));
}

__global__ void GeluBackwardKernel(const float* x, const float* dy, float* dx, int64_t n) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= n) return;
  const float v = x[i];
  const float th = tanhf(kSqrt2OverPi * (v + kGeluCubic * v * v * v));
  const float dinner = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v);
  dx[i] = dy[i] * (0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * dinner);
}

__global__ void CausalSoftmaxKernel(float* scores, int64_t t) {
  __shared__ float shared[kRowThreads / 32];
  const int64_t r = blockIdx.x;
  float* row = scores + r * t;
  const int64_t n = r % t + 1;
  float max = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) max = fmaxf(max, row[j]);
  max = BlockReduce<true>(max, shared);
  float sum = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float e = expf(row[j] - max);
    row[j] = e;
    sum += e;
  }
  const float inv = 1.0f / BlockReduce<false>(sum, shared);
  for (int64_t j = threadIdx.x; j < t; j += blockDim.x) row[j] = j < n ? row[j] * inv : 0.0f;
}

__global__ void CausalSoftmaxBackwardKernel(const float* p, float* dp, int64_t t, float scale) {
  __shared__ float shared[kRowThreads / 32];
  const int64_t r = blockIdx.x;
  const float* prow = p + r * t;
  float* drow = dp + r * t;
  const int64_t n = r % t + 1;
  float dot = 0;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) dot += prow[j] * drow[j];
  dot = BlockReduce<false>(dot, shared);
  for (int64_t j = threadIdx.x; j < t; j += blockDim.x) {
    drow[j] = j < n ? prow[j] * (drow[j] - dot) * scale : 0.0f;
  }
}

__global__ void CrossEntropyKernel(float* logits, const int32_t* targets, float* row_loss,
                                   int64_t vocab, float grad_scale) {
  __shared__ float shared[kRowThreads / 32];
  const int64_t r = blockIdx.x;
  float* z = logits + r * vocab;
  float max = -INFINITY;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) max = fmaxf(max, z[j]);
  max = BlockReduce<true>(max, shared);
  float sum = 0;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) sum += expf(z[j] - max);
  const float log_sum = max + logf(BlockReduce<false>(sum, shared));
  const int32_t target = targets[r];
  if (threadIdx.x == 0) row_loss[r] = log_sum - z[target];
  if (grad_scale == 0) return;
  __syncthreads();  // z[target] is read above before it is overwritten below
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    z[j] = expf(z[j] - log_sum) * grad_scale - (j == target ? grad_scale : 0.0f);
  }
}

__global__ void AddColumnSumsKernel(const float* m, int64_t rows, int64_t cols, float* out) {
  const int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (j >= cols) return;
  float sum = 0;
  for (int64_t r = 0; r < rows; ++r) sum += m[r * cols + j];
  out[j] += sum;
}

__global__ void AddKernel(const float* a, const float* b, float* out, int64_t n) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}

}  // namespace

void LaunchConvert(const void* src, bool src_bf16, void* dst, bool dst_bf16,
                   const ConvertShape& shape, void* stream) {
  const int64_t total = shape.dims[0] * shape.dims[1] * shape.dims[2];
  if (total == 0) return;
  const unsigned blocks = Blocks(total);
  cudaStream_t s = AsStream(stream);
  using Bf16 = __nv_bfloat16;
  if (src_bf16 && dst_bf16) {
    ConvertKernel<<<blocks, kThreads, 0, s>>>(static_cast<const Bf16*>(src),
                                              static_cast<Bf16*>(dst), shape, total);
  } else if (src_bf16) {
    ConvertKernel<<<blocks, kThreads, 0, s>>>(static_cast<const Bf16*>(src),
                                              static_cast<float*>(dst), shape, total);
  } else if (dst_bf16) {
    ConvertKernel<<<blocks, kThreads, 0, s>>>(static_cast<const float*>(src),
                                              static_cast<Bf16*>(dst), shape, total);
  } else {
    ConvertKernel<<<blocks, kThreads, 0, s>>>(static_cast<const float*>(src),
                                              static_cast<float*>(dst), shape, total);
  }
}

void LaunchBroadcastBias(float* c, const float* bias, int64_t rows, int64_t cols, int64_t ldc,
                         bool accumulate, void* stream) {
  BroadcastBiasKernel<<<Blocks(rows * cols), kThreads, 0, AsStream(stream)>>>(c, bias, rows, cols,
                                                                              ldc, accumulate);
}

void LaunchEmbeddingForward(const int32_t* tokens, const float* wte, const float* wpe, float* x,
                            int64_t n, int64_t t, int64_t d, void* stream) {
  EmbeddingForwardKernel<<<Blocks(n * d), kThreads, 0, AsStream(stream)>>>(tokens, wte, wpe, x, n,
                                                                           t, d);
}

void LaunchTokenEmbeddingBackward(const int32_t* unique, const int32_t* offsets,
                                  const int32_t* rows, int64_t unique_count, const float* dx,
                                  float* dwte, int64_t d, void* stream) {
  if (unique_count == 0) return;
  const dim3 grid(static_cast<unsigned>(unique_count), Blocks(d));
  TokenEmbeddingBackwardKernel<<<grid, kThreads, 0, AsStream(stream)>>>(unique, offsets, rows, dx,
                                                                        dwte, d);
}

void LaunchPositionEmbeddingBackward(const float* dx, float* dwpe, int64_t n, int64_t t, int64_t d,
                                     void* stream) {
  PositionEmbeddingBackwardKernel<<<Blocks(t * d), kThreads, 0, AsStream(stream)>>>(dx, dwpe, n, t,
                                                                                    d);
}

void LaunchLayerNormForward(const float* x, const float* gamma, const float* beta, float* y,
                            float* mean, float* var, int64_t rows, int64_t cols, float eps,
                            void* stream) {
  LayerNormForwardKernel<<<static_cast<unsigned>(rows), kRowThreads, 0, AsStream(stream)>>>(
      x, gamma, beta, y, mean, var, cols, eps);
}

void LaunchLayerNormBackwardInput(const float* x, const float* gamma, const float* mean,
                                  const float* var, const float* dy, float* dx, int64_t rows,
                                  int64_t cols, float eps, void* stream) {
  LayerNormBackwardInputKernel<<<static_cast<unsigned>(rows), kRowThreads, 0, AsStream(stream)>>>(
      x, gamma, mean, var, dy, dx, cols, eps);
}

void LaunchLayerNormBackwardParams(const float* x, const float* mean, const float* var,
                                   const float* dy, float* dgamma, float* dbeta, int64_t rows,
                                   int64_t cols, float eps, void* stream) {
  LayerNormBackwardParamsKernel<<<Blocks(cols), kThreads, 0, AsStream(stream)>>>(
      x, mean, var, dy, dgamma, dbeta, rows, cols, eps);
}

void LaunchGeluForward(const float* x, float* y, int64_t n, void* stream) {
  GeluForwardKernel<<<Blocks(n), kThreads, 0, AsStream(stream)>>>(x, y, n);
}

void LaunchGeluBackward(const float* x, const float* dy, float* dx, int64_t n, void* stream) {
  GeluBackwardKernel<<<Blocks(n), kThreads, 0, AsStream(stream)>>>(x, dy, dx, n);
}

void LaunchCausalSoftmax(float* scores, int64_t rows, int64_t t, void* stream) {
  CausalSoftmaxKernel<<<static_cast<unsigned>(rows), kRowThreads, 0, AsStream(stream)>>>(scores, t);
}

void LaunchCausalSoftmaxBackward(const float* p, float* dp, int64_t rows, int64_t t, float scale,
                                 void* stream) {
  CausalSoftmaxBackwardKernel<<<static_cast<unsigned>(rows), kRowThreads, 0, AsStream(stream)>>>(
      p, dp, t, scale);
}

void LaunchCrossEntropy(float* logits, const int32_t* targets, float* row_loss, int64_t rows,
                        int64_t vocab, float grad_scale, void* stream) {
  CrossEntropyKernel<<<static_cast<unsigned>(rows), kRowThreads, 0, AsStream(stream)>>>(
      logits, targets, row_loss, vocab, grad_scale);
}

void LaunchAddColumnSums(const float* m, int64_t rows, int64_t cols, float* out, void* stream) {
  AddColumnSumsKernel<<<Blocks(cols), kThreads, 0, AsStream(stream)>>>(m, rows, cols, out);
}

void LaunchAdd(const float* a, const float* b, float* out, int64_t n, void* stream) {
  AddKernel<<<Blocks(n), kThreads, 0, AsStream(stream)>>>(a, b, out, n);
}

}  // namespace gpt::cuda
