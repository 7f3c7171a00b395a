// The compute of the GPT example (examples/gpt/gpt_model.h) behind one interface, so that the
// model runs unchanged on the CPU and on a GPU:
//   - CPU: oneDNN primitives and plain loops (gpt_kernels_cpu.cc), on a HostDevice;
//   - CUDA: cuBLAS plus small custom kernels (gpt_kernels_cuda.cc, gpt_kernels_cuda.cu), on a
//     CudaDevice; compiled only where nvcc is (gpt_kernels_no_cuda.cc otherwise).
//
// Every pointer passed to an op is backend memory: memory from device().Allocate() (the
// activations and scratch, so that they count against the device's budget), or what
// Parameters() and Gradients() hand back. Activations and gradients are fp32; parameters are
// Tensors tagged fp32 or bf16, so that matmul weights can arrive in bf16 (as the engine will
// hand them out). Ops are enqueued in order on one stream and may run asynchronously (on CUDA
// they do; on the CPU they run inline on the calling thread). An op that fails records the
// first error, which is sticky: later ops become no-ops and every Status-returning call
// reports it. See Note [GPT compute] in gpt_kernels_cpu.cc for the numerics.
//
// Thread-safety: one thread drives a GptKernels.
#ifndef ZINF_EXAMPLES_GPT_GPT_KERNELS_H_
#define ZINF_EXAMPLES_GPT_GPT_KERNELS_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "zinf/cpu_optimizer.h"
#include "zinf/device.h"
#include "zinf/status.h"

namespace gpt {

using zinf::ElementType;

// A parameter in backend memory, tagged with its element type (kFp32 or kBf16).
struct Tensor {
  const void* data = nullptr;
  ElementType dtype = ElementType::kFp32;

  // The data of an fp32 tensor (LayerNorm parameters and biases, which ops take as floats).
  const float* f32() const { return static_cast<const float*>(data); }
};

// A row-major matrix {rows, cols} or a batch of them {batch, rows, cols} anywhere in backend
// memory, with strides in elements, of fp32 or bf16 elements. Transposed views swap the last
// two strides.
struct View {
  const void* data = nullptr;
  int ndims = 2;
  std::array<int64_t, 3> dims{};
  std::array<int64_t, 3> strides{};
  ElementType dtype = ElementType::kFp32;

  int64_t batch() const { return ndims == 3 ? dims[0] : 1; }
  int64_t batch_stride() const { return ndims == 3 ? strides[0] : 0; }
  int64_t rows() const { return dims[ndims - 2]; }
  int64_t cols() const { return dims[ndims - 1]; }
  int64_t row_stride() const { return strides[ndims - 2]; }
  int64_t col_stride() const { return strides[ndims - 1]; }
};

inline View Matrix(const float* data, int64_t rows, int64_t cols) {
  return {data, 2, {rows, cols, 0}, {cols, 1, 0}};
}

inline View Matrix(const Tensor& t, int64_t rows, int64_t cols) {
  return {t.data, 2, {rows, cols, 0}, {cols, 1, 0}, t.dtype};
}

// `batch` matrices [rows, cols] with row stride `ld`, `batch_stride` apart: e.g. the heads of
// q inside one sequence's [T, 3d] c_attn output.
inline View Batched(const float* data, int64_t batch, int64_t rows, int64_t cols,
                    int64_t batch_stride, int64_t ld) {
  return {data, 3, {batch, rows, cols}, {batch_stride, ld, 1}};
}

inline View Transposed(View v) {
  std::swap(v.dims[v.ndims - 1], v.dims[v.ndims - 2]);
  std::swap(v.strides[v.ndims - 1], v.strides[v.ndims - 2]);
  return v;
}

// The view of a dense copy of v's elements (its data pointer left to the caller), of type
// `dtype`: the batch outermost, then the matrix's two dimensions in v's memory order, so that
// a transposed operand stays transposed (a copy reads and writes in order, and keeps the unit
// stride BLAS needs) while the batch of attention heads, interleaved within rows in the
// c_attn output, becomes contiguous matrices (the layout oneDNN's and cuBLAS's batched
// kernels are fastest on). Sets *elements to the copy's size.
inline View DenseCopy(const View& v, ElementType dtype, int64_t* elements) {
  View out = v;
  out.dtype = dtype;
  const int r = v.ndims - 2, c = v.ndims - 1;
  const bool row_major = v.strides[c] <= v.strides[r];
  const int inner = row_major ? c : r, outer = row_major ? r : c;
  out.strides[inner] = 1;
  out.strides[outer] = v.dims[inner];
  if (v.ndims == 3) out.strides[0] = v.dims[1] * v.dims[2];
  *elements = v.batch() * v.dims[r] * v.dims[c];
  return out;
}

// Which module's parameters a Parameters() call converts: modules in different
// slots may be held at the same time (the head needs "embed" and "ln_f" together).
enum class Slot { kEmbed, kLnF, kBlock };

// What every backend's Parameters() checks of its arguments: one numel and one wanted type per
// tensor, every type fp32 or bf16. InvalidArgument naming the first bad one.
inline zinf::Status ValidateParameters(const std::vector<Tensor>& fetched,
                                       const std::vector<int64_t>& numel,
                                       const std::vector<ElementType>& want) {
  if (numel.size() != fetched.size() || want.size() != fetched.size()) {
    return zinf::InvalidArgument("Parameters: " + std::to_string(fetched.size()) + " tensors, " +
                                 std::to_string(numel.size()) + " lengths and " +
                                 std::to_string(want.size()) + " wanted types");
  }
  for (size_t i = 0; i < fetched.size(); ++i) {
    for (ElementType t : {fetched[i].dtype, want[i]}) {
      if (t != ElementType::kFp32 && t != ElementType::kBf16) {
        return zinf::InvalidArgument("Parameters: tensor " + std::to_string(i) + " is " +
                                     std::string(zinf::ElementTypeName(t)) +
                                     "; the GPT's backends take fp32 and bf16");
      }
    }
  }
  return zinf::OkStatus();
}

class GptKernels {
 public:
  // Waits for queued work (best effort).
  virtual ~GptKernels() = default;

  // Where the activations live: allocate them here.
  virtual zinf::Device& device() = 0;
  // The element type matmuls multiply in: kFp32, or kBf16 (bf16 inputs, fp32 accumulation).
  virtual ElementType matmul_type() const = 0;

  // ---- The engine's tensors. A backend computes on the engine's compute device (the CPU on
  // the host device, the GPU on cuda:N): the engine's fetched parameters and its gradient
  // buffers are backend memory, used where they are (see Note [GPT staging]).

  // The parameters of one fetched module as the ops take them: `fetched[i]` (the engine's
  // tensor, fp32 or bf16, complete once `ready` has; nullptr: already) holds `numel[i]`
  // elements and comes back as a tensor of element type `want[i]` (kFp32 or kBf16; see Note
  // [GPT compute] for which the model asks for). A fetched tensor already of its wanted type
  // is handed back as it is, valid until the module's Release; the others are converted into
  // the slot's buffers, valid until the next Parameters() call for the slot. Ops queued after
  // this call see the parameters without the host waiting. InvalidArgument for kFp16 or
  // mismatched lengths.
  virtual zinf::StatusOr<std::vector<Tensor>> Parameters(Slot slot,
                                                         const std::vector<Tensor>& fetched,
                                                         const std::vector<int64_t>& numel,
                                                         const std::vector<ElementType>& want,
                                                         zinf::Event* ready) = 0;
  // An event recorded after every op queued so far, for Engine::Release and ReduceGradients:
  // the engine reuses or reads its tensors only after it, and neither call waits for it. Null
  // where ops run on the calling thread (the CPU): they have all run. Valid until the next
  // Done(); the engine captures it when it is handed over.
  virtual zinf::StatusOr<zinf::Event*> Done() = 0;
  // Copies n floats of backend memory to host memory and waits.
  virtual zinf::Status CopyToHost(float* host, const float* src, int64_t n) = 0;
  // Waits for every queued op; the first error of any op so far.
  virtual zinf::Status Synchronize() = 0;

  // ---- Ops. Shapes are in elements; n rows of d columns unless said otherwise.

  // The tokens and targets (host memory, n values each) of the batch the embedding and
  // cross-entropy ops below use. The pointers may be reused once this returns.
  virtual void SetTokens(const int32_t* tokens, const int32_t* targets, int64_t n) = 0;
  // x[r] = wte[tokens[r]] + wpe[r % t].
  virtual void EmbeddingForward(const float* wte, const float* wpe, float* x, int64_t n, int64_t t,
                                int64_t d) = 0;
  // dwte[tokens[r]] += dx[r] and dwpe[r % t] += dx[r], over every row r.
  virtual void EmbeddingBackward(const float* dx, float* dwte, float* dwpe, int64_t n, int64_t t,
                                 int64_t d) = 0;
  // c = scale * a·b, plus bias[column] when `bias` is given, plus c's old value when
  // `accumulate`. c must be fp32 with unit column stride; a and b may be fp32 or bf16. They
  // are multiplied in matmul_type(): operands of another type are converted first (fp32 to
  // bf16 rounds to nearest even; bf16 to fp32 is exact), and products accumulate in fp32
  // either way. A bias needs a 2-d c and scale 1.
  virtual void Matmul(const View& a, const View& b, const View& c, const float* bias = nullptr,
                      float scale = 1.0f, bool accumulate = false) = 0;
  // Each row of x normalized, times gamma plus beta, into y; the row means and variances
  // (biased) are kept for the backward.
  virtual void LayerNormForward(const float* x, const float* gamma, const float* beta, float* y,
                                float* mean, float* var, int64_t rows, int64_t cols) = 0;
  // dx = the gradient through the LayerNorm of dy (written); the gradients of gamma and beta
  // are added into dgamma and dbeta.
  virtual void LayerNormBackward(const float* x, const float* gamma, const float* beta,
                                 const float* mean, const float* var, const float* dy, float* dx,
                                 float* dgamma, float* dbeta, int64_t rows, int64_t cols) = 0;
  // GELU with the tanh approximation (GPT-2's, torch's gelu(approximate='tanh')).
  virtual void GeluForward(const float* x, float* y, int64_t n) = 0;
  // dx = dy * gelu'(x).
  virtual void GeluBackward(const float* x, const float* dy, float* dx, int64_t n) = 0;
  // Softmax of each row of `matrices` [t, t] score matrices in place, row i over its first
  // i + 1 entries (causal); the entries past them become 0.
  virtual void CausalSoftmax(float* scores, int64_t matrices, int64_t t) = 0;
  // From the softmax output p and the gradient dp of its output, the gradient of the scores
  // before the softmax (and before the 1/sqrt(head_dim) `scale`), in place of dp.
  virtual void CausalSoftmaxBackward(const float* p, float* dp, int64_t matrices, int64_t t,
                                     float scale) = 0;
  // The mean over rows of -log softmax(logits)[target] (targets from SetTokens); waits for
  // it. With grad_scale != 0 the logits are replaced by grad_scale times the gradient of each
  // row's loss: softmax - onehot(target).
  virtual zinf::StatusOr<double> CrossEntropy(float* logits, int64_t rows, int64_t vocab,
                                              float grad_scale) = 0;
  // out[j] += sum over rows of m[row][j]: a bias gradient.
  virtual void AddColumnSums(const float* m, int64_t rows, int64_t cols, float* out) = 0;
  // out = a + b (out may be a or b).
  virtual void Add(const float* a, const float* b, float* out, int64_t n) = 0;
  virtual void Copy(float* dst, const float* src, int64_t n) = 0;
  virtual void Zero(float* dst, int64_t n) = 0;
};

// The oneDNN backend on a HostDevice whose budget is `memory_budget_bytes` (0: the machine's
// memory), multiplying matrices in `matmul_type`. kBf16 needs a CPU with bf16 dot products
// (AVX512_BF16 or AMX) that oneDNN uses: Unavailable, saying which is missing, where there is
// none (oneDNN could emulate bf16 on plain AVX-512, but slower than fp32, so it is refused).
// InvalidArgument for kFp16; otherwise the HostDevice's errors.
zinf::StatusOr<std::unique_ptr<GptKernels>> CreateCpuKernels(
    uint64_t memory_budget_bytes, ElementType matmul_type = ElementType::kFp32);

// The cuBLAS backend on CUDA device `ordinal` (budget 0: CudaDevice's default), multiplying
// matrices in `matmul_type`: kFp32 in plain fp32 (no TF32), kBf16 on tensor cores with fp32
// accumulation (cublasGemmStridedBatchedEx, CUBLAS_COMPUTE_32F), which needs compute
// capability 8.0 or later (Unavailable below it). Unavailable, with CreateCudaDevice's
// reason, when zinf was built without CUDA or no GPU is usable; InvalidArgument for kFp16;
// Internal naming the call when cuBLAS cannot start.
zinf::StatusOr<std::unique_ptr<GptKernels>> CreateCudaKernels(
    int ordinal, uint64_t memory_budget_bytes, ElementType matmul_type = ElementType::kFp32);

}  // namespace gpt

#endif  // ZINF_EXAMPLES_GPT_GPT_KERNELS_H_
