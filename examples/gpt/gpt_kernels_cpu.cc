// The GPT example's CPU backend: oneDNN primitives and plain loops, run inline on the calling
// thread (on its OpenMP threads; see SetComputeThreads). Activations live on a HostDevice, so
// they count against its budget; parameters and gradients are the engine's host buffers, used
// in place (bf16 copies of fp32 parameters go into per-slot buffers on the device).
//
// Note [GPT compute]
// Matmuls, LayerNorm and GELU are oneDNN primitives, created once per shape and cached:
// creating one costs more than running it many times at these sizes. Attention runs one
// sequence at a time as matmuls batched over the heads, reading q, k and v in place from the
// c_attn output through strides (a 4-d batch over sequences and heads with these strides
// falls off oneDNN's fast path). The causal softmax and the cross-entropy are plain loops:
// oneDNN's softmax has no mask, and a loop skips the masked half of each row outright.
// Weight gradients are matmuls with a sum post-op, so they accumulate into the engine's
// gradient buffers as its contract asks; bias and LayerNorm gradients are added likewise.
//
// Precision. Everything is fp32 except, with matmul_type() kBf16, the inputs of every matmul
// (forward, dX = dY W and dW = dY^T X, and attention's), which are bf16 with fp32
// accumulation and fp32 output, as PyTorch's autocast does: oneDNN runs them on the CPU's bf16
// dot products (AVX512_BF16's vdpbf16ps, or AMX tiles). The model asks Parameters() for its
// weight matrices in bf16, so that a module's weights are converted once per fetch (or not at
// all when the engine hands out bf16); activations are converted by a oneDNN reorder into
// scratch just before each matmul (laid out as DenseCopy says). LayerNorm, GELU, softmax,
// cross-entropy, the residual stream, every gradient buffer and the optimizer stay fp32.
// Rounding an input to bf16 moves it by at most 2^-9 of itself, so a product moves by at
// most 2^-8 of |a||b| and a matmul element by at most 2^-8 * sum |a_ik b_kj| (plus fp32
// accumulation error); tests/gpt/gpt_kernels_cpu_test.cc checks exactly that bound.
//
// The CUDA backend (gpt_kernels_cuda.cc) computes the same functions with cuBLAS and its own
// kernels; it agrees to float rounding, not bitwise.
#include <fmt/core.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <new>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <utility>

#include "examples/gpt/gpt_kernels.h"
#include "zinf/cpu_info.h"
#include "zinf/dtype.h"

namespace gpt {
namespace {

using dnnl::memory;
using zinf::Status;
using zinf::StatusOr;

constexpr float kLayerNormEps = 1e-5f;
// Converted parameters start on a cache line each.
constexpr size_t kAlignBytes = 64;
// Elements per task of a parallel conversion: large enough to amortize the task, small
// enough to spread a block's weights over the threads.
constexpr int64_t kConvertChunk = int64_t{1} << 16;
// Note [Operand conversions on one thread]
// A bf16 matmul converts its fp32 operands first, which would make one parallel region (and
// one barrier) into three. The conversions are memory-bound and short (an activation of the
// 1B model, 128 x 8192, converts in well under a millisecond), while a barrier on a machine
// whose cores other processes share costs a scheduler time slice whenever one OpenMP thread
// is descheduled. On the 2-core machine of bench/RESULTS.md, busy with other jobs, a d_model
// 2048 model ran its bf16 path at 0.71x the fp32 one with OpenMP's default active waiting and
// at 1.26x with OMP_WAIT_POLICY=passive: barriers, not arithmetic, decided. So conversions
// up to this many elements run on the calling thread alone; larger ones use every thread.
// (On the same machine at rest, interleaved, that model's bf16 / fp32 step ratio was 1.25,
// 1.28, 1.31 this way against 1.22, 1.22, 1.24 with every conversion parallel.)
constexpr int64_t kSerialConvertElements = int64_t{1} << 20;

memory::data_type DnnlType(ElementType t) {
  return t == ElementType::kBf16 ? memory::data_type::bf16 : memory::data_type::f32;
}

// OK when oneDNN will run bf16 matmuls on bf16 dot-product instructions here.
Status CheckNativeBf16() {
  const zinf::CpuIsa& isa = zinf::GetCpuInfo().isa;
  if (!isa.avx512_bf16 && !isa.amx_bf16) {
    return zinf::Unavailable(fmt::format(
        "bf16 matmuls on the CPU need AVX512_BF16 or AMX, and this CPU has neither (it has: {})",
        zinf::IsaSummary(isa)));
  }
  // The CPU has them, but oneDNN may be capped below them (ONEDNN_MAX_CPU_ISA).
  const auto effective = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  if ((effective & bf16) != bf16) {
    return zinf::Unavailable(
        fmt::format("bf16 matmuls: the CPU has {}, but oneDNN's effective ISA (0x{:x}) is below "
                    "avx512_core_bf16 (is ONEDNN_MAX_CPU_ISA set?)",
                    isa.amx_bf16 ? "AMX" : "AVX512_BF16", effective));
  }
  return zinf::OkStatus();
}

// `count` elements from `src` (of type `from`) into `dst` (of type `to`), over the OpenMP
// threads. fp32 to bf16 rounds to nearest even, as the engine's bf16 copies do.
void ConvertParallel(const void* src, ElementType from, void* dst, ElementType to, int64_t count) {
  const size_t in_size = zinf::ElementSize(from), out_size = zinf::ElementSize(to);
  const int64_t chunks = (count + kConvertChunk - 1) / kConvertChunk;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t first = c * kConvertChunk, n = std::min(kConvertChunk, count - first);
    const void* in = static_cast<const char*>(src) + first * in_size;
    void* out = static_cast<char*>(dst) + first * out_size;
    if (from == ElementType::kFp32) {
      zinf::ConvertFromFp32(static_cast<const float*>(in), to, out, n);
    } else {
      zinf::ConvertToFp32(in, from, static_cast<float*>(out), n);
    }
  }
}

class CpuKernels final : public GptKernels {
 public:
  CpuKernels(std::unique_ptr<zinf::Device> device, ElementType matmul_type)
      : device_(std::move(device)),
        matmul_type_(matmul_type),
        engine_(dnnl::engine::kind::cpu, 0),
        stream_(engine_) {}

  zinf::Device& device() override { return *device_; }
  ElementType matmul_type() const override { return matmul_type_; }

  StatusOr<std::vector<Tensor>> Parameters(Slot slot, const std::vector<Tensor>& fetched,
                                           const std::vector<int64_t>& numel,
                                           const std::vector<ElementType>& want,
                                           zinf::Event* ready) override {
    ZINF_RETURN_IF_ERROR(status_);
    ZINF_RETURN_IF_ERROR(ValidateParameters(fetched, numel, want));
    // The host device's Fetch returns complete tensors (this thread is the compute stream).
    if (ready != nullptr) ZINF_RETURN_IF_ERROR(ready->Synchronize());
    // Tensors already of their wanted type are used in place; the others are converted into
    // the slot's buffer, one after another.
    std::vector<size_t> offsets(fetched.size());
    size_t bytes = 0;
    for (size_t i = 0; i < fetched.size(); ++i) {
      if (fetched[i].dtype == want[i]) continue;
      offsets[i] = bytes;
      const size_t size = static_cast<size_t>(numel[i]) * zinf::ElementSize(want[i]);
      bytes += (size + kAlignBytes - 1) / kAlignBytes * kAlignBytes;
    }
    zinf::DeviceBuffer& buffer = slots_[static_cast<int>(slot)];
    if (buffer.size_bytes() < bytes) {
      buffer.Reset();
      auto allocated = device_->Allocate(bytes);
      if (!allocated.ok()) {
        return std::move(allocated).status().WithContext("converted parameters");
      }
      buffer = std::move(allocated).value();
    }
    std::vector<Tensor> out(fetched.size());
    for (size_t i = 0; i < fetched.size(); ++i) {
      if (fetched[i].dtype == want[i]) {
        out[i] = fetched[i];
        continue;
      }
      void* dst = buffer.as<char>() + offsets[i];
      ConvertParallel(fetched[i].data, fetched[i].dtype, dst, want[i], numel[i]);
      out[i] = {dst, want[i]};
    }
    return out;
  }
  // Every op has run when it returns.
  StatusOr<zinf::Event*> Done() override {
    ZINF_RETURN_IF_ERROR(status_);
    return nullptr;
  }
  Status CopyToHost(float* host, const float* src, int64_t n) override {
    ZINF_RETURN_IF_ERROR(status_);
    std::copy(src, src + n, host);
    return status_;
  }
  Status Synchronize() override { return status_; }

  void SetTokens(const int32_t* tokens, const int32_t* targets, int64_t n) override {
    tokens_.assign(tokens, tokens + n);
    targets_.assign(targets, targets + n);
  }

  void EmbeddingForward(const float* wte, const float* wpe, float* x, int64_t n, int64_t t,
                        int64_t d) override {
    if (!status_.ok()) return;
    for (int64_t r = 0; r < n; ++r) {
      Add(wte + tokens_[r] * d, wpe + (r % t) * d, x + r * d, d);
    }
  }

  void EmbeddingBackward(const float* dx, float* dwte, float* dwpe, int64_t n, int64_t t,
                         int64_t d) override {
    if (!status_.ok()) return;
    for (int64_t r = 0; r < n; ++r) {
      const float* g = dx + r * d;
      float* gtok = dwte + tokens_[r] * d;
      float* gpos = dwpe + (r % t) * d;
      for (int64_t j = 0; j < d; ++j) {
        gtok[j] += g[j];
        gpos[j] += g[j];
      }
    }
  }

  void Matmul(const View& a, const View& b, const View& c, const float* bias, float scale,
              bool accumulate) override {
    Run("matmul", [&] {
      if (c.dtype != ElementType::kFp32) {
        status_ = zinf::Internal("matmul: the output must be fp32");
        return;
      }
      // Operands not of the matmul type are converted into scratch first (Note [GPT compute]).
      const View ca = Converted(a, 0), cb = Converted(b, 1);
      if (!status_.ok()) return;
      std::vector<int64_t> key;
      for (const View* v : {&ca, &cb, &c}) {
        key.insert(key.end(), v->dims.begin(), v->dims.begin() + v->ndims);
        key.insert(key.end(), v->strides.begin(), v->strides.begin() + v->ndims);
        key.push_back(static_cast<int64_t>(v->dtype));
      }
      uint32_t scale_bits;
      std::memcpy(&scale_bits, &scale, 4);
      key.insert(key.end(), {bias != nullptr, accumulate, scale_bits});
      const memory::desc bias_md =
          bias != nullptr ? Md(gpt::Matrix(bias, 1, c.cols())) : memory::desc();
      auto it = matmuls_.find(key);
      if (it == matmuls_.end()) {
        dnnl::primitive_attr attr;
        if (scale != 1.0f) attr.set_output_scales(0, {scale});
        if (accumulate) {
          dnnl::post_ops ops;
          ops.append_sum(1.0f);
          attr.set_post_ops(ops);
        }
        const dnnl::matmul::desc desc = bias != nullptr
                                            ? dnnl::matmul::desc(Md(ca), Md(cb), bias_md, Md(c))
                                            : dnnl::matmul::desc(Md(ca), Md(cb), Md(c));
        it = matmuls_.emplace(key, dnnl::matmul({desc, attr, engine_})).first;
      }
      std::unordered_map<int, memory> args = {
          {DNNL_ARG_SRC, Mem(ca)}, {DNNL_ARG_WEIGHTS, Mem(cb)}, {DNNL_ARG_DST, Mem(c)}};
      if (bias != nullptr) args.emplace(DNNL_ARG_BIAS, Mem(bias_md, bias));
      it->second.execute(stream_, args);
    });
  }

  void LayerNormForward(const float* x, const float* gamma, const float* beta, float* y,
                        float* mean, float* var, int64_t rows, int64_t cols) override {
    Run("layer norm forward", [&] {
      LayerNormPrimitives& p = LayerNorm(rows, cols);
      p.forward.execute(stream_, {{DNNL_ARG_SRC, Mem(p.data, x)},
                                  {DNNL_ARG_DST, Mem(p.data, y)},
                                  {DNNL_ARG_MEAN, Mem(p.stat, mean)},
                                  {DNNL_ARG_VARIANCE, Mem(p.stat, var)},
                                  {DNNL_ARG_SCALE, Mem(p.param, gamma)},
                                  {DNNL_ARG_SHIFT, Mem(p.param, beta)}});
    });
  }

  // (oneDNN asks for beta although it does not use it.)
  void LayerNormBackward(const float* x, const float* gamma, const float* beta, const float* mean,
                         const float* var, const float* dy, float* dx, float* dgamma, float* dbeta,
                         int64_t rows, int64_t cols) override {
    Run("layer norm backward", [&] {
      LayerNormPrimitives& p = LayerNorm(rows, cols);
      float* dscale = p.dparams.data();
      float* dshift = dscale + cols;
      p.backward.execute(stream_, {{DNNL_ARG_SRC, Mem(p.data, x)},
                                   {DNNL_ARG_MEAN, Mem(p.stat, mean)},
                                   {DNNL_ARG_VARIANCE, Mem(p.stat, var)},
                                   {DNNL_ARG_DIFF_DST, Mem(p.data, dy)},
                                   {DNNL_ARG_SCALE, Mem(p.param, gamma)},
                                   {DNNL_ARG_SHIFT, Mem(p.param, beta)},
                                   {DNNL_ARG_DIFF_SRC, Mem(p.data, dx)},
                                   {DNNL_ARG_DIFF_SCALE, Mem(p.param, dscale)},
                                   {DNNL_ARG_DIFF_SHIFT, Mem(p.param, dshift)}});
      for (int64_t j = 0; j < cols; ++j) {
        dgamma[j] += dscale[j];
        dbeta[j] += dshift[j];
      }
    });
  }

  void GeluForward(const float* x, float* y, int64_t n) override {
    Run("gelu forward", [&] {
      GeluPrimitives& p = Gelu(n);
      p.forward.execute(stream_, {{DNNL_ARG_SRC, Mem(p.data, x)}, {DNNL_ARG_DST, Mem(p.data, y)}});
    });
  }

  void GeluBackward(const float* x, const float* dy, float* dx, int64_t n) override {
    Run("gelu backward", [&] {
      GeluPrimitives& p = Gelu(n);
      p.backward.execute(stream_, {{DNNL_ARG_SRC, Mem(p.data, x)},
                                   {DNNL_ARG_DIFF_DST, Mem(p.data, dy)},
                                   {DNNL_ARG_DIFF_SRC, Mem(p.data, dx)}});
    });
  }

  void CausalSoftmax(float* scores, int64_t matrices, int64_t t) override {
    if (!status_.ok()) return;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < matrices * t; ++r) {
      float* row = scores + r * t;
      const int64_t n = r % t + 1;
      const float max = *std::max_element(row, row + n);
      float sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        row[j] = std::exp(row[j] - max);
        sum += row[j];
      }
      const float inv = 1.0f / sum;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) row[j] *= inv;
      std::fill(row + n, row + t, 0.0f);
    }
  }

  void CausalSoftmaxBackward(const float* p, float* dp, int64_t matrices, int64_t t,
                             float scale) override {
    if (!status_.ok()) return;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < matrices * t; ++r) {
      const float* prow = p + r * t;
      float* drow = dp + r * t;
      const int64_t n = r % t + 1;
      float dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < n; ++j) dot += prow[j] * drow[j];
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) drow[j] = prow[j] * (drow[j] - dot) * scale;
      std::fill(drow + n, drow + t, 0.0f);
    }
  }

  StatusOr<double> CrossEntropy(float* logits, int64_t rows, int64_t vocab,
                                float grad_scale) override {
    ZINF_RETURN_IF_ERROR(status_);
    const int32_t* targets = targets_.data();
    double total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total)
    for (int64_t r = 0; r < rows; ++r) {
      float* z = logits + r * vocab;
      const float max = *std::max_element(z, z + vocab);
      float sum = 0;
      for (int64_t j = 0; j < vocab; ++j) sum += std::exp(z[j] - max);
      const float log_sum = max + std::log(sum);
      total += log_sum - z[targets[r]];
      if (grad_scale != 0) {
        for (int64_t j = 0; j < vocab; ++j) z[j] = std::exp(z[j] - log_sum) * grad_scale;
        z[targets[r]] -= grad_scale;
      }
    }
    return total / static_cast<double>(rows);
  }

  void AddColumnSums(const float* m, int64_t rows, int64_t cols, float* out) override {
    if (!status_.ok()) return;
    // (omp simd here and in Add: the arrays never overlap, which the compiler cannot know.)
    for (int64_t r = 0; r < rows; ++r) {
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) out[j] += m[r * cols + j];
    }
  }

  void Add(const float* a, const float* b, float* out, int64_t n) override {
    if (!status_.ok()) return;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
  }

  void Copy(float* dst, const float* src, int64_t n) override {
    if (status_.ok()) std::copy(src, src + n, dst);
  }
  void Zero(float* dst, int64_t n) override {
    if (status_.ok()) std::fill(dst, dst + n, 0.0f);
  }

 private:
  struct LayerNormPrimitives {
    memory::desc data, stat, param;
    dnnl::layer_normalization_forward forward;
    dnnl::layer_normalization_backward backward;
    std::vector<float> dparams;  // oneDNN writes dgamma, dbeta here; we add them up
  };
  struct GeluPrimitives {
    memory::desc data;
    dnnl::eltwise_forward forward;
    dnnl::eltwise_backward backward;
  };

  // Runs a oneDNN call, turning its exceptions into the sticky error.
  template <typename Fn>
  void Run(const char* op, Fn&& fn) {
    if (!status_.ok()) return;
    try {
      fn();
    } catch (const dnnl::error& e) {
      status_ = zinf::Internal(
          fmt::format("oneDNN {}: {} (status {})", op, e.what(), static_cast<int>(e.status)));
    } catch (const std::bad_alloc&) {
      status_ = zinf::ResourceExhausted(fmt::format("oneDNN {}: out of host memory", op));
    }
  }

  static memory::desc Md(const View& v) {
    return memory::desc(memory::dims(v.dims.begin(), v.dims.begin() + v.ndims), DnnlType(v.dtype),
                        memory::dims(v.strides.begin(), v.strides.begin() + v.ndims));
  }
  memory Mem(const View& v) { return Mem(Md(v), v.data); }
  // oneDNN takes non-const handles for inputs too; it does not write them.
  memory Mem(const memory::desc& md, const void* data) {
    return memory(md, engine_, const_cast<void*>(data));
  }

  // `v` as matmul_type_: itself when it is already, else a copy in scratch buffer `which` (0
  // or 1: a matmul's two operands) laid out by DenseCopy. On failure sets status_ and
  // returns v.
  View Converted(const View& v, int which) {
    if (v.dtype == matmul_type_) return v;
    int64_t elements = 0;
    View out = DenseCopy(v, matmul_type_, &elements);
    const size_t bytes = static_cast<size_t>(elements) * zinf::ElementSize(matmul_type_);
    zinf::DeviceBuffer& buffer = scratch_[which];
    if (buffer.size_bytes() < bytes) {
      buffer.Reset();
      auto allocated = device_->Allocate(bytes);
      if (!allocated.ok()) {
        status_ = std::move(allocated).status().WithContext("matmul operand conversion");
        return v;
      }
      buffer = std::move(allocated).value();
    }
    out.data = buffer.data();
    std::vector<int64_t> key;
    for (const View* x : {&v, static_cast<const View*>(&out)}) {
      key.insert(key.end(), x->dims.begin(), x->dims.begin() + x->ndims);
      key.insert(key.end(), x->strides.begin(), x->strides.begin() + x->ndims);
      key.push_back(static_cast<int64_t>(x->dtype));
    }
    auto it = reorders_.find(key);
    if (it == reorders_.end()) {
      it = reorders_
               .emplace(key, dnnl::reorder(
                                 dnnl::reorder::primitive_desc(engine_, Md(v), engine_, Md(out))))
               .first;
    }
    // Small ones on this thread alone: see Note [Operand conversions on one thread].
    const int threads = omp_get_max_threads();
    if (elements <= kSerialConvertElements) omp_set_num_threads(1);
    it->second.execute(stream_, {{DNNL_ARG_FROM, Mem(v)}, {DNNL_ARG_TO, Mem(out)}});
    omp_set_num_threads(threads);
    return out;
  }

  LayerNormPrimitives& LayerNorm(int64_t rows, int64_t cols) {
    auto it = layer_norms_.find({rows, cols});
    if (it != layer_norms_.end()) return it->second;
    using dnnl::normalization_flags;
    using dnnl::prop_kind;
    const auto flags = normalization_flags::use_scale | normalization_flags::use_shift;
    LayerNormPrimitives p;
    p.data = memory::desc({rows, cols}, memory::data_type::f32, memory::format_tag::ab);
    p.stat = memory::desc({rows}, memory::data_type::f32, memory::format_tag::a);
    p.param = memory::desc({cols}, memory::data_type::f32, memory::format_tag::a);
    const dnnl::layer_normalization_forward::primitive_desc forward(
        {prop_kind::forward_training, p.data, p.stat, kLayerNormEps, flags}, engine_);
    p.forward = dnnl::layer_normalization_forward(forward);
    p.backward = dnnl::layer_normalization_backward(
        {{prop_kind::backward, p.data, p.data, p.stat, kLayerNormEps, flags}, engine_, forward});
    p.dparams.resize(2 * cols);
    return layer_norms_.emplace(std::pair{rows, cols}, std::move(p)).first->second;
  }

  GeluPrimitives& Gelu(int64_t n) {
    auto it = gelus_.find(n);
    if (it != gelus_.end()) return it->second;
    const auto algorithm = dnnl::algorithm::eltwise_gelu_tanh;
    GeluPrimitives p;
    p.data = memory::desc({n}, memory::data_type::f32, memory::format_tag::a);
    const dnnl::eltwise_forward::primitive_desc forward(
        {dnnl::prop_kind::forward_training, algorithm, p.data, 0.0f, 0.0f}, engine_);
    p.forward = dnnl::eltwise_forward(forward);
    p.backward =
        dnnl::eltwise_backward({{algorithm, p.data, p.data, 0.0f, 0.0f}, engine_, forward});
    return gelus_.emplace(n, std::move(p)).first->second;
  }

  std::unique_ptr<zinf::Device> device_;
  const ElementType matmul_type_;
  dnnl::engine engine_;
  dnnl::stream stream_;
  Status status_;  // the first error; sticky
  std::vector<int32_t> tokens_, targets_;
  std::array<zinf::DeviceBuffer, 3> slots_;    // converted parameters, one buffer per Slot
  std::array<zinf::DeviceBuffer, 2> scratch_;  // converted matmul operands
  std::map<std::vector<int64_t>, dnnl::matmul> matmuls_;
  std::map<std::vector<int64_t>, dnnl::reorder> reorders_;
  std::map<std::pair<int64_t, int64_t>, LayerNormPrimitives> layer_norms_;
  std::map<int64_t, GeluPrimitives> gelus_;
};

}  // namespace

StatusOr<std::unique_ptr<GptKernels>> CreateCpuKernels(uint64_t memory_budget_bytes,
                                                       ElementType matmul_type) {
  if (matmul_type == ElementType::kFp16) {
    return zinf::InvalidArgument("the GPT's CPU backend multiplies in fp32 or bf16, not fp16");
  }
  if (matmul_type == ElementType::kBf16) ZINF_RETURN_IF_ERROR(CheckNativeBf16());
  if (memory_budget_bytes == 0) memory_budget_bytes = zinf::GetCpuInfo().total_memory_bytes;
  // Where /proc/meminfo does not say, leave the budget to the allocator.
  if (memory_budget_bytes == 0) memory_budget_bytes = uint64_t{1} << 50;
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<zinf::Device> device,
                        zinf::CreateHostDevice({.memory_budget_bytes = memory_budget_bytes}));
  try {
    return std::unique_ptr<GptKernels>(new CpuKernels(std::move(device), matmul_type));
  } catch (const dnnl::error& e) {
    return zinf::Internal(fmt::format("oneDNN: cannot create a CPU engine: {}", e.what()));
  }
}

}  // namespace gpt
