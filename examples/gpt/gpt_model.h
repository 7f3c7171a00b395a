// A GPT-2-style language model whose parameters live in a zinf Engine: every module is
// fetched just before it runs and released after, and its gradients are reduce-scattered as
// soon as backward has produced them. Forward and backward are written by hand in fp32, with
// the matmuls' inputs in bf16 where GptOptions::matmul_precision says so, on a compute backend
// (examples/gpt/gpt_kernels.h) on the engine's compute device: on the host device, oneDNN on
// the CPU; on cuda:N, cuBLAS and small custom kernels on that GPU (built where nvcc is). The
// model needs nothing but zinf's public headers, oneDNN and, for CUDA, the CUDA toolkit.
//
// The parameter names are those of Hugging Face's GPT-2 ("h.3.attn.c_attn.weight"), with
// torch's nn.Linear layout [out, in], so that checkpoints and exports map one to one:
//   module "embed": wte.weight [V, d], wpe.weight [T, d]
//   module "h.{i}": h.{i}.ln_1.{weight,bias} [d], h.{i}.attn.c_attn.{weight [3d, d], bias [3d]},
//                   h.{i}.attn.c_proj.{weight [d, d], bias [d]}, h.{i}.ln_2.{weight,bias} [d],
//                   h.{i}.mlp.c_fc.{weight [4d, d], bias [4d]},
//                   h.{i}.mlp.c_proj.{weight [d, 4d], bias [d]}
//   module "ln_f":  ln_f.weight [d], ln_f.bias [d]
//
// Thread-safety: one thread drives a Gpt (as it drives its Engine). On the CPU the compute
// runs on the calling thread's OpenMP threads; SetComputeThreads sets how many.
#ifndef ZINF_EXAMPLES_GPT_GPT_MODEL_H_
#define ZINF_EXAMPLES_GPT_GPT_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/cpu_optimizer.h"
#include "zinf/device.h"
#include "zinf/engine.h"
#include "zinf/status.h"

namespace gpt {

struct GptConfig {
  int vocab_size = 256;  // byte-level tokens
  int seq_len = 64;      // positions (the context window)
  int d_model = 128;
  int n_layer = 4;
  int n_head = 4;  // must divide d_model
  // Keep only each block's input from the forward pass and recompute the block's
  // activations in backward: one block's activations in memory instead of n_layer's, for
  // about a third more compute.
  bool activation_checkpointing = true;

  // Parses the JSON object of a config's "model" key (keys as the fields above; absent keys
  // keep their defaults). InvalidArgument names the key, its value and what is allowed.
  static zinf::StatusOr<GptConfig> FromJson(std::string_view json_object);
  // Also refuses a model whose parameter count overflows int64.
  zinf::Status Validate() const;
  int64_t parameter_count() const;
  // Bytes of the activations (and backward scratch) Gpt allocates for micro-batches of `batch`
  // sequences, on the compute device, all at once on the first micro-batch. InvalidArgument,
  // naming the batch and the model's dimensions, when the count overflows 64 bits; call it to
  // check a batch size against the memory there is before anything is allocated.
  zinf::StatusOr<uint64_t> ActivationBytes(int64_t batch) const;
  // Every parameter's name, in the order the model registers them.
  std::vector<std::string> parameter_names() const;
  // The model as a JSON object: the sizes above and what the model computes (norm, its
  // epsilon and place, activation, positions, biases, head), which Gpt::Create records in
  // the engine's checkpoints as metadata "zinf_gpt" (Engine::SetCheckpointMetadata).
  std::string DescriptionJson() const;
};

// The element type of every matmul's inputs (forward, both backward products, attention);
// products accumulate in fp32 and everything else computes in fp32 either way (Note [GPT
// compute] in gpt_kernels_cpu.cc).
enum class MatmulPrecision {
  // bf16 when the engine computes in bf16 (EngineConfig::bf16) and the device multiplies bf16
  // natively (a CPU with AVX512_BF16 or AMX, a GPU of compute capability 8.0 or later); fp32
  // otherwise.
  kAuto,
  kFp32,
  // bf16 whatever the engine's precision; Unavailable where the device has no native bf16.
  kBf16,
};

// How the model computes. Where is the engine's compute device (EngineOptions::device): oneDNN
// on the CPU for "host", cuBLAS on the GPU for "cuda:N", using the engine's fetched
// parameters and gradient buffers in place (Note [GPT staging] in gpt_model.cc).
struct GptOptions {
  // Budget of the device memory the activations and converted parameters may take. 0: the
  // machine's memory on the host, CudaDevice's default (90% of what is free) on CUDA.
  uint64_t device_memory_bytes = 0;
  MatmulPrecision matmul_precision = MatmulPrecision::kAuto;
};

class Gpt {
 public:
  // Registers the model's modules with `engine`, which must not be initialized yet; call
  // engine.Initialize() afterwards. `engine` must outlive the Gpt. InvalidArgument for a bad
  // config, or for an fp16 engine on a GPU; Unavailable, saying why, where the backend of the
  // engine's device cannot start (zinf built without CUDA, a GPU without cuBLAS), or for
  // MatmulPrecision::kBf16 where the device has no native bf16 matmuls (the engine is then
  // left untouched); the engine's error if registration fails.
  static zinf::StatusOr<std::unique_ptr<Gpt>> Create(zinf::Engine& engine, const GptConfig& config,
                                                     const GptOptions& options = {});
  ~Gpt();
  Gpt(const Gpt&) = delete;
  Gpt& operator=(const Gpt&) = delete;

  const GptConfig& config() const;
  // What the matmuls multiply in: kFp32, or kBf16 (bf16 inputs, fp32 accumulation).
  zinf::ElementType matmul_type() const;

  // One micro-batch of next-token prediction: `tokens` and `targets` hold batch * seq_len
  // values in [0, vocab_size), row after row. Runs forward and backward, writes the gradients
  // of (mean loss * engine.loss_scale()) into the engine and reduces them; the caller calls
  // engine.Step() after gradient_accumulation_steps of these. Returns the mean cross-entropy
  // over the batch * seq_len positions. InvalidArgument for a token out of range or
  // batch < 1; ResourceExhausted when the activations do not fit the device's budget; the
  // engine's error if a fetch or reduction fails, the backend's (Internal, naming the op) if
  // a kernel fails (the engine, or the Gpt, is then unusable).
  zinf::StatusOr<double> TrainMicroBatch(const int32_t* tokens, const int32_t* targets, int batch);
  // A whole batch of gradient_accumulation_steps micro-batches (tokens[k], targets[k] as
  // TrainMicroBatch takes them) layer-major, for an engine with zinf.layer_major: each module
  // fetched once in forward and once in backward, every micro-batch through it in turn (Note
  // [Layer-major GPT] in gpt_model.cc). On one rank the gradients, and so the step, are
  // bitwise those of the micro-batches one by one. Returns each micro-batch's mean loss.
  // Errors as TrainMicroBatch's; ResourceExhausted when the micro-batches' checkpoints do not
  // fit.
  zinf::StatusOr<std::vector<double>> TrainBatch(const std::vector<const int32_t*>& tokens,
                                                 const std::vector<const int32_t*>& targets,
                                                 int batch);
  // Forward only: the mean loss, and when `logits` is not null the logits
  // [batch, seq_len, vocab_size]. Leaves no gradients behind.
  zinf::StatusOr<double> Loss(const int32_t* tokens, const int32_t* targets, int batch,
                              std::vector<float>* logits = nullptr);

  // Where the time of the calls above went, accumulated since the last TakeTiming().
  struct Timing {
    double compute_s = 0;      // forward, backward and recomputation
    double param_wait_s = 0;   // Engine::Fetch and Release: gathering parameters
    double grad_reduce_s = 0;  // Engine::Gradients and ReduceGradients
  };
  Timing TakeTiming();

 private:
  struct Impl;
  explicit Gpt(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Threads for the model's CPU compute (OpenMP, used by oneDNN too), for the calling thread's
// later calls. threads >= 1.
void SetComputeThreads(int threads);

}  // namespace gpt

#endif  // ZINF_EXAMPLES_GPT_GPT_MODEL_H_
