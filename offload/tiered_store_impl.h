// TieredStore::Impl: what the store decides, on the parts that do the rest. It makes a current
// copy resident where it is asked for (MakeValid), finds room by evicting cached copies
// (TryAllocate, EvictLocked), moves many tensors as one batch (Note [Batched write-backs] in
// offload/tiered_store.cc), streams NVMe homes through a caller's buffers, and writes back
// what is newer than its home (Flush). Its parts, each with its own header:
//   TensorCatalog  the records, scratch reuse, the eviction order  (tensor_catalog.h)
//   TierMover      the bytes of one tensor from one tier to another (tier_mover.h)
//   NvmePieces     the NVMe tier: swap extents, piece I/O, staging  (nvme_pieces.h)
//   LinkMeters     bytes and busy time per link                    (link_meter.h)
//   TransferWorkers  the threads of the asynchronous calls          (transfer_workers.h)
// and the memory pools (memory_pool.h), which hold each tier's budget.
//
// Thread-safety: `mu` guards the catalog and every record in it (offload/store_tensor.h). A
// transfer runs without it, its tensor marked busy; `cv` wakes the threads waiting for a
// tensor to become idle or for memory to come back.
#ifndef ZINF_OFFLOAD_TIERED_STORE_IMPL_H_
#define ZINF_OFFLOAD_TIERED_STORE_IMPL_H_

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/mutex.h"
#include "offload/link_meter.h"
#include "offload/memory_pool.h"
#include "offload/nvme_pieces.h"
#include "offload/store_tensor.h"
#include "offload/tensor_catalog.h"
#include "offload/tier_mover.h"
#include "offload/transfer_workers.h"
#include "zinf/device.h"
#include "zinf/tiered_store.h"

namespace zinf {

struct TieredStore::Impl {
  // The pools and the NVMe tier (null: none) made; `mover` is set next.
  Impl(const TieredStoreOptions& options, Device* device, std::unique_ptr<MemoryPool> device_pool,
       std::unique_ptr<MemoryPool> host_pool, std::unique_ptr<NvmePieces> nvme);
  // Runs the queued jobs, waits for transfers, frees every tensor's memory.
  ~Impl();

  bool HasTier(Tier tier) const;

  // TieredStore::Create and CreateScratch past the checks: a new tensor homed in `home`.
  StatusOr<TensorId> CreateLocked(std::string_view name, uint64_t size, Tier home, bool scratch)
      ZINF_REQUIRES(mu);
  // One attempt at the memory of t's copy in `tier`: allocates it, or evicts one cached copy in
  // that tier to make room and returns OK without allocating (the caller looks at the tensor
  // again and retries: the lock may have been released for a write-back, and t changed).
  Status TryAllocate(StoreTensor& t, Tier tier) ZINF_REQUIRES(mu);
  // Makes a current copy of t resident in `tier`. `overwrite`: the caller writes every byte,
  // so memory is enough; no current bytes are copied.
  Status MakeValid(StoreTensor& t, Tier tier, bool for_write, bool overwrite = false)
      ZINF_REQUIRES(mu);
  // A home copy that was never written reads as zeros but its memory was never cleared (Create
  // leaves that to the first Acquire, so that tensors the caller overwrites cost nothing):
  // clears it.
  Status ClearNeverWritten(StoreTensor& t, Tier tier) ZINF_REQUIRES(mu);
  // Drops t's cached copy in `tier`, writing it back home when the home is stale. `keep`: the
  // copy stays, current in both tiers (TieredStore::WriteBackAsync).
  Status EvictLocked(StoreTensor& t, Tier tier, bool keep = false) ZINF_REQUIRES(mu);

  // TieredStore::Evict. `leave_held`: a copy acquired now is left to its holders instead of
  // refused (Note [Evicting a held copy]).
  Status Evict(TensorId id, Tier tier, bool keep = false, bool leave_held = false)
      ZINF_EXCLUDES(mu);
  // EvictMany as one job of a transfer thread; the future holds its outcome.
  std::shared_future<Status> EvictManyAsync(std::span<const TensorId> ids, Tier tier, bool keep)
      ZINF_EXCLUDES(mu);
  // TieredStore::Prefetch of one tensor (of several), run on a transfer thread.
  Status PrefetchOne(TensorId id, Tier tier) ZINF_EXCLUDES(mu);
  Status PrefetchMany(const std::vector<TensorId>& ids, Tier tier) ZINF_EXCLUDES(mu);
  // Memory in `tier` (device or host) for those of `tensors` that have none there: one run
  // where it fits, at the distances of their copies in the other of the two tiers where they
  // all have one there (Note [Runs of blocks] in offload/memory_pool.h), else in the order
  // given; else each where it fits. Never evicts: those that find no room are unclaimed (not
  // busy), leave `tensors` and go to `alone`. A batch's stale device copies that do not lie as
  // a run are placed again (FreeStaleOutOfRun). TieredStore::Place, and the prefetch batches.
  void PlaceRun(std::vector<StoreTensor*>& tensors, Tier tier, std::vector<TensorId>& alone)
      ZINF_REQUIRES(mu);
  // TieredStore::Flush.
  Status Flush() ZINF_EXCLUDES(mu);
  // TieredStore::ReadHomeAsync and WriteHomeAsync: every NVMe piece of the tensor between its
  // home and `buffer` in flight together, the tensor busy until the last completes.
  void StreamHome(TensorId id, char* buffer, bool write, std::function<void(Status)> done)
      ZINF_EXCLUDES(mu);
  // Entries of every container that could grow with use (TieredStoreStats).
  uint64_t BookkeepingEntries() const ZINF_REQUIRES(mu);

  const TieredStoreOptions options;
  std::unique_ptr<Device> owned_device;  // opened from options.device by Create(options)
  Device* const device;                  // the device tier's; owned_device or the caller's
  LinkMeters links;
  TransferCounters no_device_counters;  // where a store without a device tier counts
  TransferCounters& counters;           // the device's, or the above (Note [Transfer counters])
  std::unique_ptr<TierMover> mover;     // its streams outlive the memory, as before the device
  const std::unique_ptr<MemoryPool> device_pool;  // null without a device tier
  const std::unique_ptr<MemoryPool> host_pool;
  const std::unique_ptr<NvmePieces> nvme;  // null without an NVMe tier

  mutable Mutex mu;
  CondVar cv;  // a tensor became idle, or memory came back
  TensorCatalog catalog ZINF_GUARDED_BY(mu);
  TransferWorkers workers;

 private:
  // Tensor `id` of a batch; null, with the error kept in `first` when it is the first, where
  // there is none.
  StoreTensor* FindForBatch(TensorId id, Status& first) ZINF_REQUIRES(mu);
  // TieredStore::EvictAsync (or with `keep`, WriteBackAsync) of several tensors, run on one
  // transfer thread.
  Status EvictMany(const std::vector<TensorId>& ids, Tier tier, bool keep) ZINF_EXCLUDES(mu);
  // Sorts EvictMany's tensors: dropped now (nothing to write back), claimed for a batch
  // (`batch` to NVMe, `uploads` to their home in device memory), or left to Evict one at a
  // time (`alone`).
  void SortEvictions(const std::vector<TensorId>& ids, Tier tier, bool keep,
                     std::vector<StoreTensor*>& batch, std::vector<StoreTensor*>& uploads,
                     std::vector<TensorId>& alone, Status& first) ZINF_REQUIRES(mu);
  // Sorts PrefetchMany's tensors likewise: `batch` from NVMe into memory the host addresses;
  // behind a device link, `uploads` from a current host copy to device memory and `staged`
  // from NVMe to host memory and then up; each claimed with the memory it needs.
  void SortPrefetches(const std::vector<TensorId>& ids, Tier tier, std::vector<StoreTensor*>& batch,
                      std::vector<StoreTensor*>& staged, std::vector<StoreTensor*>& uploads,
                      std::vector<TensorId>& alone, Status& first) ZINF_REQUIRES(mu);
  // Sorts the claimed tensors in their host copies' order; where their device copies do not
  // lie at those distances, frees the stale ones (not current: about to be overwritten; never
  // a home, which torch may hold as a parameter's own memory) for PlaceRun to place again as
  // one run. A batch read again step after step is placed once.
  void FreeStaleOutOfRun(std::vector<StoreTensor*>& claimed) ZINF_REQUIRES(mu);
  // Drops the host copies that tensors read from NVMe passed through on their way up to
  // device memory, where nobody holds them: the host tier holds them only on the way, as the
  // staging buffer did, so that it holds no more than when they moved a piece at a time.
  void DropPassedThrough(const std::vector<TensorId>& ids) ZINF_EXCLUDES(mu);

  // The NVMe I/O of tensors claimed (busy) for a batch, between their home and their copy in
  // `tier`: every tensor's requests start before any is waited for; then each outcome is
  // recorded as it completes (FinishWriteBack, FinishRead), and the tensor is idle again, or,
  // read and given `then`, stays claimed and joins it.
  void RunBatch(const std::vector<StoreTensor*>& batch, Tier tier, bool write_back, bool keep,
                Status& first, std::vector<StoreTensor*>* then = nullptr) ZINF_EXCLUDES(mu);
  // The host copies of tensors claimed (busy) for a batch copied to their device copies as one
  // batch (TierMover::Upload): one wait for all of them. With `write_back` the device copy is
  // their home (FinishWriteBack), else a prefetch's (FinishRead).
  void RunUploads(const std::vector<StoreTensor*>& uploads, bool write_back, bool keep,
                  Status& first) ZINF_EXCLUDES(mu);
  void FinishWriteBack(StoreTensor& t, Tier tier, bool keep, Status s, Status& first)
      ZINF_REQUIRES(mu);
  // A read from `src` into the copy in `tier`.
  void FinishRead(StoreTensor& t, Tier src, Tier tier, Status s, Status& first) ZINF_REQUIRES(mu);
  // A tensor claimed (busy) for StreamHome, and what its stream needs.
  struct StreamClaim {
    StoreTensor* tensor = nullptr;
    std::vector<SwapExtent> extents;
    uint64_t size = 0;
    std::string what;  // "reading tensor 3 ('x') from NVMe", for errors
  };
  // StreamHome's checks, with the tensor claimed when they pass; false when `done` has been
  // called instead (an error, or a read of a home never written: zeros).
  bool ClaimForStream(TensorId id, char* buffer, bool write,
                      const std::function<void(Status)>& done, StreamClaim& claim)
      ZINF_EXCLUDES(mu);
};

}  // namespace zinf

#endif  // ZINF_OFFLOAD_TIERED_STORE_IMPL_H_
