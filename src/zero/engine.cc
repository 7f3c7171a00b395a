// The ZeRO engine's facade: creation, registration, fetch and release, gradients, and the
// parameter accessors. The contract is include/zinf/engine.h; the rest of the engine is laid
// out in src/zero/engine_impl.h. Partitioning: Note [ZeRO partitioning] in
// src/zero/partition.h. Parameters, gathered copies and gradient buffers live in the tiered
// store: Note [Parameter tier] in src/zero/param_tier.h.
//
// Stages: all three keep optimizer state and the fp32 master copy sharded. Stage 3 gathers a
// parameter at Fetch and frees it at Release (unless it is smaller than
// stage3_param_persistence_threshold); stages 1 and 2 keep every parameter gathered and
// re-gather after each step. Gradients are reduce-scattered into the shard at
// ReduceGradients in every stage.
//
// offload_optimizer.device = nvme: the fp32 master copy and the optimizer state live on NVMe
// and are stepped by the PipelinedOptimizer, which reads the gradient accumulators where they
// are, in host memory (OptimizerStep, optimizer_step_nvme.cc).
//
// offload_param.device = nvme: each parameter's shard is a tensor of the tiered store whose
// home is NVMe (Note [Parameter tier]); Step writes it with the new values. With the optimizer
// on NVMe too, no fp32 copy of the shard stays in host memory: the new values come from the
// pipelined step chunk by chunk (ParamTier::ChunkWriter), alongside backward where it can
// (Note [Overlapped step] in src/zero/optimizer_overlap.h).
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
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "comm/communicator.h"
#include "core/log.h"
#include "zero/engine_impl.h"
#include "zero/partition.h"
#include "zero/process_group.h"
#include "zinf/cpu_optimizer.h"
#include "zinf/engine.h"
#include "zinf/tiered_store.h"

namespace zinf {

// More elements than any machine holds (4 PiB of fp32): a shape beyond this is a mistake, and
// refusing it at registration keeps the size arithmetic below far from overflow.
constexpr uint64_t kMaxElements = uint64_t{1} << 50;

Status Engine::Impl::CheckRanksAgree() {
  nlohmann::json model = nlohmann::json::array();
  for (const Param& p : params) {
    model.push_back(
        {p.spec.name, p.spec.shape, p.module, p.spec.optimizer_group, p.spec.trainable});
  }
  const nlohmann::json cfg = {config.zero_stage,
                              OffloadDeviceName(config.offload_param_device),
                              OffloadDeviceName(config.offload_optimizer_device),
                              config.gradient_accumulation_steps,
                              config.layer_major,
                              config.gradient_clipping,
                              config.fp16,
                              config.bf16,
                              OptimizerTypeName(config.optimizer.type),
                              config.optimizer.lr,
                              config.optimizer.beta1,
                              config.optimizer.beta2,
                              config.optimizer.eps,
                              config.optimizer.weight_decay,
                              config.seed};
  nlohmann::json groups = nlohmann::json::array();  // Note [Parameter groups]
  for (int g = 1; g < optimizer_step->num_groups(); ++g) {
    const OptimizerHyperParams hp = *optimizer_step->hyper_params(g);
    groups.push_back({hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay});
  }
  const int64_t mine[2] = {static_cast<int64_t>(HashName(0, model.dump())),
                           static_cast<int64_t>(HashName(0, cfg.dump() + groups.dump()))};
  std::vector<int64_t> all(2 * world());
  ZINF_RETURN_IF_ERROR(comm->AllGather(mine, all.data(), 2, ElementType::kInt64));
  for (int r = 0; r < world(); ++r) {
    if (all[2 * r + 1] != all[1]) {
      return FailedPrecondition(fmt::format(
          "rank {} was started with a different config than rank 0 (stage, offload, "
          "optimizer or its parameter groups, precision, accumulation or seed differ); every "
          "rank needs the same one",
          r));
    }
    if (all[2 * r] != all[0]) {
      return FailedPrecondition(fmt::format(
          "rank {} registered different modules, parameter shapes or trainable parameters than "
          "rank 0",
          r));
    }
  }
  return OkStatus();
}

StatusOr<const Param*> Engine::Impl::FindParam(std::string_view name) const {
  auto it = param_by_name.find(name);
  if (it == param_by_name.end()) return InvalidArgument(fmt::format("no parameter '{}'", name));
  return &params[it->second];
}

StatusOr<Module*> Engine::Impl::FindModule(int id) {
  if (!initialized) return FailedPrecondition("the engine is not initialized");
  if (id < 0 || id >= static_cast<int>(modules.size())) {
    return InvalidArgument(
        fmt::format("module id {} is not registered (have {})", id, modules.size()));
  }
  return &modules[id];
}

Status Engine::Impl::FillInitial(uint64_t begin, uint64_t count, float* out) const {
  if (!initial_values) {
    zinf::FillInitial(params, config.seed, rank(), begin, count, out);
    return OkStatus();
  }
  return FillShard(params, rank(), begin, count, out,
                   [this](const Param& p, uint64_t first, uint64_t n, float* values) {
                     return initial_values(p.spec.name, first, n, values);
                   });
}

Status Engine::Impl::WriteFrozenInitial() {
  std::vector<float> values;
  Status written;
  for (const Param& p : params) {
    if (p.trainable()) continue;
    values.resize(p.shard_size);
    written = FillInitial(p.flat_offset, p.shard_size, values.data());
    if (written.ok()) written = param_tier->WriteFp32(p, values.data());
    if (!written.ok()) break;
  }
  Status finished = param_tier->FinishWrites();
  return written.ok() ? finished : written;
}

Status Engine::Impl::ReadValues(const Param& p, float* out) {
  return p.trainable() ? optimizer_step->ReadMaster(p, out) : param_tier->ReadFp32(p, out);
}

Status Engine::Impl::AgreeAll(Status mine, const std::string& what) {
  const int64_t failed = mine.ok() ? 0 : 1;
  std::vector<int64_t> all(world());
  Status agreed = comm->AllGather(&failed, all.data(), 1, ElementType::kInt64);
  if (!mine.ok()) return Context(std::move(mine), what);
  ZINF_RETURN_IF_ERROR(Context(std::move(agreed), what));
  for (int r = 0; r < world(); ++r) {
    if (all[r] != 0) return FailedPrecondition(fmt::format("{} failed on rank {}", what, r));
  }
  return OkStatus();
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

int Engine::rank() const { return impl_->rank(); }
int Engine::world_size() const { return impl_->world(); }
int Engine::local_rank() const { return impl_->local_rank; }
Device* Engine::compute_device() const { return impl_->compute.get(); }
const std::string& Engine::compute_device_name() const { return impl_->device; }

StatusOr<TieredStoreStats> Engine::store_stats() const {
  if (impl_->store == nullptr) return FailedPrecondition("store_stats before Initialize");
  return impl_->store->stats();
}
double Engine::loss_scale() const { return impl_->scaler.scale; }
const EngineConfig& Engine::config() const { return impl_->config; }

double Engine::learning_rate() const { return impl_->optimizer_step->learning_rate(); }

Status Engine::SetLearningRate(double lr) {
  Impl& m = *impl_;
  ZINF_RETURN_IF_ERROR(m.optimizer_step->Quiesce("SetLearningRate"));
  return m.optimizer_step->SetLearningRate(lr);
}

StatusOr<int> Engine::AddParamGroup(const OptimizerHyperParams& hyper_params) {
  if (impl_->initialized) return FailedPrecondition("AddParamGroup after Initialize");
  return impl_->optimizer_step->AddParamGroup(hyper_params);
}

int Engine::num_param_groups() const { return impl_->optimizer_step->num_groups(); }

StatusOr<OptimizerHyperParams> Engine::param_group(int group) const {
  OptimizerStep& step = *impl_->optimizer_step;
  ZINF_ASSIGN_OR_RETURN(OptimizerHyperParams hyper_params, step.hyper_params(group));
  hyper_params.lr = step.learning_rate(group);  // the rate the next step applies
  return hyper_params;
}

Status Engine::SetGroupLearningRate(int group, double lr) {
  Impl& m = *impl_;
  ZINF_RETURN_IF_ERROR(m.optimizer_step->Quiesce("SetLearningRate"));
  return m.optimizer_step->SetGroupLearningRate(group, lr);
}

StatusOr<std::unique_ptr<Engine>> Engine::Create(const EngineConfig& config,
                                                 const EngineOptions& options) {
  ZINF_RETURN_IF_ERROR(config.Validate());
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  ZINF_ASSIGN_OR_RETURN(const ProcessPlace place, ResolveProcessPlace(options));
  ZINF_ASSIGN_OR_RETURN(impl->device, ResolveComputeDevice(options.device, place.local_rank));
  impl->fp32_view = options.fp32_view && impl->device == "host";
  impl->params_on_nvme = config.offload_param_device == OffloadDevice::kNvme;
  impl->host_master =
      !(impl->params_on_nvme && config.offload_optimizer_device == OffloadDevice::kNvme);
  impl->param_type = config.bf16   ? ElementType::kBf16
                     : config.fp16 ? ElementType::kFp16
                                   : ElementType::kFp32;
  impl->global_rank = place.global_rank;
  impl->local_rank = place.local_rank;
  // train_batch_size counts the data-parallel ranks, known only now.
  ZINF_RETURN_IF_ERROR(impl->config.ResolveBatchSize(place.size));
  // Every trainer reads the batch shape back from config() (Engine::config), so this line is
  // what it trains at, however the config gave it.
  if (place.global_rank == 0) log::Info("batch: {}", impl->config.BatchShape(place.size));
  ZINF_ASSIGN_OR_RETURN(ProcessGroup group, ConnectProcessGroup(place, options.timeout));
  impl->rendezvous = std::move(group.rendezvous);
  impl->comm = std::move(group.comm);
  if (impl->device != "host" && place.size > 1) {
    ZINF_ASSIGN_OR_RETURN(
        impl->device_comm,
        CreateNcclCommunicator(*impl->rendezvous, {.rank = place.rank,
                                                   .world_size = place.size,
                                                   .device = std::stoi(impl->device.substr(5)),
                                                   .timeout = options.timeout,
                                                   .group_name = place.name + "-device"}));
  }
  ZINF_ASSIGN_OR_RETURN(impl->optimizer_step,
                        OptimizerStep::Create(impl->config, options.optimizer_threads));
  impl->scaler = LossScaler::FromConfig(config);
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

bool Engine::parameters_resident() const {
  const Impl& m = *impl_;
  // One rank hands out the shard itself (Note [Parameter tier]); a device-homed shard never
  // moves, and its writes end in it (ParamTier::WriteTier: in place, or a host copy written
  // back, which FinishWrites waits for). The overlapped step writes it while backward goes on,
  // guarded by refusing the fetch of a module reduced for the last time (Note [Overlapped
  // step]), which a trainer that fetches nothing would never meet.
  const bool overlapped =
      m.config.offload_optimizer_device == OffloadDevice::kNvme && m.config.overlap_optimizer;
  return m.initialized && m.world() == 1 && !overlapped &&
         m.config.offload_param_device == OffloadDevice::kNone &&
         (m.param_type == ElementType::kFp32 || !m.fp32_view);
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

Status Engine::Initialize(const InitialValues& initial_values) {
  Impl& m = *impl_;
  if (m.initialized) return FailedPrecondition("Initialize called twice");
  m.initial_values = initial_values;
  // The caller's source is not kept past this call, however it ends.
  struct Forget {
    Impl& m;
    ~Forget() { m.initial_values = nullptr; }
  } forget{m};
  ZINF_RETURN_IF_ERROR(m.Context(m.CheckRanksAgree(), "checking that ranks agree"));
  // Note [Frozen parameters]: the parameters in flat order, the modules' indices following.
  const std::vector<int> moved = OrderTrainableFirst(m.params);
  for (Module& module : m.modules) {
    for (int& pi : module.params) {
      pi = moved[pi];
      module.trains = module.trains || m.params[pi].trainable();
    }
  }
  for (auto& [name, pi] : m.param_by_name) pi = moved[pi];
  m.shard_elements = Partition(m.params, m.world(), m.config.zero_stage,
                               m.config.stage3_param_persistence_threshold);
  ZINF_RETURN_IF_ERROR(m.Context(m.CheckHostMemory(), "sizing host memory"));
  uint64_t speculative_chunks = 0;
  ZINF_RETURN_IF_ERROR(
      m.Context(m.OpenTiers(m.device, &speculative_chunks),
                m.params_on_nvme || m.config.offload_optimizer_device == OffloadDevice::kNvme
                    ? "opening the tiered store and its NVMe swap space"
                    : "opening the tiered store"));
  ZINF_RETURN_IF_ERROR(m.optimizer_step->Open({.store = m.store.get(),
                                               .param_tier = m.param_tier.get(),
                                               .params = &m.params,
                                               .modules = &m.modules,
                                               .rank = m.rank(),
                                               .shard_elements = m.shard_elements,
                                               .param_type = m.param_type,
                                               .host_master = m.host_master,
                                               .params_on_nvme = m.params_on_nvme,
                                               .speculative_chunks = speculative_chunks},
                                              [&m](uint64_t begin, uint64_t count, float* out) {
                                                return m.FillInitial(begin, count, out);
                                              }));
  ZINF_RETURN_IF_ERROR(m.Context(m.WriteFrozenInitial(), "writing the frozen parameters"));
  ZINF_ASSIGN_OR_RETURN(m.buckets,
                        GradientBuckets::Create(m.store.get(), m.compute.get(), m.DeviceComm(),
                                                m.BucketElements(), m.optimizer_step.get()));
  // Initialization's traffic is not the first step's.
  m.nvme_read_at = m.store->stats().nvme_to_host;
  m.nvme_written_at = m.store->stats().host_to_nvme;
  m.initialized = true;
  return OkStatus();
}

StatusOr<FetchedModule> Engine::Fetch(int id) {
  Impl& m = *impl_;
  ZINF_ASSIGN_OR_RETURN(Module * module, m.FindModule(id));
  if (module->reductions == m.config.ReductionsPerStep()) {
    ZINF_RETURN_IF_ERROR(m.optimizer_step->Quiesce(fmt::format(
        "Fetch of module '{}' after its last ReduceGradients of the batch", module->name)));
  }
  ZINF_RETURN_IF_ERROR(m.optimizer_step->BeforeFetch(id));
  FetchedModule out;
  ZINF_RETURN_IF_ERROR(m.Context(m.param_tier->Fetch(id, &out.tensors, &out.params, &out.ready),
                                 fmt::format("fetching module '{}'", module->name)));
  return out;
}

Status Engine::Release(int id, Event* done) {
  Impl& m = *impl_;
  ZINF_ASSIGN_OR_RETURN(Module * module, m.FindModule(id));
  if (!module->fetched) {
    return FailedPrecondition(
        fmt::format("Release of module '{}', which is not fetched", module->name));
  }
  ZINF_RETURN_IF_ERROR(m.Context(m.param_tier->Release(id, done),
                                 fmt::format("releasing module '{}'", module->name)));
  module->fetched = false;
  return OkStatus();
}

StatusOr<std::vector<float*>> Engine::Gradients(int id, GradientWrite write) {
  Impl& m = *impl_;
  ZINF_ASSIGN_OR_RETURN(Module * module, m.FindModule(id));
  ZINF_RETURN_IF_ERROR(m.optimizer_step->BeforeGradients());
  m.param_tier->NoteBackward();
  std::vector<float*> out;
  for (int pi : module->params) {
    const Param& p = m.params[pi];
    if (!p.trainable()) {  // Note [Frozen parameters]: nothing to write
      out.push_back(nullptr);
      continue;
    }
    GradBuffer& g = m.grads[pi];
    float* accumulator = m.optimizer_step->Accumulator(p);
    if (g.data == nullptr && m.world() == 1 && module->reductions == 0 && accumulator != nullptr &&
        m.host_addressable) {
      // The accumulator holds nothing of this batch until the module's first reduction
      // (Note [First gradient copied] in src/zero/optimizer_step.cc): where backward's memory
      // is host memory, it may write the gradient there directly, which saves a buffer and a
      // pass. Zeroed first only for a backward that adds into it.
      if (write == GradientWrite::kAdd) m.optimizer_step->ZeroAccumulator(p);
      g.data = accumulator;
    } else if (g.data == nullptr) {
      // A device tensor, reading as zeros where backward adds into it, else as it is (its
      // padding, past the parameter's elements, is never read: GradientBuckets::Add).
      ZINF_ASSIGN_OR_RETURN(g.tensor,
                            m.store->CreateScratch(p.spec.name + " (gradient)",
                                                   p.shard_size * m.world() * 4, Tier::kDevice));
      StatusOr<void*> data =
          m.store->Acquire(g.tensor, Tier::kDevice,
                           write == GradientWrite::kAdd ? Access::kWrite : Access::kOverwrite);
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

// Note [Layer-major micro-batches]
// With gradient accumulation G, the micro-batch-major schedule runs each micro-batch through
// the whole model: every module is fetched 2G times a step (a forward and a backward fetch per
// micro-batch), which with parameters on NVMe is 2G reads of the model. zinf.layer_major lets
// the trainer turn the loops around: forward runs all G micro-batches through module k (one
// fetch) before module k+1, keeping each micro-batch's activations; backward takes the modules
// in reverse, each fetched once, its G micro-batches' gradients accumulated in the buffers of
// one Gradients() call, and reduced once. The engine's part is only the count: a module is
// reduced ReductionsPerStep() times a step (1 here), which is when the overlapped step
// begins, gradients on NVMe are final and Step may run; the mean still divides by G x world.
// The sums: on one rank the accumulator receives (g_1 + g_2) + ... either way, so the two
// schedules agree bit for bit (but for the sign of a zero: the buffers a trainer adds into
// start from zeros, and Note [First gradient copied] copies the first micro-batch); on
// several ranks each rank first sums its micro-batches in
// micro-batch order, and the ranks' sums are reduced once (the collective's order), where the
// micro-batch-major schedule reduces each micro-batch over the ranks and sums the reduced
// micro-batches. The trainer pays with G micro-batches' activations held at once.
Status Engine::ReduceGradients(int id, Event* ready) {
  Impl& m = *impl_;
  ZINF_ASSIGN_OR_RETURN(Module * module, m.FindModule(id));
  const auto t0 = EngineClock::now();
  if (module->reductions + 1 == m.config.ReductionsPerStep()) {
    ZINF_RETURN_IF_ERROR(m.optimizer_step->BeginLastMicroBatch(m.MeanScale()));
  }
  for (int pi : module->params) {
    if (m.params[pi].trainable() && m.grads[pi].data == nullptr) {
      return FailedPrecondition(fmt::format(
          "ReduceGradients of module '{}': Gradients() was not called for it", module->name));
    }
  }
  // Last parameter first: backward reduces the modules in reverse, so the gradients reach the
  // buckets in reverse flat order, which lets one rank's bucket land in the accumulators in
  // one copy (Note [Gradient buckets]). Each parameter's sums are the same in any order.
  for (auto it = module->params.rbegin(); it != module->params.rend(); ++it) {
    const int pi = *it;
    const Param& p = m.params[pi];
    if (!p.trainable()) continue;
    const GradBuffer& g = m.grads[pi];
    if (g.tensor != 0) {  // the buckets own the buffer from here, and free it
      const GradBuffer handed = std::exchange(m.grads[pi], GradBuffer());
      ZINF_RETURN_IF_ERROR(
          m.Context(m.buckets->Add(handed.data, p.shard_size, p.flat_offset, p.spec.name, ready,
                                   handed.tensor, p.shard_size * m.world() - p.numel),
                    fmt::format("reducing the gradient of '{}'", p.spec.name)));
    } else {  // written into the accumulator itself (host memory)
      if (ready != nullptr) ZINF_RETURN_IF_ERROR(ready->Synchronize());
      m.optimizer_step->GradientWritten(pi);
      m.grads[pi] = GradBuffer();
    }
    m.pending.bytes_reduce_scattered += p.shard_size * m.world() * 4;
  }
  ++module->reductions;
  m.pending.seconds_reduce += SecondsSince(t0);
  return OkStatus();
}

Status Engine::GatherParameter(const std::string& name, std::vector<float>* out) {
  Impl& m = *impl_;
  ZINF_RETURN_IF_ERROR(m.optimizer_step->Quiesce("GatherParameter"));
  ZINF_ASSIGN_OR_RETURN(const Param* found, m.FindParam(name));
  const Param& p = *found;
  std::vector<float> local(p.shard_size), full(p.shard_size * m.world());
  Status read = m.ReadValues(p, local.data());
  // Every rank joins the gather, so that one rank's failure cannot leave the others waiting.
  Status gathered = m.comm->AllGather(local.data(), full.data(), p.shard_size, ElementType::kFp32);
  ZINF_RETURN_IF_ERROR(m.Context(read, fmt::format("reading parameter '{}'", name)));
  ZINF_RETURN_IF_ERROR(gathered);
  full.resize(p.numel);
  *out = std::move(full);
  return OkStatus();
}

StatusOr<double> Engine::MeanOverRanks(double value) {
  Impl& m = *impl_;
  ZINF_RETURN_IF_ERROR(m.comm->AllReduce(&value, 1, ElementType::kFp64, ReduceOp::kSum));
  return value / m.world();
}

Status Engine::Broadcast(float* values, uint64_t count, int root_rank) {
  Impl& m = *impl_;
  if (root_rank < 0 || root_rank >= m.world()) {
    return InvalidArgument(
        fmt::format("Broadcast: root_rank must be in [0, {}), got {}", m.world(), root_rank));
  }
  if (values == nullptr && count > 0) return InvalidArgument("Broadcast: values is null");
  if (count == 0 || m.world() == 1) return OkStatus();
  return m.comm->Broadcast(values, count, ElementType::kFp32, root_rank);
}

Status Engine::SetParameter(const std::string& name, const float* values, uint64_t count) {
  Impl& m = *impl_;
  ZINF_RETURN_IF_ERROR(m.optimizer_step->Quiesce("SetParameter"));
  if (!m.initialized) return FailedPrecondition("SetParameter before Initialize");
  ZINF_ASSIGN_OR_RETURN(const Param* found, m.FindParam(name));
  const Param& p = *found;
  if (values == nullptr || count != p.numel) {
    return InvalidArgument(fmt::format("SetParameter('{}'): {} values given, the parameter has {}",
                                       name, values == nullptr ? 0 : count, p.numel));
  }
  const uint64_t begin = m.rank() * p.shard_size;
  std::vector<float> shard(p.shard_size);
  for (uint64_t i = 0; i < p.shard_size; ++i) {
    shard[i] = begin + i < p.numel ? values[begin + i] : 0.0f;
  }
  if (p.trainable()) {
    ZINF_RETURN_IF_ERROR(m.Context(m.optimizer_step->WriteMaster(p, shard.data()),
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
  ZINF_ASSIGN_OR_RETURN(const Param* found, m.FindParam(name));
  const Param& p = *found;
  if (!p.trainable()) {
    return InvalidArgument(fmt::format(
        "GatherGradient('{}'): the parameter is frozen (ParamSpec::trainable false) and has no "
        "gradient",
        name));
  }
  ZINF_RETURN_IF_ERROR(m.optimizer_step->BeforeGradients());
  ZINF_RETURN_IF_ERROR(m.FinishReductions());
  std::vector<float> full(p.shard_size * m.world());
  std::vector<float> shard(p.shard_size);
  ZINF_RETURN_IF_ERROR(m.optimizer_step->ReadGradient(p, shard.data()));
  ZINF_RETURN_IF_ERROR(
      m.comm->AllGather(shard.data(), full.data(), p.shard_size, ElementType::kFp32));
  full.resize(p.numel);
  const double scale = m.MeanScale();
  for (float& g : full) g = static_cast<float>(g * scale);
  *out = std::move(full);
  return OkStatus();
}

StatusOr<Engine::ShardRange> Engine::Shard(const std::string& name) const {
  const Impl& m = *impl_;
  ZINF_ASSIGN_OR_RETURN(const Param* found, m.FindParam(name));
  const Param& p = *found;
  const uint64_t begin = m.rank() * p.shard_size;
  return ShardRange{begin, begin >= p.numel ? 0 : std::min(p.shard_size, p.numel - begin)};
}

}  // namespace zinf
