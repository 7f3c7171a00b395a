// MemoryPool: a pool of large arenas carved into blocks, for pinned host memory (staging
// buffers, host-resident optimizer state) and for device memory.
//
// Arenas are made on demand, each at least `arena_bytes` (a larger request gets an arena of
// its own size), and never more in total than the budget. Inside an arena, blocks come from an
// ExtentAllocator (src/core/extent_allocator.h): best fit with coalescing, rounded only to the
// alignment, so a 1.1 GiB request costs 1.1 GiB and not the 2 GiB a power-of-two allocator
// takes (See Note [Pool sizing]). The budget is a MemoryBudget on the bytes in blocks, so an
// over-budget request gets the standard ResourceExhausted message naming the pool, what is in
// use and what was asked.
//
// Thread-safety: all methods are thread-safe. A PoolBlock may be moved between threads; it
// must be destroyed before its pool. A block's memory may still be the source or target of
// queued device work when it is freed: waiting for that work is the caller's job, as for
// DeviceBuffer.
#ifndef ZINF_OFFLOAD_MEMORY_POOL_H_
#define ZINF_OFFLOAD_MEMORY_POOL_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "core/extent_allocator.h"
#include "core/memory_budget.h"
#include "zinf/device.h"
#include "zinf/host_memory.h"
#include "zinf/status.h"

namespace zinf {

// Note [Pool sizing]
// DeepSpeed's pinned buffers and PyTorch's caching host allocator round requests to powers of
// two and keep freed blocks per size class, so a model whose tensors are just over a power of
// two pins nearly twice its size (DeepSpeed #3000). MemoryPool rounds only to `alignment`
// (4 KiB by default, what O_DIRECT needs) and merges free neighbours, so the pinned memory is
// what the blocks in use need plus the holes between them; `fragmentation` reports the holes.
//
// Note [Small blocks at the top]
// Holes come from blocks of very different lifetimes side by side. A training step allocates
// a module's large parameter and gradient buffers, which live for a module, next to its small
// ones (biases, norms), many of which persist for the whole run: placed best-fit, each small
// block lands just after its module's large ones, and once those are freed, the persistent
// small blocks cut the arena into holes the size of one layer's matrices. On the 2.8B `scale`
// GPT (25 layers) 1 MiB of them left a 1.52 GiB device tier with 1.30 GiB free and no hole
// larger than 72 MiB, and the first 108 MiB gradient failed. So blocks below kSmallBlockBytes
// (PyTorch's caching allocator keeps blocks below the same size in a pool of their own) come
// from the top of an arena, and large ones best-fit from the bottom: the small blocks gather
// at one end, whatever their lifetimes, and large holes stay whole.

// Note [Arena slack]
// Blocks that live long in arenas of a fixed size leave tails no larger block can take: the
// host tier's small shards fill a 1 GiB arena before a flat array of the optimizer asks for
// one of its own, and a budget of exactly what the blocks need then has no room for the last
// array (a 605M model with its parameters in host memory failed at initialize so). Raising the
// budget by an arena would make the room, but a budget is also what a cache fills: the store
// keeps cached copies until the budget is reached, and the 1B `large` on NVMe then held 1 GiB
// more for nothing. So the slack is the arenas', not the blocks': arena_slack_bytes lets the
// arenas together exceed the budget, while the bytes in blocks, and so every cache, stay
// within it. Tails are untouched memory: pageable arenas cost no resident memory for them.

// Note [Runs of blocks]
// Tensors that always move together (a module's parameters, fetched to the device as one
// batch) move in one copy when their blocks follow one another at the same distances in both
// tiers: per copy a GPU pays a launch and the link a ramp, and a batch of small copies leaves
// PCIe well below its rate. AllocateRun places such blocks as one reservation split in order;
// a copy between two runs then also carries the rounding between blocks, which belongs to the
// block before it on both sides.

struct MemoryPoolStats {
  uint64_t budget_bytes = 0;        // 0: unlimited
  uint64_t arena_bytes = 0;         // memory held by arenas (what is pinned or allocated)
  uint64_t in_use_bytes = 0;        // bytes in live blocks (rounded to the alignment)
  uint64_t peak_in_use_bytes = 0;   // highest in_use_bytes since creation or ResetPeak
  uint64_t free_bytes = 0;          // arena_bytes - in_use_bytes
  uint64_t largest_free_bytes = 0;  // largest block that fits without a new arena
  size_t arenas = 0;
  size_t blocks = 0;
  size_t free_ranges = 0;  // holes across the arenas
  // 1 - largest_free / free: 0 when the free space is one range (or there is none), near 1
  // when it is scattered in small holes.
  double fragmentation = 0.0;
};

class MemoryPool;

// One block of a pool; returns its bytes to the pool when destroyed. Move-only.
class PoolBlock {
 public:
  PoolBlock() = default;
  PoolBlock(PoolBlock&& other) noexcept { *this = std::move(other); }
  PoolBlock& operator=(PoolBlock&& other) noexcept;
  PoolBlock(const PoolBlock&) = delete;
  PoolBlock& operator=(const PoolBlock&) = delete;
  ~PoolBlock() { Reset(); }

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  uint64_t size_bytes() const { return size_bytes_; }  // as requested
  // The bytes the block holds in its pool: its size rounded up to the pool's alignment.
  uint64_t reserved_bytes() const;
  bool empty() const { return data_ == nullptr; }
  void Reset();

 private:
  friend class MemoryPool;
  PoolBlock(MemoryPool* pool, void* data, uint64_t size_bytes, size_t arena, uint64_t offset)
      : pool_(pool), data_(data), size_bytes_(size_bytes), arena_(arena), offset_(offset) {}

  MemoryPool* pool_ = nullptr;
  void* data_ = nullptr;
  uint64_t size_bytes_ = 0;
  size_t arena_ = 0;
  uint64_t offset_ = 0;
};

// The size of the host tier's arenas (TieredStore), pinned as they are needed. Small tensors
// fill an arena whose free tail no larger block can take, so the host tier's arenas may hold
// one arena more than its budget, above one arena (PinnedPoolOptions::arena_slack_bytes).
inline constexpr uint64_t kHostTierArenaBytes = 1ull << 30;

struct PinnedPoolOptions {
  // Bytes the pool may hand out (and pin); must be > 0.
  uint64_t budget_bytes = 0;
  // Size of each arena; 0 means one arena of the whole budget. Smaller arenas pin memory as
  // it is needed, at the price of more places where a large block may not fit.
  uint64_t arena_bytes = 0;
  // How far the arenas together may exceed the budget: room for the tails that small blocks
  // leave in their arenas and a larger block cannot use (Note [Arena slack]). The blocks in
  // use stay within budget_bytes; only arenas are made beyond it, and only for a block that
  // fits nowhere else.
  uint64_t arena_slack_bytes = 0;
  // Block alignment, a power of two >= 64. 4096 suits O_DIRECT and registered I/O.
  uint64_t alignment = 4096;
  // Make every arena at Create instead of on first use (fails early when pinning is refused).
  bool preallocate = false;
  // Page-lock the arenas. false gives ordinary (pageable) memory with the same accounting.
  bool pinned = true;
  // Bind arenas to this NUMA node; -1 leaves placement to first touch.
  int numa_node = -1;
  // When set, arenas come from device->AllocateHost (the device's own pinning, e.g.
  // cudaHostAlloc-compatible registration); numa_node must then be -1. Not owned.
  Device* device = nullptr;
  std::string name = "pinned pool";

  // InvalidArgument naming the field.
  [[nodiscard]] Status Validate() const;
};

struct DevicePoolOptions {
  // Bytes the pool may hand out; 0 means the device's own budget (or unlimited if it has none).
  uint64_t budget_bytes = 0;
  // Size of each arena; 0 means the budget (one arena) when there is one, else 256 MiB.
  uint64_t arena_bytes = 0;
  uint64_t alignment = 256;  // a power of two >= 64
  bool preallocate = false;
  std::string name = "device pool";

  [[nodiscard]] Status Validate() const;
};

class MemoryPool {
 public:
  // Blocks smaller than this come from the top of an arena (Note [Small blocks at the top]).
  static constexpr uint64_t kSmallBlockBytes = 1 << 20;

  // Errors: InvalidArgument for bad options; with preallocate, the arena allocation's error.
  static StatusOr<std::unique_ptr<MemoryPool>> CreatePinned(const PinnedPoolOptions& options);
  // `device` is not owned and must outlive the pool.
  static StatusOr<std::unique_ptr<MemoryPool>> CreateOnDevice(Device& device,
                                                              const DevicePoolOptions& options);
  // Blocks must have been destroyed; live ones are reported in the log and their memory freed.
  ~MemoryPool();
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  // A block of `size_bytes` (> 0). Errors: InvalidArgument for 0; ResourceExhausted when the
  // budget would be exceeded (the standard MemoryBudget message) or when the free space is too
  // fragmented for the request and no arena can be added (the message gives the largest free
  // range); the arena allocation's own error when the system refuses memory or pinning.
  StatusOr<PoolBlock> Allocate(uint64_t size_bytes);
  // Blocks of `sizes` (each > 0), in order, each starting where the one before ends after its
  // rounding to the alignment: what is moved together can go as one copy (Note [Runs of
  // blocks]). Each block is freed on its own. Errors: Allocate's, for the run's total.
  StatusOr<std::vector<PoolBlock>> AllocateRun(std::span<const uint64_t> sizes);

  // Frees arenas that hold no block. Returns the bytes released.
  uint64_t Trim();

  MemoryPoolStats stats() const;
  void ResetPeak();
  const std::string& name() const { return name_; }
  bool is_device() const { return device_ != nullptr; }
  uint64_t alignment() const { return alignment_; }

 private:
  struct Arena {
    std::variant<HostBuffer, DeviceBuffer> memory;
    char* base = nullptr;
    uint64_t size_bytes = 0;
    ExtentAllocator extents;
    size_t blocks = 0;
  };
  friend class PoolBlock;

  // Where a reservation lies.
  struct Place {
    size_t arena = 0;
    uint64_t offset = 0;
    char* data = nullptr;
  };

  MemoryPool(std::string name, uint64_t budget_bytes, uint64_t arena_bytes, uint64_t alignment,
             uint64_t arena_slack_bytes = 0);
  // `rounded` bytes, best fit across the arenas, to be split into `blocks` blocks.
  StatusOr<Place> Reserve(uint64_t rounded, size_t blocks);
  // Adds an arena of `size_bytes`; mu_ held.
  StatusOr<size_t> AddArenaLocked(uint64_t size_bytes);
  void Free(size_t arena, uint64_t offset, uint64_t size_bytes) noexcept;

  const std::string name_;
  const uint64_t arena_bytes_;
  const uint64_t alignment_;
  const uint64_t arena_slack_bytes_;
  MemoryBudget budget_;  // bytes in blocks
  PinnedPoolOptions host_options_;
  Device* device_ = nullptr;

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Arena>> arenas_;  // null entries are trimmed arenas
  uint64_t arena_total_ = 0;
  size_t blocks_ = 0;
};

}  // namespace zinf

#endif  // ZINF_OFFLOAD_MEMORY_POOL_H_
