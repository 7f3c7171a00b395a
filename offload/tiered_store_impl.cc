// TieredStore::Impl: see offload/tiered_store_impl.h, and the Notes in offload/tiered_store.cc.
#include "offload/tiered_store_impl.h"

#include <fmt/core.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <utility>

#include "core/units.h"
#include "nvme/io_engine.h"

namespace zinf {

TieredStore::Impl::Impl(const TieredStoreOptions& options, Device* device,
                        std::unique_ptr<MemoryPool> device_pool,
                        std::unique_ptr<MemoryPool> host_pool, std::unique_ptr<NvmePieces> nvme)
    : options(options),
      device(device),
      counters(device != nullptr ? device->transfer_counters() : no_device_counters),
      device_pool(std::move(device_pool)),
      host_pool(std::move(host_pool)),
      nvme(std::move(nvme)),
      catalog(this->nvme.get()),
      workers(options.transfer_threads, "zinf-prefetch") {}

TieredStore::Impl::~Impl() {
  workers.Stop();
  MutexLock lock(&mu);
  while (catalog.AnyBusy()) cv.Wait(&mu);
  catalog.ReleaseAll();
}

bool TieredStore::Impl::HasTier(Tier tier) const {
  switch (tier) {
    case Tier::kDevice:
      return device != nullptr;
    case Tier::kHost:
      return true;
    case Tier::kNvme:
      return nvme != nullptr;
  }
  return false;
}

StatusOr<TensorId> TieredStore::Impl::CreateLocked(std::string_view name, uint64_t size, Tier home,
                                                   bool scratch) {
  StoreTensor& t = catalog.Add(name, size, home, scratch);
  t.busy = true;  // not visible as a victim or source while its home is set up
  Status s;
  while (s.ok() && !t.copies[Index(home)].present) s = TryAllocate(t, home);
  t.busy = false;
  cv.SignalAll();
  if (!s.ok()) {
    catalog.Remove(t);
    return s;
  }
  TierCopy& c = t.copies[Index(home)];
  c.valid = true;
  c.zero = true;
  t.last_use = catalog.Tick();
  return t.id;
}

Status TieredStore::Impl::TryAllocate(StoreTensor& t, Tier tier) {
  TierCopy& c = t.copies[Index(tier)];
  if (tier == Tier::kNvme) {
    ZINF_ASSIGN_OR_RETURN(c.extents, nvme->Allocate(t.name, t.size));
    c.present = true;
    return OkStatus();
  }
  MemoryPool& pool = tier == Tier::kDevice ? *device_pool : *host_pool;
  StatusOr<PoolBlock> block = pool.Allocate(t.size);
  if (block.ok()) {
    c.block = std::move(*block);
    c.present = true;
    return OkStatus();
  }
  if (block.status().code() != StatusCode::kResourceExhausted) return block.status();
  if (catalog.DropIdleScratch(tier)) return OkStatus();  // look again with its memory back
  StoreTensor* victim = catalog.PickVictim(tier, &t);
  if (victim == nullptr && catalog.MovingIn(tier, &t)) {
    cv.Wait(&mu);  // a transfer in flight will leave a copy to evict, or free one
    return OkStatus();
  }
  if (victim == nullptr) {
    return ResourceExhausted(
        fmt::format("{} tier cannot hold tensor '{}' ({}): {}; nothing to evict ({} held by homes, "
                    "pinned or moving copies)",
                    TierName(tier), t.name, FormatBytes(t.size), block.status().message(),
                    FormatBytes(catalog.HeldBytes(tier))));
  }
  return EvictLocked(*victim, tier);
}

Status TieredStore::Impl::EvictLocked(StoreTensor& t, Tier tier, bool keep) {
  TierCopy& c = t.copies[Index(tier)];
  TierCopy& home = t.copies[Index(t.home)];
  if (c.valid && !home.valid) {
    t.busy = true;
    mu.Unlock();
    Status s = mover->Move(t, tier, t.home);
    mu.Lock();
    t.busy = false;
    cv.SignalAll();
    if (!s.ok()) {
      return std::move(s).WithContext(
          fmt::format("writing tensor '{}' back to its home ({})", t.name, TierName(t.home)));
    }
    home.valid = true;
    home.zero = false;
    catalog.CountWriteBack();
  }
  if (keep) return OkStatus();
  catalog.DropCopy(t, tier);
  catalog.CountEviction();
  return OkStatus();
}

Status TieredStore::Impl::MakeValid(StoreTensor& t, Tier tier, bool for_write, bool overwrite) {
  const TensorId id = t.id;
  bool waited = false;  // counted once a call (Note [Transfer counters])
  while (true) {
    if (catalog.Lookup(id) == nullptr) return catalog.Find(id).status();
    TierCopy& c = t.copies[Index(tier)];
    if (t.busy || t.writer || (for_write && t.pins() > 0)) {
      if (!std::exchange(waited, true)) counters.CountWait();
      cv.Wait(&mu);
      continue;
    }
    if (c.valid) return OkStatus();
    if (!c.present) {
      ZINF_RETURN_IF_ERROR(TryAllocate(t, tier));
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
    mu.Unlock();
    Status s = mover->Move(t, src, tier);
    mu.Lock();
    t.busy = false;
    cv.SignalAll();
    if (!s.ok()) {
      return std::move(s).WithContext(
          fmt::format("moving tensor '{}' from {} to {}", t.name, TierName(src), TierName(tier)));
    }
    c.valid = true;
    c.zero = false;
    return OkStatus();
  }
}

Status TieredStore::Impl::ClearNeverWritten(StoreTensor& t, Tier tier) {
  t.busy = true;
  mu.Unlock();
  Status s = mover->Clear(t, tier);
  mu.Lock();
  t.busy = false;
  cv.SignalAll();
  if (s.ok()) t.copies[Index(tier)].zero = false;
  return s;
}

Status TieredStore::Impl::Evict(TensorId id, Tier tier, bool keep, bool leave_held) {
  MutexLock lock(&mu);
  while (true) {
    ZINF_ASSIGN_OR_RETURN(StoreTensor * t, catalog.Find(id));
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
      cv.Wait(&mu);
      continue;
    }
    if (!t->copies[Index(tier)].present) return OkStatus();
    return EvictLocked(*t, tier, keep);
  }
}

Status TieredStore::Impl::PrefetchOne(TensorId id, Tier tier) {
  MutexLock lock(&mu);
  StatusOr<StoreTensor*> t = catalog.Find(id);
  Status s = t.ok() ? MakeValid(**t, tier, false) : t.status();
  if (s.ok()) (*t)->last_use = catalog.Tick();
  return s;
}

Status TieredStore::Impl::Flush() {
  std::vector<std::shared_future<Status>> inflight;
  {
    MutexLock lock(&mu);
    inflight = catalog.Prefetches();  // prefetches in flight first
  }
  for (auto& f : inflight) f.wait();
  MutexLock lock(&mu);
  Status first;
  for (TensorId id : catalog.Ids()) {
    while (true) {
      StoreTensor* t = catalog.Lookup(id);
      if (t == nullptr) break;
      if (t->busy || t->writer) {
        cv.Wait(&mu);
        continue;
      }
      TierCopy& home = t->copies[Index(t->home)];
      if (home.valid) break;
      Tier src = t->copies[Index(Tier::kHost)].valid ? Tier::kHost : Tier::kDevice;
      t->busy = true;
      mu.Unlock();
      Status s = mover->Move(*t, src, t->home);
      mu.Lock();
      t->busy = false;
      cv.SignalAll();
      if (s.ok()) {
        home.valid = true;
        home.zero = false;
        catalog.CountWriteBack();
      } else if (first.ok()) {
        first = std::move(s).WithContext(fmt::format("flushing tensor '{}'", t->name));
      }
      break;
    }
  }
  return first;
}

// ---- Streams: the home's bytes straight to and from a caller's buffer ----

namespace {

// Why tensor `t` cannot stream through `buffer` now; OK when it can.
Status StreamRefusal(const StoreTensor& t, const char* buffer, const std::string& what) {
  if (t.home != Tier::kNvme) {
    return InvalidArgument(
        fmt::format("{}: its home is the {} tier, not NVMe", what, TierName(t.home)));
  }
  if (reinterpret_cast<uintptr_t>(buffer) % 4096 != 0) {
    return InvalidArgument(what + ": the buffer is not 4096-aligned");
  }
  if (t.pins() > 0 || t.copies[Index(Tier::kDevice)].present ||
      t.copies[Index(Tier::kHost)].present) {
    return FailedPrecondition(what +
                              ": it is acquired or cached, so its home is not its only copy");
  }
  return OkStatus();
}

}  // namespace

bool TieredStore::Impl::ClaimForStream(TensorId id, char* buffer, bool write,
                                       const std::function<void(Status)>& done,
                                       StreamClaim& claim) {
  Status refused;
  {
    MutexLock lock(&mu);
    StatusOr<StoreTensor*> found = catalog.Find(id);
    while (found.ok() && (*found)->busy) {
      cv.Wait(&mu);
      found = catalog.Find(id);
    }
    if (!found.ok()) {
      refused = std::move(found).status();
    } else {
      StoreTensor& t = **found;
      claim.what = fmt::format("{} tensor {} ('{}') {} NVMe", write ? "writing" : "reading", id,
                               t.name, write ? "to" : "from");
      refused = StreamRefusal(t, buffer, claim.what);
      claim.size = t.size;
      const bool zeros = !write && t.copies[Index(Tier::kNvme)].zero;  // never written
      if (refused.ok() && !zeros) {
        t.busy = true;
        claim.tensor = &t;
        claim.extents = t.copies[Index(Tier::kNvme)].extents;
      }
    }
  }
  if (!refused.ok()) {
    done(std::move(refused));
    return false;
  }
  if (claim.tensor == nullptr) {
    std::memset(buffer, 0, AlignUp(claim.size, 4096));
    counters.CountHostSet(AlignUp(claim.size, 4096));
    done(OkStatus());
    return false;
  }
  return true;
}

void TieredStore::Impl::StreamHome(TensorId id, char* buffer, bool write,
                                   std::function<void(Status)> done) {
  StreamClaim claim;
  if (!ClaimForStream(id, buffer, write, done, claim)) return;
  struct Pending {
    std::atomic<size_t> left{0};
    Mutex mu;
    Status first ZINF_GUARDED_BY(mu);
    std::function<void(Status)> done;
  };
  auto pending = std::make_shared<Pending>();
  pending->done = std::move(done);
  pending->left = claim.extents.size();
  LinkMeter& meter = write ? links.h2n : links.n2h;
  meter.Begin();
  auto piece_done = [this, t = claim.tensor, write, size = claim.size, &meter, pending,
                     what = claim.what](Status s) {
    if (!s.ok()) {
      MutexLock lock(&pending->mu);
      if (pending->first.ok()) pending->first = std::move(s);
    }
    if (--pending->left != 0) return;
    meter.End(size);
    Status result;
    {
      MutexLock lock(&pending->mu);
      result = pending->first;
    }
    {
      MutexLock lock(&mu);
      t->busy = false;
      if (write && result.ok()) {
        t->copies[Index(Tier::kNvme)].valid = true;
        t->copies[Index(Tier::kNvme)].zero = false;
      }
      cv.SignalAll();
    }
    // Nothing of the store is touched past this point: its destructor may run now.
    pending->done(result.ok() ? result : std::move(result).WithContext(what));
  };
  nvme->Stream(claim.extents, buffer, write, piece_done);
}

uint64_t TieredStore::Impl::BookkeepingEntries() const {
  uint64_t n = catalog.BookkeepingEntries() + workers.queued();
  for (const MemoryPool* pool : {device_pool.get(), host_pool.get()}) {
    if (pool != nullptr) n += pool->stats().free_ranges;
  }
  if (nvme != nullptr) n += nvme->BookkeepingEntries();
  return n;
}

}  // namespace zinf
