// The GPT example's CUDA backend: matmuls on cuBLAS, everything else in the small kernels of
// gpt_kernels_cuda.cu, all on one stream of a CudaDevice. Matmuls are plain fp32 (no TF32), or
// with matmul type bf16 bf16 x bf16 on tensor cores accumulating in fp32
// (cublasGemmStridedBatchedEx with CUBLAS_COMPUTE_32F), the CPU backend's numerics (Note [GPT
// compute] in gpt_kernels_cpu.cc): weights arrive in bf16 from Parameters(), activations are
// converted into scratch just before each matmul. The engine computes on the same GPU (Note
// [GPT staging] in gpt_model.cc): its parameters and gradient buffers are used in place, in
// stream order with its events. gpt_kernels.h has the contract. Results are
// deterministic from run to run on one GPU (cuBLAS picks the same algorithm for the same
// shapes; the kernels use no atomics) but differ from the CPU backend's in rounding.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <climits>
#include <cstring>
#include <string>
#include <type_traits>

#include "examples/gpt/gpt_kernels.h"
#include "examples/gpt/gpt_kernels_cuda.h"

namespace gpt {
namespace {

using zinf::Status;
using zinf::StatusOr;

constexpr float kLayerNormEps = 1e-5f;
// Parameters and gradients of a module are packed into one buffer, each starting on a
// multiple of this many bytes so that cuBLAS sees aligned matrices.
constexpr int64_t kAlignBytes = 256;

Status CudaError(cudaError_t err, std::string_view op) {
  if (err == cudaSuccess) return zinf::OkStatus();
  const std::string m = fmt::format("CUDA {}: {}", op, cudaGetErrorString(err));
  return err == cudaErrorMemoryAllocation ? zinf::ResourceExhausted(m) : zinf::Internal(m);
}

// cuBLAS is opened when a CUDA backend is first created, not linked: loading its libraries
// (their relocations alone) would cost every run of a CUDA build, CPU-only ones too, about
// 150 MiB of RSS.
// cublasGemmStridedBatchedEx as the library exports it (the header overloads the name with an
// inline wrapper that takes a cudaDataType compute type).
using GemmStridedBatchedExFn = cublasStatus_t (*)(
    cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*, const void*,
    cudaDataType, int, long long, const void*, cudaDataType, int, long long,  // NOLINT(runtime/int)
    const void*, void*, cudaDataType, int, long long, int, cublasComputeType_t,  // NOLINT
    cublasGemmAlgo_t);

struct CublasApi {
  decltype(&cublasCreate) create = nullptr;
  decltype(&cublasDestroy) destroy = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasSetStream) set_stream = nullptr;
  decltype(&cublasSgemmStridedBatched) sgemm_strided_batched = nullptr;
  GemmStridedBatchedExFn gemm_strided_batched_ex = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
};

// The loaded API, or Unavailable naming the library and what dlopen said. Loaded once.
StatusOr<const CublasApi*> LoadCublas() {
  static const StatusOr<CublasApi> api = []() -> StatusOr<CublasApi> {
    const std::string name = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      return zinf::Unavailable(fmt::format("cannot load {}: {}", name, dlerror()));
    }
    CublasApi a;
    auto bind = [&](auto* fn, const char* symbol) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(lib, symbol));
      return *fn != nullptr;
    };
    if (!bind(&a.create, "cublasCreate_v2") || !bind(&a.destroy, "cublasDestroy_v2") ||
        !bind(&a.set_math_mode, "cublasSetMathMode") ||
        !bind(&a.set_stream, "cublasSetStream_v2") ||
        !bind(&a.sgemm_strided_batched, "cublasSgemmStridedBatched") ||
        !bind(&a.gemm_strided_batched_ex, "cublasGemmStridedBatchedEx") ||
        !bind(&a.status_string, "cublasGetStatusString")) {
      return zinf::Unavailable(fmt::format("{} lacks a cuBLAS function: {}", name, dlerror()));
    }
    return a;  // the library stays loaded for the process
  }();
  if (!api.ok()) return api.status();
  return &*api;
}

// Only called once LoadCublas succeeded.
const CublasApi& Cublas() { return **LoadCublas(); }

Status CublasError(cublasStatus_t s, std::string_view op) {
  if (s == CUBLAS_STATUS_SUCCESS) return zinf::OkStatus();
  return zinf::Internal(
      fmt::format("cuBLAS {}: {} ({})", op, Cublas().status_string(s), static_cast<int>(s)));
}

int64_t AlignUp(int64_t bytes) { return (bytes + kAlignBytes - 1) / kAlignBytes * kAlignBytes; }

// The [batch, rows, cols] shape of a copy from view `from` to the same elements in `to`.
cuda::ConvertShape ShapeOf(const View& from, const View& to) {
  cuda::ConvertShape shape{{1, 1, 1}, {0, 0, 0}, {0, 0, 0}};
  const int skip = 3 - from.ndims;  // a 2-d view is one batch
  for (int i = 0; i < from.ndims; ++i) {
    shape.dims[skip + i] = from.dims[i];
    shape.src_strides[skip + i] = from.strides[i];
    shape.dst_strides[skip + i] = to.strides[i];
  }
  return shape;
}

// How cuBLAS (column-major) sees a row-major view [R, C]: the matrix op(stored) is the
// view's transpose, [C, R] column-major, where the stored matrix has leading dimension ld.
struct Operand {
  cublasOperation_t op;
  int64_t ld;
};

bool AsColumnMajor(const View& v, Operand* out) {
  if (v.col_stride() == 1 && v.row_stride() >= std::max<int64_t>(v.cols(), 1)) {
    *out = {CUBLAS_OP_N, v.row_stride()};  // stored [C, R] column-major: the transpose
    return true;
  }
  if (v.row_stride() == 1 && v.col_stride() >= std::max<int64_t>(v.rows(), 1)) {
    *out = {CUBLAS_OP_T, v.col_stride()};  // stored [R, C] column-major: the view itself
    return true;
  }
  return false;
}

class CudaKernels final : public GptKernels {
 public:
  CudaKernels(std::unique_ptr<zinf::Device> device, std::unique_ptr<zinf::Stream> stream,
              std::unique_ptr<zinf::Event> done, cublasHandle_t blas, int ordinal,
              ElementType matmul_type)
      : device_(std::move(device)),
        stream_(std::move(stream)),
        done_(std::move(done)),
        cu_stream_(stream_->native_handle()),
        blas_(blas),
        ordinal_(ordinal),
        matmul_type_(matmul_type) {}

  ~CudaKernels() override {
    (void)stream_->Synchronize();
    cudaSetDevice(ordinal_);
    Cublas().destroy(blas_);
  }

  zinf::Device& device() override { return *device_; }
  ElementType matmul_type() const override { return matmul_type_; }

  StatusOr<std::vector<Tensor>> Parameters(Slot slot, const std::vector<Tensor>& fetched,
                                           const std::vector<int64_t>& numel,
                                           const std::vector<ElementType>& want,
                                           zinf::Event* ready) override {
    ZINF_RETURN_IF_ERROR(ValidateParameters(fetched, numel, want));
    ZINF_RETURN_IF_ERROR(status_);
    // The engine's gathers complete at `ready`: the stream waits for it, the host does not.
    if (ready != nullptr) ZINF_RETURN_IF_ERROR(Sticky(stream_->Wait(*ready), "parameter fetch"));
    std::vector<int64_t> bytes(fetched.size(), 0);
    for (size_t i = 0; i < fetched.size(); ++i) {
      if (fetched[i].dtype != want[i]) {
        bytes[i] = numel[i] * static_cast<int64_t>(zinf::ElementSize(want[i]));
      }
    }
    std::vector<int64_t> offsets;
    zinf::DeviceBuffer& converted = slots_[static_cast<int>(slot)];
    ZINF_RETURN_IF_ERROR(Pack(bytes, &offsets, &converted));
    std::vector<Tensor> out;
    for (size_t i = 0; i < fetched.size(); ++i) {
      if (fetched[i].dtype == want[i]) {  // the engine's tensor, in this GPU's memory
        out.push_back(fetched[i]);
        continue;
      }
      void* dst = converted.as<char>() + offsets[i];
      const cuda::ConvertShape shape{{1, 1, numel[i]}, {0, 0, 1}, {0, 0, 1}};
      cuda::LaunchConvert(fetched[i].data, fetched[i].dtype == ElementType::kBf16, dst,
                          want[i] == ElementType::kBf16, shape, cu_stream_);
      if (!CheckLaunch("parameter conversion")) return status_;
      out.push_back({dst, want[i]});
    }
    return out;
  }

  StatusOr<zinf::Event*> Done() override {
    ZINF_RETURN_IF_ERROR(status_);
    ZINF_RETURN_IF_ERROR(Sticky(stream_->Record(*done_), "recording the ops' completion"));
    return done_.get();
  }

  Status CopyToHost(float* host, const float* src, int64_t n) override {
    ZINF_RETURN_IF_ERROR(status_);
    ZINF_RETURN_IF_ERROR(Sticky(
        stream_->Copy(host, src, n * sizeof(float), zinf::CopyKind::kDeviceToHost), "download"));
    return Synchronize();
  }

  Status Synchronize() override {
    if (status_.ok()) status_ = stream_->Synchronize();
    return status_;
  }

  void SetTokens(const int32_t* tokens, const int32_t* targets, int64_t n) override {
    if (!status_.ok()) return;
    // One upload: tokens, targets, then the rows of each distinct token (a counting sort, so
    // the embedding backward adds them in row order) as unique[u], offsets[u], rows.
    std::vector<int32_t> count;
    for (int64_t r = 0; r < n; ++r) {
      if (tokens[r] >= static_cast<int32_t>(count.size())) count.resize(tokens[r] + 1, 0);
      ++count[tokens[r]];
    }
    std::vector<int32_t> unique, offsets = {0}, start(count.size());
    for (size_t v = 0; v < count.size(); ++v) {
      if (count[v] == 0) continue;
      start[v] = offsets.back();
      unique.push_back(static_cast<int32_t>(v));
      offsets.push_back(offsets.back() + count[v]);
    }
    std::vector<int32_t> rows(n);
    for (int64_t r = 0; r < n; ++r) rows[start[tokens[r]]++] = static_cast<int32_t>(r);
    unique_count_ = static_cast<int64_t>(unique.size());
    host_ints_.clear();
    host_ints_.insert(host_ints_.end(), tokens, tokens + n);
    host_ints_.insert(host_ints_.end(), targets, targets + n);
    host_ints_.insert(host_ints_.end(), rows.begin(), rows.end());
    host_ints_.insert(host_ints_.end(), unique.begin(), unique.end());
    host_ints_.insert(host_ints_.end(), offsets.begin(), offsets.end());
    const size_t bytes = host_ints_.size() * sizeof(int32_t);
    if (!Ensure(&ints_, bytes, "token buffer")) return;
    if (!Ensure(&row_loss_, n * sizeof(float), "loss buffer")) return;
    int32_t* d = ints_.as<int32_t>();
    tokens_ = d;
    targets_ = d + n;
    rows_ = d + 2 * n;
    unique_ = rows_ + n;
    offsets_ = unique_ + unique_count_;
    // From pageable memory the copy returns once host_ints_ has been staged.
    (void)Sticky(stream_->Copy(d, host_ints_.data(), bytes, zinf::CopyKind::kHostToDevice),
                 "token upload");
  }

  void EmbeddingForward(const float* wte, const float* wpe, float* x, int64_t n, int64_t t,
                        int64_t d) override {
    if (!status_.ok()) return;
    cuda::LaunchEmbeddingForward(tokens_, wte, wpe, x, n, t, d, cu_stream_);
    CheckLaunch("embedding forward");
  }

  void EmbeddingBackward(const float* dx, float* dwte, float* dwpe, int64_t n, int64_t t,
                         int64_t d) override {
    if (!status_.ok()) return;
    cuda::LaunchTokenEmbeddingBackward(unique_, offsets_, rows_, unique_count_, dx, dwte, d,
                                       cu_stream_);
    CheckLaunch("token embedding backward");
    cuda::LaunchPositionEmbeddingBackward(dx, dwpe, n, t, d, cu_stream_);
    CheckLaunch("position embedding backward");
  }

  void Matmul(const View& a, const View& b, const View& c, const float* bias, float scale,
              bool accumulate) override {
    if (!status_.ok()) return;
    if (c.dtype != ElementType::kFp32) {
      status_ = zinf::Internal("matmul: the output must be fp32");
      return;
    }
    // Operands not of the matmul type are converted into scratch first.
    const View ca = Converted(a, 0), cb = Converted(b, 1);
    if (!status_.ok()) return;
    // Row-major C = A·B is column-major C^T = B^T·A^T: B comes first.
    Operand oa{CUBLAS_OP_N, 0}, ob{CUBLAS_OP_N, 0};
    const int64_t m = c.rows(), n = c.cols(), k = ca.cols(), batch = c.batch();
    const bool shapes_ok = ca.rows() == m && cb.rows() == k && cb.cols() == n &&
                           ca.batch() == batch && cb.batch() == batch && c.col_stride() == 1 &&
                           c.row_stride() >= n && AsColumnMajor(ca, &oa) &&
                           AsColumnMajor(cb, &ob) && (bias == nullptr || c.ndims == 2);
    for (int64_t v : {m, n, k, batch, oa.ld, ob.ld, c.row_stride()}) {
      if (v > INT_MAX) status_ = zinf::Internal(fmt::format("matmul: dimension {} > INT_MAX", v));
    }
    if (!shapes_ok) {
      status_ = zinf::Internal(fmt::format(
          "matmul: unsupported views a [{}, {}] b [{}, {}] c [{}, {}] (batch {}, {}, {})",
          ca.rows(), ca.cols(), cb.rows(), cb.cols(), m, n, ca.batch(), cb.batch(), batch));
    }
    if (!status_.ok()) return;
    float* out = static_cast<float*>(const_cast<void*>(c.data));
    float beta = accumulate ? 1.0f : 0.0f;
    if (bias != nullptr) {
      cuda::LaunchBroadcastBias(out, bias, m, n, c.row_stride(), accumulate, cu_stream_);
      if (!CheckLaunch("matmul bias")) return;
      beta = 1.0f;
    }
    const float alpha = scale;
    if (matmul_type_ == ElementType::kFp32) {
      const cublasStatus_t s = Cublas().sgemm_strided_batched(
          blas_, ob.op, oa.op, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
          &alpha, static_cast<const float*>(cb.data), static_cast<int>(ob.ld), cb.batch_stride(),
          static_cast<const float*>(ca.data), static_cast<int>(oa.ld), ca.batch_stride(), &beta,
          out, static_cast<int>(c.row_stride()), c.batch_stride(), static_cast<int>(batch));
      status_ = CublasError(
          s, fmt::format("cublasSgemmStridedBatched ({}x{}x{}, batch {})", m, n, k, batch));
      return;
    }
    // bf16 inputs, fp32 output and accumulation; the default algorithm picks tensor cores.
    const cublasStatus_t s = Cublas().gemm_strided_batched_ex(
        blas_, ob.op, oa.op, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha,
        cb.data, CUDA_R_16BF, static_cast<int>(ob.ld), cb.batch_stride(), ca.data, CUDA_R_16BF,
        static_cast<int>(oa.ld), ca.batch_stride(), &beta, out, CUDA_R_32F,
        static_cast<int>(c.row_stride()), c.batch_stride(), static_cast<int>(batch),
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    status_ = CublasError(
        s, fmt::format("cublasGemmStridedBatchedEx bf16 ({}x{}x{}, batch {})", m, n, k, batch));
  }

  void LayerNormForward(const float* x, const float* gamma, const float* beta, float* y,
                        float* mean, float* var, int64_t rows, int64_t cols) override {
    if (!status_.ok()) return;
    cuda::LaunchLayerNormForward(x, gamma, beta, y, mean, var, rows, cols, kLayerNormEps,
                                 cu_stream_);
    CheckLaunch("layer norm forward");
  }

  void LayerNormBackward(const float* x, const float* gamma, const float*, const float* mean,
                         const float* var, const float* dy, float* dx, float* dgamma, float* dbeta,
                         int64_t rows, int64_t cols) override {
    if (!status_.ok()) return;
    cuda::LaunchLayerNormBackwardInput(x, gamma, mean, var, dy, dx, rows, cols, kLayerNormEps,
                                       cu_stream_);
    if (!CheckLaunch("layer norm backward")) return;
    cuda::LaunchLayerNormBackwardParams(x, mean, var, dy, dgamma, dbeta, rows, cols, kLayerNormEps,
                                        cu_stream_);
    CheckLaunch("layer norm parameter backward");
  }

  void GeluForward(const float* x, float* y, int64_t n) override {
    if (!status_.ok()) return;
    cuda::LaunchGeluForward(x, y, n, cu_stream_);
    CheckLaunch("gelu forward");
  }

  void GeluBackward(const float* x, const float* dy, float* dx, int64_t n) override {
    if (!status_.ok()) return;
    cuda::LaunchGeluBackward(x, dy, dx, n, cu_stream_);
    CheckLaunch("gelu backward");
  }

  void CausalSoftmax(float* scores, int64_t matrices, int64_t t) override {
    if (!status_.ok()) return;
    cuda::LaunchCausalSoftmax(scores, matrices * t, t, cu_stream_);
    CheckLaunch("causal softmax");
  }

  void CausalSoftmaxBackward(const float* p, float* dp, int64_t matrices, int64_t t,
                             float scale) override {
    if (!status_.ok()) return;
    cuda::LaunchCausalSoftmaxBackward(p, dp, matrices * t, t, scale, cu_stream_);
    CheckLaunch("causal softmax backward");
  }

  StatusOr<double> CrossEntropy(float* logits, int64_t rows, int64_t vocab,
                                float grad_scale) override {
    ZINF_RETURN_IF_ERROR(status_);
    cuda::LaunchCrossEntropy(logits, targets_, row_loss_.as<float>(), rows, vocab, grad_scale,
                             cu_stream_);
    CheckLaunch("cross-entropy");
    std::vector<float> row_loss(rows);
    ZINF_RETURN_IF_ERROR(CopyToHost(row_loss.data(), row_loss_.as<float>(), rows));
    double total = 0;
    for (float l : row_loss) total += l;
    return total / static_cast<double>(rows);
  }

  void AddColumnSums(const float* m, int64_t rows, int64_t cols, float* out) override {
    if (!status_.ok()) return;
    cuda::LaunchAddColumnSums(m, rows, cols, out, cu_stream_);
    CheckLaunch("column sums");
  }

  void Add(const float* a, const float* b, float* out, int64_t n) override {
    if (!status_.ok()) return;
    cuda::LaunchAdd(a, b, out, n, cu_stream_);
    CheckLaunch("add");
  }

  void Copy(float* dst, const float* src, int64_t n) override {
    if (!status_.ok()) return;
    (void)Sticky(stream_->Copy(dst, src, n * sizeof(float), zinf::CopyKind::kDeviceToDevice),
                 "copy");
  }

  void Zero(float* dst, int64_t n) override {
    if (!status_.ok()) return;
    (void)Sticky(stream_->Memset(dst, 0, n * sizeof(float)), "zero");
  }

 private:
  // Records the first error; returns it.
  Status Sticky(Status s, std::string_view op) {
    if (status_.ok() && !s.ok()) status_ = std::move(s).WithContext(std::string(op));
    return status_;
  }

  bool CheckLaunch(std::string_view op) {
    if (status_.ok()) status_ = CudaError(cudaGetLastError(), op);
    return status_.ok();
  }

  // Makes `buffer` hold at least `bytes`; an old, smaller one is freed once nothing queued
  // can use it.
  bool Ensure(zinf::DeviceBuffer* buffer, size_t bytes, std::string_view what) {
    if (!status_.ok()) return false;
    if (buffer->size_bytes() >= bytes) return true;
    if (!buffer->empty() && !Synchronize().ok()) return false;
    buffer->Reset();
    auto allocated = device_->Allocate(bytes);
    if (!allocated.ok()) return Sticky(allocated.status(), what).ok();
    *buffer = std::move(allocated).value();
    return true;
  }

  // Lays out tensors of `bytes` each in one aligned buffer; offsets in bytes.
  Status Pack(const std::vector<int64_t>& bytes, std::vector<int64_t>* offsets,
              zinf::DeviceBuffer* buffer) {
    ZINF_RETURN_IF_ERROR(status_);
    offsets->clear();
    int64_t total = 0;
    for (int64_t b : bytes) {
      offsets->push_back(total);
      total += AlignUp(b);
    }
    Ensure(buffer, static_cast<size_t>(total), "converted parameters");
    return status_;
  }

  // `v` as matmul_type_: itself when it is already, else a copy laid out by DenseCopy in
  // scratch buffer `which` (0 or 1: a matmul's two operands), enqueued on the stream. The next
  // matmul may reuse the scratch: the stream runs them in order. On failure sets status_ and
  // returns v.
  View Converted(const View& v, int which) {
    if (v.dtype == matmul_type_) return v;
    int64_t elements = 0;
    View out = DenseCopy(v, matmul_type_, &elements);
    const size_t bytes = static_cast<size_t>(elements) * zinf::ElementSize(matmul_type_);
    if (!Ensure(&scratch_[which], bytes, "matmul operand conversion")) return v;
    out.data = scratch_[which].data();
    cuda::LaunchConvert(v.data, v.dtype == ElementType::kBf16, scratch_[which].data(),
                        matmul_type_ == ElementType::kBf16, ShapeOf(v, out), cu_stream_);
    CheckLaunch("matmul operand conversion");
    return out;
  }

  std::unique_ptr<zinf::Device> device_;
  std::unique_ptr<zinf::Stream> stream_;
  std::unique_ptr<zinf::Event> done_;  // see Done()
  void* cu_stream_;
  cublasHandle_t blas_;
  const int ordinal_;
  const ElementType matmul_type_;
  Status status_;                              // the first error; sticky
  std::array<zinf::DeviceBuffer, 3> slots_;    // each slot's converted parameters
  std::array<zinf::DeviceBuffer, 2> scratch_;  // converted matmul operands
  // The batch's tokens (see SetTokens), in ints_.
  std::vector<int32_t> host_ints_;
  zinf::DeviceBuffer ints_, row_loss_;
  const int32_t *tokens_ = nullptr, *targets_ = nullptr, *rows_ = nullptr, *unique_ = nullptr,
                *offsets_ = nullptr;
  int64_t unique_count_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<GptKernels>> CreateCudaKernels(int ordinal, uint64_t memory_budget_bytes,
                                                        ElementType matmul_type) {
  if (matmul_type == ElementType::kFp16) {
    return zinf::InvalidArgument("the GPT's CUDA backend multiplies in fp32 or bf16, not fp16");
  }
  ZINF_ASSIGN_OR_RETURN(
      std::unique_ptr<zinf::Device> device,
      zinf::CreateCudaDevice({.ordinal = ordinal, .memory_budget_bytes = memory_budget_bytes}));
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<zinf::Stream> stream, device->CreateStream());
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<zinf::Event> done, device->CreateEvent());
  ZINF_RETURN_IF_ERROR(CudaError(cudaSetDevice(ordinal), "cudaSetDevice"));
  if (matmul_type == ElementType::kBf16) {
    int major = 0, minor = 0;
    ZINF_RETURN_IF_ERROR(
        CudaError(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal),
                  "cudaDeviceGetAttribute"));
    ZINF_RETURN_IF_ERROR(
        CudaError(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, ordinal),
                  "cudaDeviceGetAttribute"));
    if (major < 8) {
      return zinf::Unavailable(fmt::format(
          "bf16 matmuls need a GPU of compute capability 8.0 or later (bf16 tensor cores); "
          "GPU {} is {}.{}",
          ordinal, major, minor));
    }
  }
  ZINF_ASSIGN_OR_RETURN(const CublasApi* api, LoadCublas());
  cublasHandle_t blas = nullptr;
  ZINF_RETURN_IF_ERROR(CublasError(api->create(&blas), "cublasCreate"));
  // fp32: plain fp32, no TF32 tensor-core math even where the environment asks for it. bf16:
  // the default mode, since pedantic math would turn CUBLAS_COMPUTE_32F into its pedantic
  // variant and keep bf16 off the tensor cores; TF32 cannot enter, as no fp32 GEMM runs then.
  const cublasMath_t math =
      matmul_type == ElementType::kBf16 ? CUBLAS_DEFAULT_MATH : CUBLAS_PEDANTIC_MATH;
  Status s = CublasError(api->set_math_mode(blas, math), "cublasSetMathMode");
  if (s.ok()) {
    s = CublasError(api->set_stream(blas, static_cast<cudaStream_t>(stream->native_handle())),
                    "cublasSetStream");
  }
  if (!s.ok()) {
    api->destroy(blas);
    return s;
  }
  return std::unique_ptr<GptKernels>(new CudaKernels(std::move(device), std::move(stream),
                                                     std::move(done), blas, ordinal, matmul_type));
}

}  // namespace gpt
