// MemoryPool: arenas carved by ExtentAllocator. See offload/memory_pool.h.
#include "offload/memory_pool.h"

#include <fmt/core.h>

#include <algorithm>
#include <limits>

#include "core/log.h"
#include "core/units.h"

namespace zinf {

PoolBlock& PoolBlock::operator=(PoolBlock&& other) noexcept {
  if (this != &other) {
    Reset();
    pool_ = std::exchange(other.pool_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
    arena_ = other.arena_;
    offset_ = other.offset_;
  }
  return *this;
}

uint64_t PoolBlock::reserved_bytes() const {
  return pool_ == nullptr ? 0 : AlignUp(size_bytes_, pool_->alignment());
}

void PoolBlock::Reset() {
  if (pool_ != nullptr && data_ != nullptr) pool_->Free(arena_, offset_, size_bytes_);
  pool_ = nullptr;
  data_ = nullptr;
  size_bytes_ = 0;
}

namespace {

Status CheckAlignment(uint64_t alignment) {
  if (!IsPowerOfTwo(alignment) || alignment < 64) {
    return InvalidArgument(
        fmt::format("alignment must be a power of two >= 64, got {}", alignment));
  }
  return OkStatus();
}

}  // namespace

Status PinnedPoolOptions::Validate() const {
  if (budget_bytes == 0) return InvalidArgument("pinned pool budget_bytes must be > 0, got 0");
  if (arena_bytes > budget_bytes) {
    return InvalidArgument(
        fmt::format("pinned pool arena_bytes ({}) must not exceed budget_bytes ({})", arena_bytes,
                    budget_bytes));
  }
  ZINF_RETURN_IF_ERROR_CTX(CheckAlignment(alignment), "pinned pool");
  if (alignment > 4096 * 512) {
    return InvalidArgument(
        fmt::format("pinned pool alignment must be <= 2 MiB, got {}", alignment));
  }
  if (numa_node < -1) {
    return InvalidArgument(
        fmt::format("pinned pool numa_node must be -1 or a node id, got {}", numa_node));
  }
  if (device != nullptr && numa_node != -1) {
    return InvalidArgument(fmt::format(
        "pinned pool numa_node must be -1 when arenas come from a device, got {}", numa_node));
  }
  return OkStatus();
}

Status DevicePoolOptions::Validate() const {
  if (budget_bytes != 0 && arena_bytes > budget_bytes) {
    return InvalidArgument(
        fmt::format("device pool arena_bytes ({}) must not exceed budget_bytes ({})", arena_bytes,
                    budget_bytes));
  }
  return CheckAlignment(alignment).WithContext("device pool");
}

MemoryPool::MemoryPool(std::string name, uint64_t budget_bytes, uint64_t arena_bytes,
                       uint64_t alignment, uint64_t arena_slack_bytes)
    : name_(std::move(name)),
      arena_bytes_(arena_bytes),
      alignment_(alignment),
      arena_slack_bytes_(arena_slack_bytes),
      budget_(name_, budget_bytes) {}

StatusOr<std::unique_ptr<MemoryPool>> MemoryPool::CreatePinned(const PinnedPoolOptions& options) {
  ZINF_RETURN_IF_ERROR(options.Validate());
  uint64_t arena = options.arena_bytes == 0 ? options.budget_bytes : options.arena_bytes;
  std::unique_ptr<MemoryPool> pool(new MemoryPool(options.name, options.budget_bytes, arena,
                                                  options.alignment, options.arena_slack_bytes));
  pool->host_options_ = options;
  if (options.preallocate) {
    std::lock_guard lock(pool->mu_);
    while (pool->arena_total_ < options.budget_bytes) {
      ZINF_RETURN_IF_ERROR(
          pool->AddArenaLocked(std::min(arena, options.budget_bytes - pool->arena_total_))
              .status());
    }
  }
  return pool;
}

StatusOr<std::unique_ptr<MemoryPool>> MemoryPool::CreateOnDevice(Device& device,
                                                                 const DevicePoolOptions& options) {
  ZINF_RETURN_IF_ERROR(options.Validate());
  uint64_t budget = options.budget_bytes;
  uint64_t device_budget = device.memory_stats().budget_bytes;
  if (budget == 0) budget = device_budget;
  if (device_budget != 0 && budget > device_budget) {
    return InvalidArgument(fmt::format("{} budget_bytes ({}) exceeds the budget of {} ({})",
                                       options.name, FormatBytes(budget), device.name(),
                                       FormatBytes(device_budget)));
  }
  uint64_t arena = options.arena_bytes;
  if (arena == 0) arena = budget != 0 ? budget : 256 * kMiB;
  std::unique_ptr<MemoryPool> pool(new MemoryPool(options.name, budget, arena, options.alignment));
  pool->device_ = &device;
  if (options.preallocate && budget != 0) {
    std::lock_guard lock(pool->mu_);
    while (pool->arena_total_ < budget) {
      ZINF_RETURN_IF_ERROR(
          pool->AddArenaLocked(std::min(arena, budget - pool->arena_total_)).status());
    }
  }
  return pool;
}

MemoryPool::~MemoryPool() {
  if (blocks_ != 0) {
    log::Error("{}: destroyed with {} live blocks ({} in use); their memory is freed", name_,
               blocks_, FormatBytes(budget_.in_use_bytes()));
  }
}

StatusOr<size_t> MemoryPool::AddArenaLocked(uint64_t size_bytes) {
  auto arena = std::make_unique<Arena>(
      Arena{HostBuffer(), nullptr, size_bytes, ExtentAllocator(size_bytes, alignment_), 0});
  if (device_ != nullptr) {
    StatusOr<DeviceBuffer> buffer = device_->Allocate(size_bytes);
    if (!buffer.ok()) {
      return std::move(buffer).status().WithContext(
          fmt::format("{}: adding an arena of {}", name_, FormatBytes(size_bytes)));
    }
    arena->base = buffer->as<char>();
    arena->memory = std::move(*buffer);
  } else {
    StatusOr<HostBuffer> buffer = [&]() -> StatusOr<HostBuffer> {
      if (host_options_.device != nullptr) return host_options_.device->AllocateHost(size_bytes);
      HostAllocOptions host;
      host.alignment = std::max<uint64_t>(alignment_, 4096);
      host.pinned = host_options_.pinned;
      host.numa_node = host_options_.numa_node;
      return HostBuffer::Allocate(size_bytes, host);
    }();
    if (!buffer.ok()) {
      return std::move(buffer).status().WithContext(
          fmt::format("{}: adding an arena of {}", name_, FormatBytes(size_bytes)));
    }
    arena->base = buffer->as<char>();
    arena->memory = std::move(*buffer);
  }
  arena_total_ += size_bytes;
  // Reuse a trimmed slot so that live blocks' arena indices stay valid.
  for (size_t i = 0; i < arenas_.size(); ++i) {
    if (arenas_[i] == nullptr) {
      arenas_[i] = std::move(arena);
      return i;
    }
  }
  arenas_.push_back(std::move(arena));
  return arenas_.size() - 1;
}

StatusOr<PoolBlock> MemoryPool::Allocate(uint64_t size_bytes) {
  if (size_bytes == 0) return InvalidArgument(fmt::format("{}: cannot allocate 0 bytes", name_));
  const uint64_t rounded = AlignUp(size_bytes, alignment_);
  ZINF_ASSIGN_OR_RETURN(const Place place, Reserve(rounded, 1));
  return PoolBlock(this, place.data, size_bytes, place.arena, place.offset);
}

StatusOr<std::vector<PoolBlock>> MemoryPool::AllocateRun(std::span<const uint64_t> sizes) {
  uint64_t total = 0;
  for (uint64_t size : sizes) {
    if (size == 0) return InvalidArgument(fmt::format("{}: cannot allocate 0 bytes", name_));
    total += AlignUp(size, alignment_);
  }
  if (sizes.empty()) return std::vector<PoolBlock>();
  ZINF_ASSIGN_OR_RETURN(const Place place, Reserve(total, sizes.size()));
  std::vector<PoolBlock> blocks;
  blocks.reserve(sizes.size());
  uint64_t offset = 0;
  for (uint64_t size : sizes) {
    blocks.push_back(
        PoolBlock(this, place.data + offset, size, place.arena, place.offset + offset));
    offset += AlignUp(size, alignment_);
  }
  return blocks;
}

StatusOr<MemoryPool::Place> MemoryPool::Reserve(uint64_t rounded, size_t blocks) {
  ZINF_RETURN_IF_ERROR(budget_.Reserve(rounded));
  std::lock_guard lock(mu_);
  // Best fit across arenas: the arena whose largest hole is the smallest that fits.
  size_t best = arenas_.size();
  uint64_t best_largest = std::numeric_limits<uint64_t>::max();
  for (size_t i = 0; i < arenas_.size(); ++i) {
    if (arenas_[i] == nullptr) continue;
    uint64_t largest = arenas_[i]->extents.largest_free_bytes();
    if (largest >= rounded && largest < best_largest) {
      best = i;
      best_largest = largest;
    }
  }
  if (best == arenas_.size()) {
    // Note [Arena slack]: the arenas may exceed the budget by the slack, the blocks may not.
    const uint64_t limit =
        budget_.limit_bytes() == 0 ? 0 : budget_.limit_bytes() + arena_slack_bytes_;
    uint64_t size = std::max(arena_bytes_, rounded);
    if (limit != 0) size = std::min(size, limit - std::min(limit, arena_total_));
    if (size < rounded) {
      budget_.Release(rounded);
      uint64_t largest = 0, free = 0;
      size_t ranges = 0;
      for (const auto& a : arenas_) {
        if (a == nullptr) continue;
        largest = std::max(largest, a->extents.largest_free_bytes());
        free += a->extents.free_bytes();
        ranges += a->extents.free_ranges();
      }
      return ResourceExhausted(fmt::format(
          "{}: no free range of {} (largest free range {}, {} free in {} scattered ranges, "
          "budget {}{} fully assigned to arenas); free blocks or Trim() the pool",
          name_, FormatBytes(rounded), FormatBytes(largest), FormatBytes(free), ranges,
          FormatBytes(budget_.limit_bytes()),
          arena_slack_bytes_ == 0
              ? ""
              : fmt::format(" and its arena slack {}", FormatBytes(arena_slack_bytes_))));
    }
    StatusOr<size_t> added = AddArenaLocked(size);
    if (!added.ok()) {
      budget_.Release(rounded);
      return std::move(added).status();
    }
    best = *added;
  }
  Arena& arena = *arenas_[best];
  StatusOr<uint64_t> offset = arena.extents.Allocate(rounded, rounded < kSmallBlockBytes);
  if (!offset.ok()) {
    budget_.Release(rounded);
    return std::move(offset).status().WithContext(name_);
  }
  arena.blocks += blocks;
  blocks_ += blocks;
  return Place{best, *offset, arena.base + *offset};
}

void MemoryPool::Free(size_t arena, uint64_t offset, uint64_t size_bytes) noexcept {
  const uint64_t rounded = AlignUp(size_bytes, alignment_);
  {
    std::lock_guard lock(mu_);
    if (arena >= arenas_.size() || arenas_[arena] == nullptr) {
      log::Error("{}: free of a block in unknown arena {}", name_, arena);
      return;
    }
    Status status = arenas_[arena]->extents.Free(offset, rounded);
    if (!status.ok()) {
      log::Error("{}: {}", name_, status);
      return;
    }
    --arenas_[arena]->blocks;
    --blocks_;
  }
  budget_.Release(rounded);
}

uint64_t MemoryPool::Trim() {
  std::vector<std::unique_ptr<Arena>> released;
  uint64_t bytes = 0;
  {
    std::lock_guard lock(mu_);
    for (auto& arena : arenas_) {
      if (arena != nullptr && arena->blocks == 0) {
        bytes += arena->size_bytes;
        arena_total_ -= arena->size_bytes;
        released.push_back(std::move(arena));
      }
    }
  }
  return bytes;  // `released` frees the memory outside the lock
}

MemoryPoolStats MemoryPool::stats() const {
  MemoryPoolStats s;
  s.budget_bytes = budget_.limit_bytes();
  s.in_use_bytes = budget_.in_use_bytes();
  s.peak_in_use_bytes = budget_.peak_bytes();
  std::lock_guard lock(mu_);
  s.arena_bytes = arena_total_;
  s.blocks = blocks_;
  for (const auto& arena : arenas_) {
    if (arena == nullptr) continue;
    ++s.arenas;
    s.free_bytes += arena->extents.free_bytes();
    s.free_ranges += arena->extents.free_ranges();
    s.largest_free_bytes = std::max(s.largest_free_bytes, arena->extents.largest_free_bytes());
  }
  s.fragmentation =
      s.free_bytes == 0 ? 0.0 : 1.0 - static_cast<double>(s.largest_free_bytes) / s.free_bytes;
  return s;
}

void MemoryPool::ResetPeak() { budget_.ResetPeak(); }

}  // namespace zinf
