// PipelinedOptimizer: see offload/pipelined_optimizer.h and Note [Pipelined step].
#include "offload/pipelined_optimizer.h"

#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <optional>
#include <set>

#include "core/elapsed.h"
#include "core/log.h"
#include "core/units.h"

namespace zinf {
namespace {

using Clock = SteadyClock;

// Where the arrays of one chunk sit in a buffer (a staging buffer or a host state block):
// [params | state0 | state1 | grads], each region 4 KiB aligned so that the state regions form
// one extent and the gradients another. The chunk's NVMe state tensor holds [home_offset,
// state_bytes): the parameters and the state arrays, or the state arrays alone where the
// caller keeps the parameters (Note [Parameters kept by the caller]).
struct ChunkLayout {
  uint64_t param_bytes = 0;  // one fp32 array, aligned
  uint64_t state_bytes = 0;  // params and state arrays
  uint64_t home_offset = 0;  // where the state tensor's bytes begin
  uint64_t grad_bytes = 0;   // aligned

  ChunkLayout(size_t count, int state_count, ElementType grad_type, bool params_kept) {
    param_bytes = AlignUp(count * 4, 4096);
    state_bytes = param_bytes * (1 + state_count);
    home_offset = params_kept ? param_bytes : 0;
    grad_bytes = AlignUp(count * ElementSize(grad_type), 4096);
  }
  uint64_t data_bytes() const { return state_bytes + grad_bytes; }
  uint64_t home_bytes() const { return state_bytes - home_offset; }  // what is written back
};

}  // namespace

struct PipelinedOptimizer::Slot {
  TensorId tensor = 0;   // a host-tier tensor, acquired for the optimizer's lifetime
  char* data = nullptr;  // its memory
  IoWaiter reads;
  IoWaiter writes;
  // A speculative step's old parameters, for shards whose parameters the caller keeps.
  TensorId old_params_tensor = 0;
  char* old_params = nullptr;
  char* base() const { return data; }
};

// A host-resident chunk's tensor, acquired in the host tier for one use (RAII).
class PipelinedOptimizer::HostChunk {
 public:
  HostChunk(TieredStore* store, TensorId id) : store_(store), id_(id) {
    StatusOr<void*> data = store->Acquire(id, Tier::kHost, Access::kWrite);
    if (data.ok()) {
      data_ = static_cast<char*>(*data);
    } else {
      status_ = std::move(data).status();
    }
  }
  ~HostChunk() {
    if (data_ != nullptr) store_->Release(id_, Tier::kHost).IgnoreError();
  }
  HostChunk(const HostChunk&) = delete;
  HostChunk& operator=(const HostChunk&) = delete;
  const Status& status() const { return status_; }
  char* data() const { return data_; }

 private:
  TieredStore* store_;
  TensorId id_;
  char* data_ = nullptr;
  Status status_;
};

struct PipelinedOptimizer::Shard {
  struct Chunk {
    size_t offset = 0;
    size_t count = 0;
    bool on_nvme = false;
    // Store tensors; 0 for none.
    TensorId state = 0;       // on_nvme: the fp32 parameters (unless the caller keeps them)
                              // and the state arrays
    TensorId grads = 0;       // on_nvme, without ShardSpec::host_grads
    TensorId undo = 0;        // a speculative step's old state, until resolved
    TensorId old_params = 0;  // ... and old parameters, where the caller keeps them
    TensorId host = 0;        // !on_nvme: the whole chunk, homed in the host tier
  };
  ShardSpec spec;
  int state_count = 2;
  std::vector<Chunk> chunks;

  bool in_place() const { return spec.handoff == ParamHandoff::kInPlace; }
  ChunkLayout Layout(const Chunk& chunk) const {
    return ChunkLayout(chunk.count, state_count, spec.grad_type, in_place());
  }
  ChunkView View(const Chunk& chunk, char* base) const {
    ChunkLayout layout = Layout(chunk);
    ChunkView view;
    view.offset = chunk.offset;
    view.count = chunk.count;
    view.params = reinterpret_cast<float*>(base);
    view.state0 = reinterpret_cast<float*>(base + layout.param_bytes);
    view.state1 =
        state_count == 2 ? reinterpret_cast<float*>(base + 2 * layout.param_bytes) : nullptr;
    view.grads = spec.host_grads != nullptr ? static_cast<char*>(spec.host_grads) +
                                                  chunk.offset * ElementSize(spec.grad_type)
                                            : base + layout.state_bytes;
    view.grad_type = spec.grad_type;
    return view;
  }
  std::string ChunkName(size_t index) const {
    return fmt::format("chunk {} (elements {}..{}) of shard '{}'", index, chunks[index].offset,
                       chunks[index].offset + chunks[index].count, spec.name);
  }
};

// One run of the pipeline over a list of chunks (Note [Pipelined step]): item j's chunk is read
// into staging buffer j % k, updated there (a host chunk where it lives), handed to its writer
// and written home from there, while the reads of the next items and the write of the one
// before are in flight.
class PipelinedOptimizer::Pipeline {
 public:
  Pipeline(PipelinedOptimizer& optimizer, const std::vector<Item>& items, float grad_scale,
           bool speculative, ParamWriter* writer)
      : o_(optimizer),
        items_(items),
        grad_scale_(grad_scale),
        speculative_(speculative),
        writer_(writer),
        k_(optimizer.slots_.size()) {}

  // Every item through the pipeline; the I/O is drained whatever happens.
  Status Run() {
    const Clock::time_point start = Clock::now();
    const size_t n = items_.size();
    Status failure;
    size_t failed = 0;
    for (size_t j = 0; j < std::min(n, k_ - 1) && failure.ok(); ++j) {
      failure = Read(j);
      failed = j;
    }
    for (size_t i = 0; i < n && failure.ok(); ++i) {
      failed = i;
      failure = Process(i);
      if (failure.ok() && i + k_ - 1 < n) {
        failure = Read(i + k_ - 1);
        if (!failure.ok()) failed = i + k_ - 1;
      }
    }
    Drain(failure);
    o_.stats_.seconds += SecondsSince(start);
    if (!failure.ok()) {
      const Item& item = items_[std::min(failed, n - 1)];
      return std::move(failure).WithContext(
          fmt::format("pipelined optimizer step at {}", item.shard->ChunkName(item.chunk)));
    }
    return OkStatus();
  }

 private:
  ParamWriter* WriterOf(const Shard& shard) const {
    return writer_ != nullptr ? writer_ : shard.spec.writer;
  }

  // Makes staging buffer j % k ready for item j: its previous writes done, then the reads
  // started (and the parameters kept by the writer asked for).
  Status Read(size_t j) {
    Slot& slot = *o_.slots_[j % k_];
    {
      const Clock::time_point t = Clock::now();
      Status written = slot.writes.Wait();
      o_.stats_.wait_seconds += SecondsSince(t);
      ZINF_RETURN_IF_ERROR(written);
    }
    const Shard& shard = *items_[j].shard;
    const Shard::Chunk& chunk = shard.chunks[items_[j].chunk];
    if (shard.in_place()) WriterOf(shard)->Prefetch({chunk.offset, chunk.count, chunk.on_nvme});
    if (!chunk.on_nvme) return OkStatus();
    const ChunkLayout layout = shard.Layout(chunk);
    slot.reads.Add(1);
    o_.store_->ReadHomeAsync(chunk.state, slot.base() + layout.home_offset, slot.reads.Callback());
    o_.stats_.bytes_read += layout.home_bytes();
    if (chunk.grads != 0) {
      slot.reads.Add(1);
      o_.store_->ReadHomeAsync(chunk.grads, slot.base() + layout.state_bytes,
                               slot.reads.Callback());
      o_.stats_.bytes_read += layout.grad_bytes;
    }
    return OkStatus();
  }

  // Item i, once read: updated, handed to its writer and written home.
  Status Process(size_t i) {
    Slot& slot = *o_.slots_[i % k_];
    const Item& item = items_[i];
    const Shard::Chunk& chunk = item.shard->chunks[item.chunk];
    {
      const Clock::time_point t = Clock::now();
      Status read = slot.reads.Wait();
      o_.stats_.wait_seconds += SecondsSince(t);
      ZINF_RETURN_IF_ERROR(read);
    }
    std::optional<HostChunk> host;  // held through the update
    if (!chunk.on_nvme) {
      host.emplace(o_.store_, chunk.host);
      ZINF_RETURN_IF_ERROR(host->status());
    }
    char* base = host ? host->data() : slot.base();
    ZINF_RETURN_IF_ERROR(Update(item, slot, base));
    ZINF_RETURN_IF_ERROR(Write(item, slot, base));
    ++o_.stats_.chunks;
    return OkStatus();
  }

  // Updates the item's chunk, whose arrays are at `base`, and hands it to the writer.
  Status Update(const Item& item, Slot& slot, char* base) {
    const Shard& shard = *item.shard;
    const ShardSpec& spec = shard.spec;
    const Shard::Chunk& chunk = shard.chunks[item.chunk];
    ParamWriter* writer = WriterOf(shard);
    const bool in_place = shard.in_place();
    ChunkView view = shard.View(chunk, base);
    OptimizerSpan span;
    span.params = view.params;
    span.grads = view.grads;
    span.grad_type = view.grad_type;
    span.state0 = view.state0;
    span.state1 = view.state1;
    span.param_copy_type = spec.param_copy_type;
    span.count = chunk.count;
    // The writer's targets split the update into stretches (element-wise: the same bits), each
    // writing its stretch of the copy, or its parameters, where the writer keeps them.
    std::vector<CopyTarget> targets = {{0, chunk.count, nullptr}};
    if (spec.handoff != ParamHandoff::kNewValues) {
      ZINF_ASSIGN_OR_RETURN(targets, writer->Targets(view));
    }
    // In place: the parameters where the writer keeps them; the padding's zeros in the buffer.
    auto params_of = [&](const CopyTarget& target) {
      if (target.dst != nullptr) return static_cast<float*>(target.dst);
      std::memset(view.params + target.begin, 0, target.count * 4);
      return view.params + target.begin;
    };
    if (in_place && speculative_) {  // their old values, to write aside
      for (const CopyTarget& target : targets) {
        std::memcpy(slot.old_params + target.begin * 4, params_of(target), target.count * 4);
      }
    }
    const Clock::time_point t = Clock::now();
    Status updated;
    for (const CopyTarget& target : targets) {
      OptimizerSpan part = span.Slice(target.begin, target.count);
      if (in_place) {
        part.params = params_of(target);
      } else {
        part.param_copy = target.dst;
      }
      // Split again where the part crosses from one parameter group into the next.
      const uint64_t first = chunk.offset + target.begin;
      updated = ForEachGroupRun(
          spec.runs, first, target.count, [&](int group, uint64_t begin, uint64_t n) {
            return o_.optimizer_->Update(group, part.Slice(begin - first, n), grad_scale_);
          });
      if (!updated.ok()) break;
    }
    o_.stats_.compute_seconds += SecondsSince(t);
    ZINF_RETURN_IF_ERROR(updated);
    view.copy_written = spec.handoff == ParamHandoff::kCopy;
    view.params_in_place = in_place;
    return writer != nullptr ? writer->Updated(view) : OkStatus();
  }

  // Writes the item's chunk home from `base`: to a new state tensor when speculative, the old
  // one kept (and the old parameters written aside, where the writer keeps them).
  Status Write(const Item& item, Slot& slot, const char* base) {
    Shard& shard = *item.shard;
    Shard::Chunk& chunk = shard.chunks[item.chunk];
    if (!chunk.on_nvme) return OkStatus();  // updated where it lives
    const ChunkLayout layout = shard.Layout(chunk);
    TieredStore& store = *o_.store_;
    if (speculative_) {
      ZINF_ASSIGN_OR_RETURN(TensorId fresh, store.Create(fmt::format("{} chunk {} new state",
                                                                     shard.spec.name, item.chunk),
                                                         layout.home_bytes(), Tier::kNvme));
      chunk.undo = std::exchange(chunk.state, fresh);
      if (shard.in_place()) {
        ZINF_ASSIGN_OR_RETURN(
            chunk.old_params,
            store.Create(fmt::format("{} chunk {} old parameters", shard.spec.name, item.chunk),
                         layout.param_bytes, Tier::kNvme));
        slot.writes.Add(1);
        store.WriteHomeAsync(chunk.old_params, slot.old_params, slot.writes.Callback());
        o_.stats_.bytes_written += layout.param_bytes;
      }
    }
    slot.writes.Add(1);
    store.WriteHomeAsync(chunk.state, base + layout.home_offset, slot.writes.Callback());
    o_.stats_.bytes_written += layout.home_bytes();
    return OkStatus();
  }

  // Waits for every read and write, also after a failure (kept in `failure`, the first one):
  // the staging buffers must not be reused while I/O still targets them.
  void Drain(Status& failure) {
    const Clock::time_point t = Clock::now();
    for (auto& slot : o_.slots_) {
      Status r = slot->reads.Wait();
      Status w = slot->writes.Wait();
      if (failure.ok() && !r.ok()) failure = r;
      if (failure.ok() && !w.ok()) failure = w;
    }
    o_.stats_.wait_seconds += SecondsSince(t);
  }

  PipelinedOptimizer& o_;
  const std::vector<Item>& items_;
  const float grad_scale_;
  const bool speculative_;
  ParamWriter* const writer_;  // stands in for the shards' own, when set
  const size_t k_;
};

Status PipelinedOptimizerOptions::Validate() const {
  if (num_buffers < 3 || num_buffers > 64) {
    return InvalidArgument(fmt::format("num_buffers must be in [3, 64], got {}", num_buffers));
  }
  if (chunk_elements < kMinChunkElements || chunk_elements % kChunkAlignElements != 0) {
    return InvalidArgument(
        fmt::format("chunk_elements must be a multiple of {} and at least {}, got {}",
                    kChunkAlignElements, kMinChunkElements, chunk_elements));
  }
  if (!(nvme_ratio >= 0.0 && nvme_ratio <= 1.0)) {
    return InvalidArgument(
        fmt::format("nvme_ratio (offload_optimizer.ratio) must be in [0, 1], got {}", nvme_ratio));
  }
  const uint64_t minimum = num_buffers * kMinChunkElements * kStagingBytesPerElement;
  if (host_budget_bytes < minimum) {
    return InvalidArgument(fmt::format(
        "host_budget_bytes {} ({}) is too small for the pipelined optimizer step: it needs at "
        "least {} ({}): {} staging buffers of one chunk of {} elements at {} bytes each",
        host_budget_bytes, FormatBytes(host_budget_bytes), minimum, FormatBytes(minimum),
        num_buffers, kMinChunkElements, kStagingBytesPerElement));
  }
  return OkStatus();
}

PipelinedOptimizer::PipelinedOptimizer(CpuOptimizer* optimizer, TieredStore* store,
                                       const PipelinedOptimizerOptions& options)
    : optimizer_(optimizer), store_(store), options_(options) {}

uint64_t PipelinedOptimizer::staging_bytes() const {
  const bool old_params = !slots_.empty() && slots_[0]->old_params != nullptr;
  return (slot_bytes_ + (old_params
                             ? chunk_elements_ * PipelinedOptimizerOptions::kOldParamBytesPerElement
                             : 0)) *
         slots_.size();
}

uint64_t PipelinedOptimizer::ChunkBytes(uint64_t count, int state_count) {
  return ChunkLayout(count, state_count, ElementType::kFp32, false).data_bytes();
}

StatusOr<std::vector<CopyTarget>> ParamWriter::Targets(const ChunkView& c) {
  return FailedPrecondition(
      fmt::format("this parameter writer gives no targets (chunk at element {})", c.offset));
}
void ParamWriter::Prefetch(const ChunkInfo&) {}
Status ParamWriter::Read(const ChunkView& c) {
  return FailedPrecondition(
      fmt::format("this parameter writer keeps no parameters (chunk at element {})", c.offset));
}
Status ParamWriter::Store(const ChunkView& c) {
  return FailedPrecondition(
      fmt::format("this parameter writer keeps no parameters (chunk at element {})", c.offset));
}
Status ParamWriter::Restart() { return OkStatus(); }

StatusOr<std::unique_ptr<PipelinedOptimizer>> PipelinedOptimizer::Create(
    CpuOptimizer* optimizer, TieredStore& store, const PipelinedOptimizerOptions& options) {
  if (optimizer == nullptr) return InvalidArgument("pipelined optimizer: optimizer is null");
  ZINF_RETURN_IF_ERROR_CTX(options.Validate(), "pipelined optimizer options");
  const bool has_nvme = store.stats().tiers[int(Tier::kNvme)].budget_bytes > 0;
  if (options.nvme_ratio > 0 && !has_nvme) {
    return InvalidArgument(
        fmt::format("pipelined optimizer: nvme_ratio is {} but the tiered store has no NVMe tier",
                    options.nvme_ratio));
  }
  std::unique_ptr<PipelinedOptimizer> self(new PipelinedOptimizer(optimizer, &store, options));
  self->has_nvme_ = has_nvme;
  const uint64_t k = options.num_buffers;
  uint64_t fit =
      options.host_budget_bytes / (k * PipelinedOptimizerOptions::kStagingBytesPerElement);
  fit -= fit % PipelinedOptimizerOptions::kChunkAlignElements;
  self->chunk_elements_ = std::min<uint64_t>(options.chunk_elements, fit);
  self->slot_bytes_ = self->chunk_elements_ * PipelinedOptimizerOptions::kStagingBytesPerElement;
  for (uint64_t i = 0; i < k; ++i) {
    auto slot = std::make_unique<Slot>();
    ZINF_ASSIGN_OR_RETURN(slot->tensor, store.Create(fmt::format("pipelined step staging {}", i),
                                                     self->slot_bytes_, Tier::kHost));
    StatusOr<void*> data = store.Acquire(slot->tensor, Tier::kHost, Access::kOverwrite);
    if (!data.ok()) {
      store.Free(slot->tensor).IgnoreError();
      return std::move(data).status();
    }
    slot->data = static_cast<char*>(*data);
    self->slots_.push_back(std::move(slot));
    Status registered = store.RegisterStreamBuffer(self->slots_.back()->data, self->slot_bytes_);
    if (!registered.ok()) {
      log::Debug("pipelined step: staging buffer not registered for fixed I/O: {}", registered);
    }
  }
  return self;
}

PipelinedOptimizer::~PipelinedOptimizer() {
  for (auto& slot : slots_) {
    slot->reads.Wait().IgnoreError();
    slot->writes.Wait().IgnoreError();
  }
  for (auto& shard : shards_) {
    Status status = FreeShard(*shard);
    if (!status.ok()) log::Warn("pipelined optimizer: {}", status);
  }
  for (auto& slot : slots_) {
    for (TensorId t : {slot->tensor, slot->old_params_tensor}) {
      if (t == 0) continue;
      store_->Release(t, Tier::kHost).IgnoreError();
      store_->Free(t).IgnoreError();
    }
  }
}

StatusOr<PipelinedOptimizer::Shard*> PipelinedOptimizer::Find(int shard) {
  if (shard < 0 || static_cast<size_t>(shard) >= shards_.size()) {
    return InvalidArgument(fmt::format("pipelined optimizer: no shard with id {}", shard));
  }
  return shards_[shard].get();
}

StatusOr<int> PipelinedOptimizer::AddShard(const ShardSpec& spec, const ChunkVisitor& init) {
  const std::string what = fmt::format("adding shard '{}'", spec.name);
  if (spec.count == 0) return InvalidArgument(what + ": count must be > 0");
  ShardSpec normalized = spec;
  if (normalized.runs.empty()) normalized.runs = {{0, spec.group}};
  ZINF_RETURN_IF_ERROR(CheckGroupRuns(normalized.runs, spec.count, *optimizer_, what));
  ZINF_ASSIGN_OR_RETURN(ParamGroupState group, optimizer_->group(normalized.runs[0].group));
  if (spec.handoff != ParamHandoff::kNewValues && spec.writer == nullptr) {
    return InvalidArgument(what +
                           ": the parameters go to a writer (copy or in place) but it is null");
  }
  if (spec.handoff == ParamHandoff::kCopy && spec.param_copy_type != ElementType::kBf16 &&
      spec.param_copy_type != ElementType::kFp16) {
    return InvalidArgument(fmt::format("{}: param_copy_type must be bf16 or fp16, got {}", what,
                                       ElementTypeName(spec.param_copy_type)));
  }
  if (spec.handoff == ParamHandoff::kInPlace) ZINF_RETURN_IF_ERROR_CTX(MakeOldParamBuffers(), what);

  auto shard = std::make_unique<Shard>();
  shard->spec = std::move(normalized);
  shard->state_count = group.hyper_params.state_count();
  const double ratio = options_.nvme_ratio;
  for (size_t offset = 0, c = 0; offset < spec.count; offset += chunk_elements_, ++c) {
    Shard::Chunk chunk;
    chunk.offset = offset;
    chunk.count = std::min<size_t>(chunk_elements_, spec.count - offset);
    // Interleave the NVMe and host chunks (See Note [Pipelined step]).
    chunk.on_nvme = std::floor((c + 1) * ratio) > std::floor(c * ratio);
    shard->chunks.push_back(std::move(chunk));
  }

  // On any error below, FreeShard frees what was allocated.
  shards_.push_back(std::move(shard));
  const int id = static_cast<int>(shards_.size() - 1);
  Shard& s = *shards_.back();
  auto fail = [&](Status status) {
    FreeShard(s).IgnoreError();
    shards_.pop_back();
    return std::move(status).WithContext(what);
  };
  Slot& slot = *slots_[0];
  for (size_t c = 0; c < s.chunks.size(); ++c) {
    Shard::Chunk& chunk = s.chunks[c];
    ChunkLayout layout = s.Layout(chunk);
    auto create = [&](uint64_t bytes, std::string_view part, Tier home) -> StatusOr<TensorId> {
      return store_->Create(fmt::format("{} chunk {} {}", spec.name, c, part), bytes, home);
    };
    std::optional<HostChunk> host;
    char* base = slot.base();
    if (chunk.on_nvme) {
      StatusOr<TensorId> t = create(layout.home_bytes(), "state", Tier::kNvme);
      if (!t.ok()) return fail(std::move(t).status());
      chunk.state = *t;
      if (spec.host_grads == nullptr) {
        t = create(layout.grad_bytes, "grads", Tier::kNvme);
        if (!t.ok()) return fail(std::move(t).status());
        chunk.grads = *t;
      }
    } else {
      StatusOr<TensorId> t = create(layout.data_bytes(), "in host memory", Tier::kHost);
      if (!t.ok()) return fail(std::move(t).status());
      chunk.host = *t;
      host.emplace(store_, chunk.host);
      if (!host->status().ok()) return fail(host->status());
      base = host->data();
    }
    std::memset(base, 0, layout.data_bytes());
    ChunkView view = s.View(chunk, base);
    OptimizerSpan span;
    span.params = view.params;
    span.state0 = view.state0;
    span.state1 = view.state1;
    span.count = chunk.count;
    Status status = ForEachGroupRun(
        s.spec.runs, chunk.offset, chunk.count, [&](int group, uint64_t begin, uint64_t n) {
          return optimizer_->InitState(group, span.Slice(begin - chunk.offset, n));
        });
    if (status.ok() && init) status = init(view);
    if (status.ok() && chunk.on_nvme) {
      status = store_->WriteHome(chunk.state, base + layout.home_offset);
    }
    if (status.ok() && chunk.grads != 0) {
      status = store_->WriteHome(chunk.grads, base + layout.state_bytes);
    }
    if (!status.ok()) return fail(std::move(status).WithContext(s.ChunkName(c)));
  }
  return id;
}

Status PipelinedOptimizer::FreeShard(Shard& shard) {
  Status first;
  for (Shard::Chunk& chunk : shard.chunks) {
    for (TensorId* t : {&chunk.state, &chunk.grads, &chunk.undo, &chunk.old_params, &chunk.host}) {
      if (*t != 0) {
        Status status = store_->Free(std::exchange(*t, 0));
        if (first.ok() && !status.ok()) first = status;
      }
    }
  }
  return first;
}

Status PipelinedOptimizer::Visit(int id, const ChunkVisitor& visit, bool write_back) {
  ZINF_ASSIGN_OR_RETURN(Shard * shard, Find(id));
  std::vector<size_t> all(shard->chunks.size());
  for (size_t c = 0; c < all.size(); ++c) all[c] = c;
  return VisitChunks(shard, all, visit, write_back);
}

Status PipelinedOptimizer::VisitChunks(int id, const std::vector<size_t>& chunks,
                                       const ChunkVisitor& visit) {
  ZINF_ASSIGN_OR_RETURN(Shard * shard, Find(id));
  ZINF_RETURN_IF_ERROR(CheckChunks(*shard, chunks));
  return VisitChunks(shard, chunks, visit, /*write_back=*/false);
}

Status PipelinedOptimizer::CheckChunks(const Shard& shard, const std::vector<size_t>& chunks) {
  for (size_t c : chunks) {
    if (c >= shard.chunks.size()) {
      return InvalidArgument(fmt::format("shard '{}' has {} chunks, no chunk {}", shard.spec.name,
                                         shard.chunks.size(), c));
    }
  }
  return OkStatus();
}

Status PipelinedOptimizer::VisitChunks(Shard* shard, const std::vector<size_t>& chunks,
                                       const ChunkVisitor& visit, bool write_back) {
  Slot& slot = *slots_[0];
  for (size_t c : chunks) {
    Shard::Chunk& chunk = shard->chunks[c];
    ChunkLayout layout = shard->Layout(chunk);
    std::optional<HostChunk> host;
    if (!chunk.on_nvme) host.emplace(store_, chunk.host);
    char* base = host ? host->data() : slot.base();
    Status status = host ? host->status() : OkStatus();
    if (chunk.on_nvme) {
      status = store_->ReadHome(chunk.state, base + layout.home_offset);
      if (status.ok() && chunk.grads != 0) {
        status = store_->ReadHome(chunk.grads, base + layout.state_bytes);
      }
    }
    const ChunkView view = shard->View(chunk, base);
    if (status.ok() && shard->in_place()) status = shard->spec.writer->Read(view);
    if (status.ok()) status = visit(view);
    if (status.ok() && write_back && chunk.on_nvme) {
      status = store_->WriteHome(chunk.state, base + layout.home_offset);
      if (status.ok() && chunk.grads != 0) {
        status = store_->WriteHome(chunk.grads, base + layout.state_bytes);
      }
    }
    if (status.ok() && write_back && shard->in_place()) status = shard->spec.writer->Store(view);
    if (!status.ok()) {
      return std::move(status).WithContext(fmt::format("visiting {}", shard->ChunkName(c)));
    }
  }
  return OkStatus();
}

StatusOr<PipelinedOptimizer::Shard*> PipelinedOptimizer::FindGradientChunk(int id, size_t c,
                                                                           const void* buffer) {
  ZINF_ASSIGN_OR_RETURN(Shard * shard, Find(id));
  ZINF_RETURN_IF_ERROR(CheckChunks(*shard, {c}));
  if (shard->spec.grad_type != ElementType::kFp32 || shard->spec.host_grads != nullptr) {
    return InvalidArgument(
        fmt::format("shard '{}' keeps no fp32 gradients of its own", shard->spec.name));
  }
  if (buffer == nullptr || reinterpret_cast<uintptr_t>(buffer) % 4096 != 0) {
    return InvalidArgument("chunk gradients: the buffer must be page-aligned and not null");
  }
  return shard;
}

void PipelinedOptimizer::WriteChunkGradientsAsync(int id, size_t c, const void* buffer,
                                                  IoCallback done) {
  StatusOr<Shard*> shard = FindGradientChunk(id, c, buffer);
  if (!shard.ok()) return done(shard.status());
  const Shard::Chunk& chunk = (*shard)->chunks[c];
  if (!chunk.on_nvme) {
    HostChunk host(store_, chunk.host);
    if (!host.status().ok()) return done(host.status());
    std::memcpy((*shard)->View(chunk, host.data()).grads, buffer, chunk.count * 4);
    return done(OkStatus());
  }
  const std::string name = (*shard)->ChunkName(c);
  store_->WriteHomeAsync(chunk.grads, buffer, [done = std::move(done), name](Status s) {
    done(s.ok() ? s : std::move(s).WithContext("writing the gradients of " + name));
  });
}

Status PipelinedOptimizer::ReadChunkGradients(int id, size_t c, void* buffer) {
  ZINF_ASSIGN_OR_RETURN(Shard * shard, FindGradientChunk(id, c, buffer));
  const Shard::Chunk& chunk = shard->chunks[c];
  if (!chunk.on_nvme) {
    HostChunk host(store_, chunk.host);
    ZINF_RETURN_IF_ERROR(host.status());
    std::memcpy(buffer, shard->View(chunk, host.data()).grads, chunk.count * 4);
    return OkStatus();
  }
  ZINF_RETURN_IF_ERROR_CTX(store_->ReadHome(chunk.grads, buffer),
                           fmt::format("reading the gradients of {}", shard->ChunkName(c)));
  return OkStatus();
}

Status PipelinedOptimizer::MakeOldParamBuffers() {
  const uint64_t bytes = chunk_elements_ * PipelinedOptimizerOptions::kOldParamBytesPerElement;
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& slot = *slots_[i];
    if (slot.old_params != nullptr) continue;
    ZINF_ASSIGN_OR_RETURN(
        TensorId t,
        store_->Create(fmt::format("pipelined step old parameters {}", i), bytes, Tier::kHost));
    StatusOr<void*> data = store_->Acquire(t, Tier::kHost, Access::kOverwrite);
    if (!data.ok()) {
      store_->Free(t).IgnoreError();
      return std::move(data).status();
    }
    slot.old_params_tensor = t;
    slot.old_params = static_cast<char*>(*data);
  }
  return OkStatus();
}

Status PipelinedOptimizer::Step(const std::vector<int>& ids, float grad_scale) {
  stats_ = PipelinedStepStats();
  std::vector<Shard*> shards;
  if (ids.empty()) {
    for (auto& s : shards_) shards.push_back(s.get());
  } else {
    for (int id : ids) {
      ZINF_ASSIGN_OR_RETURN(Shard * s, Find(id));
      shards.push_back(s);
    }
  }
  std::set<int> groups;
  for (Shard* s : shards) {
    for (const GroupRun& run : s->spec.runs) groups.insert(run.group);
  }
  for (int g : groups) ZINF_RETURN_IF_ERROR(optimizer_->BeginStep(g).status());
  std::vector<Item> items;
  for (Shard* s : shards) {
    for (size_t c = 0; c < s->chunks.size(); ++c) items.push_back({s, c});
  }
  return Pipeline(*this, items, grad_scale, /*speculative=*/false, /*writer=*/nullptr).Run();
}

StatusOr<std::vector<ChunkInfo>> PipelinedOptimizer::Chunks(int id) {
  ZINF_ASSIGN_OR_RETURN(Shard * shard, Find(id));
  std::vector<ChunkInfo> out;
  for (const Shard::Chunk& c : shard->chunks) out.push_back({c.offset, c.count, c.on_nvme});
  return out;
}

Status PipelinedOptimizer::BeginPartialStep(int id) {
  ZINF_ASSIGN_OR_RETURN(Shard * shard, Find(id));
  stats_ = PipelinedStepStats();
  for (int group : GroupsOf(shard->spec.runs)) {
    ZINF_RETURN_IF_ERROR(optimizer_->BeginStep(group).status());
  }
  return OkStatus();
}

StatusOr<std::vector<int>> PipelinedOptimizer::Groups(int id) {
  ZINF_ASSIGN_OR_RETURN(Shard * shard, Find(id));
  return GroupsOf(shard->spec.runs);
}

Status PipelinedOptimizer::StepChunks(int id, const std::vector<size_t>& chunks, float grad_scale,
                                      bool speculative, ParamWriter* writer) {
  ZINF_ASSIGN_OR_RETURN(Shard * shard, Find(id));
  ZINF_RETURN_IF_ERROR(CheckChunks(*shard, chunks));
  std::vector<Item> items;
  for (size_t c : chunks) {
    const Shard::Chunk& chunk = shard->chunks[c];
    if (speculative && (!chunk.on_nvme || chunk.undo != 0)) {
      return InvalidArgument(
          fmt::format("{} cannot be stepped speculatively: {}", shard->ChunkName(c),
                      !chunk.on_nvme ? "its home is host memory, where nothing keeps the old state"
                                     : "it was already stepped speculatively in this step"));
    }
    items.push_back({shard, c});
  }
  return Pipeline(*this, items, grad_scale, speculative, writer).Run();
}

StatusOr<std::vector<size_t>> PipelinedOptimizer::ResolveSpeculation(int id, bool commit) {
  ZINF_ASSIGN_OR_RETURN(Shard * shard, Find(id));
  std::vector<size_t> undone;
  // The writer lets go of the parameters first: dropping the speculation may store them (Note
  // [Parameters kept by the caller]), and it will see every chunk again.
  Status first =
      !commit && shard->spec.writer != nullptr ? shard->spec.writer->Restart() : OkStatus();
  for (size_t c = 0; c < shard->chunks.size(); ++c) {
    Shard::Chunk& chunk = shard->chunks[c];
    if (chunk.undo == 0) continue;
    if (chunk.old_params != 0) {
      // Where the caller keeps the parameters, the step wrote them in place: back they go.
      Status restored;
      if (!commit) {
        char* staging = slots_[0]->base();
        restored = store_->ReadHome(chunk.old_params, staging);
        if (restored.ok()) restored = shard->spec.writer->Store(shard->View(chunk, staging));
        restored = std::move(restored).WithContext(
            fmt::format("restoring the parameters of {}", shard->ChunkName(c)));
      }
      Status freed = store_->Free(std::exchange(chunk.old_params, 0));
      if (first.ok()) first = restored.ok() ? freed : restored;
    }
    if (commit) {
      Status freed = store_->Free(std::exchange(chunk.undo, 0));
      if (first.ok()) first = freed;
    } else {
      Status freed = store_->Free(std::exchange(chunk.state, chunk.undo));
      chunk.undo = 0;
      if (first.ok()) first = freed;
      undone.push_back(c);
    }
  }
  ZINF_RETURN_IF_ERROR_CTX(
      first, fmt::format("resolving the speculative step of shard '{}'", shard->spec.name));
  return undone;
}

}  // namespace zinf
