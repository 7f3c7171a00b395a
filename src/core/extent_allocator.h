// ExtentAllocator: hands out aligned ranges of a fixed address space (SwapStore's striped
// swap space) and takes them back, merging neighbours so that freed space is reused whole.
//
// Best fit over a free list ordered by offset; O(free ranges) per Allocate, O(log) per Free.
// Not thread-safe: SwapStore holds its mutex around every call.
#ifndef ZINF_CORE_EXTENT_ALLOCATOR_H_
#define ZINF_CORE_EXTENT_ALLOCATOR_H_

#include <cstdint>
#include <map>

#include "zinf/status.h"

namespace zinf {

class ExtentAllocator {
 public:
  // `capacity_bytes` and `alignment` (a power of two) define the space [0, capacity).
  ExtentAllocator(uint64_t capacity_bytes, uint64_t alignment);

  // An offset for `size_bytes` rounded up to the alignment: the start of the smallest free
  // range that holds it, or with `top` the end of the highest one, so that what is asked for
  // that way gathers at the top of the space, clear of the rest (MemoryPool's small blocks).
  // InvalidArgument for size 0; ResourceExhausted saying what was asked, the largest free
  // range and the total free.
  StatusOr<uint64_t> Allocate(uint64_t size_bytes, bool top = false);
  // Returns [offset, offset + size_bytes rounded up) to the free list. InvalidArgument when the
  // range was not allocated (double free, wrong size): the free list is left unchanged.
  [[nodiscard]] Status Free(uint64_t offset, uint64_t size_bytes);

  uint64_t capacity_bytes() const { return capacity_; }
  uint64_t free_bytes() const { return free_bytes_; }
  uint64_t largest_free_bytes() const;
  size_t free_ranges() const { return free_.size(); }

 private:
  uint64_t Round(uint64_t size) const { return (size + alignment_ - 1) & ~(alignment_ - 1); }

  uint64_t capacity_;
  uint64_t alignment_;
  uint64_t free_bytes_;
  std::map<uint64_t, uint64_t> free_;  // offset -> length, disjoint and never adjacent
};

}  // namespace zinf

#endif  // ZINF_CORE_EXTENT_ALLOCATOR_H_
