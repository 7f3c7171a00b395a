// GPT-2 forward and backward by hand, parameters fetched from a zinf Engine one module at a
// time, compute on a GptKernels backend (gpt_kernels.h: oneDNN on the CPU, cuBLAS on CUDA).
// See gpt_model.h for the contract and Note [GPT compute] in gpt_kernels_cpu.cc.
//
// Note [GPT staging]
// The model code is the same for every backend, and the backend computes where the engine
// does (Engine::compute_device_name): the CPU backend on the host device, the CUDA backend on
// cuda:N. The engine's fetched parameters and gradient buffers are therefore backend memory and
// are used where they are: weight matrices arrive in the engine's compute precision (bf16
// under EngineConfig::bf16, which bf16 matmuls take in place); only tensors the ops want in
// another type (fp32 LayerNorm parameters from a bf16 engine, say) are converted into the
// backend's slot buffers. Backward writes the engine's gradient buffers directly. On CUDA
// nothing waits on the host: the backend's stream waits for each fetch's ready event, and
// Release and ReduceGradients receive an event recorded after the ops that use the module
// (GptKernels::Done), so the engine reuses or reads those tensors in stream order. The
// embedding gets gradient twice, from the tied head (before the blocks' backward) and from
// the input embedding (after): Gradients(embed) hands back the same buffers both times.
#include "examples/gpt/gpt_model.h"

#include <fmt/core.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <utility>

#include "examples/gpt/gpt_kernels.h"

namespace gpt {
namespace {

using Clock = std::chrono::steady_clock;
using zinf::InvalidArgument;
using zinf::Status;
using zinf::StatusOr;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
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

// One block's forward activations, in backend memory: everything its backward reads besides
// the block input.
struct BlockActivations {
  float *ln1, *ln1_mean, *ln1_var;  // [N, d], [N], [N]
  float* qkv;                       // [N, 3d]: q, k, v side by side, heads within
  float* probs;                     // [B, H, T, T]: attention weights
  float* attn;                      // [N, d]: the heads' outputs side by side
  float* mid;                       // [N, d]: block input + attention
  float *ln2, *ln2_mean, *ln2_var;
  float *fc, *gelu;  // [N, 4d]: before and after the GELU
};

}  // namespace

struct Gpt::Impl {
  Impl(zinf::Engine& e, const GptConfig& c, std::unique_ptr<GptKernels> k)
      : engine(e), config(c), kernels(std::move(k)) {}
  ~Impl() {
    // The buffers below may still be in use by queued work.
    (void)kernels->Synchronize();
  }

  zinf::Engine& engine;
  const GptConfig config;
  std::unique_ptr<GptKernels> kernels;
  int embed = -1, ln_f = -1;
  std::vector<int> blocks;
  // Elements of each parameter of the embedding, of a block and of ln_f, in registration order.
  std::vector<int64_t> embed_numel, block_numel, ln_f_numel;
  // The types the model asks Parameters() for: weight matrices in the matmul type, the rest
  // (LayerNorm parameters, biases, and the embedding tables for the lookup) in fp32.
  std::vector<ElementType> block_want, head_want, fp32_2;
  Timing timing;

  // Sized for `batch` sequences by Resize, in backend memory. N = batch * seq_len rows.
  int batch = 0;
  zinf::DeviceBuffer activations;      // owns every pointer below
  std::vector<float*> x;               // [n_layer + 1][N, d]: the input of each block, then ln_f's
  std::vector<BlockActivations> acts;  // one per block, or one reused under checkpointing
  float *xf, *lnf_mean, *lnf_var;      // ln_f's output [N, d] and statistics
  float* logits;                       // [N, V]; backward turns them into their gradient
  // Backward scratch: gradients of a block's intermediate values, and the gradient of the
  // residual stream (dx, flowing from block to block, and dx_next, the next one).
  float *dx, *dx_next, *dmid, *dattn, *dnorm, *dln;  // [N, d]
  float* dqkv;                                       // [N, 3d]
  float* dprobs;                                     // [B, H, T, T]
  float *dgelu, *dfc;                                // [N, 4d]

  // Note [Layer-major GPT]
  // Under zinf.layer_major the batch's micro-batches go through each module together (Note
  // [Layer-major micro-batches] in src/zero/engine.cc): TrainBatch fetches every module once
  // in forward and once in backward. It keeps each micro-batch's block inputs (its
  // checkpoints: backward recomputes a block's activations from them, as activation
  // checkpointing does) and the gradient flowing back through it. Each micro-batch's
  // parameter gradients are computed into zeroed scratch, exactly as the micro-batch-major
  // schedule computes them into the engine's zeroed buffers, and added into the module's one
  // buffer in micro-batch order, as the engine adds reduced micro-batches: on one rank the
  // two schedules give the same bits. The tied embedding gets its head part early in backward
  // and its lookup part at the end, so it keeps one scratch per micro-batch.
  struct LayerMajor {
    int micro = 0, batch = 0;
    zinf::DeviceBuffer arena;             // owns every pointer below
    std::vector<std::vector<float*>> xs;  // [micro][n_layer + 1]: the blocks' inputs, ln_f's
    std::vector<float*> dxs;              // [micro]: the gradient flowing back
    float* spare = nullptr;               // the next block's dxs, swapped in
    std::vector<float*> block_grads;      // one block's gradients, per parameter
    std::vector<float*> ln_f_grads;       // [weight, bias]
    std::vector<std::vector<float*>> embed_grads;  // [micro][wte, wpe]
  } lm;

  int64_t T() const { return config.seq_len; }
  int64_t D() const { return config.d_model; }
  int64_t H() const { return config.n_head; }
  int64_t V() const { return config.vocab_size; }
  int64_t N() const { return batch * T(); }

  Status Resize(int new_batch) {
    if (new_batch == batch) return zinf::OkStatus();
    // Nothing queued may still use the old buffers; a sticky error is reported by the ops.
    (void)kernels->Synchronize();
    batch = 0;
    activations = zinf::DeviceBuffer();
    // Checked first: every product below is then at most `needed` and cannot overflow.
    ZINF_ASSIGN_OR_RETURN(const uint64_t needed, config.ActivationBytes(new_batch));
    const int64_t n = new_batch * T(), d = D(), probs = new_batch * H() * T() * T();
    // Every array is a slice of one zeroed allocation, each starting on 256 bytes: one
    // allocation instead of dozens, each of which the host allocator would round up to a page.
    std::vector<std::pair<int64_t, float**>> arrays;
    auto want = [&](int64_t count, float** v) { arrays.emplace_back((count + 63) / 64 * 64, v); };
    x.assign(config.n_layer + 1, nullptr);
    for (float*& v : x) want(n * d, &v);
    acts.resize(config.activation_checkpointing ? 1 : config.n_layer);
    for (BlockActivations& a : acts) {
      for (float** v : {&a.ln1, &a.attn, &a.mid, &a.ln2}) want(n * d, v);
      for (float** v : {&a.ln1_mean, &a.ln1_var, &a.ln2_mean, &a.ln2_var}) want(n, v);
      want(n * 3 * d, &a.qkv);
      want(probs, &a.probs);
      want(n * 4 * d, &a.fc);
      want(n * 4 * d, &a.gelu);
    }
    for (float** v : {&xf, &dx, &dx_next, &dmid, &dattn, &dnorm, &dln}) want(n * d, v);
    for (float** v : {&lnf_mean, &lnf_var}) want(n, v);
    want(n * V(), &logits);
    want(n * 3 * d, &dqkv);
    want(probs, &dprobs);
    want(n * 4 * d, &dgelu);
    want(n * 4 * d, &dfc);
    int64_t total = 0;
    for (const auto& [count, v] : arrays) total += count;
    if (static_cast<uint64_t>(total) * sizeof(float) != needed) {
      return zinf::Internal(fmt::format("activations: laid out {} bytes, ActivationBytes says {}",
                                        total * sizeof(float), needed));
    }
    auto arena = kernels->device().Allocate(static_cast<size_t>(total) * sizeof(float));
    Status status = arena.status();
    if (status.ok()) {
      float* at = arena->as<float>();
      kernels->Zero(at, total);
      for (const auto& [count, v] : arrays) {
        *v = at;
        at += count;
      }
      status = kernels->Synchronize();
    }
    if (!status.ok()) {
      return std::move(status).WithContext(fmt::format(
          "activations of a batch of {} sequences on {}", new_batch, kernels->device().name()));
    }
    activations = std::move(*arena);
    batch = new_batch;
    return zinf::OkStatus();
  }

  Status ResizeLayerMajor(int micro) {
    if (lm.micro == micro && lm.batch == batch) return zinf::OkStatus();
    (void)kernels->Synchronize();
    lm = LayerMajor();
    const int64_t nd = N() * D();
    std::vector<std::pair<int64_t, float**>> arrays;
    auto want = [&](int64_t count, float** v) { arrays.emplace_back((count + 63) / 64 * 64, v); };
    lm.xs.assign(micro, std::vector<float*>(config.n_layer + 1));
    lm.dxs.assign(micro, nullptr);
    for (int g = 0; g < micro; ++g) {
      for (float*& v : lm.xs[g]) want(nd, &v);
      want(nd, &lm.dxs[g]);
    }
    want(nd, &lm.spare);
    auto grads = [&](const std::vector<int64_t>& numel, std::vector<float*>* out) {
      out->assign(numel.size(), nullptr);
      for (size_t i = 0; i < numel.size(); ++i) want(numel[i], &(*out)[i]);
    };
    grads(block_numel, &lm.block_grads);
    grads(ln_f_numel, &lm.ln_f_grads);
    lm.embed_grads.resize(micro);
    for (std::vector<float*>& e : lm.embed_grads) grads(embed_numel, &e);
    int64_t total = 0;
    for (const auto& [count, v] : arrays) total += count;
    auto arena = kernels->device().Allocate(static_cast<size_t>(total) * sizeof(float));
    if (!arena.ok()) {
      return std::move(arena).status().WithContext(fmt::format(
          "zinf.layer_major: the checkpoints and gradient scratch of {} micro-batches of {} "
          "sequences on {}",
          micro, batch, kernels->device().name()));
    }
    float* at = arena->as<float>();
    for (const auto& [count, v] : arrays) {
      *v = at;
      at += count;
    }
    lm.arena = std::move(*arena);
    lm.micro = micro;
    lm.batch = batch;
    return zinf::OkStatus();
  }

  // Scratch gradients `scratch` of one micro-batch into the module's buffers `into`: the first
  // micro-batch's copied, the rest added, as the engine accumulates reduced micro-batches.
  void AddMicroBatch(const std::vector<float*>& into, const std::vector<float*>& scratch,
                     const std::vector<int64_t>& numel, bool first) {
    for (size_t i = 0; i < into.size(); ++i) {
      if (first) {
        kernels->Copy(into[i], scratch[i], numel[i]);
      } else {
        kernels->Add(into[i], scratch[i], into[i], numel[i]);
      }
    }
  }
  void ZeroAll(const std::vector<float*>& arrays, const std::vector<int64_t>& numel) {
    for (size_t i = 0; i < arrays.size(); ++i) kernels->Zero(arrays[i], numel[i]);
  }

  // Engine calls, timed. Fetch hands back the module's parameters in backend memory, each in
  // the type `want` names.
  StatusOr<std::vector<Tensor>> Fetch(int module, Slot slot, const std::vector<int64_t>& numel,
                                      const std::vector<ElementType>& want) {
    const auto t0 = Clock::now();
    auto fetched = engine.Fetch(module);
    timing.param_wait_s += SecondsSince(t0);
    if (!fetched.ok()) return fetched.status();
    // The engine's compute precision as it is; fp16, which the backends do not take, as its
    // fp32 view (handed out on the host device only: Create refuses fp16 elsewhere).
    std::vector<Tensor> tensors;
    for (size_t i = 0; i < fetched->tensors.size(); ++i) {
      const zinf::ParamTensor& p = fetched->tensors[i];
      if (p.dtype == ElementType::kFp16) {
        if (i >= fetched->params.size()) {
          return zinf::FailedPrecondition("fp16 parameters without the engine's fp32 view");
        }
        tensors.push_back({fetched->params[i], ElementType::kFp32});
      } else {
        tensors.push_back({p.data, p.dtype});
      }
    }
    return kernels->Parameters(slot, tensors, numel, want, fetched->ready);
  }
  // Ends the module's use once the ops queued so far have run.
  Status Release(int module) {
    ZINF_ASSIGN_OR_RETURN(zinf::Event * done, kernels->Done());
    const auto t0 = Clock::now();
    Status s = engine.Release(module, done);
    timing.param_wait_s += SecondsSince(t0);
    return s;
  }
  StatusOr<std::vector<float*>> Gradients(int module) {
    const auto t0 = Clock::now();
    auto grads = engine.Gradients(module);
    timing.grad_reduce_s += SecondsSince(t0);
    return grads;
  }
  // Reduces the module's gradients once the ops queued so far (its backward) have run.
  Status ReduceGradients(int module) {
    ZINF_ASSIGN_OR_RETURN(zinf::Event * ready, kernels->Done());
    const auto t0 = Clock::now();
    Status s = engine.ReduceGradients(module, ready);
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
  void BlockForward(const std::vector<Tensor>& p, const float* in, float* out,
                    BlockActivations& a) {
    GptKernels& k = *kernels;
    const int64_t n = N(), d = D(), t = T();
    const float scale = 1.0f / std::sqrt(static_cast<float>(d / H()));
    k.LayerNormForward(in, p[kLn1Weight].f32(), p[kLn1Bias].f32(), a.ln1, a.ln1_mean, a.ln1_var, n,
                       d);
    k.Matmul(Matrix(a.ln1, n, d), Transposed(Matrix(p[kAttnWeight], 3 * d, d)),
             Matrix(a.qkv, n, 3 * d), p[kAttnBias].f32());
    for (int64_t b = 0; b < batch; ++b) {
      const float* qkv = a.qkv + b * t * 3 * d;
      k.Matmul(Heads(qkv), Transposed(Heads(qkv + d)), Scores(a.probs + b * H() * t * t), nullptr,
               scale);
    }
    k.CausalSoftmax(a.probs, batch * H(), t);
    for (int64_t b = 0; b < batch; ++b) {
      const float* qkv = a.qkv + b * t * 3 * d;
      k.Matmul(Scores(a.probs + b * H() * t * t), Heads(qkv + 2 * d),
               Batched(a.attn + b * t * d, H(), t, d / H(), d / H(), d));
    }
    k.Copy(a.mid, in, n * d);
    k.Matmul(Matrix(a.attn, n, d), Transposed(Matrix(p[kAttnProjWeight], d, d)),
             Matrix(a.mid, n, d), p[kAttnProjBias].f32(), 1.0f, /*accumulate=*/true);
    k.LayerNormForward(a.mid, p[kLn2Weight].f32(), p[kLn2Bias].f32(), a.ln2, a.ln2_mean, a.ln2_var,
                       n, d);
    k.Matmul(Matrix(a.ln2, n, d), Transposed(Matrix(p[kFcWeight], 4 * d, d)),
             Matrix(a.fc, n, 4 * d), p[kFcBias].f32());
    k.GeluForward(a.fc, a.gelu, n * 4 * d);
    if (out == nullptr) return;
    k.Copy(out, a.mid, n * d);
    k.Matmul(Matrix(a.gelu, n, 4 * d), Transposed(Matrix(p[kMlpProjWeight], d, 4 * d)),
             Matrix(out, n, d), p[kMlpProjBias].f32(), 1.0f, /*accumulate=*/true);
  }

  // From dout, the gradient of the block's output, the gradient of its input `in` into din;
  // parameter gradients are added into g.
  void BlockBackward(const std::vector<Tensor>& p, const std::vector<float*>& g, const float* in,
                     const BlockActivations& a, const float* dout, float* din) {
    GptKernels& k = *kernels;
    const int64_t n = N(), d = D(), t = T();
    const float scale = 1.0f / std::sqrt(static_cast<float>(d / H()));
    // out = mid + c_proj(gelu(c_fc(ln_2(mid))))
    k.Matmul(Matrix(dout, n, d), Matrix(p[kMlpProjWeight], d, 4 * d), Matrix(dgelu, n, 4 * d));
    k.Matmul(Transposed(Matrix(dout, n, d)), Matrix(a.gelu, n, 4 * d),
             Matrix(g[kMlpProjWeight], d, 4 * d), nullptr, 1.0f, /*accumulate=*/true);
    k.AddColumnSums(dout, n, d, g[kMlpProjBias]);
    k.GeluBackward(a.fc, dgelu, dfc, n * 4 * d);
    k.Matmul(Transposed(Matrix(dfc, n, 4 * d)), Matrix(a.ln2, n, d), Matrix(g[kFcWeight], 4 * d, d),
             nullptr, 1.0f, /*accumulate=*/true);
    k.AddColumnSums(dfc, n, 4 * d, g[kFcBias]);
    k.Matmul(Matrix(dfc, n, 4 * d), Matrix(p[kFcWeight], 4 * d, d), Matrix(dln, n, d));
    k.LayerNormBackward(a.mid, p[kLn2Weight].f32(), p[kLn2Bias].f32(), a.ln2_mean, a.ln2_var, dln,
                        dnorm, g[kLn2Weight], g[kLn2Bias], n, d);
    k.Add(dout, dnorm, dmid, n * d);

    // mid = in + c_proj(attention(c_attn(ln_1(in))))
    k.Matmul(Matrix(dmid, n, d), Matrix(p[kAttnProjWeight], d, d), Matrix(dattn, n, d));
    k.Matmul(Transposed(Matrix(dmid, n, d)), Matrix(a.attn, n, d), Matrix(g[kAttnProjWeight], d, d),
             nullptr, 1.0f, /*accumulate=*/true);
    k.AddColumnSums(dmid, n, d, g[kAttnProjBias]);
    for (int64_t b = 0; b < batch; ++b) {
      const float* qkv = a.qkv + b * t * 3 * d;
      const View dy = Batched(dattn + b * t * d, H(), t, d / H(), d / H(), d);
      // dP = dY V^T; dV = P^T dY.
      k.Matmul(dy, Transposed(Heads(qkv + 2 * d)), Scores(dprobs + b * H() * t * t));
      k.Matmul(Transposed(Scores(a.probs + b * H() * t * t)), dy,
               Heads(dqkv + b * t * 3 * d + 2 * d));
    }
    k.CausalSoftmaxBackward(a.probs, dprobs, batch * H(), t, scale);
    for (int64_t b = 0; b < batch; ++b) {
      const float* qkv = a.qkv + b * t * 3 * d;
      const View ds = Scores(dprobs + b * H() * t * t);
      float* dq = dqkv + b * t * 3 * d;
      // dQ = dS K; dK = dS^T Q.
      k.Matmul(ds, Heads(qkv + d), Heads(dq));
      k.Matmul(Transposed(ds), Heads(qkv), Heads(dq + d));
    }
    k.Matmul(Transposed(Matrix(dqkv, n, 3 * d)), Matrix(a.ln1, n, d),
             Matrix(g[kAttnWeight], 3 * d, d), nullptr, 1.0f, /*accumulate=*/true);
    k.AddColumnSums(dqkv, n, 3 * d, g[kAttnBias]);
    k.Matmul(Matrix(dqkv, n, 3 * d), Matrix(p[kAttnWeight], 3 * d, d), Matrix(dln, n, d));
    k.LayerNormBackward(in, p[kLn1Weight].f32(), p[kLn1Bias].f32(), a.ln1_mean, a.ln1_var, dln,
                        dnorm, g[kLn1Weight], g[kLn1Bias], n, d);
    k.Add(dmid, dnorm, din, n * d);
  }

  Status CheckTokens(const int32_t* values, int64_t n, const char* name) const {
    if (values == nullptr) return InvalidArgument(fmt::format("{} is null", name));
    for (int64_t i = 0; i < n; ++i) {
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
    const int64_t n = int64_t{new_batch} * T();
    ZINF_RETURN_IF_ERROR(CheckTokens(tokens, n, "tokens"));
    ZINF_RETURN_IF_ERROR(CheckTokens(targets, n, "targets"));
    ZINF_RETURN_IF_ERROR(Resize(new_batch));
    kernels->SetTokens(tokens, targets, n);
    ZINF_ASSIGN_OR_RETURN(const double loss, Compute(train, logits_out));
    timing.compute_s += SecondsSince(t0) - (timing.param_wait_s - engine_before.param_wait_s) -
                        (timing.grad_reduce_s - engine_before.grad_reduce_s);
    return loss;
  }

  // The batch layer-major (Note [Layer-major GPT]); each micro-batch's mean loss.
  StatusOr<std::vector<double>> RunLayerMajor(const std::vector<const int32_t*>& tokens,
                                              const std::vector<const int32_t*>& targets,
                                              int new_batch) {
    if (new_batch < 1) return InvalidArgument(fmt::format("batch must be >= 1, got {}", new_batch));
    if (tokens.empty() || tokens.size() != targets.size()) {
      return InvalidArgument(fmt::format("TrainBatch: {} token and {} target micro-batches",
                                         tokens.size(), targets.size()));
    }
    const auto t0 = Clock::now();
    const Timing engine_before = timing;
    const int micro = static_cast<int>(tokens.size());
    const int64_t n = int64_t{new_batch} * T();
    for (int g = 0; g < micro; ++g) {
      ZINF_RETURN_IF_ERROR(CheckTokens(tokens[g], n, "tokens"));
      ZINF_RETURN_IF_ERROR(CheckTokens(targets[g], n, "targets"));
    }
    ZINF_RETURN_IF_ERROR(Resize(new_batch));
    ZINF_RETURN_IF_ERROR(ResizeLayerMajor(micro));
    GptKernels& k = *kernels;
    const int64_t d = D(), L = config.n_layer;
    BlockActivations& a = acts[0];
    // Forward: every micro-batch through a module, then the next module.
    ZINF_ASSIGN_OR_RETURN(std::vector<Tensor> e, Fetch(embed, Slot::kEmbed, embed_numel, fp32_2));
    for (int g = 0; g < micro; ++g) {
      k.SetTokens(tokens[g], targets[g], n);
      k.EmbeddingForward(e[0].f32(), e[1].f32(), lm.xs[g][0], n, T(), d);
    }
    ZINF_RETURN_IF_ERROR(Release(embed));
    for (int64_t l = 0; l < L; ++l) {
      ZINF_ASSIGN_OR_RETURN(std::vector<Tensor> p,
                            Fetch(blocks[l], Slot::kBlock, block_numel, block_want));
      for (int g = 0; g < micro; ++g) BlockForward(p, lm.xs[g][l], lm.xs[g][l + 1], a);
      ZINF_RETURN_IF_ERROR(Release(blocks[l]));
    }
    // ln_f and the tied head, forward and backward per micro-batch while both are fetched.
    ZINF_ASSIGN_OR_RETURN(std::vector<Tensor> f, Fetch(ln_f, Slot::kLnF, ln_f_numel, fp32_2));
    ZINF_ASSIGN_OR_RETURN(e, Fetch(embed, Slot::kEmbed, embed_numel, head_want));
    ZINF_ASSIGN_OR_RETURN(std::vector<float*> ge, Gradients(embed));
    ZINF_ASSIGN_OR_RETURN(std::vector<float*> gf, Gradients(ln_f));
    const float grad_scale = static_cast<float>(engine.loss_scale() / n);
    std::vector<double> losses;
    for (int g = 0; g < micro; ++g) {
      k.SetTokens(tokens[g], targets[g], n);
      k.LayerNormForward(lm.xs[g][L], f[0].f32(), f[1].f32(), xf, lnf_mean, lnf_var, n, d);
      k.Matmul(Matrix(xf, n, d), Transposed(Matrix(e[0], V(), d)), Matrix(logits, n, V()));
      ZINF_ASSIGN_OR_RETURN(const double loss, k.CrossEntropy(logits, n, V(), grad_scale));
      losses.push_back(loss);
      ZeroAll(lm.embed_grads[g], embed_numel);
      k.Matmul(Matrix(logits, n, V()), Matrix(e[0], V(), d), Matrix(dln, n, d));
      k.Matmul(Transposed(Matrix(logits, n, V())), Matrix(xf, n, d),
               Matrix(lm.embed_grads[g][0], V(), d), nullptr, 1.0f, /*accumulate=*/true);
      ZeroAll(lm.ln_f_grads, ln_f_numel);
      k.LayerNormBackward(lm.xs[g][L], f[0].f32(), f[1].f32(), lnf_mean, lnf_var, dln, lm.dxs[g],
                          lm.ln_f_grads[0], lm.ln_f_grads[1], n, d);
      AddMicroBatch(gf, lm.ln_f_grads, ln_f_numel, g == 0);
    }
    ZINF_RETURN_IF_ERROR(Release(embed));
    ZINF_RETURN_IF_ERROR(ReduceGradients(ln_f));
    ZINF_RETURN_IF_ERROR(Release(ln_f));
    // Backward: a module's micro-batches, then the module before it.
    for (int64_t l = L - 1; l >= 0; --l) {
      ZINF_ASSIGN_OR_RETURN(std::vector<Tensor> p,
                            Fetch(blocks[l], Slot::kBlock, block_numel, block_want));
      ZINF_ASSIGN_OR_RETURN(std::vector<float*> g_block, Gradients(blocks[l]));
      for (int g = 0; g < micro; ++g) {
        ZeroAll(lm.block_grads, block_numel);
        BlockForward(p, lm.xs[g][l], nullptr, a);  // the activations, from the checkpoint
        BlockBackward(p, lm.block_grads, lm.xs[g][l], a, lm.dxs[g], lm.spare);
        std::swap(lm.dxs[g], lm.spare);
        AddMicroBatch(g_block, lm.block_grads, block_numel, g == 0);
      }
      ZINF_RETURN_IF_ERROR(ReduceGradients(blocks[l]));
      ZINF_RETURN_IF_ERROR(Release(blocks[l]));
    }
    // The lookup's part of the embedding's gradient, after the head's part of each
    // micro-batch; the buffers are the ones the head stage was handed.
    ZINF_ASSIGN_OR_RETURN(ge, Gradients(embed));
    for (int g = 0; g < micro; ++g) {
      k.SetTokens(tokens[g], targets[g], n);
      k.EmbeddingBackward(lm.dxs[g], lm.embed_grads[g][0], lm.embed_grads[g][1], n, T(), d);
      AddMicroBatch(ge, lm.embed_grads[g], embed_numel, g == 0);
    }
    ZINF_RETURN_IF_ERROR(ReduceGradients(embed));
    timing.compute_s += SecondsSince(t0) - (timing.param_wait_s - engine_before.param_wait_s) -
                        (timing.grad_reduce_s - engine_before.grad_reduce_s);
    return losses;
  }

  StatusOr<double> Compute(bool train, std::vector<float>* logits_out) {
    GptKernels& k = *kernels;
    const int64_t n = N(), d = D(), L = config.n_layer;
    ZINF_ASSIGN_OR_RETURN(std::vector<Tensor> e, Fetch(embed, Slot::kEmbed, embed_numel, fp32_2));
    k.EmbeddingForward(e[0].f32(), e[1].f32(), x[0], n, T(), d);
    ZINF_RETURN_IF_ERROR(Release(embed));
    for (int64_t l = 0; l < L; ++l) {
      ZINF_ASSIGN_OR_RETURN(std::vector<Tensor> p,
                            Fetch(blocks[l], Slot::kBlock, block_numel, block_want));
      BlockForward(p, x[l], x[l + 1], acts[config.activation_checkpointing ? 0 : l]);
      ZINF_RETURN_IF_ERROR(Release(blocks[l]));
    }
    // ln_f and the tied head (wte again), then their backward while both are fetched.
    ZINF_ASSIGN_OR_RETURN(std::vector<Tensor> f, Fetch(ln_f, Slot::kLnF, ln_f_numel, fp32_2));
    k.LayerNormForward(x[L], f[0].f32(), f[1].f32(), xf, lnf_mean, lnf_var, n, d);
    // The head needs wte as a matmul weight; wpe goes along unused.
    ZINF_ASSIGN_OR_RETURN(e, Fetch(embed, Slot::kEmbed, embed_numel, head_want));
    k.Matmul(Matrix(xf, n, d), Transposed(Matrix(e[0], V(), d)), Matrix(logits, n, V()));
    const float grad_scale = train ? static_cast<float>(engine.loss_scale() / n) : 0.0f;
    ZINF_ASSIGN_OR_RETURN(const double loss, k.CrossEntropy(logits, n, V(), grad_scale));
    if (!train) {
      if (logits_out != nullptr) {
        logits_out->resize(n * V());
        ZINF_RETURN_IF_ERROR(k.CopyToHost(logits_out->data(), logits, n * V()));
      }
      ZINF_RETURN_IF_ERROR(Release(embed));
      ZINF_RETURN_IF_ERROR(Release(ln_f));
      return loss;
    }
    ZINF_ASSIGN_OR_RETURN(std::vector<float*> ge, Gradients(embed));
    k.Matmul(Matrix(logits, n, V()), Matrix(e[0], V(), d), Matrix(dln, n, d));
    k.Matmul(Transposed(Matrix(logits, n, V())), Matrix(xf, n, d), Matrix(ge[0], V(), d), nullptr,
             1.0f, /*accumulate=*/true);
    ZINF_RETURN_IF_ERROR(Release(embed));
    ZINF_ASSIGN_OR_RETURN(std::vector<float*> gf, Gradients(ln_f));
    k.LayerNormBackward(x[L], f[0].f32(), f[1].f32(), lnf_mean, lnf_var, dln, dx, gf[0], gf[1], n,
                        d);
    ZINF_RETURN_IF_ERROR(ReduceGradients(ln_f));
    ZINF_RETURN_IF_ERROR(Release(ln_f));

    for (int64_t l = L - 1; l >= 0; --l) {
      ZINF_ASSIGN_OR_RETURN(std::vector<Tensor> p,
                            Fetch(blocks[l], Slot::kBlock, block_numel, block_want));
      ZINF_ASSIGN_OR_RETURN(std::vector<float*> g, Gradients(blocks[l]));
      BlockActivations& a = acts[config.activation_checkpointing ? 0 : l];
      if (config.activation_checkpointing) BlockForward(p, x[l], nullptr, a);
      BlockBackward(p, g, x[l], a, dx, dx_next);
      std::swap(dx, dx_next);
      ZINF_RETURN_IF_ERROR(ReduceGradients(blocks[l]));
      ZINF_RETURN_IF_ERROR(Release(blocks[l]));
    }
    // The embedding's gradient needs no parameters: Gradients(embed) hands back the buffers
    // the head already added into.
    ZINF_ASSIGN_OR_RETURN(ge, Gradients(embed));
    k.EmbeddingBackward(dx, ge[0], ge[1], n, T(), d);
    ZINF_RETURN_IF_ERROR(ReduceGradients(embed));
    return loss;
  }
};

Gpt::Gpt(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Gpt::~Gpt() = default;

StatusOr<std::unique_ptr<Gpt>> Gpt::Create(zinf::Engine& engine, const GptConfig& config,
                                           const GptOptions& options) {
  ZINF_RETURN_IF_ERROR(config.Validate());
  // The backend first, on the engine's compute device (Note [GPT staging]): a device that
  // cannot be had leaves the engine untouched.
  const std::string& device = engine.compute_device_name();
  int ordinal = -1;
  if (device.rfind("cuda:", 0) == 0) {
    ordinal = std::stoi(device.substr(5));
    if (engine.config().fp16) {
      return InvalidArgument(
          "the GPT's CUDA backend takes fp32 and bf16 parameters; use bf16 instead of fp16 on a "
          "GPU, or compute on the host device");
    }
  } else if (device != "host") {
    return InvalidArgument(fmt::format("the GPT has no backend for compute device \"{}\"", device));
  }
  auto create = [&](ElementType matmul_type) -> StatusOr<std::unique_ptr<GptKernels>> {
    if (ordinal >= 0) return CreateCudaKernels(ordinal, options.device_memory_bytes, matmul_type);
    return CreateCpuKernels(options.device_memory_bytes, matmul_type);
  };
  std::unique_ptr<GptKernels> kernels;
  switch (options.matmul_precision) {
    case MatmulPrecision::kFp32: {
      ZINF_ASSIGN_OR_RETURN(kernels, create(ElementType::kFp32));
      break;
    }
    case MatmulPrecision::kBf16: {
      ZINF_ASSIGN_OR_RETURN(kernels, create(ElementType::kBf16));
      break;
    }
    case MatmulPrecision::kAuto: {
      auto bf16 = engine.config().bf16 ? create(ElementType::kBf16)
                                       : StatusOr<std::unique_ptr<GptKernels>>(
                                             zinf::Unavailable("the engine computes in fp32"));
      // No native bf16 on this device (or no device: the fp32 attempt then says so).
      if (bf16.ok()) {
        kernels = std::move(bf16).value();
      } else if (bf16.status().code() == zinf::StatusCode::kUnavailable) {
        ZINF_ASSIGN_OR_RETURN(kernels, create(ElementType::kFp32));
      } else {
        return bf16.status();
      }
      break;
    }
  }
  if (kernels == nullptr) {
    return InvalidArgument("GptOptions.matmul_precision is not a known MatmulPrecision");
  }
  auto impl = std::make_unique<Impl>(engine, config, std::move(kernels));
  const int64_t v = config.vocab_size, t = config.seq_len, d = config.d_model;
  impl->embed_numel = {v * d, t * d};
  impl->block_numel = {d, d, 3 * d * d, 3 * d, d * d, d, d, d, 4 * d * d, 4 * d, d * 4 * d, d};
  impl->ln_f_numel = {d, d};
  const ElementType mm = impl->kernels->matmul_type(), f32 = ElementType::kFp32;
  impl->block_want = {f32, f32, mm, f32, mm, f32, f32, f32, mm, f32, mm, f32};
  impl->head_want = {mm, f32};
  impl->fp32_2 = {f32, f32};
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
  // Checkpoints say what model they hold (`zinf ckpt export --hf` maps it to GPT-2).
  ZINF_RETURN_IF_ERROR(
      engine.SetCheckpointMetadata("{\"zinf_gpt\": " + config.DescriptionJson() + "}"));
  return std::unique_ptr<Gpt>(new Gpt(std::move(impl)));
}

const GptConfig& Gpt::config() const { return impl_->config; }

ElementType Gpt::matmul_type() const { return impl_->kernels->matmul_type(); }

StatusOr<double> Gpt::TrainMicroBatch(const int32_t* tokens, const int32_t* targets, int batch) {
  return impl_->Run(tokens, targets, batch, /*train=*/true, nullptr);
}

StatusOr<std::vector<double>> Gpt::TrainBatch(const std::vector<const int32_t*>& tokens,
                                              const std::vector<const int32_t*>& targets,
                                              int batch) {
  return impl_->RunLayerMajor(tokens, targets, batch);
}

StatusOr<double> Gpt::Loss(const int32_t* tokens, const int32_t* targets, int batch,
                           std::vector<float>* logits) {
  return impl_->Run(tokens, targets, batch, /*train=*/false, logits);
}

Gpt::Timing Gpt::TakeTiming() { return std::exchange(impl_->timing, Timing()); }

void SetComputeThreads(int threads) { omp_set_num_threads(std::max(threads, 1)); }

}  // namespace gpt
