// The ZeRO engine: parameters, gradients and optimizer state sharded across data-parallel
// ranks; parameters gathered just before a module runs and released after; gradients
// reduce-scattered so that each rank keeps its own shard; the optimizer stepped on the CPU.
//
// A trainer uses it like this (see tests/zero/mlp_test.cc for a complete one):
//
//   auto engine = Engine::Create(EngineConfig::FromJsonFile("ds_config.json").value(), {});
//   int fc1 = engine->RegisterModule("fc1", {{"fc1.weight", {64, 32}}, {"fc1.bias", {64}}});
//   engine->Initialize();
//   for each step:
//     for each micro-batch:
//       forward:  auto p = engine->Fetch(fc1);  ... use p->params[i] ...  engine->Release(fc1);
//       backward: auto p = engine->Fetch(fc1);  auto g = engine->Gradients(fc1);
//                 write g[i] (of the loss times loss_scale());
//                 engine->ReduceGradients(fc1); engine->Release(fc1);
//     auto summary = engine->Step();
//
// Numerics: the optimizer sees the mean gradient over ranks and micro-batches (each rank's
// loss is its micro-batch mean), exactly as one process training on the whole global batch.
// The master copy, the gradient accumulators and the optimizer state are fp32.
//
// Every rank must make the same calls in the same order (they drive collectives). Errors
// name the rank, the module and the parameter; a dead peer is reported within
// EngineOptions::timeout.
//
// Thread-safety: one thread drives an Engine.
#ifndef ZINF_ENGINE_H_
#define ZINF_ENGINE_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/aio.h"
#include "zinf/cpu_optimizer.h"
#include "zinf/dtype.h"
#include "zinf/export.h"
#include "zinf/status.h"

namespace zinf {

// DeepSpeed's "scheduler": {"type": ..., "params": {...}}, with DeepSpeed's parameter names
// and defaults. The engine sets the optimizer's learning rate (and, for OneCycle, its betas)
// from it after every applied step, as DeepSpeed's engine calls scheduler.step() after
// optimizer.step(); the formulas and that ordering are in src/zero/lr_schedule.h.
struct SchedulerConfig {
  // "" (no scheduler: optimizer.params.lr throughout, or what SetLearningRate sets), WarmupLR,
  // WarmupDecayLR, WarmupCosineLR, OneCycle or LRRangeTest.
  std::string type;
  // WarmupLR, WarmupDecayLR: from warmup_min_lr to warmup_max_lr over warmup_num_steps (at
  // least 2), log or linear in the step; WarmupDecayLR then falls linearly to 0 at
  // total_num_steps. Unset warmup_max_lr: WarmupLR takes optimizer.params.lr, WarmupDecayLR
  // 0.001 (DeepSpeed's defaults).
  double warmup_min_lr = 0.0;
  std::optional<double> warmup_max_lr;
  int64_t warmup_num_steps = 1000;  // also WarmupCosineLR's
  std::string warmup_type = "log";  // log | linear; also WarmupCosineLR's
  int64_t total_num_steps = 0;      // WarmupDecayLR and WarmupCosineLR: required
  // WarmupCosineLR: optimizer.params.lr times a ratio that warms up from warmup_min_ratio to
  // 1, then follows a cosine down to cos_min_ratio at total_num_steps.
  double warmup_min_ratio = 0.0;
  double cos_min_ratio = 0.0001;
  // OneCycle: up from cycle_min_lr to cycle_max_lr over cycle_first_step_size steps, down
  // over cycle_second_step_size (unset: the first), then cycle_min_lr divided by
  // (1 + decay_lr_rate * steps past the cycle / decay_step_size). With cycle_momentum, beta1
  // moves the other way between cycle_max_mom and cycle_min_mom and beta2 is 0.99, as in
  // DeepSpeed (off, with a warning, for Adagrad, which has no betas).
  double cycle_min_lr = 0.0;  // required
  double cycle_max_lr = 0.0;  // required
  double decay_lr_rate = 0.0;
  int64_t cycle_first_step_size = 2000;
  std::optional<int64_t> cycle_second_step_size;
  int64_t decay_step_size = 0;  // 0: no decay after the cycle
  bool cycle_momentum = true;
  double cycle_min_mom = 0.8;
  double cycle_max_mom = 0.9;
  double decay_mom_rate = 0.0;
  // LRRangeTest: lr_range_test_min_lr * (1 + step_rate * steps / step_size), the quotient
  // rounded down with staircase.
  double lr_range_test_min_lr = 1e-3;
  int64_t lr_range_test_step_size = 2000;
  double lr_range_test_step_rate = 1.0;
  bool lr_range_test_staircase = false;
};

// What a trainer knows for the keys a config leaves as "auto", as Hugging Face's DeepSpeed
// integration fills them (its TrainingArguments in brackets). An "auto" with no value here
// gets the documented default of its key, a warning that names the key and where its value
// came from (Note [Dropped "auto"] in src/zero/engine_config.cc). A value here that differs
// from one the config spells out is InvalidArgument naming both, as in Hugging Face.
struct TrainerValues {
  std::optional<int> micro_batch_size;             // [per_device_train_batch_size]
  std::optional<int> gradient_accumulation_steps;  // [gradient_accumulation_steps]
  std::optional<double> gradient_clipping;         // [max_grad_norm]
  std::optional<double> lr;  // [learning_rate]: optimizer.params.lr, scheduler warmup_max_lr
  std::optional<double> beta1, beta2;  // [adam_beta1, adam_beta2]
  std::optional<double> eps;           // [adam_epsilon]
  std::optional<double> weight_decay;  // [weight_decay]
  // scheduler.params.total_num_steps [the run's steps]: fills "auto" only; a number in the
  // config is the schedule's length and may differ from where this run stops.
  std::optional<int64_t> total_num_steps;
  std::optional<int64_t> warmup_num_steps;  // scheduler.params.warmup_num_steps [warmup_steps]
  std::optional<bool> fp16, bf16;           // fp16.enabled, bf16.enabled [fp16, bf16]
  // The model's hidden size: "auto" bucket sizes become hidden^2 (reduce_bucket_size),
  // 0.9 hidden^2 (stage3_prefetch_bucket_size) and 10 hidden
  // (stage3_param_persistence_threshold), Hugging Face's choices.
  std::optional<int64_t> hidden_size;
};

// Where offload_param / offload_optimizer put their state (DeepSpeed's "device" key).
enum class OffloadDevice { kNone, kCpu, kNvme };
ZINF_EXPORT std::string_view OffloadDeviceName(OffloadDevice device);  // "none", "cpu", "nvme"

// The parts of a DeepSpeed config the engine implements, with DeepSpeed's key names. Unknown
// keys are errors; keys zinf accepts but does not act on are warnings (see `warnings`).
// Defaults are DeepSpeed's.
struct ZINF_EXPORT EngineConfig {
  int zero_stage = 3;  // zero_optimization.stage: 1, 2 or 3
  // Gradients are reduce-scattered in buckets of this many elements, each while backward goes
  // on; a bucket takes this many elements of host memory, twice (one filling, one in flight).
  // zero_optimization.reduce_bucket_size (elements); 0, as in DeepSpeed, a bucket per
  // parameter: a bucket always grows to hold the largest parameter.
  uint64_t reduce_bucket_size = 500000000;
  uint64_t stage3_param_persistence_threshold = 100000;  // elements; smaller params stay gathered
  // Prefetching of NVMe-resident parameters reads ahead this many elements along the recorded
  // module order, and stops where the gathered and prefetched parameters would exceed
  // stage3_max_live_parameters elements.
  uint64_t stage3_prefetch_bucket_size = 50000000;
  uint64_t stage3_max_live_parameters = 1000000000;
  // zero_optimization.sub_group_size (elements): read and checked, but zinf's NVMe optimizer
  // step sizes its chunks from zinf.host_budget instead (a warning says so).
  uint64_t sub_group_size = 1000000000;
  OffloadDevice offload_param_device = OffloadDevice::kNone;
  OffloadDevice offload_optimizer_device = OffloadDevice::kNone;
  // offload_optimizer.ratio, DeepSpeed's meaning: the fraction of the optimizer state kept on
  // the CPU and stepped there, the rest on the GPU ("partial offload", stage 3). zinf has no
  // GPU optimizer: it steps all of it on the CPU, and a ratio below 1 is a warning saying so.
  double offload_optimizer_cpu_ratio = 1.0;
  // zinf.optimizer_nvme_ratio: with offload_optimizer.device nvme, the fraction of the
  // optimizer state (and fp32 master) whose home is NVMe; the rest stays in host memory and
  // is stepped in the same pipeline. In [0, 1].
  double optimizer_nvme_ratio = 1.0;
  // offload_param.nvme_path and offload_optimizer.nvme_path (one path or a list each); a
  // device nvme needs its own. The engine keeps one swap store striped over NvmePaths().
  std::vector<std::string> offload_param_nvme_path;
  std::vector<std::string> offload_optimizer_nvme_path;
  // The store's host tier (parameters' host copies, gradients' landing, the NVMe optimizer
  // step's staging) page-locked, so that a GPU copies at full speed and asynchronously: on by
  // default, as DeepSpeed's offload pins; pin_memory false in offload_param or offload_optimizer
  // (or the deprecated cpu_offload_use_pin_memory) turns it off. The host device has nothing
  // to pin for and ignores it.
  bool pin_memory = true;
  int gradient_accumulation_steps = 1;
  int micro_batch_size = 1;  // train_micro_batch_size_per_gpu: for the trainer; the engine
                             // sees only gradients
  // train_batch_size: micro_batch_size x gradient_accumulation_steps x data-parallel ranks.
  // 0: not given, or "auto" with nothing to resolve it from. ResolveBatchSize checks it once
  // the number of ranks is known, deriving the factors the config left out as DeepSpeed does.
  int64_t train_batch_size = 0;
  // Whether the config set train_micro_batch_size_per_gpu and gradient_accumulation_steps
  // (or an "auto" the trainer resolved); those left unset are what ResolveBatchSize derives.
  bool micro_batch_size_set = false;
  bool gradient_accumulation_steps_set = false;
  double gradient_clipping = 0.0;  // 0: off
  // bf16 or fp16: the compute precision. Parameters are stored on their tier and gathered in
  // it (half the bytes of fp32), and Fetch hands out those 16-bit values widened to fp32; the
  // master copy, gradients and optimizer state stay fp32. fp16 adds dynamic loss scaling
  // (scale grows by 2 every loss_scale_window good steps, halves on overflow, never below
  // min_loss_scale).
  bool fp16 = false;
  bool bf16 = false;
  double initial_scale_power = 16;  // fp16.initial_scale_power: scale starts at 2^this
  int loss_scale_window = 1000;
  int hysteresis = 2;
  double min_loss_scale = 1;
  // optimizer: {"type": "AdamW", "params": {"lr", "betas", "eps", "weight_decay",
  // "bias_correction"}}, what the CPU optimizer takes as it is. "Adam" is AdamW unless
  // adam_w_mode is false, as in DeepSpeed. Keys the config leaves out keep AdamW's defaults
  // (lr 1e-3, betas 0.9 and 0.999, eps 1e-8, no weight decay) whatever the type.
  OptimizerHyperParams optimizer;
  SchedulerConfig scheduler;
  uint64_t seed = 42;  // zinf's own: parameters are a function of (seed, name, index)
  // The "aio" object: how the NVMe swap files are read and written.
  AioOptions aio;
  // Host memory for the NVMe step's staging buffers (zinf's own key: zinf.host_budget).
  uint64_t nvme_staging_budget_bytes = 512ull << 20;
  // The device tier's bytes (zinf's own key: zinf.device_budget; 0: what the model needs plus
  // 64 MiB of slack, Note [Tier budgets]). A budget below what the engine computes in (twice
  // the largest module's working set, the read-ahead window, the gradient buckets) is refused
  // at Initialize, naming both.
  uint64_t device_budget_bytes = 0;
  // CRC32C of every swap-file piece, taken on write and verified on read, so that a flipped
  // bit on disk is DataLoss naming the file and offset instead of silently diverged weights
  // (zinf.nvme_checksum; its cost is in bench/RESULTS.md).
  bool nvme_checksum = true;
  // zinf.overlap_optimizer: with offload_optimizer.device nvme, the optimizer step runs while
  // backward goes on, chunk by chunk as gradients become final, speculating that the step is
  // neither clipped nor skipped and redoing it when it is, so the result is bitwise that of
  // the step after backward (Note [Overlapped step] in src/zero/optimizer_overlap.h). Costs
  // swap space for the optimizer state once more.
  bool overlap_optimizer = true;
  // zinf.overlap_optimizer_swap_bytes: at most this much swap space for the overlapped step's
  // new state (0: as much as the NVMe path has free, up to the whole state); chunks beyond
  // it are stepped after backward.
  uint64_t overlap_optimizer_swap_bytes = 0;
  // zinf.step_beside_forward: with parameters and optimizer state both on NVMe (stage 3),
  // what is left of the step once the gradient norm is known runs beside the next batch's
  // forward, chunk by chunk in the order that forward fetches the parameters: each fetch
  // waits only for its own module's parameters, and takes them from memory as the step
  // writes them instead of reading them back from NVMe (Note [Step in the next forward's
  // order] in src/zero/step_beside_forward.h). Bitwise the step run before the forward. The
  // next Gradients call, and whatever reads or changes the model or the optimizer
  // (GatherParameter, checkpoints, SetLearningRate), wait for it; its errors are theirs. The
  // step runs at most the next module (or stage3_prefetch_bucket_size elements) ahead of the
  // forward, so the copies it keeps are that much host memory; an engine closed with the
  // step in flight stops it. On by default.
  bool step_beside_forward = true;
  // zinf.delayed_param_update (DPU, from the ZeRO-Offload paper): with the optimizer state in
  // host memory, step t's update runs on the CPU during batch t+1 and its parameters are used
  // from batch t+2 on: each batch computes with parameters one step stale, and the update
  // never waits for backward nor backward for it. Off by default; it changes the numbers (its
  // effect on the demo's loss curve is in bench/RESULTS.md). GatherParameter, checkpoints and
  // the like wait for the update in flight and see its result. Costs a second fp32 gradient
  // array in host memory. The first zinf.delayed_param_update_warmup_steps steps are not
  // delayed (40, as in the paper).
  bool delayed_param_update = false;
  // zinf.gradients_on_nvme: with offload_optimizer.device nvme, the fp32 gradient accumulators
  // live on NVMe beside the optimizer state instead of in host memory (4 bytes a parameter),
  // so host memory no longer grows with the model (Note [Gradients on NVMe] in
  // src/zero/nvme_gradients.h). Their writes are asynchronous, and the overlapped step
  // steps each chunk once its gradients are on disk.
  bool gradients_on_nvme = false;
  int64_t delayed_param_update_warmup_steps = 40;
  // zinf.layer_major: the trainer runs every micro-batch of the step through a module before
  // it fetches the next one (Note [Layer-major micro-batches] in src/zero/engine.cc). Each
  // module is fetched once in forward and once in backward a step instead of
  // gradient_accumulation_steps times each, its gradients accumulate over the step's
  // micro-batches in the buffers of one Gradients() call, and it is reduced once a step
  // (ReduceGradients once per module and step, not per micro-batch). On one rank the result is
  // bitwise that of the micro-batch-major schedule; on several, each rank sums its
  // micro-batches (in micro-batch order) before the ranks' sums are reduced.
  bool layer_major = false;
  // Reductions of each module per step: 1 with layer_major, else gradient_accumulation_steps.
  int ReductionsPerStep() const { return layer_major ? 1 : gradient_accumulation_steps; }

  // One line per key the config sets that zinf accepts but does not act on as DeepSpeed
  // would, naming the key, its value and why (e.g. "config key 'zero_optimization.
  // overlap_comm' is false; zinf always overlaps ..."). FromJson fills it and logs each line
  // once as a warning.
  std::vector<std::string> warnings;

  // Parses DeepSpeed JSON; "auto" values are taken from `trainer`, else from their documented
  // defaults (each logged). InvalidArgument names the key path, the value and what is
  // allowed. Never throws.
  static StatusOr<EngineConfig> FromJson(std::string_view json_text,
                                         const TrainerValues& trainer = {});
  static StatusOr<EngineConfig> FromJsonFile(const std::string& path,
                                             const TrainerValues& trainer = {});
  Status Validate() const;
  // Settles train_batch_size = micro_batch_size x gradient_accumulation_steps x world_size
  // for `world_size` data-parallel ranks: a factor the config left unset is derived (the
  // accumulation steps first, as DeepSpeed does; both unset: accumulation 1), then the
  // product is checked. InvalidArgument naming the three numbers and the world size when
  // they disagree or do not divide. Engine::Create calls it on its copy of the config.
  Status ResolveBatchSize(int world_size);
  // "train_batch_size 32 = micro-batch 8 x gradient accumulation 2 x 2 data-parallel rank(s)",
  // for logs: the batch shape after ResolveBatchSize(world_size). Engine::Create logs it.
  std::string BatchShape(int world_size) const;
  // The union of offload_param_nvme_path and offload_optimizer_nvme_path, each path once, in
  // order of appearance.
  std::vector<std::string> NvmePaths() const;
};

// Where this process sits; by default read from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT
// (torchrun, `zinf run`), and a single process when they are unset.
struct EngineOptions {
  // The compute device, where gathered parameters and gradients live: "host" (the CPU as a
  // device, see include/zinf/device.h; behind a modelled PCIe link when ZINF_HOST_LINK_GBPS is
  // set), "cuda:N" (gathers and gradient reductions on the GPU over NCCL, only this rank's
  // reduced shard copied to host memory), "cuda" (cuda:LOCAL_RANK), or "auto" (the default):
  // cuda:LOCAL_RANK where this node has that GPU, else host. A trainer that computes on the
  // CPU, reading and writing the engine's tensors through host pointers, asks for "host".
  // Unavailable (saying why) for a GPU that is not there or a build without CUDA.
  std::string device = "auto";
  int rank = -1;        // -1: from the environment
  int world_size = -1;  // -1: from the environment
  // Empty: from the environment (default 127.0.0.1). An address other than loopback needs
  // the rendezvous secret in ZINF_STORE_SECRET, the same for every rank (`zinf run` sets it).
  std::string master_addr;
  // zinf's rendezvous port. 0: from the environment: ZINF_MASTER_PORT, else MASTER_PORT + 1
  // (MASTER_PORT is torch.distributed's; default 29500), so 29501 by default.
  int master_port = 0;
  // A collective or rendezvous that makes no progress this long fails (a dead rank).
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // Threads for the CPU optimizer (0: all CPUs this process may use).
  int optimizer_threads = 0;
  // The global ranks of this rank's data-parallel group, when zinf shards over a subset of the
  // processes (tensor or pipeline parallelism done elsewhere: with tensor parallel size 2 on 4
  // processes, {0, 2} and {1, 3}). Must hold `rank`; every member passes the same list. Empty:
  // all ranks. The engine's rank() and world_size() are then those within the group, and
  // checkpoint files are named by them: give each group a checkpoint directory of its own.
  std::vector<int> data_parallel_ranks;
  // Whether Fetch also hands out fp32 copies of 16-bit parameters (FetchedModule::params), on
  // the host device. A trainer that computes in the compute precision turns it off and saves
  // a widening pass and 4 bytes an element of device memory per fetched parameter.
  bool fp32_view = true;
};

enum class ParamInit { kNormal, kZeros, kOnes };

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  ParamInit init = ParamInit::kNormal;
  float init_std = 0.02f;  // for kNormal: N(0, init_std^2)
  // The optimizer parameter group it steps in: 0, the config's "optimizer", or a group that
  // Engine::AddParamGroup returned.
  int optimizer_group = 0;
  // false: a frozen parameter (a LoRA base, a reference model): sharded and placed as the
  // others, gathered by Fetch, but with no fp32 master, gradient or optimizer state. Its
  // values live only in the parameter tier, in the compute precision; Gradients hands out no
  // buffer for it (nullptr) and Step never changes it (Note [Frozen parameters] in
  // src/zero/partition.h).
  bool trainable = true;
};

// One gathered parameter in the engine's compute device memory (EngineOptions::device).
struct ParamTensor {
  void* data = nullptr;
  ElementType dtype = ElementType::kFp32;
  uint64_t numel = 0;
};

// Where Initialize takes the parameters' initial values from, instead of ParamSpec::init:
// writes elements [first, first + count) of parameter `name`'s flattened value (row-major, as
// registered) into `out`. Initialize calls it only for the elements this rank owns, each once,
// in registration order, on the calling thread, and writes them straight to the shard's home
// (the fp32 master, the NVMe optimizer state, the parameter tier). A non-OK status stops
// Initialize, which returns it with the rank and the parameter named.
using InitialValues =
    std::function<Status(const std::string& name, uint64_t first, uint64_t count, float* out)>;

class Device;  // zinf/device.h
class Event;
struct TieredStoreStats;

// A module's full parameters while it is fetched, in device memory of the compute device.
// Pointers stay valid until Release.
struct FetchedModule {
  // The gathers and conversions that filled the tensors complete at this event, owned by the
  // engine and valid until Release: a GPU trainer makes its compute stream wait on it
  // (Stream::Wait) instead of synchronizing the host. On the host device, where the caller's
  // thread is the compute stream, it has completed when Fetch returns.
  Event* ready = nullptr;
  // In the compute precision (EngineConfig::bf16, fp16, else fp32): what the device computes
  // with. One per ParamSpec.
  std::vector<ParamTensor> tensors;
  // The same values widened to fp32 (the tensors themselves at fp32), one per ParamSpec,
  // numel elements each: for trainers that compute in fp32 on the host device. Empty on a GPU.
  std::vector<float*> params;
};

// How a trainer's backward writes the buffers Engine::Gradients hands out: kAdd, adding into
// them (a kernel that accumulates, several micro-batches summed in one buffer), so they start
// as zeros; kOverwrite, writing every element, so nothing need be zeroed first.
enum class GradientWrite { kAdd, kOverwrite };

struct StepSummary {
  int64_t step = 0;         // optimizer steps taken (skipped ones not counted)
  bool skipped = false;     // fp16 overflow: nothing was updated
  double grad_norm = 0.0;   // global L2 norm of the mean gradient, before clipping
  double loss_scale = 1.0;  // the scale for the next step's backward
  double clip_coefficient = 1.0;
  uint64_t bytes_gathered = 0;  // all-gather traffic this step (this rank's view)
  // All-gather collectives started this step: one per module fetched and not already
  // gathered, its parameters together (each a rendezvous of every rank).
  uint64_t gather_collectives = 0;
  uint64_t bytes_reduce_scattered = 0;
  // Optimizer state and parameters to and from NVMe since the last step. A step whose last
  // part runs beside the next forward (zinf.step_beside_forward) counts that part in the next
  // summary, as it does its optimizer seconds.
  uint64_t bytes_nvme_read = 0;
  uint64_t bytes_nvme_written = 0;
  // The most parameter elements gathered or being prefetched at once (persistent ones not
  // counted): what stage3_max_live_parameters bounds, beyond the module being fetched.
  uint64_t peak_live_parameters = 0;
  double seconds_gather = 0, seconds_reduce = 0, seconds_optimizer = 0;
  double seconds_optimizer_compute = 0;  // of seconds_optimizer, in the CPU update itself
  // The optimizer's NVMe pass run while backward went on (zinf.overlap_optimizer): wall time
  // of the chunks stepped then, before Step was called (Note [Overlapped step]).
  double seconds_optimizer_overlapped = 0;
  // Memory per tier after the step: the engine's host arrays (fp32 master, gradient
  // accumulators, optimizer state, staging buffers, gathered persistent parameters) and the
  // swap files it keeps on NVMe.
  uint64_t host_bytes = 0;
  uint64_t nvme_bytes = 0;
  // The budgets the engine gave its store's tiers (its device tier, host memory, and the swap
  // files' capacity): what `zinf plan` predicts for the placement.
  uint64_t device_budget_bytes = 0;
  uint64_t host_budget_bytes = 0;
  uint64_t nvme_capacity_bytes = 0;
  // The most the device tier held at once since the engine started: within
  // device_budget_bytes, whatever the model's size.
  uint64_t device_peak_bytes = 0;
  // The learning rate this step applied (what learning_rate() read before the step; a skipped
  // step's too), and when the step finished: seconds since the Unix epoch, system clock.
  double learning_rate = 0;
  double unix_time_s = 0;
  // Entries in the tiered store's bookkeeping after the step (TieredStoreStats): bounded by
  // what the engine holds, so a run's steps after the first few stay within the same range; a
  // count that climbs step after step is a leak.
  uint64_t store_entries = 0;
  // The host's work around the device since the last step's summary (the compute device's
  // TransferCounts: the engine's, its store's, and a trainer's own calls on that device), what
  // shows a host pass that a GPU run would pay. Counted per call, not per time waited (Note
  // [Transfer counters] in offload/tiered_store.cc).
  // Blocking waits (Event and Stream Synchronize, waits for the store's transfers) on the
  // threads that call the engine, and on zinf's own threads (transfer and optimizer threads).
  uint64_t host_waits = 0;
  uint64_t worker_waits = 0;
  // Copies by direction and their bytes: device to host (gradients coming down), host to
  // device (parameters going up), device to device (gathers, bucket packing), and host to host
  // through the device's streams. On the host device without a link, the store's memcpys
  // between the device and host tiers count as the copies they stand for.
  uint64_t copies_down = 0, bytes_down = 0;
  uint64_t copies_up = 0, bytes_up = 0;
  uint64_t copies_on_device = 0, bytes_on_device = 0;
  uint64_t copies_host = 0, bytes_host = 0;
  uint64_t device_bytes_set = 0;  // device memory zeroed (a gradient buffer's zeros, say)
  // Host memory the CPU itself zeroed and copied in the engine's passes (an accumulator
  // zeroed for a backward that adds into it, the parameter tier written from the master,
  // staging copies).
  uint64_t host_bytes_set = 0;
  uint64_t host_bytes_copied = 0;
};

class ZINF_EXPORT Engine {
 public:
  static StatusOr<std::unique_ptr<Engine>> Create(const EngineConfig& config,
                                                  const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  int rank() const;
  int world_size() const;
  // This process's index among the ranks on its node (LOCAL_RANK; 0 when unset), e.g. the GPU
  // a trainer should use.
  int local_rank() const;
  // The compute device (EngineOptions::device), once initialized (null before): a trainer
  // makes its streams and the events of Release and ReduceGradients on it.
  Device* compute_device() const;
  // The compute device as Create resolved EngineOptions::device: "host" or "cuda:N". Where a
  // trainer's compute goes, known before Initialize.
  const std::string& compute_device_name() const;
  // Whether every module's fetched tensors are its parameters' own memory, which stays where
  // it is and holds their current values for the engine's life (Step, SetParameter and the
  // loads write it in place, complete when they return): one rank, the parameters homed in
  // device memory (offload_param none), handed out in their stored precision (on the host
  // device: fp32, or fp32_view off), and no optimizer step writing them while backward goes
  // on (zinf.overlap_optimizer with the optimizer on NVMe). A trainer may then fetch each module
  // once, release it, and keep computing on those tensors with no Fetch or Release around each use,
  // provided its device is done reading them before it calls one of those writers (zinf.zero does:
  // Note [Resident parameters] in zinf/zero.py). False before Initialize.
  bool parameters_resident() const;
  // The tiered store's tiers, links and bookkeeping now (include zinf/tiered_store.h), once
  // initialized: what each tier holds at this moment, where a StepSummary reports after steps.
  StatusOr<TieredStoreStats> store_stats() const;

  // Registers a module before Initialize(); returns its id. InvalidArgument for empty or
  // duplicate names and non-positive dimensions.
  StatusOr<int> RegisterModule(const std::string& name, const std::vector<ParamSpec>& params);
  // Partitions every parameter, creates this rank's shards and optimizer state, and checks
  // that all ranks registered the same modules with the same config (FailedPrecondition
  // naming the difference otherwise). The parameters start from `initial_values` when given
  // (not kept past this call): how a model built elsewhere comes in one piece at a time, in
  // one pass and never whole in memory; else from each ParamSpec's init. Every rank must
  // supply the same values (each keeps its own elements only).
  Status Initialize(const InitialValues& initial_values = nullptr);

  StatusOr<FetchedModule> Fetch(int module);
  // Ends the module's use of its fetched tensors. `done` (optional): an event the trainer's
  // compute stream recorded after its last use of them; their memory is reused only after
  // it, and Release does not wait for it. Without it the tensors must no longer be in use.
  Status Release(int module, Event* done = nullptr);
  // Full-size gradient buffers for the module (one per ParamSpec), to be written by
  // backward; valid until ReduceGradients. Allocated only in backward, never in forward.
  // `write` says how backward writes them: GradientWrite::kAdd (the default) hands out zeros
  // to add into; kOverwrite, for a trainer that writes each of the parameter's elements (a
  // copy of its own gradient), hands them out as they are, with no pass to zero them (the
  // padding past them is never read). A second call for the
  // module before ReduceGradients returns the same buffers (what was written stays).
  StatusOr<std::vector<float*>> Gradients(int module, GradientWrite write = GradientWrite::kAdd);
  // Queues the module's gradients for reduce-scattering (in buckets of reduce_bucket_size,
  // asynchronously) into this rank's fp32 accumulators, and frees the buffers. `ready`
  // (optional): an event the trainer's compute stream recorded after backward wrote them;
  // they are read after it. FailedPrecondition when Gradients(module) was not called.
  Status ReduceGradients(int module, Event* ready = nullptr);
  // Ends a global batch: after gradient_accumulation_steps micro-batches of
  // ReduceGradients on every module, updates the parameters.
  StatusOr<StepSummary> Step();

  // The factor the trainer multiplies its loss by before backward (1 without fp16).
  double loss_scale() const;
  // The config as Create resolved it (ResolveBatchSize for this world size): a trainer reads
  // micro_batch_size and gradient_accumulation_steps here.
  const EngineConfig& config() const;
  // The learning rate the next Step() applies: optimizer.params.lr, the config's scheduler's
  // value for the steps taken so far, or what SetLearningRate set.
  double learning_rate() const;
  // Sets the learning rate of the following steps, for a trainer that runs its own schedule.
  // InvalidArgument for a negative or non-finite lr; FailedPrecondition when the config has a
  // scheduler (it would overwrite the value after the next step). Not a collective, but every
  // rank must set the same value.
  Status SetLearningRate(double lr);
  // ---- Optimizer parameter groups (torch's param_groups) ----
  // Adds a group before Initialize and returns its index (1, 2, ...; group 0 is the config's
  // "optimizer"): the parameters whose ParamSpec::optimizer_group names it step with these
  // hyper-parameters (lr, weight_decay, betas, eps...). The config's scheduler sets every
  // group's lr after each step (a fixed value to all, a ratio of each group's own lr), and
  // SetLearningRate sets every group's. InvalidArgument for a type other than the config's
  // optimizer's or bad hyper-parameters; FailedPrecondition after Initialize. Every rank must
  // add the same groups.
  StatusOr<int> AddParamGroup(const OptimizerHyperParams& hyper_params);
  int num_param_groups() const;
  // Group `group`'s hyper-parameters as the next Step() applies them (InvalidArgument for a
  // bad index).
  StatusOr<OptimizerHyperParams> param_group(int group) const;
  // Sets one group's learning rate, for a trainer whose schedule scales each group's own
  // (torch's LambdaLR). Errors as SetLearningRate's, and InvalidArgument for a bad index.
  Status SetGroupLearningRate(int group, double lr);
  // The mean of `value` over all ranks (a collective), e.g. the loss of the global batch.
  StatusOr<double> MeanOverRanks(double value);
  // Every rank's `count` fp32 values at `values` (host memory) become root_rank's: a
  // collective, e.g. to start every rank from one rank's values. InvalidArgument for a
  // null `values` with count > 0 or a root_rank outside [0, world_size).
  Status Broadcast(float* values, uint64_t count, int root_rank);
  // The full fp32 master value of a parameter (a collective: every rank must call it).
  Status GatherParameter(const std::string& name, std::vector<float>* out);
  // Replaces a parameter's value (`values` holds its numel elements on every rank; each rank
  // keeps its shard), e.g. to load pretrained weights after Initialize. Not a collective.
  // InvalidArgument for an unknown name or a wrong element count.
  Status SetParameter(const std::string& name, const float* values, uint64_t count);
  // Replaces every parameter's value with the tensor of the same name in the safetensors
  // file `path` (F32, BF16 or F16, widened to fp32; `zinf ckpt export` writes such files),
  // e.g. to start training from pretrained weights after Initialize. The optimizer state and
  // step counts are left as they are. A collective: every rank reads the file and keeps its
  // shards. Checked before anything is replaced: InvalidArgument naming the tensor when a
  // parameter has no tensor of its name, a tensor's shape differs from the parameter's, the
  // file holds tensors that are not parameters, or a dtype is not one of the three; DataLoss
  // for a truncated or corrupt file (see src/ckpt/safetensors.h); IoError when it cannot be
  // read. An I/O error while the values are written may leave some parameters replaced.
  Status LoadSafetensors(const std::string& path);
  // The gradient the next Step() would apply to a parameter before clipping: the mean over
  // ranks and micro-batches, loss scale removed. A collective; call it after the last
  // ReduceGradients of the batch.
  Status GatherGradient(const std::string& name, std::vector<float>* out);
  // ---- Module buffers ----
  // State of the model that is not trained (BatchNorm's running statistics and counters):
  // replicated, not sharded, as DeepSpeed keeps it; each rank holds its own values. SetBuffer
  // records this rank's current value of buffer `name` (a copy of `bytes` bytes at `data`,
  // `dtype` a safetensors name: F32, F64, F16, BF16, I64, I32, I16, I8, U8, BOOL); the first
  // call registers it, later ones must keep its dtype and shape. SaveCheckpoint writes rank 0's
  // values, LoadCheckpoint restores every rank's from them (a checkpoint that lacks one of the
  // registered buffers, or has others, is FailedPrecondition naming it), and `zinf ckpt export`
  // writes them beside the parameters. GetBuffer copies the value back into `out` (`bytes` must
  // be its size). InvalidArgument for a bad dtype, shape or size, a name that is a parameter's,
  // or (GetBuffer) one never set.
  Status SetBuffer(const std::string& name, const std::string& dtype,
                   const std::vector<int64_t>& shape, const void* data, uint64_t bytes);
  Status GetBuffer(const std::string& name, void* out, uint64_t bytes) const;
  // ---- Checkpoint metadata ----
  // A JSON object describing the model, which every later checkpoint carries (rank 0's) and
  // resuming does not need: `zinf ckpt export --hf` reads "hf_config" (the Hugging Face config
  // of a transformers model; zinf.zero sets it) and "zinf_gpt" (the GPT example's model
  // config). LoadCheckpoint replaces it with the checkpoint's. Not a collective.
  // InvalidArgument for text that is not a JSON object.
  Status SetCheckpointMetadata(const std::string& json_object);
  const std::string& checkpoint_metadata() const;  // "{}" until set
  // ---- Checkpoints (collectives: every rank calls them, between steps) ----
  // Saves what resuming needs to continue bitwise: the fp32 master shard, the optimizer state
  // and step counts, the loss scaler, and `client_state` (a JSON object of the trainer's, such
  // as its data position). Writes `dir`/`tag`/ (a file per rank and a manifest), then points
  // `dir`/latest at it and removes older checkpoints in `dir`. A crash at any moment leaves
  // the previous checkpoint loadable (format and protocol: src/ckpt/checkpoint.h).
  // FailedPrecondition with gradients pending or when `tag` is the latest checkpoint already.
  Status SaveCheckpoint(const std::string& dir, const std::string& tag,
                        const std::string& client_state = "{}");
  // Restores the checkpoint `dir`/latest (or `dir` itself, a tag directory) saved by the same
  // model and optimizer with any number of ranks (another world size is resharded on load:
  // each rank reads its shard from the saved ranks that hold it, optimizer state included),
  // and returns its client_state. Everything is verified before anything is replaced: a
  // missing, truncated or corrupt file is DataLoss naming it and leaves the engine as it was;
  // a different model or optimizer is FailedPrecondition naming the difference.
  StatusOr<std::string> LoadCheckpoint(const std::string& dir);

  // This rank's shard of a parameter: [offset, offset + size) of the flattened parameter.
  struct ShardRange {
    uint64_t offset = 0;
    uint64_t size = 0;  // 0 for ranks past the end of a small parameter
  };
  StatusOr<ShardRange> Shard(const std::string& name) const;

 private:
  struct Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf

#endif  // ZINF_ENGINE_H_
