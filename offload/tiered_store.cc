// TieredStore: see include/zinf/tiered_store.h. This file holds the entry points, which check
// their arguments and the catalog, and the Notes on the store's behaviour; the moves, eviction
// and batches are TieredStore::Impl's (offload/tiered_store_impl.h, which lists its parts).
//
// One mutex guards every tensor's metadata; transfers run without it, with the tensor marked
// busy so that nothing evicts, frees or overwrites the copies a transfer uses. A condition
// variable wakes threads waiting for a tensor to become idle or for memory to come back.
// The pools (MemoryPool) enforce each tier's budget; a copy that does not fit evicts unpinned
// cached copies first (See Note [TieredStore eviction order]).
#include "zinf/tiered_store.h"

#include <fmt/core.h>

#include <chrono>
#include <future>
#include <memory>
#include <utility>

#include "nvme/swap_store.h"
#include "offload/memory_pool.h"
#include "offload/tiered_store_impl.h"
#include "offload/tiered_store_internal.h"
#include "zinf/device.h"

namespace zinf {

// Note [TieredStore eviction order]
// The ZeRO engine knows, from the trace of the first step, when each parameter is needed next,
// and passes it as SetNextUse; evicting the copy needed furthest in the future is Belady's
// optimal policy. Tensors without a hint are ones the engine does not expect to need (or a
// caller that gives no hints at all): they go first, least recently used first, which is plain
// LRU when no hints are given.

// Note [Batched write-backs]
// A step writes back every shard of the parameter tier it updated, each a few KiB to a few
// MiB, and the next batch reads them again. Moved one by one, each costs a transfer thread's
// wake-up, one request at a time from that thread, and the waiter's wake-up: about 100 us a
// shard when other ranks hold the cores, far more than the disk takes. EvictAsync and
// Prefetch of several tensors claim, as one job, those idle now whose move is between NVMe
// and host-addressable memory (and, for a read, whose memory is free without evicting), start
// all their requests before waiting for any, and finish each tensor as its own requests
// complete: a failed write-back keeps its copy, as Evict does; a failed read leaves the copy
// invalid for the next Acquire to read again. Host copies written home to device memory (a
// step's new parameters on a GPU) are a batch too: every copy is queued on the upload stream
// before one wait for them all, where one at a time cost an event and a host wait each; a
// failed batch keeps every copy. So are prefetches into device memory from a current host copy
// (a module's parameters homed in host memory, fetched to a GPU): their device memory is one
// run (Note [Runs of blocks] in offload/memory_pool.h), so a module's tensors go up as one
// copy, and a failed batch leaves each device copy invalid for the next Acquire to copy again.
// Tensors homed on NVMe go to device memory behind a link the same way, through host memory:
// every read in flight at once into one run of host memory, then up with the batch, and the
// host copies dropped once up (the host tier holds them only on the way, as a staging buffer).
// The others (busy, pinned, needing room made) are moved one at a time as Evict and Prefetch
// do, with the same errors but one: a copy held when the job runs
// is left to its holders (Note [Evicting a held copy]).
// WriteBackAsync is the same job keeping each copy once it is home: a step whose next
// forward reads the shards soon after it writes them (Note [Step in the next forward's order]
// in src/zero/step_beside_forward.h) then costs no read, and the copies, clean, are dropped for
// free when the tier needs their room.

// Note [Evicting a held copy]
// Evict refuses a copy its caller still holds: that is the caller's mistake. An asynchronous
// eviction is different: it runs on a transfer thread some time after the call, and by then
// another thread may have acquired the tensor again; the optimizer step sends a shard home
// just as the next forward's gather reads it. So EvictAsync and WriteBackAsync leave a copy
// held when the job runs to its holders and do not fail for it: one only read is written home
// (when newer) and kept, one being written stays as it is (its writer sends it home, or an
// eviction for room does). Either is a clean or dirty cached copy like any other.

// Note [Scratch tensors]
// A training step makes and frees the same short-lived tensors every time: a gather's
// destination per parameter, a gradient buffer per parameter, the coalesced gathers' send and
// receive tensors. Made new each time, each costs a pool allocation, a heap allocation for
// its record and one for its name, and (with the names of freed tensors kept for errors) a
// record that outlives it. So CreateScratch takes a freed scratch tensor of the same size and
// home when there is one (a new id, the old memory, reading as zeros as a new tensor does), and
// Free parks a scratch tensor instead of dropping its memory. What is parked is bounded by
// what was live at once (a loop reuses what it freed), and by kIdleScratchKept; it gives its
// memory back, oldest first, before any cached copy is evicted for room, so it never fails an
// allocation that would have succeeded without it. The engine hands what is parked back after
// each step (ReleaseIdleScratch): reuse is within a step, where the same sizes come back module
// after module, and between steps the tiers hold only what is live (the step's host figures,
// and the memory NVMe gradients save, count no parked buffers). Errors name a freed tensor from a
// ring of the last kFreedNamesKept: older ids are still known freed (ids only grow), just not by
// name.

// Note [Transfer counters]
// What makes a step's host work checkable without a GPU (the engine's StepSummary reports it
// per step) is counted where it happens, each kind at one place, on the device's
// TransferCounters (include/zinf/device.h), which the store and its clients share
// (TieredStore::transfer_counters):
// - waits: the device's Event::Synchronize and Stream::Synchronize; the store's Acquire
//   finding its tensor in a transfer (MakeValid), and its own waits for a stream to NVMe
//   (ReadHome, WriteHome); the engine's waits for the store's futures, where it waits for them;
//   split by thread (the store's transfer threads and the engine's optimizer threads mark
//   themselves) into the trainer's waits and zinf's own;
// - copies by direction: the device's Stream::Copy, by its CopyKind; and TierMover's memcpys
//   between the tiers of the direct host device (Note [Direct host device]), which are the
//   same copies done by the CPU;
// - memsets: the device's Stream::Memset; TierMover's zeroing (of device memory on the direct
//   host device, counted as the device's, and of host memory); the zeros a stream reads for a
//   home never written;
// - the host's own passes over host memory: counted by the code that makes them (the engine's
//   zeroing of its accumulators, its staging copies), beside the memset or memcpy.
// A count is a call, not an elapsed wait: deterministic where the calls are, so tests pin them.

// Note [Direct host device]
// On the host device without a modelled link, device memory is host memory that nothing but
// this store's own streams would order. Moving bytes through a stream there costs a thread
// handoff per transfer and, for NVMe, a copy through a staging buffer, for nothing: the store
// then copies with memcpy and reads and writes NVMe straight into the device tier's blocks
// (aligned for O_DIRECT), as it does for the host tier. With a link modelled, every transfer
// goes through the device's copy engines, so that the model sees it.

std::string_view TierName(Tier tier) {
  switch (tier) {
    case Tier::kDevice:
      return "device";
    case Tier::kHost:
      return "host";
    case Tier::kNvme:
      return "nvme";
  }
  return "unknown";
}

Status TieredStoreOptions::Validate() const {
  if (!device.empty() && device != "host" && device.rfind("cuda:", 0) != 0) {
    return InvalidArgument(fmt::format(
        "tiered store device must be \"host\", \"cuda:N\" or empty, got \"{}\"", device));
  }
  if (!device.empty() && device_budget_bytes == 0) {
    return InvalidArgument("tiered store device_budget_bytes must be > 0 with a device, got 0");
  }
  if (host_budget_bytes == 0) {
    return InvalidArgument("tiered store host_budget_bytes must be > 0, got 0");
  }
  if (!nvme_paths.empty() && nvme_capacity_bytes == 0) {
    return InvalidArgument("tiered store nvme_capacity_bytes must be > 0 with nvme_paths, got 0");
  }
  if (nvme_rank < 0) {
    return InvalidArgument(fmt::format("tiered store nvme_rank must be >= 0, got {}", nvme_rank));
  }
  if (piece_bytes == 0 || piece_bytes % 4096 != 0) {
    return InvalidArgument(fmt::format(
        "tiered store piece_bytes must be a positive multiple of 4096, got {}", piece_bytes));
  }
  if (staging_buffers < 1 || staging_buffers > 64) {
    return InvalidArgument(
        fmt::format("tiered store staging_buffers must be in [1, 64], got {}", staging_buffers));
  }
  if (transfer_threads < 1 || transfer_threads > 64) {
    return InvalidArgument(
        fmt::format("tiered store transfer_threads must be in [1, 64], got {}", transfer_threads));
  }
  return OkStatus();
}

namespace internal {
namespace {
TieredStoreEngineFactory& EngineFactory() {
  static TieredStoreEngineFactory factory;
  return factory;
}
}  // namespace
void SetTieredStoreEngineFactoryForTest(TieredStoreEngineFactory factory) {
  EngineFactory() = std::move(factory);
}
}  // namespace internal

namespace {

// The host tier's pool: pinned by the device's own call where the device is a GPU.
StatusOr<std::unique_ptr<MemoryPool>> OpenHostTier(const TieredStoreOptions& options,
                                                   Device* device) {
  PinnedPoolOptions hp;
  hp.name = "host tier";
  hp.budget_bytes = options.host_budget_bytes;
  hp.arena_bytes = std::min<uint64_t>(options.host_budget_bytes, kHostTierArenaBytes);
  // Note [Arena slack]: the tails small tensors leave, where there is more than one arena.
  hp.arena_slack_bytes = options.host_budget_bytes > hp.arena_bytes ? hp.arena_bytes : 0;
  hp.pinned = options.pin_host;
  hp.numa_node = options.numa_node;
  hp.device = options.pin_host && device != nullptr && device->kind() == DeviceKind::kCuda
                  ? device
                  : nullptr;
  if (hp.device != nullptr) hp.numa_node = -1;
  return MemoryPool::CreatePinned(hp);
}

// The NVMe tier of options.nvme_paths, on the test hook's engine when one is set.
StatusOr<std::unique_ptr<NvmePieces>> OpenNvmeTier(const TieredStoreOptions& options) {
  SwapStoreOptions swap;
  swap.paths = options.nvme_paths;
  swap.rank = options.nvme_rank;
  swap.capacity_bytes = options.nvme_capacity_bytes;
  swap.checksum = options.nvme_checksum;
  swap.aio = options.nvme_aio;
  std::unique_ptr<IoEngine> engine;
  if (internal::EngineFactory()) {
    ZINF_ASSIGN_OR_RETURN(engine, internal::EngineFactory()(swap.aio));
  }
  return NvmePieces::Open(swap, options.piece_bytes, options.staging_buffers, options.pin_host,
                          std::move(engine));
}

}  // namespace

TieredStore::TieredStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TieredStore::~TieredStore() = default;

StatusOr<std::unique_ptr<TieredStore>> TieredStore::Create(const TieredStoreOptions& options) {
  ZINF_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<Device> device;
  if (!options.device.empty()) {
    ZINF_ASSIGN_OR_RETURN(device, CreateDevice(options.device, options.device_budget_bytes));
  }
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<TieredStore> store, Create(options, device.get()));
  store->impl_->owned_device = std::move(device);
  return store;
}

StatusOr<std::unique_ptr<TieredStore>> TieredStore::Create(const TieredStoreOptions& options,
                                                           Device* device) {
  // The options are checked as for the device given: a device tier needs a budget, whatever
  // options.device names.
  TieredStoreOptions checked = options;
  checked.device = device != nullptr ? "host" : "";
  ZINF_RETURN_IF_ERROR(checked.Validate());
  std::unique_ptr<MemoryPool> device_pool;
  if (device != nullptr) {
    DevicePoolOptions dp;
    dp.name = device->name() + " tier";
    dp.budget_bytes = options.device_budget_bytes;
    // As the host tier's: NVMe reads land in it (O_DIRECT) where the host addresses it, and a
    // run placed in either tier can lie at the other's distances (Note [Runs of blocks]).
    dp.alignment = 4096;
    ZINF_ASSIGN_OR_RETURN(device_pool, MemoryPool::CreateOnDevice(*device, dp));
  }
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<MemoryPool> host_pool, OpenHostTier(options, device));
  std::unique_ptr<NvmePieces> nvme;
  if (!options.nvme_paths.empty()) {
    ZINF_ASSIGN_OR_RETURN(nvme, OpenNvmeTier(options));
  }
  auto impl = std::make_unique<Impl>(options, device, std::move(device_pool), std::move(host_pool),
                                     std::move(nvme));
  ZINF_ASSIGN_OR_RETURN(impl->mover,
                        TierMover::Create(device, impl->nvme.get(), &impl->links, &impl->counters));
  return std::unique_ptr<TieredStore>(new TieredStore(std::move(impl)));
}

StatusOr<TensorId> TieredStore::Create(std::string name, uint64_t size_bytes, Tier home) {
  Impl& m = *impl_;
  if (size_bytes == 0)
    return InvalidArgument(fmt::format("tensor '{}': size_bytes must be > 0", name));
  if (!m.HasTier(home)) {
    return InvalidArgument(
        fmt::format("tensor '{}': this store has no {} tier", name, TierName(home)));
  }
  MutexLock lock(&m.mu);
  return m.CreateLocked(name, size_bytes, home, /*scratch=*/false);
}

StatusOr<TensorId> TieredStore::CreateScratch(std::string_view name, uint64_t size_bytes,
                                              Tier home) {
  Impl& m = *impl_;
  if (size_bytes == 0)
    return InvalidArgument(fmt::format("tensor '{}': size_bytes must be > 0", name));
  if (home == Tier::kNvme || !m.HasTier(home)) {
    return InvalidArgument(fmt::format(
        "scratch tensor '{}': its home must be the device or host tier of this store, not {}", name,
        TierName(home)));
  }
  MutexLock lock(&m.mu);
  if (StoreTensor* t = m.catalog.Revive(name, size_bytes, home)) return t->id;
  return m.CreateLocked(name, size_bytes, home, /*scratch=*/true);
}

void TieredStore::ReleaseIdleScratch() {
  MutexLock lock(&impl_->mu);
  impl_->catalog.ReleaseIdleScratch();
}

Status TieredStore::Free(TensorId id) {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  while (true) {
    ZINF_ASSIGN_OR_RETURN(StoreTensor * t, m.catalog.Find(id));
    if (t->pins() > 0) {
      return FailedPrecondition(
          fmt::format("tensor {} ('{}') is acquired and cannot be freed", id, t->name));
    }
    if (t->busy) {
      m.cv.Wait(&m.mu);
      continue;
    }
    m.catalog.Retire(*t);
    m.cv.SignalAll();
    return OkStatus();
  }
}

namespace {

std::shared_future<Status> Ready(Status s) {
  std::promise<Status> p;
  p.set_value(std::move(s));
  return p.get_future().share();
}

bool InFlight(const std::shared_future<Status>& f) {
  return f.valid() && f.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
}

}  // namespace

std::shared_future<Status> TieredStore::Prefetch(TensorId id, Tier tier, Event* after) {
  Impl& m = *impl_;
  if (tier == Tier::kNvme || !m.HasTier(tier)) {
    return Ready(InvalidArgument(
        fmt::format("cannot prefetch tensor {} to the {} tier", id, TierName(tier))));
  }
  MutexLock lock(&m.mu);
  StatusOr<StoreTensor*> t = m.catalog.Find(id);
  if (!t.ok()) return Ready(t.status());
  StoreTensor& tensor = **t;
  if (tensor.copies[Index(tier)].valid) return Ready(OkStatus());
  std::shared_future<Status>& inflight = tensor.prefetch[Index(tier)];
  if (InFlight(inflight)) return inflight;
  auto promise = std::make_shared<std::promise<Status>>();
  inflight = promise->get_future().share();
  m.workers.Enqueue([&m, id, tier, promise, after] {
    Status written = after != nullptr ? after->Synchronize() : OkStatus();
    promise->set_value(written.ok() ? m.PrefetchOne(id, tier) : std::move(written));
  });
  return inflight;
}

std::shared_future<Status> TieredStore::CopyDownAsync(TensorId id, uint64_t offset, uint64_t bytes,
                                                      void* host_dst, Event* after) {
  Impl& m = *impl_;
  if (!m.HasTier(Tier::kDevice)) {
    return Ready(InvalidArgument(fmt::format("tensor {}: no device tier to copy from", id)));
  }
  const char* src = nullptr;
  {
    MutexLock lock(&m.mu);
    StatusOr<StoreTensor*> t = m.catalog.Find(id);
    if (!t.ok()) return Ready(t.status());
    const TierCopy& copy = (*t)->copies[Index(Tier::kDevice)];
    if (copy.pins == 0 || !copy.present) {
      return Ready(FailedPrecondition(fmt::format(
          "tensor {} ('{}') is not acquired in the device tier, so its copy there may move", id,
          (*t)->name)));
    }
    if (offset > (*t)->size || bytes > (*t)->size - offset) {
      return Ready(InvalidArgument(fmt::format("tensor {} ('{}'): bytes [{}, {}) of {}", id,
                                               (*t)->name, offset, offset + bytes, (*t)->size)));
    }
    src = copy.block.as<const char>() + offset;
  }
  auto promise = std::make_shared<std::promise<Status>>();
  std::shared_future<Status> done = promise->get_future().share();
  m.workers.Enqueue([&m, src, bytes, host_dst, promise, after] {
    Status written = after != nullptr ? after->Synchronize() : OkStatus();
    promise->set_value(written.ok() ? m.mover->CopyDown(src, host_dst, bytes) : std::move(written));
  });
  return done;
}

std::shared_future<Status> TieredStore::Prefetch(std::span<const TensorId> ids, Tier tier) {
  Impl& m = *impl_;
  auto promise = std::make_shared<std::promise<Status>>();
  std::shared_future<Status> done = promise->get_future().share();
  if (tier == Tier::kNvme || !m.HasTier(tier)) {
    promise->set_value(
        InvalidArgument(fmt::format("cannot prefetch to the {} tier", TierName(tier))));
    return done;
  }
  std::vector<TensorId> todo;
  {
    MutexLock lock(&m.mu);
    for (TensorId id : ids) {
      StoreTensor* t = m.catalog.Lookup(id);
      if (t == nullptr) {  // PrefetchMany reports it
        todo.push_back(id);
        continue;
      }
      std::shared_future<Status>& inflight = t->prefetch[Index(tier)];
      if (t->copies[Index(tier)].valid || InFlight(inflight)) continue;
      inflight = done;  // Flush waits for it
      todo.push_back(id);
    }
  }
  if (todo.empty()) {
    promise->set_value(OkStatus());
    return done;
  }
  m.workers.Enqueue([&m, todo = std::move(todo), tier, promise] {
    promise->set_value(m.PrefetchMany(todo, tier));
  });
  return done;
}

Status TieredStore::Place(std::span<const TensorId> ids, Tier tier) {
  Impl& m = *impl_;
  if (tier == Tier::kNvme || !m.HasTier(tier)) {
    return InvalidArgument(fmt::format("cannot place tensors in the {} tier", TierName(tier)));
  }
  MutexLock lock(&m.mu);
  std::vector<StoreTensor*> idle;
  for (TensorId id : ids) {
    ZINF_ASSIGN_OR_RETURN(StoreTensor * t, m.catalog.Find(id));
    if (!t->copies[Index(tier)].present && !t->busy && !t->writer) idle.push_back(t);
  }
  std::vector<TensorId> left_out;  // each gets its memory when acquired
  m.PlaceRun(idle, tier, left_out);
  return OkStatus();
}

StatusOr<void*> TieredStore::Acquire(TensorId id, Tier tier, Access access) {
  Impl& m = *impl_;
  if (tier == Tier::kNvme) {
    return InvalidArgument(
        fmt::format("tensor {}: the NVMe tier is not addressable; acquire it "
                    "in the host or device tier",
                    id));
  }
  if (!m.HasTier(tier)) {
    return InvalidArgument(fmt::format("tensor {}: this store has no {} tier", id, TierName(tier)));
  }
  MutexLock lock(&m.mu);
  ZINF_ASSIGN_OR_RETURN(StoreTensor * t, m.catalog.Find(id));
  const bool overwrite = access == Access::kOverwrite;
  Status s = m.MakeValid(*t, tier, access != Access::kRead, overwrite);
  TierCopy& c = t->copies[Index(tier)];
  if (s.ok() && c.zero && !overwrite) s = m.ClearNeverWritten(*t, tier);
  if (!s.ok())
    return std::move(s).WithContext(
        fmt::format("acquiring tensor {} in the {} tier", id, TierName(tier)));
  ++c.pins;
  t->last_use = m.catalog.Tick();
  if (access != Access::kRead) {
    t->writer = true;
    c.zero = false;
    c.valid = true;
    for (int i = 0; i < kTiers; ++i) {
      if (i != Index(tier)) t->copies[i].valid = false;
    }
  }
  return c.block.data();
}

Status TieredStore::Release(TensorId id, Tier tier) {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  ZINF_ASSIGN_OR_RETURN(StoreTensor * t, m.catalog.Find(id));
  TierCopy& c = t->copies[Index(tier)];
  if (c.pins == 0) {
    return FailedPrecondition(fmt::format("tensor {} ('{}') is not acquired in the {} tier", id,
                                          t->name, TierName(tier)));
  }
  --c.pins;
  if (t->writer && c.pins == 0) t->writer = false;
  m.cv.SignalAll();
  return OkStatus();
}

Status TieredStore::Evict(TensorId id, Tier tier) { return impl_->Evict(id, tier); }

std::shared_future<Status> TieredStore::EvictAsync(TensorId id, Tier tier) {
  return impl_->EvictManyAsync(std::span<const TensorId>(&id, 1), tier, /*keep=*/false);
}

std::shared_future<Status> TieredStore::EvictAsync(std::span<const TensorId> ids, Tier tier) {
  return impl_->EvictManyAsync(ids, tier, /*keep=*/false);
}

std::shared_future<Status> TieredStore::WriteBackAsync(std::span<const TensorId> ids, Tier tier) {
  return impl_->EvictManyAsync(ids, tier, /*keep=*/true);
}

Status TieredStore::Flush() { return impl_->Flush(); }

Status TieredStore::SetNextUse(TensorId id, int64_t next_use) {
  MutexLock lock(&impl_->mu);
  ZINF_ASSIGN_OR_RETURN(StoreTensor * t, impl_->catalog.Find(id));
  t->next_use = next_use < 0 ? -1 : next_use;
  return OkStatus();
}

StatusOr<std::vector<Tier>> TieredStore::ResidentTiers(TensorId id) {
  MutexLock lock(&impl_->mu);
  ZINF_ASSIGN_OR_RETURN(StoreTensor * t, impl_->catalog.Find(id));
  std::vector<Tier> out;
  for (int i = 0; i < kTiers; ++i) {
    if (t->copies[i].valid) out.push_back(static_cast<Tier>(i));
  }
  return out;
}

TieredStoreStats TieredStore::stats() const {
  const Impl& m = *impl_;
  TieredStoreStats s;
  s.host_to_device = m.links.h2d.stats();
  s.device_to_host = m.links.d2h.stats();
  s.host_to_nvme = m.links.h2n.stats();
  s.nvme_to_host = m.links.n2h.stats();
  auto fill = [](const MemoryPool* pool, TierStats* out) {
    if (pool == nullptr) return;
    MemoryPoolStats p = pool->stats();
    out->budget_bytes = p.budget_bytes;
    out->in_use_bytes = p.in_use_bytes;
    out->peak_bytes = p.peak_in_use_bytes;
  };
  fill(m.device_pool.get(), &s.tiers[Index(Tier::kDevice)]);
  fill(m.host_pool.get(), &s.tiers[Index(Tier::kHost)]);
  if (m.nvme != nullptr) {
    s.tiers[Index(Tier::kNvme)] = m.nvme->stats();
    s.nvme_file_bytes = m.nvme->file_bytes();
  }
  MutexLock lock(&m.mu);
  s.evictions = m.catalog.evictions();
  s.write_backs = m.catalog.write_backs();
  s.tensors = m.catalog.live();
  s.idle_scratch = m.catalog.idle_scratch();
  s.bookkeeping_entries = m.BookkeepingEntries();
  return s;
}

void TieredStore::ReadHomeAsync(TensorId id, void* buffer, std::function<void(Status)> done) {
  impl_->StreamHome(id, static_cast<char*>(buffer), /*write=*/false, std::move(done));
}

void TieredStore::WriteHomeAsync(TensorId id, const void* buffer,
                                 std::function<void(Status)> done) {
  // Only read from: the one path serves both directions.
  impl_->StreamHome(id, const_cast<char*>(static_cast<const char*>(buffer)), /*write=*/true,
                    std::move(done));
}

namespace {
// Runs an asynchronous stream and waits for its outcome.
Status WaitFor(TransferCounters& counters,
               const std::function<void(std::function<void(Status)>)>& start) {
  auto promise = std::make_shared<std::promise<Status>>();
  std::future<Status> outcome = promise->get_future();
  start([promise](Status s) { promise->set_value(std::move(s)); });
  counters.CountWait();
  return outcome.get();
}
}  // namespace

Status TieredStore::ReadHome(TensorId id, void* buffer) {
  return WaitFor(impl_->counters, [&](auto done) { ReadHomeAsync(id, buffer, std::move(done)); });
}

Status TieredStore::WriteHome(TensorId id, const void* buffer) {
  return WaitFor(impl_->counters, [&](auto done) { WriteHomeAsync(id, buffer, std::move(done)); });
}

Status TieredStore::RegisterStreamBuffer(void* data, uint64_t size_bytes) {
  return impl_->nvme != nullptr ? impl_->nvme->RegisterBuffer(data, size_bytes) : OkStatus();
}

TransferCounters& TieredStore::transfer_counters() { return impl_->counters; }

std::string TieredStore::device_name() const {
  return impl_->device != nullptr ? impl_->device->name() : std::string();
}

}  // namespace zinf
