// TensorCatalog: the tiered store's records. Every live tensor by id; the scratch tensors
// parked for reuse with their home memory (Note [Scratch tensors] in offload/tiered_store.cc);
// the names of the last freed tensors, for errors; the store's clock and counters; and the
// choice of the cached copy to evict (Note [TieredStore eviction order], ibid.).
//
// Thread-safety: none of its own. TieredStore::Impl holds its mutex around every call (the
// catalog is ZINF_GUARDED_BY it). Records handed out stay valid until Remove or Retire.
#ifndef ZINF_OFFLOAD_TENSOR_CATALOG_H_
#define ZINF_OFFLOAD_TENSOR_CATALOG_H_

#include <array>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "offload/nvme_pieces.h"
#include "offload/store_tensor.h"
#include "zinf/status.h"
#include "zinf/tiered_store.h"

namespace zinf {

class TensorCatalog {
 public:
  // `nvme` frees NVMe copies (null: the store has no NVMe tier); not owned, outlives this.
  explicit TensorCatalog(NvmePieces* nvme) : nvme_(nvme) {}
  ~TensorCatalog() { ReleaseAll(); }
  TensorCatalog(const TensorCatalog&) = delete;
  TensorCatalog& operator=(const TensorCatalog&) = delete;

  // The live tensor `id`. Errors: InvalidArgument (no such id was ever made),
  // FailedPrecondition (freed; named when it is among the last freed).
  StatusOr<StoreTensor*> Find(TensorId id);
  // The live tensor `id`, or null.
  StoreTensor* Lookup(TensorId id);
  // A new live tensor under a new id, with no memory yet.
  StoreTensor& Add(std::string_view name, uint64_t size, Tier home, bool scratch);
  // Takes back an Add whose home could not be made: its memory freed, no trace kept.
  void Remove(StoreTensor& t);
  // Takes t out of the live tensors for good: its memory goes back to the tiers, or, for a
  // scratch tensor, it is parked with its home memory (Note [Scratch tensors]).
  void Retire(StoreTensor& t);
  // A parked scratch tensor of `size` bytes homed in `home`, made live again under a new id as
  // if just created; null when there is none.
  StoreTensor* Revive(std::string_view name, uint64_t size, Tier home);
  // Gives the memory of the oldest parked scratch tensor in `tier` back to its tier; false
  // when there is none.
  bool DropIdleScratch(Tier tier);
  // Gives the memory of every parked scratch tensor back.
  void ReleaseIdleScratch();
  // Frees the memory of t's copy in `tier`.
  void DropCopy(StoreTensor& t, Tier tier);
  // Frees every tensor's memory, live or parked, and forgets them.
  void ReleaseAll();

  // The cached copy in `tier` to evict for `requester`, or null when none may go (See Note
  // [TieredStore eviction order]).
  StoreTensor* PickVictim(Tier tier, const StoreTensor* requester);
  // Whether a tensor other than `requester` has a copy in `tier` that a transfer is using
  // (its end makes that copy evictable or frees it).
  bool MovingIn(Tier tier, const StoreTensor* requester) const;
  // Bytes in `tier` that nothing can evict: homes, pinned and moving copies (for errors).
  uint64_t HeldBytes(Tier tier) const;
  // Whether any tensor has a transfer in flight.
  bool AnyBusy() const;
  // The ids of the live tensors, and the prefetches they have in flight.
  std::vector<TensorId> Ids() const;
  std::vector<std::shared_future<Status>> Prefetches() const;

  // The store's clock: a new value for StoreTensor::last_use.
  uint64_t Tick() { return ++tick_; }
  void CountEviction() { ++evictions_; }
  void CountWriteBack() { ++write_backs_; }
  uint64_t evictions() const { return evictions_; }
  uint64_t write_backs() const { return write_backs_; }
  uint64_t live() const { return tensors_.size(); }
  uint64_t idle_scratch() const { return idle_scratch_.size(); }
  // Entries of the catalog's containers (TieredStoreStats::bookkeeping_entries).
  uint64_t BookkeepingEntries() const;

 private:
  static constexpr size_t kIdleScratchKept = 4096;  // Note [Scratch tensors]
  static constexpr size_t kFreedNamesKept = 64;

  void ReleaseMemory(StoreTensor& t);

  NvmePieces* const nvme_;
  std::unordered_map<TensorId, std::unique_ptr<StoreTensor>> tensors_;
  // Freed scratch tensors with their home memory, oldest first.
  std::deque<std::unique_ptr<StoreTensor>> idle_scratch_;
  // The last kFreedNamesKept freed tensors, a ring (id 0: empty).
  std::array<std::pair<TensorId, std::string>, kFreedNamesKept> freed_names_;
  size_t freed_next_ = 0;
  TensorId next_id_ = 1;
  uint64_t tick_ = 0;
  uint64_t evictions_ = 0;
  uint64_t write_backs_ = 0;
};

}  // namespace zinf

#endif  // ZINF_OFFLOAD_TENSOR_CATALOG_H_
