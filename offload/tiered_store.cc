// TieredStore: see include/zinf/tiered_store.h.
//
// One mutex guards every tensor's metadata; transfers run without it, with the tensor marked
// busy so that nothing evicts, frees or overwrites the copies a transfer uses. A condition
// variable wakes threads waiting for a tensor to become idle or a staging buffer to come back.
// The pools (MemoryPool) enforce each tier's budget; a copy that does not fit evicts unpinned
// cached copies first (See Note [TieredStore eviction order]).
#include "zinf/tiered_store.h"

#include <fmt/core.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "core/log.h"
#include "core/thread_name.h"
#include "core/units.h"
#include "nvme/swap_store.h"
#include "offload/memory_pool.h"
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
// invalid for the next Acquire to read again. The others (busy, pinned, behind a device link,
// needing room made) are moved one at a time as Evict and Prefetch do, with the same errors
// but one: a copy held when the job runs is left to its holders (Note [Evicting a held copy]).
// WriteBackAsync is the same job keeping each copy once it is home: a step whose next
// forward reads the shards soon after it writes them (Note [Step in the next forward's order]
// in src/zero/optimizer_overlap.h) then costs no read, and the copies, clean, are dropped for
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

using Clock = std::chrono::steady_clock;
constexpr int kTiers = 3;
constexpr size_t kIdleScratchKept = 4096;  // Note [Scratch tensors]
constexpr size_t kFreedNamesKept = 64;
int Index(Tier tier) { return static_cast<int>(tier); }

// Busy time of one link: the union of the intervals during which a transfer was running.
class LinkMeter {
 public:
  void Begin() {
    std::lock_guard lock(mu_);
    if (active_++ == 0) since_ = Clock::now();
  }
  void End(uint64_t bytes) {
    std::lock_guard lock(mu_);
    stats_.bytes += bytes;
    if (--active_ == 0)
      stats_.busy_seconds += std::chrono::duration<double>(Clock::now() - since_).count();
  }
  LinkStats stats() const {
    std::lock_guard lock(mu_);
    LinkStats s = stats_;
    if (active_ > 0) s.busy_seconds += std::chrono::duration<double>(Clock::now() - since_).count();
    return s;
  }

 private:
  mutable std::mutex mu_;
  int active_ = 0;
  Clock::time_point since_;
  LinkStats stats_;
};

class LinkScope {
 public:
  LinkScope(LinkMeter& meter, uint64_t bytes) : meter_(meter), bytes_(bytes) { meter_.Begin(); }
  ~LinkScope() { meter_.End(bytes_); }

 private:
  LinkMeter& meter_;
  uint64_t bytes_;
};

}  // namespace

struct TieredStore::Impl {
  struct Copy {
    bool present = false;  // memory held in this tier
    bool valid = false;    // holds the current bytes
    bool zero = false;     // current bytes are all zero and the memory was never written
    int pins = 0;
    PoolBlock block;                  // device and host tiers
    std::vector<SwapExtent> extents;  // NVMe tier: pieces of at most piece_bytes
  };
  struct Tensor {
    TensorId id = 0;
    std::string name;
    uint64_t size = 0;
    Tier home = Tier::kHost;
    std::array<Copy, kTiers> copies;
    bool busy = false;     // a transfer uses the copies
    bool writer = false;   // acquired for writing
    bool scratch = false;  // Free parks it for reuse: Note [Scratch tensors]
    int64_t next_use = -1;
    uint64_t last_use = 0;
    std::array<std::shared_future<Status>, kTiers> prefetch;  // in flight, if valid()
    int pins() const { return copies[0].pins + copies[1].pins + copies[2].pins; }
  };

  TieredStoreOptions options;
  std::unique_ptr<Device> owned_device;  // opened from options.device by Create(options)
  Device* device = nullptr;              // the device tier's; owned_device or the caller's
  // The device is the host device with no modelled link: its memory is plain host memory, so
  // moves touch it directly (memcpy, NVMe I/O into it) instead of going through a stream and
  // a staging buffer. See Note [Direct host device].
  bool direct = false;
  std::unique_ptr<Stream> up_stream;    // host to device
  std::unique_ptr<Stream> down_stream;  // device to host
  std::unique_ptr<MemoryPool> device_pool;
  std::unique_ptr<MemoryPool> host_pool;
  std::unique_ptr<SwapStore> swap;
  std::unique_ptr<MemoryPool> staging_pool;

  mutable std::mutex mu;
  std::condition_variable cv;
  std::unordered_map<TensorId, std::unique_ptr<Tensor>> tensors;  // guarded by mu
  // Freed scratch tensors with their home memory, oldest first. Guarded by mu.
  std::deque<std::unique_ptr<Tensor>> idle_scratch;
  // The last kFreedNamesKept freed tensors, a ring (id 0: empty). Guarded by mu.
  std::array<std::pair<TensorId, std::string>, kFreedNamesKept> freed_names;
  size_t freed_next = 0;
  TensorId next_id = 1;
  uint64_t tick = 0;
  uint64_t evictions = 0;
  uint64_t write_backs = 0;
  std::vector<PoolBlock> staging_free;  // guarded by mu

  LinkMeter h2d, d2h, h2n, n2h;

  // Prefetch workers.
  mutable std::mutex queue_mu;
  std::condition_variable queue_cv;
  std::deque<std::function<void()>> queue;
  bool stopping = false;
  std::vector<std::thread> workers;

  ~Impl() {
    {
      std::lock_guard lock(queue_mu);
      stopping = true;
    }
    queue_cv.notify_all();
    for (auto& w : workers) w.join();
    std::unique_lock lock(mu);
    cv.wait(lock, [&] {
      return std::none_of(tensors.begin(), tensors.end(),
                          [](const auto& t) { return t.second->busy; });
    });
    for (auto& [id, t] : tensors) ReleaseMemory(*t);
    tensors.clear();
    idle_scratch.clear();
    staging_free.clear();
  }

  bool HasTier(Tier tier) const {
    switch (tier) {
      case Tier::kDevice:
        return device != nullptr;
      case Tier::kHost:
        return true;
      case Tier::kNvme:
        return swap != nullptr;
    }
    return false;
  }

  void ReleaseMemory(Tensor& t) {
    for (int i = 0; i < kTiers; ++i) DropCopy(t, static_cast<Tier>(i));
  }

  // Frees the memory of one copy; mu held.
  void DropCopy(Tensor& t, Tier tier) {
    Copy& c = t.copies[Index(tier)];
    c.block.Reset();
    for (const SwapExtent& e : c.extents) {
      Status s = swap->Free(e);
      if (!s.ok()) log::Warn("tiered store: freeing '{}' on NVMe: {}", t.name, s);
    }
    c.extents.clear();
    c.present = false;
    c.valid = false;
    c.zero = false;
  }

  StatusOr<Tensor*> Find(TensorId id) {
    auto it = tensors.find(id);
    if (it != tensors.end()) return it->second.get();
    if (id == 0 || id >= next_id) {
      return InvalidArgument(fmt::format("tiered store has no tensor with id {}", id));
    }
    for (const auto& [freed_id, name] : freed_names) {
      if (freed_id == id)
        return FailedPrecondition(fmt::format("tensor {} ('{}') was freed", id, name));
    }
    return FailedPrecondition(fmt::format("tensor {} was freed", id));
  }

  // Takes t out of the live tensors for good: its memory goes back to the pools, or, for a
  // scratch tensor, it is parked with its home memory (Note [Scratch tensors]). mu held.
  void Retire(Tensor& t) {
    std::pair<TensorId, std::string>& slot = freed_names[freed_next];
    freed_next = (freed_next + 1) % freed_names.size();
    slot.first = t.id;
    slot.second.assign(t.name);
    auto node = tensors.extract(t.id);
    std::unique_ptr<Tensor>& owned = node.mapped();
    for (int i = 0; i < kTiers; ++i) {
      if (!owned->scratch || i != Index(owned->home)) DropCopy(*owned, static_cast<Tier>(i));
    }
    if (!owned->scratch) return;
    owned->prefetch = {};
    idle_scratch.push_back(std::move(owned));
    if (idle_scratch.size() > kIdleScratchKept) {
      ReleaseMemory(*idle_scratch.front());
      idle_scratch.pop_front();
    }
  }

  // A parked scratch tensor of `size` bytes homed in `home`, made live again under a new id as
  // if just created; null when there is none. mu held.
  Tensor* Revive(std::string_view name, uint64_t size, Tier home) {
    for (auto it = idle_scratch.rbegin(); it != idle_scratch.rend(); ++it) {
      Tensor& t = **it;
      if (t.home != home || t.size != size) continue;
      std::unique_ptr<Tensor> owned = std::move(*it);
      idle_scratch.erase(std::next(it).base());
      owned->id = next_id++;
      owned->name.assign(name);
      owned->next_use = -1;
      owned->last_use = ++tick;
      Copy& c = owned->copies[Index(home)];
      c.valid = true;
      c.zero = true;
      return tensors.emplace(owned->id, std::move(owned)).first->second.get();
    }
    return nullptr;
  }

  // Gives the memory of the oldest parked scratch tensor in `tier` back to its pool; false
  // when there is none. mu held.
  bool DropIdleScratch(Tier tier) {
    for (auto it = idle_scratch.begin(); it != idle_scratch.end(); ++it) {
      if ((*it)->home != tier) continue;
      ReleaseMemory(**it);
      idle_scratch.erase(it);
      return true;
    }
    return false;
  }

  // TieredStore::Create and CreateScratch past the checks: a new tensor homed in `home`.
  StatusOr<TensorId> CreateLocked(std::unique_lock<std::mutex>& lock, std::string_view name,
                                  uint64_t size, Tier home, bool scratch) {
    auto owned = std::make_unique<Tensor>();
    owned->id = next_id++;
    owned->name = name;
    owned->size = size;
    owned->home = home;
    owned->scratch = scratch;
    Tensor& t = *owned;
    tensors.emplace(t.id, std::move(owned));
    t.busy = true;  // not visible as a victim or source while its home is set up
    Status s;
    while (s.ok() && !t.copies[Index(home)].present) s = TryAllocate(lock, t, home);
    t.busy = false;
    cv.notify_all();
    if (!s.ok()) {
      DropCopy(t, home);
      tensors.erase(t.id);
      return s;
    }
    Copy& c = t.copies[Index(home)];
    c.valid = true;
    c.zero = true;
    t.last_use = ++tick;
    return t.id;
  }

  // Entries of every container that could grow with use (TieredStoreStats).
  uint64_t BookkeepingEntries() const {
    // The ring of freed names counts whole: its slots are there from the start.
    uint64_t n = tensors.size() + idle_scratch.size() + staging_free.size() + freed_names.size();
    {
      std::lock_guard queue_lock(queue_mu);
      n += queue.size();
    }
    for (const MemoryPool* pool : {device_pool.get(), host_pool.get(), staging_pool.get()}) {
      if (pool != nullptr) n += pool->stats().free_ranges;
    }
    if (swap != nullptr) n += swap->extent_count() + swap->free_ranges();
    return n;
  }

  // One attempt at the memory of t's copy in `tier`: allocates it, or evicts one cached copy in
  // that tier to make room and returns OK without allocating (the caller looks at the tensor
  // again and retries: the lock may have been released for a write-back, and t changed).
  // mu held on entry and exit.
  Status TryAllocate(std::unique_lock<std::mutex>& lock, Tensor& t, Tier tier) {
    {
      if (tier == Tier::kNvme) {
        std::vector<SwapExtent> extents;
        for (uint64_t off = 0; off < t.size; off += options.piece_bytes) {
          StatusOr<SwapExtent> e =
              swap->Allocate(std::min(options.piece_bytes, t.size - off),
                             fmt::format("{} piece {}", t.name, off / options.piece_bytes));
          if (!e.ok()) {
            for (const SwapExtent& x : extents) swap->Free(x).IgnoreError();
            return std::move(e).status();
          }
          extents.push_back(*e);
        }
        t.copies[Index(tier)].extents = std::move(extents);
        t.copies[Index(tier)].present = true;
        return OkStatus();
      }
      MemoryPool& pool = tier == Tier::kDevice ? *device_pool : *host_pool;
      StatusOr<PoolBlock> block = pool.Allocate(t.size);
      if (block.ok()) {
        t.copies[Index(tier)].block = std::move(*block);
        t.copies[Index(tier)].present = true;
        return OkStatus();
      }
      if (block.status().code() != StatusCode::kResourceExhausted) return block.status();
      if (DropIdleScratch(tier)) return OkStatus();  // look again with its memory back
      Tensor* victim = PickVictim(tier, &t);
      if (victim == nullptr && MovingIn(tier, &t)) {
        cv.wait(lock);  // a transfer in flight will leave a copy to evict, or free one
        return OkStatus();
      }
      if (victim == nullptr) {
        uint64_t pinned = 0;
        for (const auto& [id, x] : tensors) {
          if (x->copies[Index(tier)].present && (x->pins() > 0 || x->busy || x->home == tier)) {
            pinned += x->size;
          }
        }
        return ResourceExhausted(fmt::format(
            "{} tier cannot hold tensor '{}' ({}): {}; nothing to evict ({} held by homes, "
            "pinned or moving copies)",
            TierName(tier), t.name, FormatBytes(t.size), block.status().message(),
            FormatBytes(pinned)));
      }
      return EvictLocked(lock, *victim, tier);
    }
  }

  // Whether a tensor other than `requester` has a copy in `tier` that a transfer is using
  // (its end makes that copy evictable or frees it). mu held.
  bool MovingIn(Tier tier, const Tensor* requester) const {
    for (const auto& [id, x] : tensors) {
      if (x.get() != requester && x->busy && x->home != tier && x->copies[Index(tier)].present)
        return true;
    }
    return false;
  }

  // See Note [TieredStore eviction order]. mu held.
  Tensor* PickVictim(Tier tier, const Tensor* requester) {
    Tensor* best = nullptr;
    for (auto& [id, p] : tensors) {
      Tensor* x = p.get();
      const Copy& c = x->copies[Index(tier)];
      if (x == requester || !c.present || x->home == tier || c.pins > 0 || x->busy || x->writer)
        continue;
      if (best == nullptr) {
        best = x;
        continue;
      }
      const bool x_hint = x->next_use >= 0, b_hint = best->next_use >= 0;
      if (x_hint != b_hint) {
        if (!x_hint) best = x;
      } else if (!x_hint) {
        if (x->last_use < best->last_use) best = x;
      } else if (x->next_use > best->next_use) {
        best = x;
      }
    }
    return best;
  }

  // Drops t's cached copy in `tier`, writing it back home when the home is stale. mu held.
  // `keep`: the copy stays, current in both tiers (TieredStore::WriteBackAsync).
  Status EvictLocked(std::unique_lock<std::mutex>& lock, Tensor& t, Tier tier, bool keep = false) {
    Copy& c = t.copies[Index(tier)];
    Copy& home = t.copies[Index(t.home)];
    if (c.valid && !home.valid) {
      t.busy = true;
      lock.unlock();
      Status s = Transfer(t, tier, t.home);
      lock.lock();
      t.busy = false;
      cv.notify_all();
      if (!s.ok()) {
        return std::move(s).WithContext(
            fmt::format("writing tensor '{}' back to its home ({})", t.name, TierName(t.home)));
      }
      home.valid = true;
      home.zero = false;
      ++write_backs;
    }
    if (keep) return OkStatus();
    DropCopy(t, tier);
    ++evictions;
    return OkStatus();
  }

  // Makes a current copy of t resident in `tier`. mu held on entry and exit.
  // `overwrite`: the caller writes every byte, so memory is enough; no current bytes are copied.
  Status MakeValid(std::unique_lock<std::mutex>& lock, Tensor& t, Tier tier, bool for_write,
                   bool overwrite = false) {
    const TensorId id = t.id;
    while (true) {
      if (!tensors.contains(id)) return Find(id).status();
      Copy& c = t.copies[Index(tier)];
      if (t.busy || t.writer || (for_write && t.pins() > 0)) {
        cv.wait(lock);
        continue;
      }
      if (c.valid) return OkStatus();
      if (!c.present) {
        ZINF_RETURN_IF_ERROR(TryAllocate(lock, t, tier));
        continue;  // the lock may have been released: look again
      }
      if (overwrite) return OkStatus();
      // The source: a current copy, the host one when there is a choice (every link touches it).
      Tier src = Tier::kHost;
      if (!t.copies[Index(Tier::kHost)].valid) {
        src = t.copies[Index(Tier::kDevice)].valid ? Tier::kDevice : Tier::kNvme;
      }
      if (!t.copies[Index(src)].valid) {
        return Internal(fmt::format("tensor '{}' has no current copy", t.name));
      }
      t.busy = true;
      lock.unlock();
      Status s = Transfer(t, src, tier);
      lock.lock();
      t.busy = false;
      cv.notify_all();
      if (!s.ok()) {
        return std::move(s).WithContext(
            fmt::format("moving tensor '{}' from {} to {}", t.name, TierName(src), TierName(tier)));
      }
      c.valid = true;
      c.zero = false;
      return OkStatus();
    }
  }

  // TieredStore::Evict. `leave_held`: a copy acquired now is left to its holders instead of
  // refused (Note [Evicting a held copy]).
  Status Evict(TensorId id, Tier tier, bool keep = false, bool leave_held = false) {
    Impl& m = *this;
    std::unique_lock lock(m.mu);
    while (true) {
      ZINF_ASSIGN_OR_RETURN(Impl::Tensor * t, m.Find(id));
      if (tier == t->home) {
        return InvalidArgument(fmt::format("tensor {} ('{}'): cannot evict from its home tier ({})",
                                           id, t->name, TierName(tier)));
      }
      if (t->copies[Index(tier)].pins > 0) {
        if (!leave_held) {
          return FailedPrecondition(fmt::format("tensor {} ('{}') is acquired in the {} tier", id,
                                                t->name, TierName(tier)));
        }
        if (t->writer) return OkStatus();  // its new bytes go home when they are done
        keep = true;                       // read: safe to write home, not to drop
      }
      if (t->busy || t->writer) {
        m.cv.wait(lock);
        continue;
      }
      if (!t->copies[Index(tier)].present) return OkStatus();
      return m.EvictLocked(lock, *t, tier, keep);
    }
  }

  // Whether moves between `tier` and NVMe go straight to and from its memory.
  bool Addressable(Tier tier) const {
    return tier == Tier::kHost || (direct && tier == Tier::kDevice);
  }

  // The I/O of tensors claimed (busy) for a batch, mu not held: `submit(t, waiter)` starts
  // every tensor's requests before any is waited for; `finish(t, status)` then records each
  // outcome as it completes, with mu held, and the tensor is idle again. See Note [Batched
  // write-backs].
  template <typename Submit, typename Finish>
  void RunBatch(const std::vector<Tensor*>& batch, LinkMeter& link, Submit submit, Finish finish) {
    if (batch.empty()) return;
    uint64_t bytes = 0;
    for (const Tensor* t : batch) bytes += t->size;
    LinkScope scope(link, bytes);
    std::deque<IoWaiter> waiters;  // one per tensor: each outcome is its own
    for (Tensor* t : batch) submit(*t, waiters.emplace_back());
    for (size_t i = 0; i < batch.size(); ++i) {
      Status s = waiters[i].Wait();
      std::lock_guard lock(mu);
      batch[i]->busy = false;
      finish(*batch[i], std::move(s));
      cv.notify_all();
    }
  }

  // The tensors of `ids`, each handed to `visit(t)` with mu held; a missing one's error goes
  // to `error` (the first is kept).
  template <typename Visit>
  void ForEachTensor(const std::vector<TensorId>& ids, Status& error, Visit visit) {
    for (TensorId id : ids) {
      StatusOr<Tensor*> found = Find(id);
      if (found.ok()) {
        visit(**found);
      } else if (error.ok()) {
        error = found.status();
      }
    }
  }

  // TieredStore::EvictAsync (or with `keep`, WriteBackAsync) of several tensors, run on one
  // transfer thread.
  Status EvictMany(const std::vector<TensorId>& ids, Tier tier, bool keep) {
    Status first;
    std::vector<Tensor*> batch;
    std::vector<TensorId> alone;  // evicted one at a time, as Evict does
    std::unique_lock lock(mu);
    ForEachTensor(ids, first, [&](Tensor& t) {
      const Copy& c = t.copies[Index(tier)];
      const bool idle = tier != t.home && !t.busy && !t.writer && c.pins == 0;
      if (idle && !c.present) return;
      if (idle && !(c.valid && !t.copies[Index(t.home)].valid)) {  // nothing to write back
        if (keep) return;
        DropCopy(t, tier);
        ++evictions;
      } else if (idle && t.home == Tier::kNvme && Addressable(tier) && !c.zero) {
        t.busy = true;
        batch.push_back(&t);
      } else {
        alone.push_back(t.id);
      }
    });
    lock.unlock();
    RunBatch(
        batch, h2n,
        [&](Tensor& t, IoWaiter& waiter) {
          SubmitPiecesFrom(t.copies[Index(Tier::kNvme)], t.copies[Index(tier)].block.as<char>(),
                           waiter);
        },
        [&](Tensor& t, Status s) {
          if (!s.ok()) {  // the copy stays: nothing is lost
            if (first.ok()) {
              first = std::move(s).WithContext(fmt::format(
                  "writing tensor '{}' back to its home ({})", t.name, TierName(t.home)));
            }
            return;
          }
          t.copies[Index(t.home)].valid = true;
          t.copies[Index(t.home)].zero = false;
          ++write_backs;
          if (keep) return;
          DropCopy(t, tier);
          ++evictions;
        });
    for (TensorId id : alone) {
      Status s = Evict(id, tier, keep, /*leave_held=*/true);
      if (first.ok()) first = std::move(s);
    }
    return first;
  }

  // EvictMany as one job of a transfer thread; the future holds its outcome.
  std::shared_future<Status> EvictManyAsync(std::span<const TensorId> ids, Tier tier, bool keep) {
    auto promise = std::make_shared<std::promise<Status>>();
    std::shared_future<Status> done = promise->get_future().share();
    Enqueue([this, ids = std::vector<TensorId>(ids.begin(), ids.end()), tier, keep, promise] {
      promise->set_value(EvictMany(ids, tier, keep));
    });
    return done;
  }

  // TieredStore::Prefetch of several tensors, run on one transfer thread: those whose current
  // copy is only on NVMe and whose memory in `tier` is free now are read together; the others
  // are made valid one at a time, as Prefetch does (Note [Batched write-backs]).
  Status PrefetchMany(const std::vector<TensorId>& ids, Tier tier) {
    Status first;
    std::vector<Tensor*> batch;
    std::vector<TensorId> alone;
    std::unique_lock lock(mu);
    ForEachTensor(ids, first, [&](Tensor& t) {
      Copy& c = t.copies[Index(tier)];
      const Copy& home = t.copies[Index(Tier::kNvme)];
      if (c.valid) return;
      if (t.busy || t.writer || !Addressable(tier) || t.home != Tier::kNvme || !home.valid ||
          home.zero || t.copies[Index(Tier::kHost)].valid || t.copies[Index(Tier::kDevice)].valid) {
        alone.push_back(t.id);
        return;
      }
      if (!c.present) {  // room without evicting: making room is left to the one-at-a-time path
        MemoryPool& pool = tier == Tier::kDevice ? *device_pool : *host_pool;
        StatusOr<PoolBlock> block = pool.Allocate(t.size);
        if (!block.ok()) {
          alone.push_back(t.id);
          return;
        }
        c.block = std::move(*block);
        c.present = true;
      }
      t.busy = true;
      batch.push_back(&t);
    });
    lock.unlock();
    RunBatch(
        batch, n2h,
        [&](Tensor& t, IoWaiter& waiter) {
          SubmitPiecesTo(t.copies[Index(Tier::kNvme)], t.copies[Index(tier)].block.as<char>(),
                         waiter);
        },
        [&](Tensor& t, Status s) {
          if (!s.ok()) {  // the memory stays, invalid; the next Acquire reads again
            if (first.ok()) {
              first = std::move(s).WithContext(
                  fmt::format("moving tensor '{}' from nvme to {}", t.name, TierName(tier)));
            }
            return;
          }
          t.copies[Index(tier)].valid = true;
          t.last_use = ++tick;
        });
    for (TensorId id : alone) {
      Status s = PrefetchOne(id, tier);
      if (first.ok()) first = std::move(s);
    }
    return first;
  }

  // TieredStore::Prefetch's work for one tensor, on a transfer thread.
  Status PrefetchOne(TensorId id, Tier tier) {
    std::unique_lock lock(mu);
    StatusOr<Tensor*> t = Find(id);
    Status s = t.ok() ? MakeValid(lock, **t, tier, false) : t.status();
    if (s.ok()) (*t)->last_use = ++tick;
    return s;
  }

  // A home copy that was never written reads as zeros but its memory was never cleared (Create
  // leaves that to the first Acquire, so that tensors the caller overwrites cost nothing):
  // clears it. mu held on entry and exit.
  Status ClearNeverWritten(std::unique_lock<std::mutex>& lock, Tensor& t, Tier tier) {
    Copy& c = t.copies[Index(tier)];
    t.busy = true;
    lock.unlock();
    Status s;
    if (tier == Tier::kDevice && !direct) {
      s = up_stream->Memset(c.block.data(), 0, t.size);
      if (s.ok()) s = up_stream->Synchronize();
    } else {
      std::memset(c.block.data(), 0, t.size);
    }
    lock.lock();
    t.busy = false;
    cv.notify_all();
    if (s.ok()) c.zero = false;
    return s;
  }

  // Copies t's bytes from copy `src` to copy `dst`; t is busy, mu not held.
  Status Transfer(Tensor& t, Tier src, Tier dst) {
    Copy& from = t.copies[Index(src)];
    Copy& to = t.copies[Index(dst)];
    if (from.zero) {
      if (dst == Tier::kHost || (direct && dst == Tier::kDevice)) {
        std::memset(to.block.data(), 0, t.size);
        return OkStatus();
      }
      if (dst == Tier::kDevice) {
        ZINF_RETURN_IF_ERROR(up_stream->Memset(to.block.data(), 0, t.size));
        return up_stream->Synchronize();
      }
      // NVMe from zeros: through a zeroed staging buffer.
      return WritePieces(t, to, nullptr);
    }
    if (direct && src != Tier::kNvme && dst != Tier::kNvme) {
      LinkScope scope(src == Tier::kHost ? h2d : d2h, t.size);
      std::memcpy(to.block.data(), from.block.data(), t.size);
      return OkStatus();
    }
    if (direct && src == Tier::kNvme) {  // NVMe straight into the device's (host) memory
      LinkScope scope(n2h, t.size);
      return ReadPieces(from, to.block.as<char>());
    }
    if (direct && dst == Tier::kNvme) {
      LinkScope scope(h2n, t.size);
      return WritePiecesFrom(to, from.block.as<const char>());
    }
    if (src == Tier::kHost && dst == Tier::kDevice) {
      LinkScope scope(h2d, t.size);
      return DeviceCopy(*up_stream, to.block.data(), from.block.data(), t.size,
                        CopyKind::kHostToDevice);
    }
    if (src == Tier::kDevice && dst == Tier::kHost) {
      LinkScope scope(d2h, t.size);
      return DeviceCopy(*down_stream, to.block.data(), from.block.data(), t.size,
                        CopyKind::kDeviceToHost);
    }
    if (src == Tier::kNvme && dst == Tier::kHost) {
      LinkScope scope(n2h, t.size);
      return ReadPieces(from, to.block.as<char>());
    }
    if (src == Tier::kHost && dst == Tier::kNvme) {
      LinkScope scope(h2n, t.size);
      return WritePiecesFrom(to, from.block.as<const char>());
    }
    if (src == Tier::kNvme && dst == Tier::kDevice) {
      ZINF_ASSIGN_OR_RETURN(PoolBlock staging, TakeStaging());
      Status s;
      for (size_t k = 0; k < from.extents.size() && s.ok(); ++k) {
        const uint64_t n = from.extents[k].size_bytes;
        {
          LinkScope scope(n2h, n);
          s = swap->Read(from.extents[k], staging.data());
        }
        if (s.ok()) {
          LinkScope scope(h2d, n);
          s = DeviceCopy(*up_stream, to.block.as<char>() + k * options.piece_bytes, staging.data(),
                         n, CopyKind::kHostToDevice);
        }
      }
      GiveStaging(std::move(staging));
      return s;
    }
    if (src == Tier::kDevice && dst == Tier::kNvme) {
      return WritePieces(t, to, from.block.as<char>());
    }
    return Internal(fmt::format("no transfer from {} to {}", TierName(src), TierName(dst)));
  }

  // TieredStore::ReadHomeAsync and WriteHomeAsync: every NVMe piece of the tensor between its
  // home and `buffer` in flight together, the tensor busy until the last completes.
  void StreamHome(TensorId id, char* buffer, bool write, std::function<void(Status)> done) {
    struct Pending {
      std::atomic<size_t> left{0};
      std::mutex mu;
      Status first;
      std::function<void(Status)> done;
    };
    auto pending = std::make_shared<Pending>();
    pending->done = std::move(done);
    Tensor* t = nullptr;
    std::vector<SwapExtent> extents;
    std::string name;
    uint64_t size = 0;
    {
      std::unique_lock lock(mu);
      while (true) {
        StatusOr<Tensor*> found = Find(id);
        if (!found.ok()) return pending->done(std::move(found).status());
        t = *found;
        if (!t->busy) break;
        cv.wait(lock);
      }
      const std::string what =
          fmt::format("{} tensor {} ('{}') {} NVMe", write ? "writing" : "reading", id, t->name,
                      write ? "to" : "from");
      if (t->home != Tier::kNvme) {
        return pending->done(InvalidArgument(
            fmt::format("{}: its home is the {} tier, not NVMe", what, TierName(t->home))));
      }
      if (reinterpret_cast<uintptr_t>(buffer) % 4096 != 0) {
        return pending->done(InvalidArgument(what + ": the buffer is not 4096-aligned"));
      }
      if (t->pins() > 0 || t->copies[Index(Tier::kDevice)].present ||
          t->copies[Index(Tier::kHost)].present) {
        return pending->done(FailedPrecondition(
            what + ": it is acquired or cached, so its home is not its only copy"));
      }
      size = t->size;
      if (!write && t->copies[Index(Tier::kNvme)].zero) {  // never written: zeros
        lock.unlock();
        std::memset(buffer, 0, AlignUp(size, 4096));
        return pending->done(OkStatus());
      }
      t->busy = true;
      extents = t->copies[Index(Tier::kNvme)].extents;
      name = what;
    }
    LinkMeter& meter = write ? h2n : n2h;
    meter.Begin();
    pending->left = extents.size();
    auto piece_done = [this, t, write, size, &meter, pending, name](Status s) {
      if (!s.ok()) {
        std::lock_guard lock(pending->mu);
        if (pending->first.ok()) pending->first = std::move(s);
      }
      if (--pending->left != 0) return;
      meter.End(size);
      Status result;
      {
        std::lock_guard lock(pending->mu);
        result = pending->first;
      }
      {
        std::lock_guard lock(mu);
        t->busy = false;
        if (write && result.ok()) {
          t->copies[Index(Tier::kNvme)].valid = true;
          t->copies[Index(Tier::kNvme)].zero = false;
        }
        cv.notify_all();
      }
      // Nothing of the store is touched past this point: its destructor may run now.
      pending->done(result.ok() ? result : std::move(result).WithContext(name));
    };
    for (size_t k = 0; k < extents.size(); ++k) {
      char* at = buffer + k * options.piece_bytes;
      if (write) {
        swap->WriteAsync(extents[k], at, piece_done);
      } else {
        swap->ReadAsync(extents[k], at, piece_done);
      }
    }
  }

  // All of `from`'s NVMe pieces into host-addressable memory at `out`, in flight together.
  Status ReadPieces(const Copy& from, char* out) {
    IoWaiter waiter;
    SubmitPiecesTo(from, out, waiter);
    return waiter.Wait();
  }
  // Starts those reads; `waiter` counts them.
  void SubmitPiecesTo(const Copy& from, char* out, IoWaiter& waiter) {
    for (size_t k = 0; k < from.extents.size(); ++k) {
      waiter.Add();
      swap->ReadAsync(from.extents[k], out + k * options.piece_bytes, waiter.Callback());
    }
  }
  // Host-addressable memory at `in` to all of `to`'s NVMe pieces, in flight together.
  Status WritePiecesFrom(const Copy& to, const char* in) {
    IoWaiter waiter;
    SubmitPiecesFrom(to, in, waiter);
    return waiter.Wait();
  }
  // Starts those writes; `waiter` counts them.
  void SubmitPiecesFrom(const Copy& to, const char* in, IoWaiter& waiter) {
    for (size_t k = 0; k < to.extents.size(); ++k) {
      waiter.Add();
      swap->WriteAsync(to.extents[k], in + k * options.piece_bytes, waiter.Callback());
    }
  }

  // Writes device memory `device_src` (or zeros when null) to the NVMe pieces of `to`, one
  // piece at a time through a staging buffer.
  Status WritePieces(Tensor& t, Copy& to, const char* device_src) {
    ZINF_ASSIGN_OR_RETURN(PoolBlock staging, TakeStaging());
    if (device_src == nullptr) std::memset(staging.data(), 0, staging.size_bytes());
    Status s;
    for (size_t k = 0; k < to.extents.size() && s.ok(); ++k) {
      const uint64_t n = to.extents[k].size_bytes;
      if (device_src != nullptr) {
        LinkScope scope(d2h, n);
        s = DeviceCopy(*down_stream, staging.data(), device_src + k * options.piece_bytes, n,
                       CopyKind::kDeviceToHost);
      }
      if (s.ok()) {
        LinkScope scope(h2n, n);
        s = swap->Write(to.extents[k], staging.data());
      }
    }
    GiveStaging(std::move(staging));
    (void)t;
    return s;
  }

  Status DeviceCopy(Stream& stream, void* dst, const void* src, uint64_t n, CopyKind kind) {
    ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Event> done, device->CreateEvent());
    ZINF_RETURN_IF_ERROR(stream.Copy(dst, src, n, kind));
    ZINF_RETURN_IF_ERROR(stream.Record(*done));
    return done->Synchronize();
  }

  StatusOr<PoolBlock> TakeStaging() {
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return !staging_free.empty(); });
    PoolBlock b = std::move(staging_free.back());
    staging_free.pop_back();
    return b;
  }
  void GiveStaging(PoolBlock b) {
    std::lock_guard lock(mu);
    staging_free.push_back(std::move(b));
    cv.notify_all();
  }

  void Enqueue(std::function<void()> job) {
    {
      std::lock_guard lock(queue_mu);
      queue.push_back(std::move(job));
    }
    queue_cv.notify_one();
  }
  void WorkerLoop() {
    while (true) {
      std::function<void()> job;
      {
        std::unique_lock lock(queue_mu);
        queue_cv.wait(lock, [&] { return stopping || !queue.empty(); });
        if (queue.empty()) return;  // stopping, and every queued job has run
        job = std::move(queue.front());
        queue.pop_front();
      }
      job();
    }
  }
};

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
  SwapStoreOptions swap;
  swap.paths = options.nvme_paths;
  swap.capacity_bytes = options.nvme_capacity_bytes;
  swap.checksum = options.nvme_checksum;
  return internal::TieredStoreAccess::Create(options, swap, device);
}

StatusOr<std::unique_ptr<TieredStore>> internal::TieredStoreAccess::Create(
    const TieredStoreOptions& options, const SwapStoreOptions& swap, Device* device) {
  // The options are checked as for the device given: a device tier needs a budget, whatever
  // options.device names.
  TieredStoreOptions checked = options;
  checked.device = device != nullptr ? "host" : "";
  ZINF_RETURN_IF_ERROR(checked.Validate());
  using Impl = TieredStore::Impl;
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->device = device;
  impl->direct = device != nullptr && device->host_addressable();
  if (impl->device != nullptr) {
    DevicePoolOptions dp;
    dp.name = impl->device->name() + " tier";
    dp.budget_bytes = options.device_budget_bytes;
    if (impl->direct) dp.alignment = 4096;  // NVMe reads land in it (O_DIRECT)
    ZINF_ASSIGN_OR_RETURN(impl->device_pool, MemoryPool::CreateOnDevice(*impl->device, dp));
    ZINF_ASSIGN_OR_RETURN(impl->up_stream, impl->device->CreateStream());
    ZINF_ASSIGN_OR_RETURN(impl->down_stream, impl->device->CreateStream());
  }
  PinnedPoolOptions hp;
  hp.name = "host tier";
  hp.budget_bytes = options.host_budget_bytes;
  hp.arena_bytes = std::min<uint64_t>(options.host_budget_bytes, 1ull << 30);
  hp.pinned = options.pin_host;
  hp.numa_node = options.numa_node;
  hp.device =
      options.pin_host && impl->device != nullptr && impl->device->kind() == DeviceKind::kCuda
          ? impl->device
          : nullptr;
  if (hp.device != nullptr) hp.numa_node = -1;
  ZINF_ASSIGN_OR_RETURN(impl->host_pool, MemoryPool::CreatePinned(hp));
  if (!swap.paths.empty()) {
    const SwapStoreOptions& so = swap;
    std::unique_ptr<IoEngine> engine;
    if (internal::EngineFactory()) {
      ZINF_ASSIGN_OR_RETURN(engine, internal::EngineFactory()(so.aio));
    }
    ZINF_ASSIGN_OR_RETURN(impl->swap, SwapStore::Open(so, std::move(engine)));
  }
  if (impl->swap != nullptr) {
    PinnedPoolOptions sp;
    sp.name = "tiered store staging";
    sp.budget_bytes = options.piece_bytes * options.staging_buffers;
    sp.preallocate = true;
    sp.pinned = options.pin_host;
    ZINF_ASSIGN_OR_RETURN(impl->staging_pool, MemoryPool::CreatePinned(sp));
    for (int i = 0; i < options.staging_buffers; ++i) {
      ZINF_ASSIGN_OR_RETURN(PoolBlock b, impl->staging_pool->Allocate(options.piece_bytes));
      impl->staging_free.push_back(std::move(b));
    }
  }
  Impl* raw = impl.get();
  for (int i = 0; i < options.transfer_threads; ++i) {
    impl->workers.emplace_back([raw] {
      NameThisThread("zinf-prefetch");
      raw->WorkerLoop();
    });
  }
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
  std::unique_lock lock(m.mu);
  return m.CreateLocked(lock, name, size_bytes, home, /*scratch=*/false);
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
  std::unique_lock lock(m.mu);
  if (Impl::Tensor* t = m.Revive(name, size_bytes, home)) return t->id;
  return m.CreateLocked(lock, name, size_bytes, home, /*scratch=*/true);
}

void TieredStore::ReleaseIdleScratch() {
  Impl& m = *impl_;
  std::unique_lock lock(m.mu);
  for (const auto& t : m.idle_scratch) m.ReleaseMemory(*t);
  m.idle_scratch.clear();
}

Status TieredStore::Free(TensorId id) {
  Impl& m = *impl_;
  std::unique_lock lock(m.mu);
  while (true) {
    ZINF_ASSIGN_OR_RETURN(Impl::Tensor * t, m.Find(id));
    if (t->pins() > 0) {
      return FailedPrecondition(
          fmt::format("tensor {} ('{}') is acquired and cannot be freed", id, t->name));
    }
    if (t->busy) {
      m.cv.wait(lock);
      continue;
    }
    m.Retire(*t);
    m.cv.notify_all();
    return OkStatus();
  }
}

std::shared_future<Status> TieredStore::Prefetch(TensorId id, Tier tier, Event* after) {
  Impl& m = *impl_;
  auto ready = [](Status s) {
    std::promise<Status> p;
    p.set_value(std::move(s));
    return p.get_future().share();
  };
  if (tier == Tier::kNvme || !m.HasTier(tier)) {
    return ready(InvalidArgument(
        fmt::format("cannot prefetch tensor {} to the {} tier", id, TierName(tier))));
  }
  std::lock_guard lock(m.mu);
  StatusOr<Impl::Tensor*> t = m.Find(id);
  if (!t.ok()) return ready(t.status());
  Impl::Tensor& tensor = **t;
  if (tensor.copies[Index(tier)].valid) return ready(OkStatus());
  std::shared_future<Status>& inflight = tensor.prefetch[Index(tier)];
  if (inflight.valid() && inflight.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    return inflight;
  }
  auto promise = std::make_shared<std::promise<Status>>();
  inflight = promise->get_future().share();
  m.Enqueue([&m, id, tier, promise, after] {
    Status written = after != nullptr ? after->Synchronize() : OkStatus();
    promise->set_value(written.ok() ? m.PrefetchOne(id, tier) : std::move(written));
  });
  return inflight;
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
    std::lock_guard lock(m.mu);
    for (TensorId id : ids) {
      auto it = m.tensors.find(id);
      if (it == m.tensors.end()) {  // PrefetchMany reports it
        todo.push_back(id);
        continue;
      }
      Impl::Tensor& t = *it->second;
      std::shared_future<Status>& inflight = t.prefetch[Index(tier)];
      if (t.copies[Index(tier)].valid ||
          (inflight.valid() &&
           inflight.wait_for(std::chrono::seconds(0)) != std::future_status::ready)) {
        continue;
      }
      inflight = done;  // Flush waits for it
      todo.push_back(id);
    }
  }
  if (todo.empty()) {
    promise->set_value(OkStatus());
    return done;
  }
  m.Enqueue([&m, todo = std::move(todo), tier, promise] {
    promise->set_value(m.PrefetchMany(todo, tier));
  });
  return done;
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
  std::unique_lock lock(m.mu);
  ZINF_ASSIGN_OR_RETURN(Impl::Tensor * t, m.Find(id));
  const bool overwrite = access == Access::kOverwrite;
  Status s = m.MakeValid(lock, *t, tier, access != Access::kRead, overwrite);
  Impl::Copy& c = t->copies[Index(tier)];
  if (s.ok() && c.zero && !overwrite) s = m.ClearNeverWritten(lock, *t, tier);
  if (!s.ok())
    return std::move(s).WithContext(
        fmt::format("acquiring tensor {} in the {} tier", id, TierName(tier)));
  ++c.pins;
  t->last_use = ++m.tick;
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
  std::lock_guard lock(m.mu);
  ZINF_ASSIGN_OR_RETURN(Impl::Tensor * t, m.Find(id));
  Impl::Copy& c = t->copies[Index(tier)];
  if (c.pins == 0) {
    return FailedPrecondition(fmt::format("tensor {} ('{}') is not acquired in the {} tier", id,
                                          t->name, TierName(tier)));
  }
  --c.pins;
  if (t->writer && c.pins == 0) t->writer = false;
  m.cv.notify_all();
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

Status TieredStore::Flush() {
  Impl& m = *impl_;
  std::unique_lock lock(m.mu);
  // Prefetches in flight first.
  std::vector<std::shared_future<Status>> inflight;
  for (auto& [id, t] : m.tensors) {
    for (auto& f : t->prefetch) {
      if (f.valid()) inflight.push_back(f);
    }
  }
  lock.unlock();
  for (auto& f : inflight) f.wait();
  lock.lock();
  std::vector<TensorId> ids;
  for (auto& [id, t] : m.tensors) ids.push_back(id);
  Status first;
  for (TensorId id : ids) {
    while (true) {
      auto it = m.tensors.find(id);
      if (it == m.tensors.end()) break;
      Impl::Tensor& t = *it->second;
      if (t.busy || t.writer) {
        m.cv.wait(lock);
        continue;
      }
      Impl::Copy& home = t.copies[Index(t.home)];
      if (home.valid) break;
      Tier src = t.copies[Index(Tier::kHost)].valid ? Tier::kHost : Tier::kDevice;
      t.busy = true;
      lock.unlock();
      Status s = m.Transfer(t, src, t.home);
      lock.lock();
      t.busy = false;
      m.cv.notify_all();
      if (s.ok()) {
        home.valid = true;
        home.zero = false;
        ++m.write_backs;
      } else if (first.ok()) {
        first = std::move(s).WithContext(fmt::format("flushing tensor '{}'", t.name));
      }
      break;
    }
  }
  return first;
}

Status TieredStore::SetNextUse(TensorId id, int64_t next_use) {
  std::lock_guard lock(impl_->mu);
  ZINF_ASSIGN_OR_RETURN(Impl::Tensor * t, impl_->Find(id));
  t->next_use = next_use < 0 ? -1 : next_use;
  return OkStatus();
}

StatusOr<std::vector<Tier>> TieredStore::ResidentTiers(TensorId id) {
  std::lock_guard lock(impl_->mu);
  ZINF_ASSIGN_OR_RETURN(Impl::Tensor * t, impl_->Find(id));
  std::vector<Tier> out;
  for (int i = 0; i < kTiers; ++i) {
    if (t->copies[i].valid) out.push_back(static_cast<Tier>(i));
  }
  return out;
}

TieredStoreStats TieredStore::stats() const {
  const Impl& m = *impl_;
  TieredStoreStats s;
  s.host_to_device = m.h2d.stats();
  s.device_to_host = m.d2h.stats();
  s.host_to_nvme = m.h2n.stats();
  s.nvme_to_host = m.n2h.stats();
  auto fill = [](const MemoryPool* pool, TierStats* out) {
    if (pool == nullptr) return;
    MemoryPoolStats p = pool->stats();
    out->budget_bytes = p.budget_bytes;
    out->in_use_bytes = p.in_use_bytes;
    out->peak_bytes = p.peak_in_use_bytes;
  };
  fill(m.device_pool.get(), &s.tiers[0]);
  fill(m.host_pool.get(), &s.tiers[1]);
  if (m.swap != nullptr) {
    s.tiers[2].budget_bytes = m.swap->capacity_bytes();
    s.tiers[2].in_use_bytes = m.swap->capacity_bytes() - m.swap->free_bytes();
    s.tiers[2].peak_bytes = s.tiers[2].in_use_bytes;
    s.nvme_file_bytes = m.swap->file_bytes() * m.swap->file_paths().size();
  }
  std::lock_guard lock(m.mu);
  s.evictions = m.evictions;
  s.write_backs = m.write_backs;
  s.tensors = m.tensors.size();
  s.idle_scratch = m.idle_scratch.size();
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
Status WaitFor(const std::function<void(std::function<void(Status)>)>& start) {
  auto promise = std::make_shared<std::promise<Status>>();
  std::future<Status> outcome = promise->get_future();
  start([promise](Status s) { promise->set_value(std::move(s)); });
  return outcome.get();
}
}  // namespace

Status TieredStore::ReadHome(TensorId id, void* buffer) {
  return WaitFor([&](auto done) { ReadHomeAsync(id, buffer, std::move(done)); });
}

Status TieredStore::WriteHome(TensorId id, const void* buffer) {
  return WaitFor([&](auto done) { WriteHomeAsync(id, buffer, std::move(done)); });
}

Status TieredStore::RegisterStreamBuffer(void* data, uint64_t size_bytes) {
  return impl_->swap != nullptr ? impl_->swap->RegisterBuffer(data, size_bytes) : OkStatus();
}

std::string TieredStore::device_name() const {
  return impl_->device != nullptr ? impl_->device->name() : std::string();
}

}  // namespace zinf
