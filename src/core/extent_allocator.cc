// ExtentAllocator: best-fit allocation with coalescing frees. Not thread-safe.
#include "core/extent_allocator.h"

#include <fmt/core.h>

#include "core/units.h"

namespace zinf {

ExtentAllocator::ExtentAllocator(uint64_t capacity_bytes, uint64_t alignment)
    : capacity_(capacity_bytes & ~(alignment - 1)), alignment_(alignment), free_bytes_(capacity_) {
  if (capacity_ > 0) free_.emplace(0, capacity_);
}

uint64_t ExtentAllocator::largest_free_bytes() const {
  uint64_t best = 0;
  for (const auto& [off, len] : free_) best = std::max(best, len);
  return best;
}

StatusOr<uint64_t> ExtentAllocator::Allocate(uint64_t size_bytes, bool top) {
  if (size_bytes == 0) return InvalidArgument("swap extent size must be positive, got 0");
  if (size_bytes > capacity_) {
    return ResourceExhausted(fmt::format("swap extent of {} is larger than the swap space ({})",
                                         FormatBytes(size_bytes), FormatBytes(capacity_)));
  }
  const uint64_t need = Round(size_bytes);
  auto best = free_.end();
  if (top) {
    for (auto it = free_.rbegin(); it != free_.rend(); ++it) {
      if (it->second >= need) {
        best = std::prev(it.base());
        break;
      }
    }
  } else {
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second >= need && (best == free_.end() || it->second < best->second)) {
        best = it;
        if (it->second == need) break;
      }
    }
  }
  if (best == free_.end()) {
    return ResourceExhausted(fmt::format(
        "swap space exhausted: need {} for an extent, largest free range is {}, {} free of {} "
        "in {} ranges",
        FormatBytes(need), FormatBytes(largest_free_bytes()), FormatBytes(free_bytes_),
        FormatBytes(capacity_), free_.size()));
  }
  const uint64_t start = best->first;
  const uint64_t left = best->second - need;
  free_.erase(best);
  if (left > 0) free_.emplace(top ? start : start + need, left);
  free_bytes_ -= need;
  return top ? start + left : start;
}

Status ExtentAllocator::Free(uint64_t offset, uint64_t size_bytes) {
  const uint64_t len = Round(size_bytes);
  if (size_bytes == 0 || offset % alignment_ != 0 || offset + len > capacity_ ||
      offset + len < offset) {
    return InvalidArgument(
        fmt::format("freeing swap range [{}, +{}): not an allocated extent of "
                    "[0, {})",
                    offset, size_bytes, capacity_));
  }
  // The range must not overlap any free range.
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && next->first < offset + len) {
    return InvalidArgument(fmt::format(
        "freeing swap range [{}, +{}) that is already free (double free)", offset, size_bytes));
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second > offset) {
      return InvalidArgument(fmt::format(
          "freeing swap range [{}, +{}) that is already free (double free)", offset, size_bytes));
    }
  }
  uint64_t start = offset;
  uint64_t length = len;
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      length += prev->second;
      free_.erase(prev);
    }
  }
  if (next != free_.end() && next->first == offset + len) {
    length += next->second;
    free_.erase(next);
  }
  free_.emplace(start, length);
  free_bytes_ += len;
  return OkStatus();
}

}  // namespace zinf
