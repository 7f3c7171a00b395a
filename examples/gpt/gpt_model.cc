// GPT-2 forward and backward by hand on oneDNN, parameters fetched from a zinf Engine one
// module at a time. See gpt_model.h for the contract.
//
// Note [GPT compute]
// Matmuls, LayerNorm and GELU are oneDNN primitives in fp32, created once per shape and
// cached: creating one costs more than running it many times at these sizes. Attention runs
// one sequence at a time as matmuls batched over the heads, reading q, k and v in place from
// the c_attn output through strides (a 4-d batch over sequences and heads with these strides
// falls off oneDNN's fast path). The causal softmax and the cross-entropy are plain loops:
// oneDNN's softmax has no mask, and a loop skips the masked half of each row outright.
// Weight gradients are matmuls with a sum post-op, so they accumulate into the engine's
// gradient buffers as its contract asks; bias and LayerNorm gradients are added likewise.
#include "examples/gpt/gpt_model.h"

#include <fmt/core.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <new>
#include <nlohmann/json.hpp>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <unordered_map>
#include <utility>

namespace gpt {
namespace {

using Clock = std::chrono::steady_clock;
using dnnl::memory;
using zinf::InvalidArgument;
using zinf::Status;
using zinf::StatusOr;

constexpr float kLayerNormEps = 1e-5f;
constexpr int64_t kMaxDimension = 1 << 20;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A row-major matrix, or a batch of them, anywhere in memory: dims {rows, cols} or
// {batch, rows, cols}, with strides in elements.
struct View {
  const float* data;
  memory::dims dims;
  memory::dims strides;
};

View Matrix(const float* data, int64_t rows, int64_t cols) {
  return {data, {rows, cols}, {cols, 1}};
}

// `batch` matrices [rows, cols] with row stride `ld`, `batch_stride` apart: e.g. the heads of
// q inside one sequence's [T, 3d] c_attn output.
View Batched(const float* data, int64_t batch, int64_t rows, int64_t cols, int64_t batch_stride,
             int64_t ld) {
  return {data, {batch, rows, cols}, {batch_stride, ld, 1}};
}

View Transposed(View v) {
  const size_t n = v.dims.size();
  std::swap(v.dims[n - 1], v.dims[n - 2]);
  std::swap(v.strides[n - 1], v.strides[n - 2]);
  return v;
}

// oneDNN primitives, each created on first use for its shape and kept.
class Kernels {
 public:
  Kernels() : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {}

  // c = scale * a·b, plus bias[column] when `bias` is given, plus c's old value when
  // `accumulate`.
  void Matmul(const View& a, const View& b, const View& c, const float* bias = nullptr,
              float scale = 1.0f, bool accumulate = false) {
    std::vector<int64_t> key;
    for (const View* v : {&a, &b, &c}) {
      key.insert(key.end(), v->dims.begin(), v->dims.end());
      key.insert(key.end(), v->strides.begin(), v->strides.end());
    }
    uint32_t scale_bits;
    std::memcpy(&scale_bits, &scale, 4);
    key.insert(key.end(), {bias != nullptr, accumulate, scale_bits});
    const memory::desc bias_md =
        bias != nullptr ? Md(Matrix(bias, 1, c.dims.back())) : memory::desc();
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
                                          ? dnnl::matmul::desc(Md(a), Md(b), bias_md, Md(c))
                                          : dnnl::matmul::desc(Md(a), Md(b), Md(c));
      it = matmuls_.emplace(key, dnnl::matmul({desc, attr, engine_})).first;
    }
    std::unordered_map<int, memory> args = {
        {DNNL_ARG_SRC, Mem(a)}, {DNNL_ARG_WEIGHTS, Mem(b)}, {DNNL_ARG_DST, Mem(c)}};
    if (bias != nullptr) args.emplace(DNNL_ARG_BIAS, Mem(bias_md, bias));
    it->second.execute(stream_, args);
  }

  // Each row of x [rows, cols] normalized, times gamma plus beta, into y; the row means and
  // variances are kept for the backward.
  void LayerNormForward(const float* x, const float* gamma, const float* beta, float* y,
                        float* mean, float* var, int64_t rows, int64_t cols) {
    LayerNormPrimitives& p = LayerNorm(rows, cols);
    p.forward.execute(stream_, {{DNNL_ARG_SRC, Mem(p.data, x)},
                                {DNNL_ARG_DST, Mem(p.data, y)},
                                {DNNL_ARG_MEAN, Mem(p.stat, mean)},
                                {DNNL_ARG_VARIANCE, Mem(p.stat, var)},
                                {DNNL_ARG_SCALE, Mem(p.param, gamma)},
                                {DNNL_ARG_SHIFT, Mem(p.param, beta)}});
  }

  // dx = the gradient through the LayerNorm of dy (written); the gradients of gamma and
  // beta are added into dgamma and dbeta. (oneDNN asks for beta although it does not use it.)
  void LayerNormBackward(const float* x, const float* gamma, const float* beta, const float* mean,
                         const float* var, const float* dy, float* dx, float* dgamma, float* dbeta,
                         int64_t rows, int64_t cols) {
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
  }

  // GELU with the tanh approximation (GPT-2's, torch's gelu(approximate='tanh')).
  void GeluForward(const float* x, float* y, int64_t n) {
    GeluPrimitives& p = Gelu(n);
    p.forward.execute(stream_, {{DNNL_ARG_SRC, Mem(p.data, x)}, {DNNL_ARG_DST, Mem(p.data, y)}});
  }

  // dx = dy * gelu'(x).
  void GeluBackward(const float* x, const float* dy, float* dx, int64_t n) {
    GeluPrimitives& p = Gelu(n);
    p.backward.execute(stream_, {{DNNL_ARG_SRC, Mem(p.data, x)},
                                 {DNNL_ARG_DIFF_DST, Mem(p.data, dy)},
                                 {DNNL_ARG_DIFF_SRC, Mem(p.data, dx)}});
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

  static memory::desc Md(const View& v) {
    return memory::desc(v.dims, memory::data_type::f32, v.strides);
  }
  memory Mem(const View& v) { return Mem(Md(v), v.data); }
  // oneDNN takes non-const handles for inputs too; it does not write them.
  memory Mem(const memory::desc& md, const float* data) {
    return memory(md, engine_, const_cast<float*>(data));
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

  dnnl::engine engine_;
  dnnl::stream stream_;
  std::map<std::vector<int64_t>, dnnl::matmul> matmuls_;
  std::map<std::pair<int64_t, int64_t>, LayerNormPrimitives> layer_norms_;
  std::map<int64_t, GeluPrimitives> gelus_;
};

// Softmax of each row of `matrices` [t, t] score matrices in place, row i over its first
// i + 1 entries (causal); the entries past them become 0.
void CausalSoftmax(float* scores, int64_t matrices, int64_t t) {
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
    for (int64_t j = 0; j < n; ++j) row[j] *= inv;
    std::fill(row + n, row + t, 0.0f);
  }
}

// From the softmax output p and the gradient dp of its output, the gradient of the scores
// before the softmax (and before the 1/sqrt(head_dim) `scale`), in place of dp.
void CausalSoftmaxBackward(const float* p, float* dp, int64_t matrices, int64_t t, float scale) {
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < matrices * t; ++r) {
    const float* prow = p + r * t;
    float* drow = dp + r * t;
    const int64_t n = r % t + 1;
    float dot = 0;
    for (int64_t j = 0; j < n; ++j) dot += prow[j] * drow[j];
    for (int64_t j = 0; j < n; ++j) drow[j] = prow[j] * (drow[j] - dot) * scale;
    std::fill(drow + n, drow + t, 0.0f);
  }
}

// The mean over rows of -log softmax(logits)[target]. With grad_scale != 0 the logits are
// replaced by grad_scale times the gradient of each row's loss: softmax - onehot(target).
double CrossEntropy(float* logits, const int32_t* targets, int64_t rows, int64_t vocab,
                    float grad_scale) {
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

// out[j] += sum over rows of m[row][j]: a bias gradient.
void AddColumnSums(const float* m, int64_t rows, int64_t cols, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) out[j] += m[r * cols + j];
  }
}

void Add(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

// The order of a block's parameters as registered.
enum BlockParam {
  kLn1Weight,
  kLn1Bias,
  kAttnWeight,
  kAttnBias,
  kAttnProjWeight,
  kAttnProjBias,
  kLn2Weight,
  kLn2Bias,
  kFcWeight,
  kFcBias,
  kMlpProjWeight,
  kMlpProjBias,
};

// One block's forward activations: everything its backward reads besides the block input.
struct BlockActivations {
  std::vector<float> ln1, ln1_mean, ln1_var;  // [N, d], [N], [N]
  std::vector<float> qkv;                     // [N, 3d]: q, k, v side by side, heads within
  std::vector<float> probs;                   // [B, H, T, T]: attention weights
  std::vector<float> attn;                    // [N, d]: the heads' outputs side by side
  std::vector<float> mid;                     // [N, d]: block input + attention
  std::vector<float> ln2, ln2_mean, ln2_var;
  std::vector<float> fc, gelu;  // [N, 4d]: before and after the GELU

  void Resize(int64_t n, int64_t d, int64_t probs_size) {
    for (auto* v : {&ln1, &attn, &mid, &ln2}) v->resize(n * d);
    for (auto* v : {&ln1_mean, &ln1_var, &ln2_mean, &ln2_var}) v->resize(n);
    qkv.resize(n * 3 * d);
    probs.resize(probs_size);
    fc.resize(n * 4 * d);
    gelu.resize(n * 4 * d);
  }
};

}  // namespace

Status GptConfig::Validate() const {
  for (auto [name, value] : {std::pair{"vocab_size", vocab_size},
                             {"seq_len", seq_len},
                             {"d_model", d_model},
                             {"n_layer", n_layer},
                             {"n_head", n_head}}) {
    if (value < 1 || value > kMaxDimension) {
      return InvalidArgument(
          fmt::format("model.{} must be in [1, {}], got {}", name, kMaxDimension, value));
    }
  }
  if (d_model % n_head != 0) {
    return InvalidArgument(
        fmt::format("model.d_model ({}) must be a multiple of model.n_head ({})", d_model, n_head));
  }
  return zinf::OkStatus();
}

StatusOr<GptConfig> GptConfig::FromJson(std::string_view json_object) {
  const nlohmann::json json = nlohmann::json::parse(json_object, nullptr, false);
  if (json.is_discarded()) return InvalidArgument("model: not valid JSON");
  if (!json.is_object()) {
    return InvalidArgument("model must be a JSON object, got " + json.dump());
  }
  GptConfig c;
  for (const auto& [key, value] : json.items()) {
    int* field = key == "vocab_size" ? &c.vocab_size
                 : key == "seq_len"  ? &c.seq_len
                 : key == "d_model"  ? &c.d_model
                 : key == "n_layer"  ? &c.n_layer
                 : key == "n_head"   ? &c.n_head
                                     : nullptr;
    if (field != nullptr) {
      if (!value.is_number_integer() || value.get<int64_t>() < 1 ||
          value.get<int64_t>() > kMaxDimension) {
        return InvalidArgument(fmt::format("model.{} must be an integer in [1, {}], got {}", key,
                                           kMaxDimension, value.dump()));
      }
      *field = value.get<int>();
    } else if (key == "activation_checkpointing") {
      if (!value.is_boolean()) {
        return InvalidArgument("model.activation_checkpointing must be true or false, got " +
                               value.dump());
      }
      c.activation_checkpointing = value.get<bool>();
    } else {
      return InvalidArgument(fmt::format(
          "model.{} is not a known key (known: vocab_size, seq_len, d_model, n_layer, n_head, "
          "activation_checkpointing)",
          key));
    }
  }
  ZINF_RETURN_IF_ERROR(c.Validate());
  return c;
}

int64_t GptConfig::parameter_count() const {
  const int64_t d = d_model;
  return (int64_t{vocab_size} + seq_len) * d + n_layer * (12 * d * d + 13 * d) + 2 * d;
}

struct Gpt::Impl {
  Impl(zinf::Engine& e, const GptConfig& c) : engine(e), config(c) {}

  zinf::Engine& engine;
  const GptConfig config;
  int embed = -1, ln_f = -1;
  std::vector<int> blocks;
  Kernels kernels;
  Timing timing;

  // Sized for `batch` sequences by Resize. N = batch * seq_len rows.
  int batch = 0;
  std::vector<std::vector<float>> x;   // [n_layer + 1][N, d]: the input of each block, then ln_f's
  std::vector<BlockActivations> acts;  // one per block, or one reused under checkpointing
  std::vector<float> xf, lnf_mean, lnf_var;  // ln_f's output [N, d] and statistics
  std::vector<float> logits;                 // [N, V]; backward turns them into their gradient
  // Backward scratch: gradients of a block's intermediate values, and the gradient of the
  // residual stream (dx, flowing from block to block, and dx_next, the next one).
  std::vector<float> dx, dx_next, dmid, dattn, dnorm, dln;  // [N, d]
  std::vector<float> dqkv;                                  // [N, 3d]
  std::vector<float> dprobs;                                // [B, H, T, T]
  std::vector<float> dgelu, dfc;                            // [N, 4d]

  int64_t T() const { return config.seq_len; }
  int64_t D() const { return config.d_model; }
  int64_t H() const { return config.n_head; }
  int64_t V() const { return config.vocab_size; }
  int64_t N() const { return batch * T(); }

  void Resize(int new_batch) {
    if (new_batch == batch) return;
    batch = new_batch;
    const int64_t n = N(), d = D(), probs = batch * H() * T() * T();
    x.assign(config.n_layer + 1, std::vector<float>(n * d));
    acts.resize(config.activation_checkpointing ? 1 : config.n_layer);
    for (BlockActivations& a : acts) a.Resize(n, d, probs);
    for (auto* v : {&xf, &dx, &dx_next, &dmid, &dattn, &dnorm, &dln}) v->resize(n * d);
    lnf_mean.resize(n);
    lnf_var.resize(n);
    logits.resize(n * V());
    dqkv.resize(n * 3 * d);
    dprobs.resize(probs);
    dgelu.resize(n * 4 * d);
    dfc.resize(n * 4 * d);
  }

  // Engine calls, timed.
  StatusOr<std::vector<float*>> Fetch(int module) {
    const auto t0 = Clock::now();
    auto fetched = engine.Fetch(module);
    timing.param_wait_s += SecondsSince(t0);
    if (!fetched.ok()) return fetched.status();
    return std::move(fetched->params);
  }
  Status Release(int module) {
    const auto t0 = Clock::now();
    Status s = engine.Release(module);
    timing.param_wait_s += SecondsSince(t0);
    return s;
  }
  StatusOr<std::vector<float*>> Gradients(int module) {
    const auto t0 = Clock::now();
    auto grads = engine.Gradients(module);
    timing.grad_reduce_s += SecondsSince(t0);
    return grads;
  }
  Status ReduceGradients(int module) {
    const auto t0 = Clock::now();
    Status s = engine.ReduceGradients(module);
    timing.grad_reduce_s += SecondsSince(t0);
    return s;
  }

  // q, k or v of every head of one sequence: `qkv` points into its [T, 3d] rows.
  View Heads(const float* qkv) const {
    return Batched(qkv, H(), T(), D() / H(), D() / H(), 3 * D());
  }
  View Scores(const float* probs) const { return Batched(probs, H(), T(), T(), T() * T(), T()); }

  // The block from its input `in` into `out`, keeping its activations in `a`. A null `out`
  // stops before the last projection: recomputation for backward needs only `a`.
  void BlockForward(const std::vector<float*>& p, const float* in, float* out,
                    BlockActivations& a) {
    const int64_t n = N(), d = D(), t = T();
    const float scale = 1.0f / std::sqrt(static_cast<float>(d / H()));
    kernels.LayerNormForward(in, p[kLn1Weight], p[kLn1Bias], a.ln1.data(), a.ln1_mean.data(),
                             a.ln1_var.data(), n, d);
    kernels.Matmul(Matrix(a.ln1.data(), n, d), Transposed(Matrix(p[kAttnWeight], 3 * d, d)),
                   Matrix(a.qkv.data(), n, 3 * d), p[kAttnBias]);
    for (int64_t b = 0; b < batch; ++b) {
      const float* qkv = a.qkv.data() + b * t * 3 * d;
      kernels.Matmul(Heads(qkv), Transposed(Heads(qkv + d)),
                     Scores(a.probs.data() + b * H() * t * t), nullptr, scale);
    }
    CausalSoftmax(a.probs.data(), batch * H(), t);
    for (int64_t b = 0; b < batch; ++b) {
      const float* qkv = a.qkv.data() + b * t * 3 * d;
      kernels.Matmul(Scores(a.probs.data() + b * H() * t * t), Heads(qkv + 2 * d),
                     Batched(a.attn.data() + b * t * d, H(), t, d / H(), d / H(), d));
    }
    std::copy(in, in + n * d, a.mid.begin());
    kernels.Matmul(Matrix(a.attn.data(), n, d), Transposed(Matrix(p[kAttnProjWeight], d, d)),
                   Matrix(a.mid.data(), n, d), p[kAttnProjBias], 1.0f, /*accumulate=*/true);
    kernels.LayerNormForward(a.mid.data(), p[kLn2Weight], p[kLn2Bias], a.ln2.data(),
                             a.ln2_mean.data(), a.ln2_var.data(), n, d);
    kernels.Matmul(Matrix(a.ln2.data(), n, d), Transposed(Matrix(p[kFcWeight], 4 * d, d)),
                   Matrix(a.fc.data(), n, 4 * d), p[kFcBias]);
    kernels.GeluForward(a.fc.data(), a.gelu.data(), n * 4 * d);
    if (out == nullptr) return;
    std::copy(a.mid.begin(), a.mid.end(), out);
    kernels.Matmul(Matrix(a.gelu.data(), n, 4 * d), Transposed(Matrix(p[kMlpProjWeight], d, 4 * d)),
                   Matrix(out, n, d), p[kMlpProjBias], 1.0f, /*accumulate=*/true);
  }

  // From dout, the gradient of the block's output, the gradient of its input `in` into din;
  // parameter gradients are added into g.
  void BlockBackward(const std::vector<float*>& p, const std::vector<float*>& g, const float* in,
                     const BlockActivations& a, const float* dout, float* din) {
    const int64_t n = N(), d = D(), t = T();
    const float scale = 1.0f / std::sqrt(static_cast<float>(d / H()));
    // out = mid + c_proj(gelu(c_fc(ln_2(mid))))
    kernels.Matmul(Matrix(dout, n, d), Matrix(p[kMlpProjWeight], d, 4 * d),
                   Matrix(dgelu.data(), n, 4 * d));
    kernels.Matmul(Transposed(Matrix(dout, n, d)), Matrix(a.gelu.data(), n, 4 * d),
                   Matrix(g[kMlpProjWeight], d, 4 * d), nullptr, 1.0f, /*accumulate=*/true);
    AddColumnSums(dout, n, d, g[kMlpProjBias]);
    kernels.GeluBackward(a.fc.data(), dgelu.data(), dfc.data(), n * 4 * d);
    kernels.Matmul(Transposed(Matrix(dfc.data(), n, 4 * d)), Matrix(a.ln2.data(), n, d),
                   Matrix(g[kFcWeight], 4 * d, d), nullptr, 1.0f, /*accumulate=*/true);
    AddColumnSums(dfc.data(), n, 4 * d, g[kFcBias]);
    kernels.Matmul(Matrix(dfc.data(), n, 4 * d), Matrix(p[kFcWeight], 4 * d, d),
                   Matrix(dln.data(), n, d));
    kernels.LayerNormBackward(a.mid.data(), p[kLn2Weight], p[kLn2Bias], a.ln2_mean.data(),
                              a.ln2_var.data(), dln.data(), dnorm.data(), g[kLn2Weight],
                              g[kLn2Bias], n, d);
    Add(dout, dnorm.data(), dmid.data(), n * d);

    // mid = in + c_proj(attention(c_attn(ln_1(in))))
    kernels.Matmul(Matrix(dmid.data(), n, d), Matrix(p[kAttnProjWeight], d, d),
                   Matrix(dattn.data(), n, d));
    kernels.Matmul(Transposed(Matrix(dmid.data(), n, d)), Matrix(a.attn.data(), n, d),
                   Matrix(g[kAttnProjWeight], d, d), nullptr, 1.0f, /*accumulate=*/true);
    AddColumnSums(dmid.data(), n, d, g[kAttnProjBias]);
    for (int64_t b = 0; b < batch; ++b) {
      const float* qkv = a.qkv.data() + b * t * 3 * d;
      const View dy = Batched(dattn.data() + b * t * d, H(), t, d / H(), d / H(), d);
      // dP = dY V^T; dV = P^T dY.
      kernels.Matmul(dy, Transposed(Heads(qkv + 2 * d)), Scores(dprobs.data() + b * H() * t * t));
      kernels.Matmul(Transposed(Scores(a.probs.data() + b * H() * t * t)), dy,
                     Heads(dqkv.data() + b * t * 3 * d + 2 * d));
    }
    CausalSoftmaxBackward(a.probs.data(), dprobs.data(), batch * H(), t, scale);
    for (int64_t b = 0; b < batch; ++b) {
      const float* qkv = a.qkv.data() + b * t * 3 * d;
      const View ds = Scores(dprobs.data() + b * H() * t * t);
      float* dq = dqkv.data() + b * t * 3 * d;
      // dQ = dS K; dK = dS^T Q.
      kernels.Matmul(ds, Heads(qkv + d), Heads(dq));
      kernels.Matmul(Transposed(ds), Heads(qkv), Heads(dq + d));
    }
    kernels.Matmul(Transposed(Matrix(dqkv.data(), n, 3 * d)), Matrix(a.ln1.data(), n, d),
                   Matrix(g[kAttnWeight], 3 * d, d), nullptr, 1.0f, /*accumulate=*/true);
    AddColumnSums(dqkv.data(), n, 3 * d, g[kAttnBias]);
    kernels.Matmul(Matrix(dqkv.data(), n, 3 * d), Matrix(p[kAttnWeight], 3 * d, d),
                   Matrix(dln.data(), n, d));
    kernels.LayerNormBackward(in, p[kLn1Weight], p[kLn1Bias], a.ln1_mean.data(), a.ln1_var.data(),
                              dln.data(), dnorm.data(), g[kLn1Weight], g[kLn1Bias], n, d);
    Add(dmid.data(), dnorm.data(), din, n * d);
  }

  Status CheckTokens(const int32_t* values, const char* name) const {
    if (values == nullptr) return InvalidArgument(fmt::format("{} is null", name));
    for (int64_t i = 0; i < N(); ++i) {
      if (values[i] < 0 || values[i] >= config.vocab_size) {
        return InvalidArgument(fmt::format("{}[{}] is {}; it must be in [0, {})", name, i,
                                           values[i], config.vocab_size));
      }
    }
    return zinf::OkStatus();
  }

  // Forward, and with `train` backward with the gradient reductions. Returns the mean loss.
  StatusOr<double> Run(const int32_t* tokens, const int32_t* targets, int new_batch, bool train,
                       std::vector<float>* logits_out) {
    if (new_batch < 1) return InvalidArgument(fmt::format("batch must be >= 1, got {}", new_batch));
    const auto t0 = Clock::now();
    const Timing engine_before = timing;
    Resize(new_batch);
    ZINF_RETURN_IF_ERROR(CheckTokens(tokens, "tokens"));
    ZINF_RETURN_IF_ERROR(CheckTokens(targets, "targets"));
    double loss = 0;
    try {
      ZINF_ASSIGN_OR_RETURN(loss, Compute(tokens, targets, train, logits_out));
    } catch (const dnnl::error& e) {
      return zinf::Internal(
          fmt::format("oneDNN: {} (status {})", e.what(), static_cast<int>(e.status)));
    } catch (const std::bad_alloc&) {
      return zinf::ResourceExhausted(
          fmt::format("out of memory for the activations of a batch of {} sequences", new_batch));
    }
    timing.compute_s += SecondsSince(t0) - (timing.param_wait_s - engine_before.param_wait_s) -
                        (timing.grad_reduce_s - engine_before.grad_reduce_s);
    return loss;
  }

  StatusOr<double> Compute(const int32_t* tokens, const int32_t* targets, bool train,
                           std::vector<float>* logits_out) {
    const int64_t n = N(), d = D(), L = config.n_layer;
    ZINF_ASSIGN_OR_RETURN(std::vector<float*> e, Fetch(embed));
    for (int64_t r = 0; r < n; ++r) {
      const float* tok = e[0] + tokens[r] * d;
      const float* pos = e[1] + (r % T()) * d;
      Add(tok, pos, x[0].data() + r * d, d);
    }
    ZINF_RETURN_IF_ERROR(Release(embed));
    for (int64_t l = 0; l < L; ++l) {
      ZINF_ASSIGN_OR_RETURN(std::vector<float*> p, Fetch(blocks[l]));
      BlockForward(p, x[l].data(), x[l + 1].data(), acts[config.activation_checkpointing ? 0 : l]);
      ZINF_RETURN_IF_ERROR(Release(blocks[l]));
    }
    // ln_f and the tied head (wte again), then their backward while both are fetched.
    ZINF_ASSIGN_OR_RETURN(std::vector<float*> f, Fetch(ln_f));
    kernels.LayerNormForward(x[L].data(), f[0], f[1], xf.data(), lnf_mean.data(), lnf_var.data(), n,
                             d);
    ZINF_ASSIGN_OR_RETURN(e, Fetch(embed));
    kernels.Matmul(Matrix(xf.data(), n, d), Transposed(Matrix(e[0], V(), d)),
                   Matrix(logits.data(), n, V()));
    const float grad_scale = train ? static_cast<float>(engine.loss_scale() / n) : 0.0f;
    const double loss = CrossEntropy(logits.data(), targets, n, V(), grad_scale);
    if (!train) {
      if (logits_out != nullptr) *logits_out = logits;
      ZINF_RETURN_IF_ERROR(Release(embed));
      ZINF_RETURN_IF_ERROR(Release(ln_f));
      return loss;
    }
    ZINF_ASSIGN_OR_RETURN(std::vector<float*> ge, Gradients(embed));
    kernels.Matmul(Matrix(logits.data(), n, V()), Matrix(e[0], V(), d), Matrix(dln.data(), n, d));
    kernels.Matmul(Transposed(Matrix(logits.data(), n, V())), Matrix(xf.data(), n, d),
                   Matrix(ge[0], V(), d), nullptr, 1.0f, /*accumulate=*/true);
    ZINF_RETURN_IF_ERROR(Release(embed));
    ZINF_ASSIGN_OR_RETURN(std::vector<float*> gf, Gradients(ln_f));
    kernels.LayerNormBackward(x[L].data(), f[0], f[1], lnf_mean.data(), lnf_var.data(), dln.data(),
                              dx.data(), gf[0], gf[1], n, d);
    ZINF_RETURN_IF_ERROR(ReduceGradients(ln_f));
    ZINF_RETURN_IF_ERROR(Release(ln_f));

    for (int64_t l = L - 1; l >= 0; --l) {
      ZINF_ASSIGN_OR_RETURN(std::vector<float*> p, Fetch(blocks[l]));
      ZINF_ASSIGN_OR_RETURN(std::vector<float*> g, Gradients(blocks[l]));
      BlockActivations& a = acts[config.activation_checkpointing ? 0 : l];
      if (config.activation_checkpointing) BlockForward(p, x[l].data(), nullptr, a);
      BlockBackward(p, g, x[l].data(), a, dx.data(), dx_next.data());
      dx.swap(dx_next);
      ZINF_RETURN_IF_ERROR(ReduceGradients(blocks[l]));
      ZINF_RETURN_IF_ERROR(Release(blocks[l]));
    }
    // The embedding's gradient needs no parameters: Gradients(embed) hands back the buffers
    // the head already added into.
    ZINF_ASSIGN_OR_RETURN(ge, Gradients(embed));
    for (int64_t r = 0; r < n; ++r) {
      const float* g = dx.data() + r * d;
      float* gtok = ge[0] + tokens[r] * d;
      float* gpos = ge[1] + (r % T()) * d;
      for (int64_t j = 0; j < d; ++j) {
        gtok[j] += g[j];
        gpos[j] += g[j];
      }
    }
    ZINF_RETURN_IF_ERROR(ReduceGradients(embed));
    return loss;
  }
};

std::vector<std::string> GptConfig::parameter_names() const {
  std::vector<std::string> names = {"wte.weight", "wpe.weight"};
  for (int i = 0; i < n_layer; ++i) {
    for (const char* p :
         {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
          "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight",
          "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"}) {
      names.push_back("h." + std::to_string(i) + "." + p);
    }
  }
  names.push_back("ln_f.weight");
  names.push_back("ln_f.bias");
  return names;
}

Gpt::Gpt(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gpt::~Gpt() = default;

StatusOr<std::unique_ptr<Gpt>> Gpt::Create(zinf::Engine& engine, const GptConfig& config) {
  ZINF_RETURN_IF_ERROR(config.Validate());
  auto impl = std::make_unique<Impl>(engine, config);
  const int64_t v = config.vocab_size, t = config.seq_len, d = config.d_model;
  // GPT-2's initialization; the residual projections are scaled down by the depth so that
  // the residual stream's variance does not grow with the number of blocks.
  const float init_std = 0.02f;
  const float proj_std = init_std / std::sqrt(2.0f * config.n_layer);
  using zinf::ParamInit;
  ZINF_ASSIGN_OR_RETURN(
      impl->embed,
      engine.RegisterModule("embed", {{"wte.weight", {v, d}, ParamInit::kNormal, init_std},
                                      {"wpe.weight", {t, d}, ParamInit::kNormal, init_std}}));
  for (int i = 0; i < config.n_layer; ++i) {
    const std::string h = "h." + std::to_string(i);
    // In BlockParam's order.
    ZINF_ASSIGN_OR_RETURN(
        int id, engine.RegisterModule(
                    h, {{h + ".ln_1.weight", {d}, ParamInit::kOnes},
                        {h + ".ln_1.bias", {d}, ParamInit::kZeros},
                        {h + ".attn.c_attn.weight", {3 * d, d}, ParamInit::kNormal, init_std},
                        {h + ".attn.c_attn.bias", {3 * d}, ParamInit::kZeros},
                        {h + ".attn.c_proj.weight", {d, d}, ParamInit::kNormal, proj_std},
                        {h + ".attn.c_proj.bias", {d}, ParamInit::kZeros},
                        {h + ".ln_2.weight", {d}, ParamInit::kOnes},
                        {h + ".ln_2.bias", {d}, ParamInit::kZeros},
                        {h + ".mlp.c_fc.weight", {4 * d, d}, ParamInit::kNormal, init_std},
                        {h + ".mlp.c_fc.bias", {4 * d}, ParamInit::kZeros},
                        {h + ".mlp.c_proj.weight", {d, 4 * d}, ParamInit::kNormal, proj_std},
                        {h + ".mlp.c_proj.bias", {d}, ParamInit::kZeros}}));
    impl->blocks.push_back(id);
  }
  ZINF_ASSIGN_OR_RETURN(impl->ln_f,
                        engine.RegisterModule("ln_f", {{"ln_f.weight", {d}, ParamInit::kOnes},
                                                       {"ln_f.bias", {d}, ParamInit::kZeros}}));
  return std::unique_ptr<Gpt>(new Gpt(std::move(impl)));
}

const GptConfig& Gpt::config() const { return impl_->config; }

StatusOr<double> Gpt::TrainMicroBatch(const int32_t* tokens, const int32_t* targets, int batch) {
  return impl_->Run(tokens, targets, batch, /*train=*/true, nullptr);
}

StatusOr<double> Gpt::Loss(const int32_t* tokens, const int32_t* targets, int batch,
                           std::vector<float>* logits) {
  return impl_->Run(tokens, targets, batch, /*train=*/false, logits);
}

Gpt::Timing Gpt::TakeTiming() { return std::exchange(impl_->timing, Timing()); }

void SetComputeThreads(int threads) { omp_set_num_threads(std::max(threads, 1)); }

}  // namespace gpt
