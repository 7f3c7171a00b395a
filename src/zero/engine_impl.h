// Engine::Impl: the ZeRO engine's state, shared by the files that implement it along its
// seams: engine.cc (the facade: creation, registration, fetch, gradients, parameters),
// engine_tiers.cc (placement on the tiered store), engine_step.cc (the optimizer step) and
// engine_checkpoint.cc (checkpoints). The parts with state of their own are classes beside
// it: partition.h, param_tier.h, gradient_buckets.h, loss_scaler.h, process_group.h.
//
// Thread-safety: one thread drives an Engine (include/zinf/engine.h).
#ifndef ZINF_ZERO_ENGINE_IMPL_H_
#define ZINF_ZERO_ENGINE_IMPL_H_

#include <fmt/core.h>

#include <chrono>
#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ckpt/checkpoint.h"
#include "comm/communicator.h"
#include "comm/tcp_store.h"
#include "offload/pipelined_optimizer.h"
#include "zero/gradient_buckets.h"
#include "zero/loss_scaler.h"
#include "zero/nvme_gradients.h"
#include "zero/optimizer_overlap.h"
#include "zero/param_tier.h"
#include "zero/partition.h"
#include "zero/store_array.h"
#include "zero/tier_budgets.h"
#include "zinf/cpu_optimizer.h"
#include "zinf/engine.h"
#include "zinf/tiered_store.h"

namespace zinf {

using EngineClock = std::chrono::steady_clock;

inline double SecondsSince(EngineClock::time_point since) {
  return std::chrono::duration<double>(EngineClock::now() - since).count();
}

// A gradient buffer backward writes, between Gradients and ReduceGradients: a tensor of the
// device tier, or with one rank in a batch's first micro-batch the (zero) accumulator itself.
struct GradBuffer {
  TensorId tensor = 0;
  float* data = nullptr;
};

struct Engine::Impl {
  EngineConfig config;
  std::unique_ptr<TcpStore> store;
  std::unique_ptr<Communicator> comm;  // host memory: norms, agreement, checkpoints
  // Collectives on the compute device's memory (gathers, gradient reductions): NCCL on a GPU
  // with several ranks; null where `comm` serves (the host device, or one rank, whose
  // gathers and reductions need no collective).
  std::unique_ptr<Communicator> device_comm;
  Communicator* DeviceComm() const {
    return device_comm != nullptr ? device_comm.get() : comm.get();
  }
  std::unique_ptr<CpuOptimizer> optimizer;
  int group = 0;          // the optimizer's parameter group
  int global_rank = 0;    // among all processes (rank() is within the data-parallel group)
  int local_rank = 0;     // among the processes of this node
  std::string device;     // EngineOptions::device
  bool fp32_view = true;  // EngineOptions::fp32_view, on the host device

  std::vector<Module> modules;
  std::vector<Param> params;
  // Module buffers (Engine::SetBuffer): replicated, this rank's latest values, in the order
  // first set; checkpoints carry rank 0's.
  struct ModuleBuffer {
    std::string name, dtype;
    std::vector<int64_t> shape;
    std::string bytes;
  };
  std::vector<ModuleBuffer> buffers;
  std::string checkpoint_metadata = "{}";  // Engine::SetCheckpointMetadata
  std::map<std::string, int, std::less<>> param_by_name;
  std::map<std::string, int, std::less<>> module_by_name;
  uint64_t registered_elements = 0;  // over all parameters, unsharded
  bool initialized = false;

  uint64_t shard_elements = 0;
  // offload_param.device = nvme, and whether the fp32 master stays in host memory.
  bool params_on_nvme = false;
  bool host_master = true;
  // The compute precision (Note [Compute precision]): what the parameter tier holds and
  // gathers move.
  ElementType param_type = ElementType::kFp32;
  // The compute device (EngineOptions::device), the tiered store's device tier: the engine's
  // parts enqueue their own work on its streams. Declared before the store, which borrows it.
  std::unique_ptr<Device> compute;
  // Where every parameter shard, gathered copy and gradient buffer lives and moves, on the
  // compute device; its swap files and host tier also hold the optimizer state (the pipelined
  // step is the store's client). Made by Initialize, declared before its clients so that it
  // outlives them.
  std::unique_ptr<TieredStore> tiers;
  // master is empty when !host_master, grad_acc with the gradients on NVMe (nvme_grads).
  StoreArray master, grad_acc, state0, state1;
  // Whether the device tier is host memory the host may touch (Device::host_addressable;
  // Note [Direct host device] in offload/tiered_store.cc): backward may then write into the
  // host accumulators directly.
  bool host_addressable = false;
  std::unique_ptr<GradientBuckets> buckets;
  std::unique_ptr<ParamTier> param_tier;
  std::vector<GradBuffer> grads;  // by parameter
  // offload_optimizer.device = nvme.
  std::unique_ptr<PipelinedOptimizer> pipelined;
  int nvme_shard = -1;
  // The NVMe step's writes of the parameter tier (when no host master), and the step run
  // alongside backward (Note [Overlapped step]); declared after what they use.
  std::unique_ptr<ParamTier::ChunkWriter> tier_writer;
  std::unique_ptr<OptimizerOverlap> overlap;
  std::unique_ptr<NvmeGradients> nvme_grads;  // zinf.gradients_on_nvme; tells `overlap`
  std::vector<int> final_adds;      // per parameter: reductions added into grad_acc this batch
  uint64_t speculative_chunks = 0;  // the overlapped step's room on NVMe, in chunks
  // zinf.delayed_param_update: the step's gradients, which the update in flight reads while
  // the next batch accumulates into grad_acc; the update itself; whether its parameters
  // still have to reach the parameter tier (at the next Step); its CPU time.
  StoreArray grad_step;
  std::future<Status> delayed;
  bool delayed_tier_write = false;
  double delayed_seconds = 0;
  // Whether the next step speculates (Note [Overlapped step]): the last one was applied
  // unclipped, so this one likely will be too.
  bool speculate = true;
  // zinf.step_beside_forward: the step's last part is running beside the next forward, and
  // what Step leaves until it is done (Note [Step in the next forward's order]).
  bool step_in_flight = false;

  LossScaler scaler;  // fp16 dynamic loss scaling (a fixed 1 otherwise)
  int64_t steps = 0;
  StepSummary pending;     // traffic and time since the last Step
  LinkStats nvme_read_at;  // the store's NVMe traffic at the last Step
  LinkStats nvme_written_at;
  // ... and when the last step's part beside the forward began: the next Step's summary
  // counts what that part moves, so that each summary holds one whole step's traffic.
  LinkStats nvme_read_beside, nvme_written_beside;

  int rank() const { return comm->rank(); }
  int world() const { return comm->world_size(); }

  Status Context(Status s, const std::string& what) const {
    return s.ok() ? s : std::move(s).WithContext(fmt::format("rank {}: {}", rank(), what));
  }

  StatusOr<Module*> FindModule(int id) {
    if (!initialized) return FailedPrecondition("the engine is not initialized");
    if (id < 0 || id >= static_cast<int>(modules.size())) {
      return InvalidArgument(
          fmt::format("module id {} is not registered (have {})", id, modules.size()));
    }
    return &modules[id];
  }

  float* Master(const Param& p) { return master.as<float>() + p.flat_offset; }

  // This rank's whole flat shard with its in-memory optimizer state.
  OptimizerSpan WholeShard() {
    return {.params = master.as<float>(),
            .grads = grad_acc.data(),
            .state0 = state0.as<float>(),
            .state1 = state1.empty() ? nullptr : state1.as<float>(),
            .count = shard_elements};
  }

  // Initialize's source of initial values; null: each ParamSpec's init.
  InitialValues initial_values;

  // Initial values of the flat shard's elements [begin, begin + count) into `out`.
  Status FillInitial(uint64_t begin, uint64_t count, float* out) const {
    if (!initial_values) {
      zinf::FillInitial(params, config.seed, rank(), begin, count, out);
      return OkStatus();
    }
    return FillShard(params, rank(), begin, count, out,
                     [this](const Param& p, uint64_t first, uint64_t n, float* values) {
                       return initial_values(p.spec.name, first, n, values);
                     });
  }

  size_t param_bytes() const { return ElementSize(param_type); }

  // Elements of gradient per reduce bucket: reduce_bucket_size, but never more than every
  // gradient of the model together.
  uint64_t BucketElements() const {
    return std::min(config.reduce_bucket_size, shard_elements * world());
  }

  // What turns the accumulators (the sum over ranks and micro-batches of loss_scale *
  // gradient) into the mean gradient: the step's gradient scale when it does not clip.
  double MeanScale() const {
    return 1.0 / (static_cast<double>(world()) * config.gradient_accumulation_steps * scaler.scale);
  }

  // This rank's fp32 master shard of `p` into `out` (shard_size values): from `master`, or
  // with no host master, from the parameter tier when it is fp32 and else from the
  // optimizer's state (a pass over it).
  Status ReadMasterShard(Param& p, float* out);

  // The error of a step whose gradients are not finite without fp16 loss scaling: names the
  // first parameter, in registration order, that has a non-finite gradient element on any
  // rank (a collective: every rank calls it), and says what to do.
  Status NonFiniteGradientError();
  // Waits until every reduced gradient is in grad_acc.
  Status FinishReductions();

  // Adds this rank's reduced gradient of the parameter at `flat_offset` into the
  // accumulators, in host memory or on NVMe.
  Status AddReducedGradient(uint64_t flat_offset, const float* reduced, uint64_t size);

  // Parameter `pi`'s reduced gradient is in grad_acc: in the batch's last micro-batch, it is
  // final (Note [Overlapped step]).
  void GradientAdded(int pi);
  // The batch's last micro-batch begins its reductions: the overlapped step begins.
  Status BeginOverlappedStep();
  // Before `what` reads or changes the model's state: FailedPrecondition naming it while the
  // overlapped step is under way; waits for a delayed update (and returns its error).
  Status QuiesceStep(std::string_view what);
  // Waits for the delayed update in flight, if any (Note [Delayed parameter update]).
  Status WaitDelayedUpdate();
  // Whether the NVMe step's last part runs beside the next forward (zinf.step_beside_forward
  // where it applies: the parameter tier written from the step's chunks, stage 3).
  bool StepsBesideForward() const;
  // The step running beside the forward: waits for module `module`'s parameters and writes
  // its persistent ones (-1: the whole step, and then does what Step left for after it).
  Status WaitForStep(int module);
  // The gradient accumulators zeroed for the next batch, in host memory or on NVMe.
  void ResetGradients();
  // After a step, applied, skipped or refused: the next batch starts from no gradients and no
  // reductions.
  void EndBatch();

  // Writes every shard of the parameter tier from `master`, in the compute precision.
  Status WriteParamTierFromMaster();

  // Checks that every rank registered the same model with the same config.
  Status CheckRanksAgree();

  // Refuses, before anything is allocated, a placement whose resident host state alone is
  // larger than this machine's memory, saying what each part needs.
  Status CheckHostMemory() const;

  // Elements per chunk of the NVMe optimizer step: the whole shard when it is small.
  uint64_t OptimizerChunkElements() const;

  // The tiered store on the compute device: the parameter tier's home (Note [Parameter
  // tier]), a device tier large enough for the gathered working set, and one swap store for
  // everything this rank keeps on NVMe.
  Status OpenTiers(const std::string& device);

  // The pipelined step's options (but its pool), which OpenTiers sizes the host tier for.
  PipelinedOptimizerOptions NvmeOptimizerOptions() const;
  Status OpenNvmeOptimizer();

  // The optimizer step over NVMe-resident state (the gradients come from grad_acc), finishing
  // what ran alongside backward, and the new parameters brought to the parameter tier: into
  // the host master and from it, or into the tier itself, from the step's chunks as they are
  // updated. `grad_scale` nullopt: a skipped step, which undoes what was speculated.
  Status NvmeStep(std::optional<float> grad_scale, StepSummary* summary);

  int state_count() const { return optimizer->group(group)->hyper_params.state_count(); }

  // Every rank learns whether any failed: `mine` where this rank failed, else an error naming
  // the first rank that did.
  Status AgreeAll(Status mine, const std::string& what);

  nlohmann::json ScalarState() const;

  struct SavedScalars {
    int64_t steps = 0, iteration = 0, last_overflow_iteration = -1;
    double loss_scale = 1;
    int hysteresis_left = 1, state_count = 0;
    std::string optimizer;
  };

  // ScalarState() back, each field checked before anything is replaced.
  static StatusOr<SavedScalars> ParseScalarState(const std::string& text, const std::string& dir);

  ckpt::Manifest MakeManifest(const std::string& tag, const std::string& client_state) const;

  // This rank's file: "params" (the fp32 master shard), "state0"/"state1" (the optimizer
  // state arrays) and "optimizer" (hyper-parameters and step counts).
  Status WriteShardFile(const std::string& tag_dir, const std::string& tag);

  // Checks the checkpoint against this engine and verifies every section of this rank's
  // file; only then replaces the state. Returns the client state.
  StatusOr<std::string> LoadShardFile(const std::string& path);

  // Engine::LoadSafetensors on this rank: matches every parameter with the file's tensor of
  // its name and shape before it replaces any, then writes this rank's shards.
  Status LoadSafetensorsFile(const std::string& path);

  // Frees parameter `pi`'s gradient buffer, if any.
  void FreeGradient(int pi);

  void MeasureTiers(StepSummary* summary);

  // Sets the optimizer's learning rate (and OneCycle's betas) for the step after `steps`
  // applied ones, from the config's scheduler; nothing without one. See Note [LR schedule
  // ordering] in src/zero/lr_schedule.h.
  Status ApplySchedule();
};

}  // namespace zinf

#endif  // ZINF_ZERO_ENGINE_IMPL_H_
