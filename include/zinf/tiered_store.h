// TieredStore: tensors (plain byte ranges) that live in one of three memory tiers — device
// memory, pinned host memory, NVMe — with cached copies in the faster tiers, moved ahead of use.
//
// Each tensor has a home tier, where its bytes persist, and may have cached copies in the device
// and host tiers (NVMe is only ever a home). Prefetch starts making a copy resident without
// blocking; Acquire returns a pointer once the copy is resident and current, and keeps it there
// until Release; Evict drops a cached copy, writing it back to the home first when it holds the
// only current bytes; Flush writes every such copy back.
//
// Budgets. Every tier has a byte budget (the NVMe tier: its swap capacity) that is never
// exceeded: homes and cached copies both count. When a copy does not fit, unpinned cached copies
// in that tier are evicted — the one whose next use (SetNextUse) is furthest away first; copies
// with no hint go before hinted ones, least recently used first. While copies of that tier are
// moving (a prefetch or a write-back in flight) the call waits for them; if nothing can be
// evicted or waited for, it fails with ResourceExhausted naming the tier, its budget and what is
// pinned.
//
// Large tensors. A tensor is stored on NVMe as pieces of at most `piece_bytes`, and moves
// between the device and NVMe go through pinned staging buffers one piece at a time, so a
// tensor larger than any staging buffer (or than the host budget) is moved, never refused.
//
// Consistency. Acquire for writing is exclusive: it waits until no other pin and no transfer
// is active on the tensor, and afterwards every other copy is stale until refreshed from the
// written one (kOverwrite: the same, without first bringing the current bytes in, for a caller
// that writes every byte). Acquire for reading is shared. Bytes read always equal the last
// bytes written.
// A thread must not acquire a tensor it has acquired for writing (it would wait for itself).
//
// Errors. An NVMe failure reaches the call that needed the transfer (or the Prefetch future)
// with the tensor named; a failed write-back leaves the cached copy in place (nothing is lost).
// Any call on a freed tensor is FailedPrecondition (naming it when it was freed recently: the
// store keeps no record that grows with the number of tensors ever made).
//
// Thread-safety: all methods are thread-safe.
#ifndef ZINF_TIERED_STORE_H_
#define ZINF_TIERED_STORE_H_

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "zinf/aio.h"
#include "zinf/device.h"
#include "zinf/export.h"
#include "zinf/status.h"

namespace zinf {

enum class Tier : int { kDevice = 0, kHost = 1, kNvme = 2 };
ZINF_EXPORT std::string_view TierName(Tier tier);  // "device", "host", "nvme"

// kOverwrite is kWrite for a caller that overwrites every byte: no current copy is read in.
enum class Access { kRead, kWrite, kOverwrite };

struct ZINF_EXPORT TieredStoreOptions {
  // The device tier: "host" (the CPU as a device: host memory under device_budget_bytes;
  // behind a modelled link when ZINF_HOST_LINK_GBPS is set, see
  // HostDeviceOptions::ApplyEnvironment), "cuda:N", or "" for none.
  std::string device = "host";
  uint64_t device_budget_bytes = 0;  // must be > 0 when there is a device
  // Pinned host tier (homes and cached copies); must be > 0.
  uint64_t host_budget_bytes = 0;
  bool pin_host = true;  // page-lock the host tier (ordinary memory when false)
  int numa_node = -1;    // NUMA node of the host tier; -1: first touch
  // NVMe tier: swap directories (DeepSpeed: nvme_path); empty for none. Several paths stripe
  // the swap space across them; each path appears once.
  std::vector<std::string> nvme_paths;
  uint64_t nvme_capacity_bytes = 0;  // swap space; must be > 0 with paths
  bool nvme_checksum = true;         // CRC32C on write, verified on read
  // Names the swap files (zinf-swap-rank<rank>-<i>.bin), so that the stores of processes that
  // share a path (the ranks of a job) do not clash. >= 0.
  int nvme_rank = 0;
  // How the NVMe tier does its I/O (DeepSpeed: the "aio" config object).
  AioOptions nvme_aio;
  // Largest single NVMe I/O piece and size of each staging buffer, a multiple of 4096.
  uint64_t piece_bytes = 64ull << 20;
  int staging_buffers = 2;   // pinned buffers for device<->NVMe moves (separate from the budget)
  int transfer_threads = 2;  // threads that run Prefetch transfers

  // InvalidArgument naming the field.
  [[nodiscard]] Status Validate() const;
};

using TensorId = uint64_t;

struct LinkStats {
  uint64_t bytes = 0;
  double busy_seconds = 0;  // wall time with at least one transfer on the link
  double GBps() const { return busy_seconds > 0 ? bytes / busy_seconds / 1e9 : 0.0; }
};

struct TierStats {
  uint64_t budget_bytes = 0;
  uint64_t in_use_bytes = 0;
  uint64_t peak_bytes = 0;
};

struct TieredStoreStats {
  LinkStats host_to_device, device_to_host, host_to_nvme, nvme_to_host;
  TierStats tiers[3];  // indexed by Tier
  uint64_t evictions = 0;
  uint64_t write_backs = 0;
  uint64_t nvme_file_bytes = 0;  // the swap files' size on disk, all paths together
  uint64_t tensors = 0;          // live tensors
  uint64_t idle_scratch = 0;     // freed scratch tensors kept for reuse (see CreateScratch)
  // Entries in all of the store's bookkeeping: tensors, idle scratch, names of recently freed
  // tensors, queued jobs, NVMe extents and free ranges, the pools' free ranges. It depends on
  // what is live, never on how many tensors were made and freed before.
  uint64_t bookkeeping_entries = 0;
};

class ZINF_EXPORT TieredStore {
 public:
  // Opens the device (options.device), the pools and the swap files. Errors: InvalidArgument
  // (options), Unavailable (no such device), the swap store's errors for the NVMe paths.
  static StatusOr<std::unique_ptr<TieredStore>> Create(const TieredStoreOptions& options);
  // Create with the device tier on `device`, the compute device of the store's clients (they
  // enqueue their own work on its streams), instead of one named by options.device; the store
  // does not own it, and it must outlive the store. Null: no device tier.
  static StatusOr<std::unique_ptr<TieredStore>> Create(const TieredStoreOptions& options,
                                                       Device* device);
  // Waits for transfers; frees everything (dirty cached copies are not written back: Flush first).
  ~TieredStore();
  TieredStore(const TieredStore&) = delete;
  TieredStore& operator=(const TieredStore&) = delete;

  // A tensor of `size_bytes` (> 0) whose home is `home`, reading as zeros. Errors:
  // InvalidArgument (size 0, a tier this store lacks), ResourceExhausted (home tier full).
  StatusOr<TensorId> Create(std::string name, uint64_t size_bytes, Tier home);
  // Create for a tensor that is made and freed over and over (a gather's destination, a
  // gradient buffer), whose home is the device or host tier (else InvalidArgument). Free keeps
  // its memory for the next CreateScratch of the same size and home, which reads as zeros as
  // Create's does; idle scratch memory goes back to its tier before any cached copy is
  // evicted there. See Note [Scratch tensors] in offload/tiered_store.cc.
  StatusOr<TensorId> CreateScratch(std::string_view name, uint64_t size_bytes, Tier home);
  // Gives the memory of every idle scratch tensor back to its tier: a caller's loop that is
  // done for now (the engine, after each step) so that what the tiers hold between loops is
  // what is live.
  void ReleaseIdleScratch();
  // Frees every copy. FailedPrecondition while the tensor is acquired.
  Status Free(TensorId id);

  // Starts making a current copy resident in `tier` (asynchronous); the future holds the
  // outcome. Errors as for Acquire. `after`: device work still writing the tensor (an event
  // recorded after it, which must stay alive and unrecorded until the future is ready); the
  // move waits for it on a transfer thread, so a copy brought down from the device tier holds
  // what that work wrote, and the caller never waits on the host.
  std::shared_future<Status> Prefetch(TensorId id, Tier tier, Event* after = nullptr);
  // Copies `bytes` of tensor `id`'s device-tier copy, from byte `offset`, into host memory
  // `host_dst` that is the caller's (another tensor's acquired host copy, say), on a transfer
  // thread once `after` (when given) has completed, over the metered device-to-host link: for
  // a part of a device tensor that belongs in memory the store does not move. The device copy
  // stays acquired, and `host_dst` and `after` alive, until the future is ready. Errors:
  // FailedPrecondition (freed, or not acquired in the device tier), InvalidArgument (past the
  // tensor's end, or no device tier), the device's.
  std::shared_future<Status> CopyDownAsync(TensorId id, uint64_t offset, uint64_t bytes,
                                           void* host_dst, Event* after = nullptr);
  // Prefetch of several tensors as one job whose reads are in flight together; a tensor is
  // usable as soon as its own read is done. The future holds the first error.
  std::shared_future<Status> Prefetch(std::span<const TensorId> ids, Tier tier);
  // Memory in `tier` (device or host) now, for those of `ids` that have none there and are
  // idle, as one run where it fits (in the order and at the distances of their copies in the
  // other of the two tiers where they all have one there, else in the order given), else each
  // where it fits, never evicting: tensors about to be written together then move as one
  // copy. Best effort: a
  // tensor left out gets its memory when acquired, as any other. Errors: InvalidArgument for a tier
  // this store has not, or NVMe; FailedPrecondition for a freed tensor.
  Status Place(std::span<const TensorId> ids, Tier tier);
  // Blocks until a current copy is resident in `tier`, pins it, and returns its address (a
  // device pointer for Tier::kDevice, a host pointer for kHost). kNvme is not addressable:
  // InvalidArgument. Errors: FailedPrecondition (freed tensor), ResourceExhausted (tier full
  // of pinned copies), the I/O error of the transfer with the tensor named.
  StatusOr<void*> Acquire(TensorId id, Tier tier, Access access);
  // Unpins one Acquire of `tier`. FailedPrecondition when it was not acquired there.
  Status Release(TensorId id, Tier tier);
  // Drops the cached copy in `tier`, writing it back home first when it is the only current
  // one. InvalidArgument for the home tier; FailedPrecondition while acquired there.
  Status Evict(TensorId id, Tier tier);
  // Evict on a transfer thread: the caller goes on while a write-back runs. The future holds
  // the outcome; a failed write-back leaves the copy in place, as with Evict. A copy another
  // thread holds when the job runs is not refused but left to its holders: written home and
  // kept if it is only read, left as it is if it is being written.
  std::shared_future<Status> EvictAsync(TensorId id, Tier tier);
  // EvictAsync of several tensors as one job whose write-backs are in flight together (one
  // transfer thread's wake-up for all). The future holds the first error; each tensor whose
  // write-back succeeded is evicted.
  std::shared_future<Status> EvictAsync(std::span<const TensorId> ids, Tier tier);
  // EvictAsync of several tensors that keeps each copy, current in both tiers once its
  // write-back is done: a later eviction costs no write, and a later read in `tier` (or a copy
  // to a faster one) no NVMe read. How a writer that will read again soon sends its bytes home.
  std::shared_future<Status> WriteBackAsync(std::span<const TensorId> ids, Tier tier);
  // Writes every cached copy that is newer than its home back to the home, and waits for
  // prefetches in flight.
  Status Flush();
  // Eviction hint: the tensor's next use, in the caller's units (e.g. the index of the module
  // that needs it next in the traced order). Smaller is sooner. Negative clears the hint.
  Status SetNextUse(TensorId id, int64_t next_use);

  // ---- Streaming NVMe-homed tensors through the caller's buffers ----
  // For a client that streams many tensors through a few buffers of its own (the pipelined
  // optimizer step reads chunk i+1 and writes chunk i-1 while it updates chunk i): the home's
  // bytes move straight between NVMe and `buffer`, making no cached copy, every piece in
  // flight together; `done` runs once, on an I/O thread, with the first error (the tensor
  // named). `buffer` is host memory, 4096-aligned, of the tensor's size rounded up to 4096.
  // A tensor never written reads as zeros. The link meters count these moves. Errors, through
  // `done`: InvalidArgument (home not NVMe, buffer not aligned), FailedPrecondition (freed,
  // cached in another tier, or acquired). A stream waits for a transfer already on the tensor.
  void ReadHomeAsync(TensorId id, void* buffer, std::function<void(Status)> done);
  void WriteHomeAsync(TensorId id, const void* buffer, std::function<void(Status)> done);
  Status ReadHome(TensorId id, void* buffer);  // ReadHomeAsync, waiting for it
  Status WriteHome(TensorId id, const void* buffer);
  // Registers a host buffer that streams will use for the NVMe tier's fixed-buffer I/O;
  // OK without an NVMe tier. A refusal costs only per-I/O page pinning. Must not race with I/O.
  Status RegisterStreamBuffer(void* data, uint64_t size_bytes);

  // Tiers where a current copy is resident (for tests and tools).
  StatusOr<std::vector<Tier>> ResidentTiers(TensorId id);
  TieredStoreStats stats() const;
  std::string device_name() const;
  // The counters of the device tier's device (Device::transfer_counters), or the store's own
  // without one: where the store counts its waits, moves and memsets, and where its clients
  // count the host passes they make over its tensors (Note [Transfer counters] in
  // offload/tiered_store.cc). Lives as long as the store.
  TransferCounters& transfer_counters();

 private:
  struct Impl;
  explicit TieredStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace zinf

#endif  // ZINF_TIERED_STORE_H_
