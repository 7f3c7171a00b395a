// The custom CUDA kernels of the GPT example's CUDA backend (gpt_kernels_cuda.cu), as plain
// launch functions: included by gpt_kernels_cuda.cc, it names no CUDA type, so the .cu file is
// the only one nvcc compiles. Every function enqueues one kernel on `stream` (a cudaStream_t)
// and returns at once; the caller checks cudaGetLastError. Each computes what the GptKernels
// op of the same name says (gpt_kernels.h); results are deterministic: no float atomics, every
// sum in a fixed order.
#ifndef ZINF_EXAMPLES_GPT_GPT_KERNELS_CUDA_H_
#define ZINF_EXAMPLES_GPT_GPT_KERNELS_CUDA_H_

#include <cstdint>

namespace gpt::cuda {

// A [batch, rows, cols] array of elements, as strides (in elements) on each side of a copy.
struct ConvertShape {
  int64_t dims[3];
  int64_t src_strides[3];
  int64_t dst_strides[3];
};
// dst = src converted element by element between fp32 and bf16 (`*_bf16` says which each side
// holds): fp32 to bf16 rounds to nearest even, bf16 to fp32 is exact.
void LaunchConvert(const void* src, bool src_bf16, void* dst, bool dst_bf16,
                   const ConvertShape& shape, void* stream);
// c[r * ldc + j] = bias[j], plus c's old value when `accumulate`.
void LaunchBroadcastBias(float* c, const float* bias, int64_t rows, int64_t cols, int64_t ldc,
                         bool accumulate, void* stream);
void LaunchEmbeddingForward(const int32_t* tokens, const float* wte, const float* wpe, float* x,
                            int64_t n, int64_t t, int64_t d, void* stream);
// dwte[unique[u]] += the sum of dx[rows[offsets[u]] .. rows[offsets[u + 1] - 1]], in that
// order: the rows of each distinct token, sorted on the host.
void LaunchTokenEmbeddingBackward(const int32_t* unique, const int32_t* offsets,
                                  const int32_t* rows, int64_t unique_count, const float* dx,
                                  float* dwte, int64_t d, void* stream);
// dwpe[p] += the sum over sequences b of dx[b * t + p].
void LaunchPositionEmbeddingBackward(const float* dx, float* dwpe, int64_t n, int64_t t, int64_t d,
                                     void* stream);
void LaunchLayerNormForward(const float* x, const float* gamma, const float* beta, float* y,
                            float* mean, float* var, int64_t rows, int64_t cols, float eps,
                            void* stream);
// dx only; LaunchLayerNormBackwardParams adds dgamma and dbeta.
void LaunchLayerNormBackwardInput(const float* x, const float* gamma, const float* mean,
                                  const float* var, const float* dy, float* dx, int64_t rows,
                                  int64_t cols, float eps, void* stream);
void LaunchLayerNormBackwardParams(const float* x, const float* mean, const float* var,
                                   const float* dy, float* dgamma, float* dbeta, int64_t rows,
                                   int64_t cols, float eps, void* stream);
void LaunchGeluForward(const float* x, float* y, int64_t n, void* stream);
void LaunchGeluBackward(const float* x, const float* dy, float* dx, int64_t n, void* stream);
// Rows are `rows` = matrices * t rows of t scores; row r is causal over r % t + 1 entries.
void LaunchCausalSoftmax(float* scores, int64_t rows, int64_t t, void* stream);
void LaunchCausalSoftmaxBackward(const float* p, float* dp, int64_t rows, int64_t t, float scale,
                                 void* stream);
// row_loss[r] = -log softmax(logits[r])[targets[r]]; the gradient as in GptKernels.
void LaunchCrossEntropy(float* logits, const int32_t* targets, float* row_loss, int64_t rows,
                        int64_t vocab, float grad_scale, void* stream);
void LaunchAddColumnSums(const float* m, int64_t rows, int64_t cols, float* out, void* stream);
void LaunchAdd(const float* a, const float* b, float* out, int64_t n, void* stream);

}  // namespace gpt::cuda

#endif  // ZINF_EXAMPLES_GPT_GPT_KERNELS_CUDA_H_
