// CPU optimizers over flat fp32 shards: AdamW, Adam, Adagrad and Lion, vectorized and threaded.
//
// A shard is a flat run of `count` fp32 master parameters with their gradients (fp32, bf16 or
// fp16) and fp32 optimizer state. One call makes a single streaming pass over the shard: it
// scales the gradients (1/loss_scale times the clip coefficient, one combined `grad_scale`),
// updates parameters and state in place, and can write a bf16 or fp16 copy of the new
// parameters in the same pass. The update is element-wise, so stepping a shard whole or in
// contiguous chunks, with any thread count, gives bitwise identical results.
//
// The formulas are PyTorch's (torch.optim in 1.13), evaluated in fp32 with the per-step
// scalars (bias corrections, step size) computed in double as Python does:
//   AdamW:   p *= 1 - lr*wd;  m = b1*m + (1-b1)*g;  v = b2*v + (1-b2)*g*g;
//            p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
//   Adam:    as AdamW but g += wd*p (L2) instead of the decoupled decay of p
//   Adagrad: g += wd*p;  s += g*g;  p -= lr/(1+(t-1)*lr_decay) * g / (sqrt(s) + eps)
//   Lion:    p *= 1 - lr*wd;  p -= lr * sign(b1*m + (1-b1)*g);  m = b2*m + (1-b2)*g
// Without bias correction (Adam/AdamW), 1-b1^t and 1-b2^t are taken as 1.
// t is the step number, 1 for the first step, as torch's `state['step']` after its increment.
//
// Overflow (fp16 dynamic loss scaling). An in-place update cannot be undone, so the check for
// non-finite gradients is a separate read-only pass: ComputeGradStats returns the sum of squares
// of the gradients (which the engine needs for the global norm and clipping anyway) and whether
// they are all finite. The caller skips the step when they are not. Step() can run that pass
// itself (StepOptions::check_finite) and then leaves everything untouched on overflow.
// See Note [Optimizer overflow contract] in cpu_optim/cpu_optimizer.cc.
//
// Chunked stepping (state streamed from NVMe): call BeginStep(group) once per optimizer step,
// then Update(group, chunk, grad_scale) for each chunk, in any order, from any one thread at a
// time or concurrently on disjoint chunks. OptimizerSpan::Slice makes the chunks.
//
// Thread-safety: Update, ApplyStep, ComputeGradStats and InitState may run concurrently on
// disjoint spans. Calls that change groups (AddParamGroup, SetHyperParams, SetStep, BeginStep,
// Step, LoadState) must not race with any other call on the same optimizer.
#ifndef ZINF_CPU_OPTIMIZER_H_
#define ZINF_CPU_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/dtype.h"
#include "zinf/export.h"
#include "zinf/status.h"

namespace zinf {

enum class OptimizerType : int { kAdamW = 0, kAdam = 1, kAdagrad = 2, kLion = 3 };
// "adamw", "adam", "adagrad", "lion"
ZINF_EXPORT std::string_view OptimizerTypeName(OptimizerType type);

// acc[i] += x[i] for `count` fp32 values, vectorized (the same bits as the plain loop).
ZINF_EXPORT void AccumulateFp32(float* acc, const float* x, size_t count);

// Hyper-parameters of one parameter group. Defaults are torch's AdamW defaults;
// Defaults(type) gives torch's defaults for each type (Lion: the paper's 1e-4, 0.9, 0.99).
struct ZINF_EXPORT OptimizerHyperParams {
  OptimizerType type = OptimizerType::kAdamW;
  double lr = 1e-3;
  double beta1 = 0.9;                      // Adam, AdamW, Lion
  double beta2 = 0.999;                    // Adam, AdamW, Lion
  double eps = 1e-8;                       // Adam, AdamW, Adagrad
  double weight_decay = 0.0;               // decoupled for AdamW and Lion, L2 for Adam and Adagrad
  bool bias_correction = true;             // Adam, AdamW
  double lr_decay = 0.0;                   // Adagrad
  double initial_accumulator_value = 0.0;  // Adagrad

  static OptimizerHyperParams Defaults(OptimizerType type);
  // InvalidArgument naming the field: lr >= 0, betas in [0, 1), eps >= 0, weight_decay >= 0...
  Status Validate() const;
  // fp32 state arrays per parameter: 2 for Adam/AdamW (exp_avg, exp_avg_sq), 1 otherwise
  // (Adagrad's sum, Lion's exp_avg).
  int state_count() const;
};

// One shard, or a contiguous chunk of one. Pointers are not owned and may be unaligned
// (aligned ones are faster: see CpuOptimizerOptions::store_mode).
struct ZINF_EXPORT OptimizerSpan {
  float* params = nullptr;      // fp32 master parameters, updated in place
  const void* grads = nullptr;  // `count` elements of grad_type; only read
  ElementType grad_type = ElementType::kFp32;
  float* state0 = nullptr;     // exp_avg (Adam, AdamW, Lion) or sum (Adagrad)
  float* state1 = nullptr;     // exp_avg_sq (Adam, AdamW); must be null otherwise
  void* param_copy = nullptr;  // optional: receives the new params in param_copy_type
  ElementType param_copy_type = ElementType::kBf16;  // kBf16 or kFp16
  size_t count = 0;

  // Elements [offset, offset + n) of this span (offset + n <= count; not checked here).
  OptimizerSpan Slice(size_t offset, size_t n) const;
};

// A span and the step number (>= 1) it takes: torch keeps a step count per parameter.
struct SteppedSpan {
  int64_t step = 1;
  OptimizerSpan span;
};

struct GradStats {
  double sum_squares = 0.0;  // sum of g*g over the gradients as given (before any scaling)
  bool finite = true;        // false when any gradient is Inf or NaN
};

enum class CpuKernelIsa : int { kAuto = 0, kScalar = 1, kAvx2 = 2, kAvx512 = 3 };
// "auto", "scalar", "avx2", "avx512"
ZINF_EXPORT std::string_view CpuKernelIsaName(CpuKernelIsa isa);
// Kernels this CPU can run, slowest first (always includes kScalar).
ZINF_EXPORT std::vector<CpuKernelIsa> SupportedCpuKernelIsas();

enum class StoreMode : int {
  // Cached for calls writing less than nt_store_min_bytes. For larger calls the first few
  // take turns between cached and non-temporal stores, each with and without software
  // prefetch, timed, and the fastest is kept (see Note [Store mode tuning] in
  // cpu_optim/cpu_optimizer.cc); values never depend on it.
  kAuto = 0,
  kCached = 1,       // ordinary stores
  kNonTemporal = 2,  // streaming stores that bypass the caches
};

// Whose threads run the kernels (Note [Whose threads] in cpu_optim/parallel.h).
enum class CpuWorkers : int {
  kOneTbb = 0,  // a oneTBB arena of the optimizer's own
  // The OpenMP runtime already in the process (torch's), else kOneTbb; for a second after the
  // team held up a call, kOneTbb (Note [Held up by the team]).
  kProcessOpenMp = 1,
};

struct ZINF_EXPORT CpuOptimizerOptions {
  // Worker threads, the calling thread included; 0 uses every CPU in the affinity mask.
  int threads = 0;
  CpuWorkers workers = CpuWorkers::kOneTbb;
  // Kernel instruction set; kAuto picks the best this CPU has. Forcing one the CPU lacks is
  // Unavailable at Create.
  CpuKernelIsa isa = CpuKernelIsa::kAuto;
  // Non-temporal stores write p, m, v (and the copy) straight to memory. On large shards they
  // can win, when a cached store's later write-back competes badly with the reads, or lose,
  // depending on the machine (measured in bench/RESULTS.md); on small shards that would stay
  // in cache they lose.
  // Streaming needs the output arrays to share their alignment modulo 64 bytes; when they do
  // not, the call falls back to cached stores.
  StoreMode store_mode = StoreMode::kAuto;
  // kAuto threshold in bytes written per call; 0 means the L3 size (32 MiB when unknown).
  size_t nt_store_min_bytes = 0;
  // Software prefetch distance for the read streams, in bytes; 0 disables it. Under
  // StoreMode::kAuto large calls also try without it and keep it only if it is faster (on a
  // 2-vCPU AVX-512 EPYC it cost 15-30%; bench/RESULTS.md).
  size_t prefetch_bytes = 1024;

  // InvalidArgument naming the field.
  Status Validate() const;
};

struct StepOptions {
  // Multiplies every gradient before use: 1/loss_scale times the clip coefficient.
  float grad_scale = 1.0f;
  // Read the gradients first and skip the step (touching nothing) when any is not finite.
  bool check_finite = false;
};

struct StepResult {
  bool skipped = false;  // true when check_finite found a non-finite gradient
  int64_t step = 0;      // the group's step count after the call
  GradStats grad_stats;  // filled when check_finite ran
};

// What a parameter group carries between steps besides its arrays.
struct ParamGroupState {
  OptimizerHyperParams hyper_params;
  int64_t step = 0;  // steps taken; the next update uses step + 1 after BeginStep
};

class ZINF_EXPORT CpuOptimizer {
 public:
  // Errors: InvalidArgument for bad options, Unavailable for a forced ISA the CPU lacks,
  // Internal when the thread arena cannot be made.
  static StatusOr<std::unique_ptr<CpuOptimizer>> Create(const CpuOptimizerOptions& options = {});
  ~CpuOptimizer();
  CpuOptimizer(const CpuOptimizer&) = delete;
  CpuOptimizer& operator=(const CpuOptimizer&) = delete;

  CpuKernelIsa isa() const;  // the kernel in use (never kAuto)
  int threads() const;
  CpuWorkers workers() const;  // the threads in use (kOneTbb where no OpenMP runtime was found)
  const CpuOptimizerOptions& options() const;
  // The store mode large calls use: options().store_mode unless it is kAuto; then kAuto while
  // still tuning, and the chosen mode after.
  StoreMode store_mode_in_use() const;
  // The software prefetch distance large calls use: options().prefetch_bytes, or under
  // StoreMode::kAuto, once tuned, that or 0, whichever was faster (Note [Store mode tuning]).
  size_t prefetch_bytes_in_use() const;

  // ---- Parameter groups ----
  // Adds a group with step 0 and returns its index. InvalidArgument for bad hyper-parameters.
  StatusOr<int> AddParamGroup(const OptimizerHyperParams& hyper_params);
  int num_groups() const;
  // InvalidArgument for a bad index.
  StatusOr<ParamGroupState> group(int index) const;
  // Changes hyper-parameters (a learning-rate schedule); the type must stay the same.
  Status SetHyperParams(int group, const OptimizerHyperParams& hyper_params);
  Status SetStep(int group, int64_t step);

  // Fills the state arrays of `span` with their initial values (zeros; Adagrad's sum with
  // initial_accumulator_value), on the optimizer's threads. Params and grads are not touched.
  // (Threads take chunks dynamically, so pages are not tied to a thread: to place state on a
  // NUMA node, allocate it there, e.g. HostAllocOptions::numa_node.)
  Status InitState(int group, const OptimizerSpan& span);

  // ---- Whole-shard step ----
  // Advances the group's step and updates `shard`. With options.check_finite, a non-finite
  // gradient leaves the arrays and the step count untouched and returns skipped = true.
  StatusOr<StepResult> Step(int group, const OptimizerSpan& shard, const StepOptions& options = {});

  // ---- Chunked step ----
  // Advances the group's step count by one and returns the new step number.
  StatusOr<int64_t> BeginStep(int group);
  // Updates one chunk with the group's current step (BeginStep must have run at least once).
  // Synchronous: the arrays may be reused when it returns. InvalidArgument for a bad span.
  Status Update(int group, const OptimizerSpan& chunk, float grad_scale = 1.0f);

  // acc[i] += x[i] for `count` elements, or with `overwrite` acc[i] = x[i], on the
  // optimizer's threads: a gradient into its accumulator at the memory's pace. The same bits
  // for any thread count. InvalidArgument for a null array with count > 0.
  Status Accumulate(float* acc, const float* x, size_t count, bool overwrite = false) const;

  // Sum of squares and finiteness of `count` gradients of `type`. Deterministic: the same
  // value for any thread count (fixed chunking and summation order).
  StatusOr<GradStats> ComputeGradStats(const void* grads, ElementType type, size_t count) const;

  // Stateless form of Update: applies step number `step` (>= 1) of `hyper_params`.
  Status ApplyStep(const OptimizerHyperParams& hyper_params, int64_t step, float grad_scale,
                   const OptimizerSpan& span) const;
  // ApplyStep over many spans, each with its own step number, in one threaded pass: their
  // chunks are shared out together, so a model's many small tensors step in parallel instead
  // of one after another. Checks every span first; a bad one leaves all untouched.
  Status ApplySteps(const OptimizerHyperParams& hyper_params, float grad_scale,
                    std::span<const SteppedSpan> spans) const;

  // ---- Checkpoints ----
  // The groups' hyper-parameters and step counts, bit-exact, in a versioned binary form. The
  // state arrays are the caller's: they are plain fp32 and are saved as bytes.
  std::string SaveState() const;
  // Replaces all groups. DataLoss for a truncated or corrupt blob, InvalidArgument for a
  // version this build does not read.
  Status LoadState(std::string_view bytes);

 private:
  struct Impl;
  explicit CpuOptimizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf

#endif  // ZINF_CPU_OPTIMIZER_H_
