// The model behind `zinf plan`: for a model's shapes, a machine profile (`zinf bench profile`)
// and a placement (an EngineConfig: offload_param, offload_optimizer, the NVMe share, the
// precision), the bytes each tier holds per rank and the predicted step time, taken from what
// the engine really allocates and moves (src/zero/tier_budgets.h for the budgets, which the
// engine calls too, src/zero/param_tier.cc for what is cached, src/zero/engine_step.cc and
// offload/pipelined_optimizer.cc for the NVMe pass).
//
// Note [Plan memory]
// The engine runs on the host device today (EngineOptions::device), so its "device" tier is
// host memory under a budget. Two figures per tier:
//  - steady: what the engine holds between steps, i.e. what StepSummary::host_bytes and
//    nvme_bytes report after Step() (the host arrays, the parameter tier where it lives in
//    memory, the shard copies the device tier still caches and the next batch's first modules
//    read ahead, the NVMe optimizer's staging arena and host state, the swap files).
//    tests/tools/plan_model_test.cc checks it, and the NVMe traffic, against a real engine.
//  - peak: the most the device tier holds at any fetch of the simulated step (cached shard
//    copies, persistent parameters, the fetched module's gathered, widened and gradient
//    buffers, the next module's gathers; the parameter tier when it lives there), never more
//    than the budget the engine gives it; the host memory's arrays, pools, write-back copies,
//    staging buffers and reduce buckets; the trainer's activations. "fits" is decided on the
//    peak (with a host device, their sum against the host memory). It leaves out the process's
//    own code and libraries (tens of MiB: bench/RESULTS.md).
// The gradient accumulators are fp32 host arrays, or with zinf.gradients_on_nvme (optimizer on
// NVMe) fp32 arrays on NVMe beside the optimizer state.
//
// Note [Plan time]
// A step is gradient_accumulation_steps micro-batches of forward and backward, then the
// optimizer step. Per rank:
//  - compute: the micro-batches' linear matmul FLOPs at the profile's oneDNN rate for the
//    compute precision, the model's d_model and tokens per micro-batch and the threads a rank
//    gets (cores / ranks), measured as a linear layer's forward and backward products together
//    on operands cold in cache; attention's small batched matmuls at their own
//    measured rate; the tanh GELU's elements at its forward and backward rates; the softmax's
//    and loss's std::exp calls at the rate of their loop; each oneDNN call's fixed cost; layer
//    norms, residuals and the rest as passes over the activations at memory bandwidth. The
//    MLP example's hand-written loops run at the profile's rate for that loop. With several
//    ranks whose compute takes every core, the CPU their collectives take (Note
//    [Collectives' CPU] in tools/bench_profile.cc) is time the compute does not get.
//  - gather: every fetch of a module with non-persistent parameters, with several ranks, is
//    one all-gather of their compute-precision bytes (latency + bytes / bandwidth of the
//    profile's 2-rank figure, and with several parameters their packing and unpacking at
//    memory bandwidth: Note [Coalesced gathers] in src/zero/param_tier.cc);
//    with parameters off the device, the shards the device tier does not keep are read from
//    NVMe (a simulation of the fetch order against the device tier's room, evicting the copy
//    needed last; each shard pays the disk's per-request latency, as many at once as
//    aio.queue_depth x aio.thread_count, since the store reads a window's shards in one
//    batch) or copied over the host link. A read starts at the fetch whose read-ahead
//    window (stage3_prefetch_bucket_size) first covers it and overlaps the compute until then;
//    what it does not hide is exposed.
//  - reduce: the reduce-scatter of the fp32 gradients (several ranks) and their accumulation
//    into the fp32 accumulators (memory bandwidth).
//  - optimizer: the CPU update of the rank's shard at the profile's rate, plus writing the
//    parameter tier.
//  - nvme: the optimizer's pass over NVMe-resident state (12 bytes per element read and
//    written; with the gradients on NVMe their 4 bytes written each micro-batch and read back),
//    reads and writes in flight together at the profile's mixed rate (bounded by each
//    direction's own; without a mixed figure, one after the other), overlapped with
//    the update and, with zinf.overlap_optimizer (the default), with the last micro-batch's
//    backward; or, with parameters and optimizer both on NVMe, zinf.step_beside_forward
//    and steps that clip (or no overlap), its I/O under the next forward's compute,
//    whose first fetch of each module reads nothing from NVMe; and the parameter tier's
//    write-back when it lives on NVMe (a request a shard,
//    all in one batch, as many at once as aio.queue_depth x aio.thread_count; with several
//    ranks at least what the profile measured two ranks pay per shard, Note [Loaded shard
//    writes] in tools/bench_profile.cc).
// The step is compute + exposed gather + reduce + what of max(optimizer update, nvme pass)
// the last backward does not hide + the parameter tier's write. zinf.delayed_param_update is
// not modelled (its update hides behind the next batch). It knows nothing of the machine's other
// load beyond what the profile measured; bench/RESULTS.md compares it with measured steps.
//
// Thread-safety: plain functions over values.
#ifndef ZINF_TOOLS_PLAN_MODEL_H_
#define ZINF_TOOLS_PLAN_MODEL_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/engine.h"
#include "zinf/status.h"

namespace zinf::plan {

// A module as the trainer registers it: its parameters' element counts, in order.
struct ModuleShape {
  std::string name;
  std::vector<uint64_t> numels;
};

// What the plan needs of a model: its modules, the order a training micro-batch fetches them
// (forward then backward), and its compute.
struct ModelSpec {
  std::string description;  // "GPT d_model 128, 4 layers, ..." for the table's heading
  std::vector<ModuleShape> modules;
  std::vector<int> fetch_order;  // module indices, one micro-batch
  // The matmul FLOPs done while each fetch of fetch_order is held (same length).
  std::vector<double> fetch_flops;
  double matmul_flops_per_micro_batch = 0;  // their sum
  // Of those, attention's small batched matmuls (at the profile's attention rate), and the
  // std::exp calls of the softmax and the loss.
  double attention_flops_per_micro_batch = 0;
  double exps_per_micro_batch = 0;
  // Elements through the MLP's tanh GELU, forward and backward, at the profile's GELU rates:
  // its arithmetic, not its bytes, sets its pace.
  double gelu_forward_elements_per_micro_batch = 0;
  double gelu_backward_elements_per_micro_batch = 0;
  // Bytes the non-matmul work (layer norms, softmax, GELU, the loss, embeddings) reads and
  // writes per micro-batch: it runs at memory bandwidth.
  double elementwise_bytes_per_micro_batch = 0;
  // oneDNN calls per micro-batch: each costs the profile's kernel_call time on top of its
  // work, which counts at a small d_model.
  double kernel_calls_per_micro_batch = 0;
  // The matmuls are oneDNN's (GPT) or a plain single-threaded loop (the MLP example).
  bool plain_loop_compute = false;
  uint64_t activation_bytes = 0;  // the trainer's, per rank
  // A PyTorch trainer's on a GPU, in 16 bits (Note [Plan on described hardware] in
  // tools/plan_hardware.h): with recomputation, each block's input kept and one block's
  // activations while it is recomputed (Korthikanti et al., 2022: s b h (34 + 5 a s / h) bytes
  // a block), and the logits in fp32.
  uint64_t gpu_activation_bytes = 0;
  uint64_t hidden_size = 0;
  double tokens_per_micro_batch = 0;

  uint64_t parameter_count() const;
};

// The GPT example's model (examples/gpt/gpt_model.h: embed, n_layer blocks, ln_f; the tied
// head fetches embed again; activation checkpointing recomputes each block in backward).
// InvalidArgument for non-positive dimensions or n_head not dividing d_model.
StatusOr<ModelSpec> GptModel(int vocab_size, int seq_len, int d_model, int n_layer, int n_head,
                             int micro_batch, bool activation_checkpointing = true);
// The MLP example's model (examples/mlp/train_mlp.cc: `layers` modules of a width x width
// weight and a bias).
StatusOr<ModelSpec> MlpModel(int layers, int width, int batch);
// `params` parameters in `layers` equal modules of one square weight each, computed as a
// transformer computes: 6 FLOPs per parameter per token (8 with recomputation).
StatusOr<ModelSpec> UniformModel(uint64_t params, int layers, uint64_t tokens_per_micro_batch);

// A config file's model: a "model" object (the GPT example's keys) makes a GPT; without one
// the file is a DeepSpeed config of the MLP example, shaped by `mlp_layers` and `mlp_width`.
// The rest of the file is the base EngineConfig (its placement is what the plan varies), its
// batch keys resolved for `world_size` ranks as the engine resolves them
// (EngineConfig::ResolveBatchSize), and the model's description ends with that batch shape.
// InvalidArgument naming the file and the key for a bad config.
struct ConfigModel {
  ModelSpec model;
  EngineConfig config;
};
StatusOr<ConfigModel> ModelFromConfigText(std::string_view text, const std::string& source,
                                          int mlp_layers, int mlp_width, int world_size = 1);

// What `zinf bench profile` measured (its JSON; see tools/bench_profile.cc). Rates in bytes or
// FLOPs per second; 0 where the profile has no figure.
struct MachineProfile {
  int cores = 1;
  uint64_t memory_bytes = 0;
  uint64_t gpu_memory_bytes = 0;  // 0: no GPU
  uint64_t nvme_free_bytes = 0;
  std::vector<std::string> nvme_paths;
  double nvme_read_Bps = 0, nvme_write_Bps = 0;
  double nvme_mixed_Bps = 0;  // reads and writes in flight together, their bytes; 0: not measured
  double nvme_read_latency_s = 0, nvme_write_latency_s = 0;  // one request at a time
  uint64_t nvme_measured_bytes = 0;  // the file the NVMe rates were measured on; 0: unknown
  struct OptimizerRow {
    int threads = 0;
    double params_per_s = 0;
  };
  std::vector<OptimizerRow> optimizer;
  double memory_Bps = 0;
  double h2d_Bps = 0, d2h_Bps = 0;  // 0: unlimited (the host device without a link model)
  struct MatmulRow {
    int threads = 0;
    double d = 0;  // the inner dimension (d_model) measured; 0: any
    double fp32_flops = 0, bf16_flops = 0;
    // The rows of the left operand (tokens per micro-batch); profiles without it measured 512.
    double tokens = 512;
  };
  std::vector<MatmulRow> matmul;
  double loop_fp32_flops = 0;  // one thread, the plain loop
  // Per thread count: a oneDNN call's fixed cost and the rates of the GPT's small kernels.
  struct CallRow {
    int threads = 0;
    double seconds = 0;
    double attention_flops = 0;                              // attention's small batched matmuls
    double gelu_forward_per_s = 0, gelu_backward_per_s = 0;  // elements; 0: not measured
  };
  std::vector<CallRow> kernel_call;  // empty: not measured
  // The row of the most threads measured up to `threads` (the fewest measured without one);
  // a row of zeros without any.
  const CallRow& KernelCall(int threads) const;
  double exp_per_s = 0;  // std::exp, one thread; 0: not measured
  double collective_latency_s = 0;
  double allgather_Bps = 0, reduce_scatter_Bps = 0;  // 2 ranks; 0: not measured
  // Note [Collectives' CPU]: a rank's CPU time, its threads and the kernel's together, per
  // collective and per byte of the collective's full buffer; 0: not measured.
  double collective_cpu_s = 0, collective_cpu_s_per_byte = 0;
  // Note [Loaded rendezvous]: the mean wait of a fetch for its prefetched all-gather after
  // so much compute, by compute; empty: not measured.
  // The batch's first blocking rendezvous (the step's norm all-reduce) waits for the ranks'
  // skew: step_s.
  struct LoadedWaitRow {
    double compute_s = 0, wait_s = 0, step_s = 0;
  };
  std::vector<LoadedWaitRow> loaded_wait;
  // Interpolated in log(compute) between the rows (the nearest row outside them); 0 without.
  double LoadedWait(double compute_s, double LoadedWaitRow::*figure) const;
  // Note [Loaded shard writes]: what a rank pays per parameter shard it writes back to NVMe
  // while another rank on the machine does the same; 0: not measured.
  double loaded_shard_write_s = 0;

  // InvalidArgument naming `source` and the key for a missing or malformed figure.
  static StatusOr<MachineProfile> FromJson(std::string_view text, const std::string& source);
  double OptimizerRate(int threads) const;  // nearest measured thread count at or below
  // The rate at the most threads measured up to `threads`, interpolated in log(d) between the
  // sizes measured (the nearest outside them).
  // The GPT's linear layers' rate at `threads`, for d_model `d` and `tokens` per micro-batch
  // (0: any), interpolated in log d and log tokens between the measured rows.
  double MatmulRate(int threads, bool bf16, double d = 0, double tokens = 0) const;
};

// Bytes per rank, steady and peak (Note [Plan memory]).
struct MemoryEstimate {
  // Steady state, as StepSummary reports it.
  uint64_t host_arrays = 0;  // gradient accumulators, fp32 master, in-memory optimizer state
  uint64_t param_tier = 0;   // the compute-precision shards where they live in memory
  uint64_t persistent = 0;   // gathered persistent parameters
  // Shard copies in the device tier when the shards live off it: what the step's last
  // fetches left cached (copies stay until the budget needs their room) and the next batch's
  // first modules read ahead at the step.
  uint64_t device_cache = 0;
  uint64_t nvme_staging = 0;     // the pipelined optimizer's staging arena
  uint64_t host_state_pool = 0;  // optimizer chunks kept in memory (optimizer_nvme_ratio < 1)
  // The reduce-scatter buckets in the device tier (several ranks): one while a micro-batch's
  // gradients fit in one, else two.
  uint64_t buckets = 0;
  uint64_t nvme = 0;  // swap files
  // The optimizer's NVMe chunks, and those the overlapped step steps beside backward (as many
  // as the disk has room for; the rest run after it).
  uint64_t optimizer_chunks = 0, speculative_chunks = 0;
  uint64_t steady_host() const {  // = StepSummary::host_bytes
    return host_arrays + param_tier + persistent + device_cache + nvme_staging + host_state_pool +
           buckets;
  }
  // Peak.
  uint64_t device_budget = 0;  // the engine's device tier budget
  uint64_t host_budget = 0;    // the engine's host tier budget
  uint64_t activations = 0;
  uint64_t peak_device = 0;  // on the compute device
  uint64_t peak_host = 0;    // in host memory (with a host device: everything)
};

struct TimeEstimate {
  double compute = 0, gather = 0, reduce = 0, optimizer = 0, nvme = 0;
  double step = 0;
  // Traffic per step, for the table and the comparison with StepSummary.
  uint64_t bytes_gathered = 0;
  uint64_t nvme_read = 0, nvme_written = 0;
};

struct Estimate {
  MemoryEstimate memory;
  TimeEstimate time;
  bool fits = false;
  std::string why;  // what does not fit
};

struct PlanOptions {
  int world_size = 1;             // data-parallel ranks (on this machine)
  int threads = 0;                // per rank for compute and the optimizer; 0: cores / ranks
  uint64_t memory_bytes = 0;      // overrides; 0: the profile's
  uint64_t gpu_memory_bytes = 0;  // overrides; 0: the profile's (none: the host device)
  uint64_t nvme_free_bytes = 0;   // overrides; 0: the profile's
  // Sizes only (no profile): an NVMe placement needs no measured bandwidth to fit, and the
  // times are left at 0.
  bool sizes_only = false;
  // The steps clip their gradients (early training with gradient_clipping set, when the norm
  // is far above it): the overlapped step then runs after backward (Note [Overlapped step]),
  // so no optimizer time hides behind backward.
  bool clipped = false;
};

// Compute threads per rank (options.threads, else the profile's cores shared by the ranks),
// and whether the ranks' compute then takes every core (the helpers' threads wait for one).
int ThreadsPerRank(const MachineProfile& profile, const PlanOptions& options);
bool ComputeTakesEveryCore(const MachineProfile& profile, const PlanOptions& options);

// `fp32_view`: the engine hands out 16-bit parameters widened to fp32 too (the host device).
// `nvme_free_per_rank`: the NVMe path's free bytes for each rank, which bound the overlapped
// step's room as the engine bounds it (SpeculativeChunks); 0: room for all of it.
MemoryEstimate EstimateMemory(const ModelSpec& model, const EngineConfig& config, int world,
                              bool fp32_view = true, uint64_t nvme_free_per_rank = 0);
StatusOr<Estimate> EstimatePlacement(const ModelSpec& model, const EngineConfig& config,
                                     const MachineProfile& profile, const PlanOptions& options);

// Every placement the engine offers at stage 3: offload_param none/cpu/nvme x offload_optimizer
// none/cpu/nvme (nvme at optimizer_nvme_ratio 1 and 0.5, and with the gradients on NVMe too),
// x precision fp32/bf16/fp16, on top of `base` (its buckets, thresholds, optimizer, batch, the
// overlapped step). NVMe placements get `nvme_path`.
std::vector<EngineConfig> Placements(const EngineConfig& base, const std::string& nvme_path);

// A short name: "param nvme, optim nvme 0.5, bf16", "param cpu, optim nvme, grads nvme, fp32".
std::string PlacementName(const EngineConfig& config);

// The DeepSpeed config for `config`, with DeepSpeed's keys (and zinf's under "zinf"), starting
// from `base_json` (the user's config, or "{}") so that keys the plan does not decide stay
// as given. EngineConfig::FromJson accepts it.
StatusOr<std::string> DeepSpeedJson(const EngineConfig& config, std::string_view base_json);

}  // namespace zinf::plan

#endif  // ZINF_TOOLS_PLAN_MODEL_H_
