// TieredStore::Impl's batches (Note [Batched write-backs] in offload/tiered_store.cc): the
// moves of several tensors claimed as one job, and the runs their memory is placed in (Note
// [Runs of blocks] in offload/memory_pool.h).
#include <fmt/core.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <utility>
#include <vector>

#include "offload/tiered_store_impl.h"

namespace zinf {

void TieredStore::Impl::RunBatch(const std::vector<StoreTensor*>& batch, Tier tier, bool write_back,
                                 bool keep, Status& first, std::vector<StoreTensor*>* then) {
  if (batch.empty()) return;
  uint64_t bytes = 0;
  for (const StoreTensor* t : batch) bytes += t->size;
  LinkScope scope(write_back ? links.h2n : links.n2h, bytes);
  std::deque<IoWaiter> waiters;  // one per tensor: each outcome is its own
  for (StoreTensor* t : batch) {
    const std::vector<SwapExtent>& home = t->copies[Index(Tier::kNvme)].extents;
    char* memory = t->copies[Index(tier)].block.as<char>();
    if (write_back) {
      nvme->SubmitWrites(home, memory, waiters.emplace_back());
    } else {
      nvme->SubmitReads(home, memory, waiters.emplace_back());
    }
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    Status s = waiters[i].Wait();
    MutexLock lock(&mu);
    if (then != nullptr && s.ok()) {
      FinishRead(*batch[i], Tier::kNvme, tier, std::move(s), first);
      then->push_back(batch[i]);  // still claimed, for what comes next
      continue;
    }
    batch[i]->busy = false;
    if (write_back) {
      FinishWriteBack(*batch[i], tier, keep, std::move(s), first);
    } else {
      FinishRead(*batch[i], Tier::kNvme, tier, std::move(s), first);
    }
    cv.SignalAll();
  }
}

void TieredStore::Impl::FinishWriteBack(StoreTensor& t, Tier tier, bool keep, Status s,
                                        Status& first) {
  if (!s.ok()) {  // the copy stays: nothing is lost
    if (first.ok()) {
      first = std::move(s).WithContext(
          fmt::format("writing tensor '{}' back to its home ({})", t.name, TierName(t.home)));
    }
    return;
  }
  t.copies[Index(t.home)].valid = true;
  t.copies[Index(t.home)].zero = false;
  catalog.CountWriteBack();
  if (keep) return;
  catalog.DropCopy(t, tier);
  catalog.CountEviction();
}

void TieredStore::Impl::FinishRead(StoreTensor& t, Tier src, Tier tier, Status s, Status& first) {
  if (!s.ok()) {  // the memory stays, invalid; the next Acquire reads again
    if (first.ok()) {
      first = std::move(s).WithContext(
          fmt::format("moving tensor '{}' from {} to {}", t.name, TierName(src), TierName(tier)));
    }
    return;
  }
  t.copies[Index(tier)].valid = true;
  t.copies[Index(tier)].zero = false;
  t.last_use = catalog.Tick();
}

void TieredStore::Impl::RunUploads(const std::vector<StoreTensor*>& uploads, bool write_back,
                                   bool keep, Status& first) {
  if (uploads.empty()) return;
  const Status s = mover->Upload(uploads);
  MutexLock lock(&mu);
  for (StoreTensor* t : uploads) {  // a failed batch: every copy stays, none is current
    t->busy = false;
    if (write_back) {
      FinishWriteBack(*t, Tier::kHost, keep, s, first);
    } else {
      FinishRead(*t, Tier::kHost, Tier::kDevice, s, first);
    }
  }
  cv.SignalAll();
}

StoreTensor* TieredStore::Impl::FindForBatch(TensorId id, Status& first) {
  StatusOr<StoreTensor*> found = catalog.Find(id);
  if (found.ok()) return *found;
  if (first.ok()) first = found.status();
  return nullptr;
}

void TieredStore::Impl::SortEvictions(const std::vector<TensorId>& ids, Tier tier, bool keep,
                                      std::vector<StoreTensor*>& batch,
                                      std::vector<StoreTensor*>& uploads,
                                      std::vector<TensorId>& alone, Status& first) {
  for (TensorId id : ids) {
    StoreTensor* found = FindForBatch(id, first);
    if (found == nullptr) continue;
    StoreTensor& t = *found;
    const TierCopy& c = t.copies[Index(tier)];
    const bool idle = tier != t.home && !t.busy && !t.writer && c.pins == 0;
    if (idle && !c.present) continue;
    if (idle && !(c.valid && !t.copies[Index(t.home)].valid)) {  // nothing to write back
      if (keep) continue;
      catalog.DropCopy(t, tier);
      catalog.CountEviction();
    } else if (idle && t.home == Tier::kNvme && mover->Addressable(tier) && !c.zero) {
      t.busy = true;
      batch.push_back(&t);
    } else if (idle && t.home == Tier::kDevice && tier == Tier::kHost && !mover->direct() &&
               !c.zero && t.copies[Index(Tier::kDevice)].present) {
      t.busy = true;
      uploads.push_back(&t);
    } else {
      alone.push_back(t.id);
    }
  }
}

Status TieredStore::Impl::EvictMany(const std::vector<TensorId>& ids, Tier tier, bool keep) {
  Status first;
  std::vector<StoreTensor*> batch, uploads;
  std::vector<TensorId> alone;  // evicted one at a time, as Evict does
  {
    MutexLock lock(&mu);
    SortEvictions(ids, tier, keep, batch, uploads, alone, first);
  }
  RunBatch(batch, tier, /*write_back=*/true, keep, first);
  RunUploads(uploads, /*write_back=*/true, keep, first);
  for (TensorId id : alone) {
    Status s = Evict(id, tier, keep, /*leave_held=*/true);
    if (first.ok()) first = std::move(s);
  }
  return first;
}

std::shared_future<Status> TieredStore::Impl::EvictManyAsync(std::span<const TensorId> ids,
                                                             Tier tier, bool keep) {
  auto promise = std::make_shared<std::promise<Status>>();
  std::shared_future<Status> done = promise->get_future().share();
  workers.Enqueue([this, ids = std::vector<TensorId>(ids.begin(), ids.end()), tier, keep, promise] {
    promise->set_value(EvictMany(ids, tier, keep));
  });
  return done;
}

namespace {

// Whether the device copies of `sorted` (in their host copies' order) that have memory lie at
// their host copies' distances (Note [Runs of blocks]).
bool LieAsRun(const std::vector<StoreTensor*>& sorted) {
  for (size_t i = 0; i + 1 < sorted.size(); ++i) {
    const StoreTensor& a = *sorted[i];
    const StoreTensor& b = *sorted[i + 1];
    if (a.copies[Index(Tier::kDevice)].present && b.copies[Index(Tier::kDevice)].present &&
        !TierMover::ContinuesRun(a, b)) {
      return false;
    }
  }
  return true;
}

// Sorts `tensors` by their copies in the `other` of the device and host tiers, when each has
// one, and returns the block sizes of a run in this tier at those copies' distances (each
// block reaching to where the next tensor's copy lies there, when that is within its own
// block there), so that they move between the two tiers as one copy (Note [Runs of blocks] in
// offload/memory_pool.h); else their own sizes, in the order given.
std::vector<uint64_t> MirroredRun(std::vector<StoreTensor*>& tensors, Tier other) {
  std::vector<uint64_t> sizes;
  const bool mirror = std::all_of(tensors.begin(), tensors.end(), [&](const StoreTensor* t) {
    return t->copies[Index(other)].present;
  });
  if (mirror) {
    std::sort(tensors.begin(), tensors.end(), [&](const StoreTensor* a, const StoreTensor* b) {
      return std::less<>()(a->copies[Index(other)].block.data(),
                           b->copies[Index(other)].block.data());
    });
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    uint64_t size = tensors[i]->size;
    if (mirror && i + 1 < tensors.size()) {
      const PoolBlock& there = tensors[i]->copies[Index(other)].block;
      const uint64_t gap = tensors[i + 1]->copies[Index(other)].block.as<char>() - there.as<char>();
      if (gap <= there.reserved_bytes()) size = gap;  // the next one follows it there
    }
    sizes.push_back(size);
  }
  return sizes;
}

}  // namespace

void TieredStore::Impl::SortPrefetches(const std::vector<TensorId>& ids, Tier tier,
                                       std::vector<StoreTensor*>& batch,
                                       std::vector<StoreTensor*>& staged,
                                       std::vector<StoreTensor*>& uploads,
                                       std::vector<TensorId>& alone, Status& first) {
  std::vector<StoreTensor*> up;  // claimed for device memory, from or through host memory
  for (TensorId id : ids) {
    StoreTensor* found = FindForBatch(id, first);
    if (found == nullptr) continue;
    StoreTensor& t = *found;
    TierCopy& c = t.copies[Index(tier)];
    if (c.valid) continue;
    const TierCopy& host = t.copies[Index(Tier::kHost)];
    const TierCopy& home = t.copies[Index(Tier::kNvme)];
    const bool to_device = tier == Tier::kDevice && !mover->direct();
    const bool from_host = to_device && host.valid && !host.zero;
    const bool from_nvme = t.home == Tier::kNvme && home.valid && !home.zero && !host.valid &&
                           !t.copies[Index(Tier::kDevice)].valid;
    if (t.busy || t.writer || !(from_host || from_nvme)) {
      alone.push_back(t.id);
      continue;
    }
    if (to_device) {  // memory for these is found below, as runs
      t.busy = true;
      up.push_back(&t);
      continue;
    }
    if (!c.present) {  // room without evicting: making room is left to the one-at-a-time path
      MemoryPool& pool = tier == Tier::kDevice ? *device_pool : *host_pool;
      StatusOr<PoolBlock> block = pool.Allocate(t.size);
      if (!block.ok()) {
        alone.push_back(t.id);
        continue;
      }
      c.block = std::move(*block);
      c.present = true;
    }
    t.busy = true;
    batch.push_back(&t);
  }
  // Host memory first, for what is read from NVMe on the way up; then device memory at the
  // distances of the host copies (Note [Runs of blocks]).
  PlaceRun(up, Tier::kHost, alone);
  PlaceRun(up, Tier::kDevice, alone);
  for (StoreTensor* t : up) (t->copies[Index(Tier::kHost)].valid ? uploads : staged).push_back(t);
}

void TieredStore::Impl::PlaceRun(std::vector<StoreTensor*>& tensors, Tier tier,
                                 std::vector<TensorId>& alone) {
  if (tier == Tier::kDevice) FreeStaleOutOfRun(tensors);
  std::vector<StoreTensor*> unplaced;
  for (StoreTensor* t : tensors) {
    if (!t->copies[Index(tier)].present) unplaced.push_back(t);
  }
  if (unplaced.empty()) return;
  MemoryPool& pool = tier == Tier::kDevice ? *device_pool : *host_pool;
  const std::vector<uint64_t> sizes =
      MirroredRun(unplaced, tier == Tier::kDevice ? Tier::kHost : Tier::kDevice);
  StatusOr<std::vector<PoolBlock>> run = pool.AllocateRun(sizes);
  for (size_t i = 0; i < unplaced.size(); ++i) {
    StoreTensor& t = *unplaced[i];
    StatusOr<PoolBlock> block =
        run.ok() ? StatusOr<PoolBlock>(std::move((*run)[i])) : pool.Allocate(t.size);
    if (!block.ok()) {  // left to the one-at-a-time path, which makes room
      t.busy = false;   // claimed under this same hold of the lock: nobody saw it busy
      alone.push_back(t.id);
      continue;
    }
    t.copies[Index(tier)].block = std::move(*block);
    t.copies[Index(tier)].present = true;
  }
  std::erase_if(tensors, [tier](const StoreTensor* t) { return !t->copies[Index(tier)].present; });
}

void TieredStore::Impl::FreeStaleOutOfRun(std::vector<StoreTensor*>& claimed) {
  std::sort(claimed.begin(), claimed.end(), TierMover::HostOrder);
  if (LieAsRun(claimed)) return;
  for (StoreTensor* t : claimed) {
    TierCopy& c = t->copies[Index(Tier::kDevice)];
    // Claimed, its bytes about to be replaced; never a home (resident parameters are torch's).
    if (c.present && !c.valid && c.pins == 0 && t->home != Tier::kDevice) {
      c.block.Reset();
      c.present = false;
    }
  }
}

void TieredStore::Impl::DropPassedThrough(const std::vector<TensorId>& ids) {
  MutexLock lock(&mu);
  for (TensorId id : ids) {
    StoreTensor* t = catalog.Lookup(id);
    if (t == nullptr || t->busy || t->writer) continue;
    const TierCopy& host = t->copies[Index(Tier::kHost)];
    // Only a clean copy: one written since is the writer's to send home.
    if (host.present && host.pins == 0 && t->copies[Index(Tier::kDevice)].valid &&
        t->copies[Index(t->home)].valid) {
      catalog.DropCopy(*t, Tier::kHost);
      catalog.CountEviction();
    }
  }
  cv.SignalAll();  // memory came back
}

Status TieredStore::Impl::PrefetchMany(const std::vector<TensorId>& ids, Tier tier) {
  Status first;
  std::vector<StoreTensor*> batch, staged, uploads;
  std::vector<TensorId> alone;
  {
    MutexLock lock(&mu);
    SortPrefetches(ids, tier, batch, staged, uploads, alone, first);
  }
  RunBatch(batch, tier, /*write_back=*/false, /*keep=*/false, first);
  // Behind a device link, NVMe's reads all in flight into host memory, then up with the rest.
  std::vector<TensorId> passed_through;
  for (const StoreTensor* t : staged) passed_through.push_back(t->id);
  RunBatch(staged, Tier::kHost, /*write_back=*/false, /*keep=*/false, first, &uploads);
  RunUploads(uploads, /*write_back=*/false, /*keep=*/false, first);
  DropPassedThrough(passed_through);
  for (TensorId id : alone) {
    Status s = PrefetchOne(id, tier);
    if (first.ok()) first = std::move(s);
  }
  return first;
}

}  // namespace zinf
