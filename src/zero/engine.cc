// The ZeRO engine. See include/zinf/engine.h for the contract and
// Partitioning: Note [ZeRO partitioning] in src/zero/partition.h. Parameters, gathered copies
// and gradient buffers live in the tiered store: Note [Parameter tier] in src/zero/param_tier.h.
//
// Stages: all three keep optimizer state and the fp32 master copy sharded. Stage 3 gathers a
// parameter at Fetch and frees it at Release (unless it is smaller than
// stage3_param_persistence_threshold); stages 1 and 2 keep every parameter gathered and
// re-gather after each step. Gradients are reduce-scattered into the shard at
// ReduceGradients in every stage.
//
// offload_optimizer.device = nvme: the fp32 master copy and the optimizer state live on NVMe
// and are stepped by the PipelinedOptimizer; the accumulated gradients are written into the
// swap space before the step (see NvmeStep).
//
// offload_param.device = nvme: each parameter's shard is a tensor of the tiered store whose
// home is NVMe (Note [Parameter tier]); Step writes it with the new values. With the optimizer
// on NVMe too, no fp32 copy of the shard stays in host memory: the new values come from the
// pipelined step chunk by chunk (AssembleParamTier).
//
// Gradients are reduce-scattered in buckets of reduce_bucket_size elements while backward
// goes on (Note [Gradient buckets] in gradient_buckets.h); Step and GatherGradient wait for
// the last ones.
//
// Note [Compute precision]
// With bf16 or fp16 enabled, the parameter tier holds each shard in that precision (rounded
// to nearest even from the fp32 master at every update) and gathers move it so: half the
// NVMe reads, link and all-gather bytes of fp32. Fetch hands out the gathered 16-bit tensors
// in device memory, and (for trainers that compute in fp32 on the host device) the same values
// widened to fp32, so the trainer computes with the 16-bit weights, as DeepSpeed's bf16 and
// fp16 modes do. Every placement computes with the same values. The master copy, gradients
// and optimizer state stay fp32; GatherParameter and checkpoints read the master.
//
// Prefetching: Note [Prefetch] in src/zero/param_tier.h.
#include <fmt/core.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numbers>
#include <set>
#include <utility>

#include "ckpt/checkpoint.h"
#include "comm/communicator.h"
#include "comm/environment.h"
#include "comm/tcp_store.h"
#include "core/config_reader.h"
#include "core/log.h"
#include "nvme/aio_options.h"
#include "nvme/io_engine.h"
#include "nvme/swap_store.h"
#include "offload/pipelined_optimizer.h"
#include "offload/tiered_store_internal.h"
#include "zero/gradient_buckets.h"
#include "zero/lr_schedule.h"
#include "zero/param_tier.h"
#include "zero/partition.h"
#include "zinf/cpu_info.h"
#include "zinf/cpu_optimizer.h"
#include "zinf/engine.h"
#include "zinf/host_memory.h"
#include "zinf/tiered_store.h"

namespace zinf {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

OptimizerType ToOptimizerType(const std::string& name) {
  if (name == "adam") return OptimizerType::kAdam;
  if (name == "adagrad") return OptimizerType::kAdagrad;
  if (name == "lion") return OptimizerType::kLion;
  return OptimizerType::kAdamW;
}

// An array the engine keeps in the tiered store's host tier for its whole life (acquired
// there): the flat shard's fp32 master, gradient accumulators and optimizer state.
class HostArray {
 public:
  HostArray() = default;
  HostArray(HostArray&& other) noexcept { *this = std::move(other); }
  HostArray& operator=(HostArray&& other) noexcept {
    if (this != &other) {
      Reset();
      store_ = std::exchange(other.store_, nullptr);
      id_ = std::exchange(other.id_, 0);
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  ~HostArray() { Reset(); }

  // `bytes` of zeros in `store`'s host tier, named `name` in its errors.
  static StatusOr<HostArray> Create(TieredStore* store, const std::string& name, uint64_t bytes) {
    HostArray a;
    ZINF_ASSIGN_OR_RETURN(a.id_, store->Create(name, bytes, Tier::kHost));
    a.store_ = store;
    ZINF_ASSIGN_OR_RETURN(a.data_, store->Acquire(a.id_, Tier::kHost, Access::kWrite));
    a.bytes_ = bytes;
    return a;
  }

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  uint64_t size_bytes() const { return bytes_; }
  bool empty() const { return data_ == nullptr; }

 private:
  void Reset() {
    if (store_ == nullptr) return;
    if (data_ != nullptr) store_->Release(id_, Tier::kHost).IgnoreError();
    store_->Free(id_).IgnoreError();
    store_ = nullptr;
    data_ = nullptr;
  }

  TieredStore* store_ = nullptr;
  TensorId id_ = 0;
  void* data_ = nullptr;
  uint64_t bytes_ = 0;
};

// A gradient buffer backward writes, between Gradients and ReduceGradients: a tensor of the
// device tier, or with one rank in a batch's first micro-batch the (zero) accumulator itself.
struct GradBuffer {
  TensorId tensor = 0;
  float* data = nullptr;
};

// This process's place in its data-parallel group.
struct DataParallelGroup {
  int rank = 0;
  int size = 1;
  std::string name = "world";  // distinguishes the groups' rendezvous in the store
};

StatusOr<DataParallelGroup> ResolveGroup(const std::vector<int>& ranks, int rank, int world) {
  if (ranks.empty()) return DataParallelGroup{rank, world, "world"};
  DataParallelGroup group{-1, static_cast<int>(ranks.size()), "dp"};
  std::vector<bool> seen(world);
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int r = ranks[i];
    if (r < 0 || r >= world || seen[r]) {
      return InvalidArgument(
          fmt::format("data_parallel_ranks {}: each must be a distinct rank in [0, world_size={})",
                      nlohmann::json(ranks).dump(), world));
    }
    seen[r] = true;
    if (r == rank) group.rank = static_cast<int>(i);
    group.name += "-" + std::to_string(r);
  }
  if (group.rank < 0) {
    return InvalidArgument(fmt::format("data_parallel_ranks {} does not hold this rank ({})",
                                       nlohmann::json(ranks).dump(), rank));
  }
  return group;
}

}  // namespace

// More elements than any machine holds (4 PiB of fp32): a shape beyond this is a mistake, and
// refusing it at registration keeps the size arithmetic below far from overflow.
constexpr uint64_t kMaxElements = uint64_t{1} << 50;
constexpr double kGiBf = double(uint64_t{1} << 30);

struct Engine::Impl {
  EngineConfig config;
  std::unique_ptr<TcpStore> store;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<CpuOptimizer> optimizer;
  int group = 0;        // the optimizer's parameter group
  int global_rank = 0;  // among all processes (rank() is within the data-parallel group)
  int local_rank = 0;   // among the processes of this node
  std::string device;   // EngineOptions::device

  std::vector<Module> modules;
  std::vector<Param> params;
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
  // Where every parameter shard, gathered copy and gradient buffer lives and moves, on the
  // compute device; its swap store also holds the NVMe optimizer state. Made by Initialize,
  // declared before its clients so that it outlives them.
  std::unique_ptr<TieredStore> tiers;
  SwapStore* swap = nullptr;                   // the store's, when anything is on NVMe
  HostArray master, grad_acc, state0, state1;  // master is empty when !host_master
  std::unique_ptr<GradientBuckets> buckets;    // world > 1
  std::unique_ptr<ParamTier> param_tier;
  std::vector<GradBuffer> grads;  // by parameter
  // offload_optimizer.device = nvme.
  std::unique_ptr<PipelinedOptimizer> pipelined;
  int nvme_shard = -1;

  // fp16 dynamic loss scaling, as DeepSpeed's DynamicLossScaler.
  double loss_scale = 1.0;
  int hysteresis_left = 1;
  int64_t iteration = 0;
  int64_t last_overflow_iteration = -1;
  int64_t steps = 0;
  StepSummary pending;     // traffic and time since the last Step
  LinkStats nvme_read_at;  // the store's NVMe traffic at the last Step
  LinkStats nvme_written_at;

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

  // Initial values of the flat shard's elements [begin, begin + count) into `out`.
  void FillInitial(uint64_t begin, uint64_t count, float* out) const {
    zinf::FillInitial(params, config.seed, rank(), begin, count, out);
  }

  size_t param_bytes() const { return ElementSize(param_type); }

  // This rank's fp32 master shard of `p` into `out` (shard_size values): from `master`, or
  // with no host master, from the parameter tier when it is fp32 and else from the
  // optimizer's state (a pass over it).
  Status ReadMasterShard(Param& p, float* out) {
    if (host_master) {
      std::memcpy(out, Master(p), p.shard_size * 4);
      return OkStatus();
    }
    if (param_type == ElementType::kFp32) return param_tier->ReadShard(p, out);
    return pipelined->Visit(
        nvme_shard,
        [&](const ChunkView& c) {
          const auto [first, last] = Overlap(c.offset, c.count, p);
          if (first < last) {
            std::memcpy(out + (first - p.flat_offset), c.params + (first - c.offset),
                        (last - first) * 4);
          }
          return OkStatus();
        },
        /*write_back=*/false);
  }

  // Waits until every reduced gradient is in grad_acc.
  Status FinishReductions() {
    if (buckets == nullptr) return OkStatus();
    const auto t0 = Clock::now();
    Status finished = Context(buckets->Finish(), "reducing gradients");
    pending.seconds_reduce += Seconds(t0);
    return finished;
  }

  // Writes every shard of the parameter tier from `master`, in the compute precision.
  Status WriteParamTierFromMaster() {
    Status converted;
    for (Param& p : params) {
      converted = param_tier->WriteFp32(p, Master(p));
      if (!converted.ok()) break;
    }
    Status written = param_tier->FinishWrites();
    return converted.ok() ? written : converted;
  }

  // Checks that every rank registered the same model with the same config.
  Status CheckRanksAgree() {
    nlohmann::json model = nlohmann::json::array();
    for (const Param& p : params) model.push_back({p.spec.name, p.spec.shape, p.module});
    const nlohmann::json cfg = {config.zero_stage,
                                config.offload_param_device,
                                config.offload_optimizer_device,
                                config.gradient_accumulation_steps,
                                config.gradient_clipping,
                                config.fp16,
                                config.bf16,
                                config.optimizer_type,
                                config.lr,
                                config.beta1,
                                config.beta2,
                                config.eps,
                                config.weight_decay,
                                config.seed};
    const int64_t mine[2] = {static_cast<int64_t>(HashName(0, model.dump())),
                             static_cast<int64_t>(HashName(0, cfg.dump()))};
    std::vector<int64_t> all(2 * world());
    ZINF_RETURN_IF_ERROR(comm->AllGather(mine, all.data(), 2, CommDataType::kInt64));
    for (int r = 0; r < world(); ++r) {
      if (all[2 * r + 1] != all[1]) {
        return FailedPrecondition(fmt::format(
            "rank {} was started with a different config than rank 0 (stage, offload, "
            "optimizer, precision, accumulation or seed differ); every rank needs the same one",
            r));
      }
      if (all[2 * r] != all[0]) {
        return FailedPrecondition(
            fmt::format("rank {} registered different modules or parameter shapes than rank 0", r));
      }
    }
    return OkStatus();
  }

  // Refuses, before anything is allocated, a placement whose resident host state alone is
  // larger than this machine's memory, saying what each part needs.
  Status CheckHostMemory() const {
    const uint64_t total = GetCpuInfo().total_memory_bytes;
    if (total == 0) return OkStatus();  // unknown: let the allocations tell
    const uint64_t shard = shard_elements * 4;
    const bool optimizer_on_nvme = config.offload_optimizer_device == "nvme";
    const uint64_t states = optimizer_on_nvme ? 0 : shard * state_count();
    const uint64_t master = host_master ? shard : 0;
    uint64_t persistent = 0;
    for (const Param& p : params) {
      if (p.persistent) persistent += p.numel * 4;
    }
    const uint64_t buckets =
        world() > 1 ? 2 * std::min(config.reduce_bucket_size, shard_elements * world()) * 4 : 0;
    // The parameter tier, where the host device's memory or pinned memory holds it.
    const uint64_t tier = params_on_nvme ? 0 : shard_elements * param_bytes();
    const uint64_t need = shard + master + states + persistent + buckets + tier;
    if (need <= total) return OkStatus();
    return ResourceExhausted(fmt::format(
        "{} parameter elements ({} per rank) need {:.1f} GiB of host memory on this rank, and "
        "this machine has {:.1f} GiB: gradient accumulators {:.1f}, fp32 master {:.1f}, "
        "optimizer state {:.1f}, persistent parameters {:.1f}, reduce buckets {:.1f}, "
        "parameter tier {:.1f} GiB. Offload the optimizer and parameters to NVMe, shard over "
        "more ranks, or shrink the model",
        registered_elements, shard_elements, need / kGiBf, total / kGiBf, shard / kGiBf,
        master / kGiBf, states / kGiBf, persistent / kGiBf, buckets / kGiBf, tier / kGiBf));
  }

  // Elements per chunk of the NVMe optimizer step: the whole shard when it is small.
  uint64_t OptimizerChunkElements() const {
    constexpr uint64_t kAlign = PipelinedOptimizerOptions::kChunkAlignElements;
    return std::clamp<uint64_t>((shard_elements + kAlign - 1) / kAlign * kAlign,
                                PipelinedOptimizerOptions::kMinChunkElements,
                                PipelinedOptimizerOptions().chunk_elements);
  }

  // The tiered store on the compute device: the parameter tier's home (Note [Parameter
  // tier]), a device tier large enough for the gathered working set, and one swap store for
  // everything this rank keeps on NVMe.
  Status OpenTiers(const std::string& device) {
    const uint64_t element = param_bytes();
    uint64_t tier_bytes = 0, largest_tier = 0, persistent = 0, working_set = 0;
    for (const Module& module : modules) {
      uint64_t bytes = 0;
      for (int pi : module.params) {
        const Param& p = params[pi];
        // The gathered copy, its fp32 widening or gradient, the gradient, the shard's copy.
        const uint64_t full = p.shard_size * world();
        const uint64_t gathered = full * (element + 4 + 4) + p.shard_size * element;
        (p.persistent ? persistent : bytes) += gathered;
      }
      working_set = std::max(working_set, bytes);
    }
    for (const Param& p : params) {
      tier_bytes += p.shard_size * element;
      largest_tier = std::max(largest_tier, p.shard_size * element);
    }
    const Tier home = params_on_nvme                         ? Tier::kNvme
                      : config.offload_param_device == "cpu" ? Tier::kHost
                                                             : Tier::kDevice;
    TieredStoreOptions options;
    options.device = device;
    // The fetched module, the next one being gathered, and backward's gradients, with room to
    // spare, plus the read-ahead window; cached shard copies fill the rest and are evicted.
    options.device_budget_bytes = (home == Tier::kDevice ? tier_bytes : 0) + persistent +
                                  4 * working_set +
                                  2 * config.stage3_prefetch_bucket_size * element + (64 << 20);
    // The flat shard's arrays (HostArray), page-aligned; the parameter tier when it lives
    // here; room for the NVMe tier's host copies while they are written.
    const uint64_t array = (std::max<uint64_t>(shard_elements, 1) * 4 + 4095) / 4096 * 4096;
    const bool states_here = config.offload_optimizer_device != "nvme";
    const uint64_t arrays = array * (1 + (host_master ? 1 : 0) + (states_here ? state_count() : 0));
    options.host_budget_bytes = arrays + (home == Tier::kHost ? tier_bytes : 0) +
                                std::max<uint64_t>(256 << 20, 4 * largest_tier);
    options.pin_host = false;  // the host device copies with memcpy: pinning buys nothing
    options.piece_bytes =
        std::clamp<uint64_t>((largest_tier + 4095) / 4096 * 4096, 1 << 20, 64 << 20);
    options.staging_buffers = 4;
    options.transfer_threads = 4;
    SwapStoreOptions swap_options;
    if (params_on_nvme || config.offload_optimizer_device == "nvme") {
      swap_options.paths = config.NvmePaths();
      swap_options.rank = global_rank;  // groups of other processes may share the nvme_path
      swap_options.checksum = config.nvme_checksum;
      ZINF_ASSIGN_OR_RETURN(nlohmann::json aio, ParseJson(config.aio_json, "aio"));
      ZINF_RETURN_IF_ERROR(ReadAioOptions(aio, "aio", &swap_options.aio));
      // Each extent is rounded up to the allocator's alignment: allow a block per extent.
      const uint64_t slack = swap_options.aio.block_size;
      if (config.offload_optimizer_device == "nvme") {
        // Per element: fp32 params and two state arrays (the gradients stay in host memory).
        const uint64_t chunk = OptimizerChunkElements();
        const uint64_t chunks = (shard_elements + chunk - 1) / chunk;
        swap_options.capacity_bytes += chunks * (chunk * 12 + slack);
      }
      if (params_on_nvme) {
        for (const Param& p : params) {
          const uint64_t bytes = p.shard_size * element;
          const uint64_t pieces = (bytes + options.piece_bytes - 1) / options.piece_bytes;
          swap_options.capacity_bytes += bytes + pieces * slack;
        }
      }
    }
    ZINF_ASSIGN_OR_RETURN(tiers, internal::TieredStoreAccess::Create(options, swap_options));
    swap = internal::TieredStoreAccess::Swap(*tiers);
    param_tier = std::make_unique<ParamTier>(
        tiers.get(), comm.get(), &params, &modules,
        ParamTierOptions{.param_type = param_type,
                         .shard_home = home,
                         .prefetch_bucket_elements = config.stage3_prefetch_bucket_size,
                         .max_live_elements = config.stage3_max_live_parameters});
    grads.assign(params.size(), GradBuffer());
    return param_tier->Create();
  }

  Status OpenNvmeOptimizer() {
    PipelinedOptimizerOptions options;
    options.chunk_elements = OptimizerChunkElements();
    options.host_budget_bytes = std::max<uint64_t>(
        config.nvme_staging_budget_bytes, options.num_buffers * options.chunk_elements *
                                              PipelinedOptimizerOptions::kStagingBytesPerElement);
    options.pinned = config.pin_memory;
    options.nvme_ratio = config.optimizer_nvme_ratio;
    ZINF_ASSIGN_OR_RETURN(pipelined, PipelinedOptimizer::Create(optimizer.get(), swap, options));
    std::vector<char*> open(params.size());
    StatusOr<int> shard = pipelined->AddShard(
        // The gradient accumulators are in host memory already: the step reads them there.
        {.name = fmt::format("rank {} shard", rank()),
         .group = group,
         .count = shard_elements,
         .host_grads = grad_acc.data()},
        [&](const ChunkView& c) {
          if (host_master) {
            std::memcpy(c.params, master.as<float>() + c.offset, c.count * 4);
            return OkStatus();
          }
          FillInitial(c.offset, c.count, c.params);
          return params_on_nvme ? AssembleParamTier(c, open) : OkStatus();
        });
    Status written = CloseParamTierWrites(open);
    ZINF_RETURN_IF_ERROR(shard.status());
    ZINF_RETURN_IF_ERROR(written);
    nvme_shard = *shard;
    return OkStatus();
  }

  // Copies the parameters of a chunk of the flat shard (fp32 values of elements [c.offset,
  // c.offset + c.count)) into the parameter tier, in its precision; `open` holds, per
  // parameter, the tier memory being written. Chunks arrive in order, so a parameter is
  // complete, and its write ends, with its last element.
  Status AssembleParamTier(const ChunkView& c, std::vector<char*>& open) {
    auto it = std::upper_bound(params.begin(), params.end(), c.offset,
                               [](uint64_t b, const Param& p) { return b < p.flat_offset; });
    for (--it; it != params.end() && it->flat_offset < c.offset + c.count; ++it) {
      const Param& p = *it;
      char*& tier = open[&p - params.data()];
      if (tier == nullptr) {
        ZINF_ASSIGN_OR_RETURN(void* memory, param_tier->BeginWrite(p));
        tier = static_cast<char*>(memory);
      }
      const auto [first, last] = Overlap(c.offset, c.count, p);
      ConvertFromFp32(c.params + (first - c.offset), param_type,
                      tier + (first - p.flat_offset) * param_bytes(), last - first);
      if (last == p.flat_offset + p.shard_size) {
        tier = nullptr;
        ZINF_RETURN_IF_ERROR(param_tier->EndWrite(p));
      }
    }
    return OkStatus();
  }

  // Ends the writes AssembleParamTier left open (after a failure) and waits for the
  // write-backs.
  Status CloseParamTierWrites(std::vector<char*>& open) {
    Status first;
    for (size_t i = 0; i < open.size(); ++i) {
      if (open[i] == nullptr) continue;
      Status s = param_tier->EndWrite(params[i]);
      if (first.ok()) first = std::move(s);
    }
    Status written = param_tier->FinishWrites();
    return first.ok() ? written : first;
  }

  // The optimizer step over NVMe-resident state (the gradients come from grad_acc), and the
  // new parameters brought to the parameter tier: the host master (read back from the swap
  // space) or the tier itself (written from the step's chunks as they are updated, no
  // read-back).
  Status NvmeStep(float grad_scale, StepSummary* summary) {
    if (host_master) {
      ZINF_RETURN_IF_ERROR(pipelined->Step({nvme_shard}, grad_scale));
      ZINF_RETURN_IF_ERROR(pipelined->ReadParams(nvme_shard, master.as<float>()));
      summary->bytes_nvme_read += shard_elements * (1 + state_count()) * 4;
      ZINF_RETURN_IF_ERROR(WriteParamTierFromMaster());
    } else {
      std::vector<char*> open(params.size());
      auto assemble = [&](const ChunkView& c) { return AssembleParamTier(c, open); };
      Status stepped = pipelined->Step({nvme_shard}, grad_scale, StepMode::kFull, assemble);
      Status written = CloseParamTierWrites(open);
      ZINF_RETURN_IF_ERROR(stepped);
      ZINF_RETURN_IF_ERROR(written);
    }
    summary->seconds_optimizer_compute = pipelined->last_step_stats().compute_seconds;
    summary->bytes_nvme_read += pipelined->last_step_stats().bytes_read;
    summary->bytes_nvme_written += pipelined->last_step_stats().bytes_written;
    return OkStatus();
  }

  int state_count() const { return optimizer->group(group)->hyper_params.state_count(); }

  // Every rank learns whether any failed: `mine` where this rank failed, else an error naming
  // the first rank that did.
  Status AgreeAll(Status mine, const std::string& what) {
    const int64_t failed = mine.ok() ? 0 : 1;
    std::vector<int64_t> all(world());
    Status agreed = comm->AllGather(&failed, all.data(), 1, CommDataType::kInt64);
    if (!mine.ok()) return Context(std::move(mine), what);
    ZINF_RETURN_IF_ERROR(Context(std::move(agreed), what));
    for (int r = 0; r < world(); ++r) {
      if (all[r] != 0) return FailedPrecondition(fmt::format("{} failed on rank {}", what, r));
    }
    return OkStatus();
  }

  nlohmann::json ScalarState() const {
    return {{"steps", steps},
            {"loss_scale", loss_scale},
            {"hysteresis_left", hysteresis_left},
            {"iteration", iteration},
            {"last_overflow_iteration", last_overflow_iteration},
            {"optimizer", config.optimizer_type},
            {"state_count", state_count()}};
  }

  struct SavedScalars {
    int64_t steps = 0, iteration = 0, last_overflow_iteration = -1;
    double loss_scale = 1;
    int hysteresis_left = 1, state_count = 0;
    std::string optimizer;
  };

  // ScalarState() back, each field checked before anything is replaced.
  static StatusOr<SavedScalars> ParseScalarState(const std::string& text, const std::string& dir) {
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    auto bad = [&](const char* key, const char* expected) {
      return DataLoss(fmt::format("{}: manifest engine_state.{} must be {}", dir, key, expected));
    };
    if (!j.is_object()) {
      return DataLoss(fmt::format("{}: manifest engine_state must be a JSON object", dir));
    }
    SavedScalars s;
    auto integer = [&](const char* key, int64_t low, int64_t high, auto* out) -> Status {
      auto it = j.find(key);
      if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() < low ||
          it->get<int64_t>() > high) {
        return bad(key, "an integer in range");
      }
      *out = static_cast<std::remove_pointer_t<decltype(out)>>(it->get<int64_t>());
      return OkStatus();
    };
    constexpr int64_t kMax = INT64_MAX / 2;
    ZINF_RETURN_IF_ERROR(integer("steps", 0, kMax, &s.steps));
    ZINF_RETURN_IF_ERROR(integer("iteration", 0, kMax, &s.iteration));
    ZINF_RETURN_IF_ERROR(integer("last_overflow_iteration", -1, kMax, &s.last_overflow_iteration));
    ZINF_RETURN_IF_ERROR(integer("hysteresis_left", 0, INT32_MAX, &s.hysteresis_left));
    ZINF_RETURN_IF_ERROR(integer("state_count", 0, 2, &s.state_count));
    auto scale = j.find("loss_scale");
    if (scale == j.end() || !scale->is_number() || !(scale->get<double>() > 0) ||
        !std::isfinite(scale->get<double>())) {
      return bad("loss_scale", "a positive finite number");
    }
    s.loss_scale = scale->get<double>();
    auto opt = j.find("optimizer");
    if (opt == j.end() || !opt->is_string()) return bad("optimizer", "a string");
    s.optimizer = opt->get<std::string>();
    return s;
  }

  ckpt::Manifest MakeManifest(const std::string& tag, const std::string& client_state) const {
    ckpt::Manifest manifest;
    manifest.tag = tag;
    manifest.world_size = world();
    manifest.step = steps;
    manifest.shard_elements = shard_elements;
    for (const Param& p : params) {
      manifest.params.push_back({p.spec.name, p.spec.shape, p.numel, p.shard_size, p.flat_offset});
    }
    manifest.engine_state = ScalarState().dump();
    manifest.client_state = client_state;
    return manifest;
  }

  // This rank's file: "params" (the fp32 master shard), "state0"/"state1" (the optimizer
  // state arrays) and "optimizer" (hyper-parameters and step counts).
  Status WriteShardFile(const std::string& tag_dir, const std::string& tag) {
    ZINF_ASSIGN_OR_RETURN(
        ckpt::ShardWriter w,
        ckpt::ShardWriter::Create(tag_dir + "/" + ckpt::ShardFileName(rank()), tag, rank()));
    const uint64_t bytes = shard_elements * 4;
    const char* names[] = {"params", "state0", "state1"};
    const int sections = 1 + state_count();
    for (int i = 0; i < sections; ++i) ZINF_RETURN_IF_ERROR(w.Add(names[i], bytes));
    if (pipelined != nullptr) {
      auto save = [&](const ChunkView& c) -> Status {
        const float* arrays[] = {c.params, c.state0, c.state1};
        for (int i = 0; i < sections; ++i) {
          ZINF_RETURN_IF_ERROR(w.Write(names[i], arrays[i], c.count * 4));
        }
        return OkStatus();
      };
      ZINF_RETURN_IF_ERROR(pipelined->Visit(nvme_shard, save, /*write_back=*/false));
    } else {
      const HostArray* arrays[] = {&master, &state0, &state1};
      for (int i = 0; i < sections; ++i) {
        ZINF_RETURN_IF_ERROR(w.Write(names[i], arrays[i]->data(), bytes));
      }
    }
    const std::string blob = optimizer->SaveState();
    ZINF_RETURN_IF_ERROR(w.Append("optimizer", blob.data(), blob.size()));
    return w.Commit();
  }

  // Checks the checkpoint against this engine and verifies every section of this rank's
  // file; only then replaces the state. Returns the client state.
  StatusOr<std::string> LoadShardFile(const std::string& path) {
    ZINF_ASSIGN_OR_RETURN(const std::string dir, ckpt::ResolveCheckpoint(path));
    ZINF_ASSIGN_OR_RETURN(const ckpt::Manifest manifest, ckpt::ReadManifest(dir));
    if (manifest.world_size != world()) {
      return FailedPrecondition(fmt::format(
          "{} was saved by {} rank(s), this run has {}; `zinf ckpt export` consolidates it for "
          "any world size",
          dir, manifest.world_size, world()));
    }
    if (manifest.params.size() != params.size()) {
      return FailedPrecondition(
          fmt::format("{} holds a different model: {} parameters, this one has {}", dir,
                      manifest.params.size(), params.size()));
    }
    if (manifest.shard_elements != shard_elements) {
      return FailedPrecondition(
          fmt::format("{} holds a different model: {} elements per rank, this one has {}", dir,
                      manifest.shard_elements, shard_elements));
    }
    for (size_t i = 0; i < params.size(); ++i) {
      const ckpt::ManifestParam& saved = manifest.params[i];
      const Param& p = params[i];
      if (saved.name != p.spec.name || saved.shape != p.spec.shape) {
        return FailedPrecondition(fmt::format(
            "{} holds a different model: parameter {} is '{}' {}, this model's is '{}' {}", dir, i,
            saved.name, nlohmann::json(saved.shape).dump(), p.spec.name,
            nlohmann::json(p.spec.shape).dump()));
      }
      if (saved.flat_offset != p.flat_offset || saved.shard_size != p.shard_size) {
        return FailedPrecondition(fmt::format(
            "{} lays parameter '{}' out differently: {} elements per rank at shard offset {} "
            "there, {} at {} here",
            dir, p.spec.name, saved.shard_size, saved.flat_offset, p.shard_size, p.flat_offset));
      }
    }
    ZINF_ASSIGN_OR_RETURN(const SavedScalars scalars, ParseScalarState(manifest.engine_state, dir));
    if (scalars.optimizer != config.optimizer_type || scalars.state_count != state_count()) {
      return FailedPrecondition(fmt::format("{} was saved with optimizer '{}', this run uses '{}'",
                                            dir, scalars.optimizer, config.optimizer_type));
    }
    ZINF_ASSIGN_OR_RETURN(
        const ckpt::ShardReader reader,
        ckpt::ShardReader::Open(dir + "/" + ckpt::ShardFileName(rank()), manifest.tag, rank()));
    const char* names[] = {"params", "state0", "state1"};
    const int sections = 1 + state_count();
    for (int i = 0; i < sections; ++i) {
      ZINF_ASSIGN_OR_RETURN(const uint64_t bytes, reader.SectionBytes(names[i]));
      if (bytes != shard_elements * 4) {
        return DataLoss(fmt::format("{}/{}: section '{}' has {} bytes, expected {}", dir,
                                    ckpt::ShardFileName(rank()), names[i], bytes,
                                    shard_elements * 4));
      }
    }
    std::string blob;
    ZINF_RETURN_IF_ERROR(reader.Verify("optimizer", [&](const char* data, uint64_t n) {
      blob.append(data, n);
      return OkStatus();
    }));
    for (int i = 0; i < sections; ++i) ZINF_RETURN_IF_ERROR(reader.Verify(names[i]));

    // Verified: replace the state, once no gather reads it.
    param_tier->DropAll();
    ZINF_RETURN_IF_ERROR(optimizer->LoadState(blob));
    if (pipelined != nullptr) {
      auto load = [&](const ChunkView& c) -> Status {
        float* arrays[] = {c.params, c.state0, c.state1};
        for (int i = 0; i < sections; ++i) {
          ZINF_RETURN_IF_ERROR(reader.Read(names[i], c.offset * 4, arrays[i], c.count * 4));
        }
        return OkStatus();
      };
      ZINF_RETURN_IF_ERROR(pipelined->Visit(nvme_shard, load, /*write_back=*/true));
    } else {
      HostArray* arrays[] = {&master, &state0, &state1};
      for (int i = 0; i < sections; ++i) {
        ZINF_RETURN_IF_ERROR(reader.Read(names[i], 0, arrays[i]->data(), shard_elements * 4));
      }
    }
    if (host_master && pipelined != nullptr) {
      ZINF_RETURN_IF_ERROR(reader.Read("params", 0, master.data(), shard_elements * 4));
    }
    if (host_master) {
      ZINF_RETURN_IF_ERROR(WriteParamTierFromMaster());
    } else {
      std::vector<float> values;
      for (Param& p : params) {
        values.resize(p.shard_size);
        ZINF_RETURN_IF_ERROR(
            reader.Read("params", p.flat_offset * 4, values.data(), p.shard_size * 4));
        ZINF_RETURN_IF_ERROR(param_tier->WriteFp32(p, values.data()));
      }
      ZINF_RETURN_IF_ERROR(param_tier->FinishWrites());
    }
    steps = scalars.steps;
    loss_scale = scalars.loss_scale;
    hysteresis_left = scalars.hysteresis_left;
    iteration = scalars.iteration;
    last_overflow_iteration = scalars.last_overflow_iteration;
    ZINF_RETURN_IF_ERROR(FinishReductions());  // reductions of a batch the load abandons
    std::memset(grad_acc.data(), 0, shard_elements * 4);
    for (size_t i = 0; i < params.size(); ++i) FreeGradient(static_cast<int>(i));
    for (Module& module : modules) module.reductions = 0;
    return manifest.client_state;
  }

  // Frees parameter `pi`'s gradient buffer, if any.
  void FreeGradient(int pi) {
    GradBuffer& g = grads[pi];
    if (g.tensor != 0) {
      tiers->Release(g.tensor, Tier::kDevice).IgnoreError();
      tiers->Free(g.tensor).IgnoreError();
    }
    g = GradBuffer();
  }

  void MeasureTiers(StepSummary* summary) {
    const TieredStoreStats stats = tiers->stats();
    // The host device's memory is host memory too.
    uint64_t host =
        stats.tiers[int(Tier::kHost)].in_use_bytes + stats.tiers[int(Tier::kDevice)].in_use_bytes;
    if (pipelined != nullptr) {
      host += pipelined->staging_pool().stats().arena_bytes +
              pipelined->host_state_pool().stats().arena_bytes;
    }
    summary->host_bytes = host;
    summary->nvme_bytes = swap == nullptr ? 0 : swap->file_bytes() * swap->file_paths().size();
    // The parameter tier's NVMe traffic since the last step (the optimizer's is counted by
    // the pipelined step).
    summary->bytes_nvme_read += stats.nvme_to_host.bytes - nvme_read_at.bytes;
    summary->bytes_nvme_written += stats.host_to_nvme.bytes - nvme_written_at.bytes;
    nvme_read_at = stats.nvme_to_host;
    nvme_written_at = stats.host_to_nvme;
  }

  void UpdateLossScale(bool overflow) {
    if (!config.fp16) return;
    if (overflow) {
      if (hysteresis_left <= 1) {
        loss_scale = std::max(loss_scale / 2, config.min_loss_scale);
      } else {
        --hysteresis_left;
      }
      last_overflow_iteration = iteration;
    } else if ((iteration - last_overflow_iteration) % config.loss_scale_window == 0) {
      loss_scale *= 2;
      hysteresis_left = config.hysteresis;
    }
    ++iteration;
  }

  // Sets the optimizer's learning rate (and OneCycle's betas) for the step after `steps`
  // applied ones, from the config's scheduler; nothing without one. See Note [LR schedule
  // ordering] in src/zero/lr_schedule.h.
  Status ApplySchedule() {
    if (config.scheduler.type.empty()) return OkStatus();
    ZINF_ASSIGN_OR_RETURN(ParamGroupState state, optimizer->group(group));
    const ScheduledHyperParams next = ScheduleAt(config.scheduler, config.lr, steps);
    state.hyper_params.lr = next.lr;
    if (next.beta1) state.hyper_params.beta1 = *next.beta1;
    if (next.beta2) state.hyper_params.beta2 = *next.beta2;
    Status set = optimizer->SetHyperParams(group, state.hyper_params);
    if (set.ok()) return set;
    return set.WithContext(
        fmt::format("scheduler {} after {} step(s)", config.scheduler.type, steps));
  }
};

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

int Engine::rank() const { return impl_->rank(); }
int Engine::world_size() const { return impl_->world(); }
int Engine::local_rank() const { return impl_->local_rank; }
double Engine::loss_scale() const { return impl_->loss_scale; }
const EngineConfig& Engine::config() const { return impl_->config; }

double Engine::learning_rate() const {
  StatusOr<ParamGroupState> state = impl_->optimizer->group(impl_->group);
  return state.ok() ? state->hyper_params.lr : std::nan("");
}

Status Engine::SetLearningRate(double lr) {
  Impl& m = *impl_;
  if (!std::isfinite(lr) || lr < 0) {
    return InvalidArgument(
        fmt::format("SetLearningRate: lr must be a finite number >= 0, got {}", lr));
  }
  if (!m.config.scheduler.type.empty()) {
    return FailedPrecondition(fmt::format(
        "SetLearningRate: the config's scheduler ({}) sets the learning rate after every step; "
        "remove \"scheduler\" from the config to drive it from the trainer",
        m.config.scheduler.type));
  }
  ZINF_ASSIGN_OR_RETURN(ParamGroupState state, m.optimizer->group(m.group));
  state.hyper_params.lr = lr;
  return m.optimizer->SetHyperParams(m.group, state.hyper_params);
}

StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineConfig& config,
                                                 const EngineOptions& options) {
  ZINF_RETURN_IF_ERROR(config.Validate());
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->device = options.device;
  if (options.device != "host") {
    return Unavailable(
        fmt::format("compute device \"{}\": the engine runs on the host device only for now (its "
                    "collectives and gradient path are host-side); use \"host\"",
                    options.device));
  }
  impl->params_on_nvme = config.offload_param_device == "nvme";
  impl->host_master = !(impl->params_on_nvme && config.offload_optimizer_device == "nvme");
  impl->param_type = config.bf16   ? ElementType::kBf16
                     : config.fp16 ? ElementType::kFp16
                                   : ElementType::kFp32;
  ZINF_ASSIGN_OR_RETURN(DistEnvironment env, ReadDistEnvironment());
  const int rank = options.rank >= 0 ? options.rank : env.rank;
  const int world = options.world_size >= 0 ? options.world_size : env.world_size;
  const std::string addr = options.master_addr.empty() ? env.master_addr : options.master_addr;
  const int port = options.master_port > 0 ? options.master_port : env.master_port;
  if (world < 1 || rank < 0 || rank >= world) {
    return InvalidArgument(fmt::format("rank must be in [0, world_size={}), got {}", world, rank));
  }
  ZINF_ASSIGN_OR_RETURN(const DataParallelGroup dp,
                        ResolveGroup(options.data_parallel_ranks, rank, world));
  impl->global_rank = rank;
  impl->local_rank = env.local_rank;
  // train_batch_size counts the data-parallel ranks, known only now.
  ZINF_RETURN_IF_ERROR(impl->config.ResolveBatchSize(dp.size));
  // Rank 0 serves the store for every group, its own may be a group of one.
  if (world > 1 && (dp.size > 1 || rank == 0)) {
    ZINF_ASSIGN_OR_RETURN(impl->store, TcpStore::Create({.host = addr,
                                                         .port = static_cast<uint16_t>(port),
                                                         .is_server = rank == 0,
                                                         .timeout = options.timeout,
                                                         .secret = env.store_secret}));
  }
  if (dp.size == 1) {
    ZINF_ASSIGN_OR_RETURN(impl->comm, CreateLocalCommunicator());
  } else {
    ZINF_ASSIGN_OR_RETURN(impl->comm,
                          CreateGlooCommunicator(*impl->store, {.rank = dp.rank,
                                                                .world_size = dp.size,
                                                                .timeout = options.timeout,
                                                                .group_name = dp.name}));
  }
  ZINF_ASSIGN_OR_RETURN(impl->optimizer,
                        CpuOptimizer::Create({.threads = options.optimizer_threads}));
  OptimizerHyperParams hp = OptimizerHyperParams::Defaults(ToOptimizerType(config.optimizer_type));
  hp.lr = config.lr;
  hp.beta1 = config.beta1;
  hp.beta2 = config.beta2;
  hp.eps = config.eps;
  hp.weight_decay = config.weight_decay;
  hp.bias_correction = config.bias_correction;
  ZINF_ASSIGN_OR_RETURN(impl->group, impl->optimizer->AddParamGroup(hp));
  ZINF_RETURN_IF_ERROR(impl->ApplySchedule());  // the first step's lr is the schedule's
  if (config.fp16) {
    impl->loss_scale = std::pow(2.0, config.initial_scale_power);
    impl->hysteresis_left = config.hysteresis;
  }
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

StatusOr<int> Engine::RegisterModule(const std::string& name,
                                     const std::vector<ParamSpec>& params) {
  Impl& m = *impl_;
  if (m.initialized) return FailedPrecondition("RegisterModule after Initialize");
  if (name.empty()) return InvalidArgument("module name is empty");
  if (m.module_by_name.count(name) != 0) {
    return InvalidArgument(fmt::format("module '{}' already registered", name));
  }
  Module module{name, {}, false, 0};
  const int id = static_cast<int>(m.modules.size());
  std::vector<Param> added;
  std::set<std::string_view> names;  // this module's, so far
  uint64_t total = m.registered_elements;
  for (const ParamSpec& spec : params) {
    if (spec.name.empty() || m.param_by_name.count(spec.name) != 0 ||
        !names.insert(spec.name).second) {
      return InvalidArgument(
          fmt::format("module '{}': parameter name '{}' is empty or taken", name, spec.name));
    }
    uint64_t numel = 1;
    for (int64_t d : spec.shape) {
      if (d <= 0) {
        return InvalidArgument(
            fmt::format("parameter '{}' has a dimension of {}; all must be > 0", spec.name, d));
      }
      if (__builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel) || numel > kMaxElements) {
        return InvalidArgument(fmt::format(
            "parameter '{}' of shape [{}] has more than {} elements, more than any machine "
            "holds",
            spec.name, fmt::join(spec.shape, ", "), kMaxElements));
      }
    }
    total += numel;
    if (total > kMaxElements) {
      return InvalidArgument(fmt::format(
          "module '{}': the model would have {} or more elements, more than any machine holds",
          name, total));
    }
    Param p;
    p.spec = spec;
    p.module = id;
    p.numel = numel;
    added.push_back(std::move(p));
  }
  // Only a module that registers whole changes the engine.
  for (Param& p : added) {
    m.param_by_name.emplace(p.spec.name, static_cast<int>(m.params.size()));
    module.params.push_back(static_cast<int>(m.params.size()));
    m.params.push_back(std::move(p));
  }
  m.registered_elements = total;
  m.module_by_name.emplace(name, id);
  m.modules.push_back(std::move(module));
  return id;
}

Status Engine::Initialize() {
  Impl& m = *impl_;
  if (m.initialized) return FailedPrecondition("Initialize called twice");
  ZINF_RETURN_IF_ERROR(m.Context(m.CheckRanksAgree(), "checking that ranks agree"));
  const uint64_t world = m.world();
  m.shard_elements = Partition(m.params, m.world(), m.config.zero_stage,
                               m.config.stage3_param_persistence_threshold);
  ZINF_RETURN_IF_ERROR(m.Context(m.CheckHostMemory(), "sizing host memory"));
  ZINF_RETURN_IF_ERROR(m.Context(m.OpenTiers(m.device),
                                 m.params_on_nvme || m.config.offload_optimizer_device == "nvme"
                                     ? "opening the tiered store and its NVMe swap space"
                                     : "opening the tiered store"));
  const size_t bytes = std::max<uint64_t>(m.shard_elements, 1) * 4;
  ZINF_ASSIGN_OR_RETURN(m.grad_acc,
                        HostArray::Create(m.tiers.get(), "gradient accumulators", bytes));
  if (world > 1) {
    // A bucket never needs to be larger than every gradient of the model together.
    const uint64_t bucket = std::min(m.config.reduce_bucket_size, m.shard_elements * world);
    m.buckets = std::make_unique<GradientBuckets>(m.comm.get(), bucket, m.grad_acc.as<float>());
  }
  if (m.host_master) {
    ZINF_ASSIGN_OR_RETURN(m.master, HostArray::Create(m.tiers.get(), "fp32 master", bytes));
    m.FillInitial(0, m.shard_elements, m.master.as<float>());
  }
  // Without a host master the NVMe optimizer's initialization also fills the parameter tier.
  if (m.config.offload_optimizer_device == "nvme") {
    ZINF_RETURN_IF_ERROR(m.Context(m.OpenNvmeOptimizer(), "opening the NVMe optimizer state"));
  } else {
    // The optimizer state lives in host memory only when it is not on NVMe.
    ZINF_ASSIGN_OR_RETURN(m.state0, HostArray::Create(m.tiers.get(), "optimizer state 0", bytes));
    if (m.state_count() > 1) {
      ZINF_ASSIGN_OR_RETURN(m.state1, HostArray::Create(m.tiers.get(), "optimizer state 1", bytes));
    }
    ZINF_RETURN_IF_ERROR(m.optimizer->InitState(m.group, m.WholeShard()));
  }
  if (m.host_master) {
    ZINF_RETURN_IF_ERROR(m.Context(m.WriteParamTierFromMaster(), "writing the parameter tier"));
  }
  // Initialization's traffic is not the first step's.
  m.nvme_read_at = m.tiers->stats().nvme_to_host;
  m.nvme_written_at = m.tiers->stats().host_to_nvme;
  m.initialized = true;
  return OkStatus();
}

StatusOr<FetchedModule> Engine::Fetch(int id) {
  Impl& m = *impl_;
  ZINF_ASSIGN_OR_RETURN(Module * module, m.FindModule(id));
  FetchedModule out;
  ZINF_RETURN_IF_ERROR(m.Context(m.param_tier->Fetch(id, &out.tensors, &out.params),
                                 fmt::format("fetching module '{}'", module->name)));
  return out;
}

Status Engine::Release(int id) {
  Impl& m = *impl_;
  ZINF_ASSIGN_OR_RETURN(Module * module, m.FindModule(id));
  if (!module->fetched) {
    return FailedPrecondition(
        fmt::format("Release of module '{}', which is not fetched", module->name));
  }
  m.param_tier->Release(id);
  module->fetched = false;
  return OkStatus();
}

StatusOr<std::vector<float*>> Engine::Gradients(int id) {
  Impl& m = *impl_;
  ZINF_ASSIGN_OR_RETURN(Module * module, m.FindModule(id));
  m.param_tier->NoteBackward();
  std::vector<float*> out;
  for (int pi : module->params) {
    const Param& p = m.params[pi];
    GradBuffer& g = m.grads[pi];
    if (g.data == nullptr && m.world() == 1 && module->reductions == 0) {
      // The accumulator is zero until the module's first reduction: backward may write the
      // sum there directly, which saves a buffer and a pass (0 + g is g, bit for bit).
      g.data = m.grad_acc.as<float>() + p.flat_offset;
    } else if (g.data == nullptr) {
      // A device tensor reading as zeros: the padding stays zero and backward may accumulate
      // into it.
      ZINF_ASSIGN_OR_RETURN(g.tensor, m.tiers->Create(p.spec.name + " (gradient)",
                                                      p.shard_size * m.world() * 4, Tier::kDevice));
      StatusOr<void*> data = m.tiers->Acquire(g.tensor, Tier::kDevice, Access::kWrite);
      if (!data.ok()) {
        m.FreeGradient(pi);
        return m.Context(data.status(), fmt::format("gradient of '{}'", p.spec.name));
      }
      g.data = static_cast<float*>(*data);
    }
    out.push_back(g.data);
  }
  return out;
}

Status Engine::ReduceGradients(int id) {
  Impl& m = *impl_;
  ZINF_ASSIGN_OR_RETURN(Module * module, m.FindModule(id));
  const auto t0 = Clock::now();
  for (int pi : module->params) {
    if (m.grads[pi].data == nullptr) {
      return FailedPrecondition(fmt::format(
          "ReduceGradients of module '{}': Gradients() was not called for it", module->name));
    }
  }
  for (int pi : module->params) {
    const Param& p = m.params[pi];
    const GradBuffer& g = m.grads[pi];
    if (m.buckets != nullptr) {
      ZINF_RETURN_IF_ERROR(
          m.Context(m.buckets->Add(g.data, p.shard_size, p.flat_offset, p.spec.name),
                    fmt::format("reducing the gradient of '{}'", p.spec.name)));
    } else if (g.tensor != 0) {  // one rank: the gradient is its own shard
      AccumulateFp32(m.grad_acc.as<float>() + p.flat_offset, g.data, p.shard_size);
    }
    m.FreeGradient(pi);
    m.pending.bytes_reduce_scattered += p.shard_size * m.world() * 4;
  }
  ++module->reductions;
  m.pending.seconds_reduce += Seconds(t0);
  return OkStatus();
}

StatusOr<StepSummary> Engine::Step() {
  Impl& m = *impl_;
  if (!m.initialized) return FailedPrecondition("Step before Initialize");
  for (const Module& module : m.modules) {
    if (module.reductions != m.config.gradient_accumulation_steps) {
      return FailedPrecondition(
          fmt::format("Step: module '{}' reduced its gradients {} time(s) since the last step; "
                      "gradient_accumulation_steps is {}",
                      module.name, module.reductions, m.config.gradient_accumulation_steps));
    }
  }
  ZINF_RETURN_IF_ERROR(m.FinishReductions());
  const auto t0 = Clock::now();
  StepSummary summary = m.pending;
  m.pending = StepSummary();
  const ParamTierCounters gathers = m.param_tier->TakeCounters();
  summary.bytes_gathered = gathers.bytes_gathered;
  summary.seconds_gather = gathers.seconds_gather;
  summary.peak_live_parameters = gathers.peak_live_parameters;
  m.param_tier->DropAll();  // prefetches past the batch's last fetch, and what the step replaces

  // Global norm and overflow over every rank's shard, in one all-reduce.
  ZINF_ASSIGN_OR_RETURN(
      GradStats stats,
      m.optimizer->ComputeGradStats(m.grad_acc.data(), ElementType::kFp32, m.shard_elements));
  double global[2] = {stats.finite ? stats.sum_squares : 0.0, stats.finite ? 0.0 : 1.0};
  ZINF_RETURN_IF_ERROR(
      m.Context(m.comm->AllReduce(global, 2, CommDataType::kFloat64, ReduceOp::kSum),
                "all-reducing the gradient norm"));
  const bool overflow = global[1] > 0 || !std::isfinite(global[0]);
  Status scheduled;  // reported once the batch's bookkeeping is done: the step itself was applied
  // The accumulators hold the sum over ranks and micro-batches of loss_scale * gradient.
  const double mean_scale =
      1.0 / (static_cast<double>(m.world()) * m.config.gradient_accumulation_steps * m.loss_scale);
  summary.grad_norm = overflow ? INFINITY : std::sqrt(global[0]) * mean_scale;

  if (overflow) {
    if (!m.config.fp16) {
      return DataLoss(
          fmt::format("rank {}: non-finite gradients without fp16 loss scaling; "
                      "the step was not applied",
                      m.rank()));
    }
    summary.skipped = true;
  } else {
    if (m.config.gradient_clipping > 0 && summary.grad_norm > m.config.gradient_clipping) {
      summary.clip_coefficient = m.config.gradient_clipping / (summary.grad_norm + 1e-6);
    }
    const float grad_scale = static_cast<float>(mean_scale * summary.clip_coefficient);
    if (m.pipelined != nullptr) {
      ZINF_RETURN_IF_ERROR(
          m.Context(m.NvmeStep(grad_scale, &summary), "stepping the NVMe optimizer state"));
    } else {
      const auto update = Clock::now();
      ZINF_RETURN_IF_ERROR(
          m.optimizer->Step(m.group, m.WholeShard(), {.grad_scale = grad_scale}).status());
      summary.seconds_optimizer_compute = Seconds(update);
      ZINF_RETURN_IF_ERROR(m.Context(m.WriteParamTierFromMaster(), "writing the parameter tier"));
    }
    ++m.steps;
    scheduled = m.ApplySchedule();  // as DeepSpeed's scheduler.step(), after the step
    // Stages 1 and 2 keep the whole model gathered: refresh it now.
    if (m.config.zero_stage < 3) {
      ZINF_RETURN_IF_ERROR(m.Context(m.param_tier->GatherPersistent(), "re-gathering"));
    }
  }
  m.UpdateLossScale(overflow);
  std::memset(m.grad_acc.data(), 0, m.shard_elements * 4);
  for (Module& module : m.modules) module.reductions = 0;
  m.param_tier->EndBatch();  // Note [Prefetch]: the first batch recorded the order
  summary.step = m.steps;
  summary.loss_scale = m.loss_scale;
  summary.seconds_optimizer = Seconds(t0);
  m.MeasureTiers(&summary);
  ZINF_RETURN_IF_ERROR(scheduled);
  return summary;
}

Status Engine::GatherParameter(const std::string& name, std::vector<float>* out) {
  Impl& m = *impl_;
  auto it = m.param_by_name.find(name);
  if (it == m.param_by_name.end()) return InvalidArgument(fmt::format("no parameter '{}'", name));
  Param& p = m.params[it->second];
  std::vector<float> local(p.shard_size), full(p.shard_size * m.world());
  Status read = m.ReadMasterShard(p, local.data());
  // Every rank joins the gather, so that one rank's failure cannot leave the others waiting.
  Status gathered =
      m.comm->AllGather(local.data(), full.data(), p.shard_size, CommDataType::kFloat32);
  ZINF_RETURN_IF_ERROR(m.Context(read, fmt::format("reading parameter '{}'", name)));
  ZINF_RETURN_IF_ERROR(gathered);
  full.resize(p.numel);
  *out = std::move(full);
  return OkStatus();
}

StatusOr<double> Engine::MeanOverRanks(double value) {
  Impl& m = *impl_;
  ZINF_RETURN_IF_ERROR(m.comm->AllReduce(&value, 1, CommDataType::kFloat64, ReduceOp::kSum));
  return value / m.world();
}

Status Engine::SetParameter(const std::string& name, const float* values, uint64_t count) {
  Impl& m = *impl_;
  if (!m.initialized) return FailedPrecondition("SetParameter before Initialize");
  auto it = m.param_by_name.find(name);
  if (it == m.param_by_name.end()) return InvalidArgument(fmt::format("no parameter '{}'", name));
  Param& p = m.params[it->second];
  if (values == nullptr || count != p.numel) {
    return InvalidArgument(fmt::format("SetParameter('{}'): {} values given, the parameter has {}",
                                       name, values == nullptr ? 0 : count, p.numel));
  }
  const uint64_t begin = m.rank() * p.shard_size;
  std::vector<float> shard(p.shard_size);
  for (uint64_t i = 0; i < p.shard_size; ++i) {
    shard[i] = begin + i < p.numel ? values[begin + i] : 0.0f;
  }
  if (m.host_master) std::memcpy(m.Master(p), shard.data(), p.shard_size * 4);
  if (m.pipelined != nullptr) {
    // A whole pass over the NVMe state: fine for loading weights, too slow for every step.
    auto store = [&](const ChunkView& c) {
      const auto [first, last] = Overlap(c.offset, c.count, p);
      if (first < last) {
        std::memcpy(c.params + (first - c.offset), shard.data() + (first - p.flat_offset),
                    (last - first) * 4);
      }
      return OkStatus();
    };
    ZINF_RETURN_IF_ERROR(m.Context(m.pipelined->Visit(m.nvme_shard, store, /*write_back=*/true),
                                   fmt::format("storing parameter '{}'", name)));
  }
  // The parameter tier; a gathered copy is dropped and the next Fetch gathers the new value.
  Status written = m.param_tier->WriteFp32(p, shard.data());
  if (written.ok()) written = m.param_tier->FinishWrites();
  return m.Context(written, fmt::format("writing parameter '{}' to its tier", name));
}

Status Engine::GatherGradient(const std::string& name, std::vector<float>* out) {
  Impl& m = *impl_;
  if (!m.initialized) return FailedPrecondition("GatherGradient before Initialize");
  auto it = m.param_by_name.find(name);
  if (it == m.param_by_name.end()) return InvalidArgument(fmt::format("no parameter '{}'", name));
  Param& p = m.params[it->second];
  ZINF_RETURN_IF_ERROR(m.FinishReductions());
  std::vector<float> full(p.shard_size * m.world());
  ZINF_RETURN_IF_ERROR(m.comm->AllGather(m.grad_acc.as<float>() + p.flat_offset, full.data(),
                                         p.shard_size, CommDataType::kFloat32));
  full.resize(p.numel);
  const double scale =
      1.0 / (static_cast<double>(m.world()) * m.config.gradient_accumulation_steps * m.loss_scale);
  for (float& g : full) g = static_cast<float>(g * scale);
  *out = std::move(full);
  return OkStatus();
}

Status Engine::SaveCheckpoint(const std::string& dir, const std::string& tag,
                              const std::string& client_state) {
  Impl& m = *impl_;
  if (!m.initialized) return FailedPrecondition("SaveCheckpoint before Initialize");
  if (tag.empty() || tag.find('/') != std::string::npos || tag[0] == '.') {
    return InvalidArgument(fmt::format("checkpoint tag '{}' must be a plain file name", tag));
  }
  const nlohmann::json client = nlohmann::json::parse(client_state, nullptr, false);
  if (!client.is_object()) {
    return InvalidArgument(
        fmt::format("client_state must be a JSON object, got: {}", client_state));
  }
  for (const Module& module : m.modules) {
    if (module.reductions != 0) {
      return FailedPrecondition(fmt::format(
          "SaveCheckpoint with gradients pending (module '{}' has {} micro-batch(es)); save "
          "between steps",
          module.name, module.reductions));
    }
  }
  namespace fs = std::filesystem;
  const std::string tag_dir = dir + "/" + tag;
  auto latest = ckpt::ResolveCheckpoint(dir);
  if (latest.ok() && fs::path(*latest).filename() == tag) {
    return FailedPrecondition(fmt::format(
        "checkpoint '{}' is the latest in {} already; save under another tag", tag, dir));
  }
  // Rank 0 clears what an interrupted save of this tag left, before anyone writes.
  Status prepared;
  std::error_code ec;
  if (m.rank() == 0) fs::remove_all(tag_dir, ec);
  fs::create_directories(tag_dir, ec);
  if (ec) prepared = IoError(fmt::format("creating {}: {}", tag_dir, ec.message()));
  ZINF_RETURN_IF_ERROR(m.AgreeAll(std::move(prepared), "preparing checkpoint " + tag_dir));
  if (m.rank() != 0) fs::create_directories(tag_dir, ec);  // rank 0 may have just removed it
  ZINF_RETURN_IF_ERROR(m.AgreeAll(m.WriteShardFile(tag_dir, tag), "writing checkpoint " + tag_dir));
  Status committed;
  if (m.rank() == 0) {
    committed = ckpt::WriteManifest(tag_dir, m.MakeManifest(tag, client.dump()));
    if (committed.ok()) committed = ckpt::CommitLatest(dir, tag);
  }
  return m.AgreeAll(std::move(committed), "committing checkpoint " + tag_dir);
}

StatusOr<std::string> Engine::LoadCheckpoint(const std::string& dir) {
  Impl& m = *impl_;
  if (!m.initialized) return FailedPrecondition("LoadCheckpoint before Initialize");
  StatusOr<std::string> client = m.LoadShardFile(dir);
  ZINF_RETURN_IF_ERROR(m.AgreeAll(client.status(), "loading checkpoint " + dir));
  return client;
}

StatusOr<Engine::ShardRange> Engine::Shard(const std::string& name) const {
  const Impl& m = *impl_;
  auto it = m.param_by_name.find(name);
  if (it == m.param_by_name.end()) return InvalidArgument(fmt::format("no parameter '{}'", name));
  const Param& p = m.params[it->second];
  const uint64_t begin = m.rank() * p.shard_size;
  return ShardRange{begin, begin >= p.numel ? 0 : std::min(p.shard_size, p.numel - begin)};
}

}  // namespace zinf
