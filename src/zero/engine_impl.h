// Engine::Impl: the ZeRO engine's state, shared by the files that implement it along its
// seams: engine.cc (the facade: creation, registration, fetch, gradients, parameters),
// engine_tiers.cc (placement on the tiered store), engine_step.cc (the step's decisions: the
// norm, skipping, clipping, loss scaling) and engine_checkpoint.cc (checkpoints). The parts
// with state of their own are classes beside it: partition.h, param_tier.h (the parameters'
// tier), gradient_buckets.h (the reductions), optimizer_step.h (the optimizer's room: master,
// accumulators, state and the update), loss_scaler.h, process_group.h.
//
// Thread-safety: one thread drives an Engine (include/zinf/engine.h).
#ifndef ZINF_ZERO_ENGINE_IMPL_H_
#define ZINF_ZERO_ENGINE_IMPL_H_

#include <fmt/core.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "comm/tcp_store.h"
#include "core/elapsed.h"
#include "zero/gradient_buckets.h"
#include "zero/loss_scaler.h"
#include "zero/optimizer_step.h"
#include "zero/param_tier.h"
#include "zero/partition.h"
#include "zero/store_array.h"
#include "zero/tier_budgets.h"
#include "zinf/cpu_optimizer.h"
#include "zinf/engine.h"
#include "zinf/tiered_store.h"

namespace zinf {

using EngineClock = SteadyClock;

// A gradient buffer backward writes, between Gradients and ReduceGradients: a tensor of the
// device tier, or with one rank in a batch's first micro-batch the (zero) accumulator itself.
struct GradBuffer {
  TensorId tensor = 0;
  float* data = nullptr;
};

struct Engine::Impl {
  EngineConfig config;
  std::unique_ptr<TcpStore> rendezvous;  // the ranks' meeting point (TCP), for the collectives
  std::unique_ptr<Communicator> comm;    // host memory: norms, agreement, checkpoints
  // Collectives on the compute device's memory (gathers, gradient reductions): NCCL on a GPU
  // with several ranks; null where `comm` serves (the host device, or one rank, whose
  // gathers and reductions need no collective).
  std::unique_ptr<Communicator> device_comm;
  Communicator* DeviceComm() const {
    return device_comm != nullptr ? device_comm.get() : comm.get();
  }
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
  // compute device; its swap files and host tier also hold the optimizer's arrays. Made by
  // Initialize, declared before its clients so that it outlives them.
  std::unique_ptr<TieredStore> store;
  // Whether the device tier is host memory the host may touch (Device::host_addressable;
  // Note [Direct host device] in offload/tiered_store.cc): backward may then write into the
  // host accumulators directly.
  bool host_addressable = false;
  std::unique_ptr<ParamTier> param_tier;
  // The optimizer, its schedule, the master, the accumulators and the state, and the update
  // (made by Create; its arrays by Initialize). It writes the parameter tier, and the buckets
  // hand it the reduced gradients: declared between the two.
  std::unique_ptr<OptimizerStep> optimizer_step;
  std::unique_ptr<GradientBuckets> buckets;
  std::vector<GradBuffer> grads;  // by parameter

  LossScaler scaler;       // fp16 dynamic loss scaling (a fixed 1 otherwise)
  StepSummary pending;     // traffic and time since the last Step
  LinkStats nvme_read_at;  // the store's NVMe traffic at the last Step
  LinkStats nvme_written_at;
  TransferCounts transfers_at;  // the device's counts at the last Step

  int rank() const { return comm->rank(); }
  int world() const { return comm->world_size(); }

  Status Context(Status s, const std::string& what) const {
    return s.ok() ? s : std::move(s).WithContext(fmt::format("rank {}: {}", rank(), what));
  }

  // Module `id`, once the engine is initialized.
  StatusOr<Module*> FindModule(int id);
  // The parameter registered as `name`; InvalidArgument naming it when there is none.
  StatusOr<const Param*> FindParam(std::string_view name) const;

  // Initialize's source of initial values; null: each ParamSpec's init.
  InitialValues initial_values;
  // Initial values of the flat shard's elements [begin, begin + count) into `out`.
  Status FillInitial(uint64_t begin, uint64_t count, float* out) const;
  // The frozen parameters' initial values into the parameter tier, their only home (Note
  // [Frozen parameters] in partition.h).
  Status WriteFrozenInitial();
  // This rank's shard of `p`'s values in fp32: the master's, or a frozen parameter's tier's.
  Status ReadValues(const Param& p, float* out);

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

  // The error of a step whose gradients are not finite without fp16 loss scaling: names the
  // first parameter, in registration order, that has a non-finite gradient element on any
  // rank (a collective: every rank calls it), and says what to do.
  Status NonFiniteGradientError();
  // Waits until every reduced gradient is in the accumulators.
  Status FinishReductions();
  // After a step, applied, skipped or refused: the next batch starts from no gradients and no
  // reductions.
  void EndBatch();
  // Checks that every rank registered the same model with the same config.
  Status CheckRanksAgree();

  // Refuses, before anything is allocated, a placement whose resident host state alone is
  // larger than this machine's memory, saying what each part needs.
  Status CheckHostMemory() const;

  // The tiered store on the compute device: the parameter tier's home (Note [Parameter
  // tier]), a device tier large enough for the gathered working set, and one swap store for
  // everything this rank keeps on NVMe. `speculative_chunks`: the overlapped step's room on
  // NVMe, in optimizer chunks.
  Status OpenTiers(const std::string& device, uint64_t* speculative_chunks);

  // Every rank learns whether any failed: `mine` where this rank failed, else an error naming
  // the first rank that did.
  Status AgreeAll(Status mine, const std::string& what);

  // Saving and loading the state above (engine_checkpoint.cc).
  struct Checkpoints;

  // Frees parameter `pi`'s gradient buffer, if any.
  void FreeGradient(int pi);

  void MeasureTiers(StepSummary* summary);
};

}  // namespace zinf

#endif  // ZINF_ZERO_ENGINE_IMPL_H_
