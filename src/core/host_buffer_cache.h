// HostBufferCache: keeps freed HostBuffers by size and hands them out again.
//
// Note [Buffer reuse]
// A new HostBuffer is fresh mmap'd memory: its first touch costs a page fault and the kernel
// zeroing the page, and freeing it an munmap with a TLB shootdown. Code that frees and
// allocates the same sizes over and over pays that every time; the ZeRO engine does so for
// every parameter it stages from NVMe, gathers and takes gradients for, which is the whole
// model's bytes several times per micro-batch. Through the cache it pays once. A buffer is
// reused only for a request of exactly its size, and the cache holds at most `limit_bytes`,
// dropping the buffers given longest ago first, so it never holds more than the caller's
// churn needs.
//
// Thread-safety: all methods are thread-safe.
#ifndef ZINF_CORE_HOST_BUFFER_CACHE_H_
#define ZINF_CORE_HOST_BUFFER_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <mutex>

#include "zinf/host_memory.h"
#include "zinf/status.h"

namespace zinf {

class HostBufferCache {
 public:
  // Buffers it allocates use `options`; 0 bytes caches nothing.
  explicit HostBufferCache(uint64_t limit_bytes, HostAllocOptions options = {})
      : limit_bytes_(limit_bytes), options_(options) {}
  HostBufferCache(const HostBufferCache&) = delete;
  HostBufferCache& operator=(const HostBufferCache&) = delete;

  // A buffer of `size_bytes`: a cached one if there is one of that size (its contents are
  // whatever its last user left), else a new one (zero). Errors as HostBuffer::Allocate.
  StatusOr<HostBuffer> Take(size_t size_bytes);
  // Take, with every byte zero.
  StatusOr<HostBuffer> TakeZeroed(size_t size_bytes);
  // Keeps `buffer` for a later Take, making room by freeing the oldest cached buffers; a
  // buffer larger than the limit, or empty, is freed at once.
  void Give(HostBuffer buffer);
  // Frees every cached buffer.
  void Clear();

  uint64_t limit_bytes() const { return limit_bytes_; }
  uint64_t cached_bytes() const;
  // Takes served from the cache, and takes that allocated.
  uint64_t hits() const;
  uint64_t misses() const;

 private:
  using Entry = std::list<HostBuffer>::iterator;

  const uint64_t limit_bytes_;
  const HostAllocOptions options_;
  mutable std::mutex mu_;
  std::list<HostBuffer> buffers_;         // oldest first
  std::multimap<size_t, Entry> by_size_;  // into buffers_
  uint64_t cached_bytes_ = 0;
  uint64_t hits_ = 0;
  uint64_t misses_ = 0;
};

}  // namespace zinf

#endif  // ZINF_CORE_HOST_BUFFER_CACHE_H_
