#include "core/host_buffer_cache.h"

#include <cstring>
#include <utility>

namespace zinf {

StatusOr<HostBuffer> HostBufferCache::Take(size_t size_bytes) {
  {
    std::lock_guard lock(mu_);
    auto found = by_size_.find(size_bytes);
    if (found != by_size_.end()) {
      HostBuffer buffer = std::move(*found->second);
      buffers_.erase(found->second);
      by_size_.erase(found);
      cached_bytes_ -= size_bytes;
      ++hits_;
      return buffer;
    }
    ++misses_;
  }
  return HostBuffer::Allocate(size_bytes, options_);
}

StatusOr<HostBuffer> HostBufferCache::TakeZeroed(size_t size_bytes) {
  {
    std::lock_guard lock(mu_);
    if (!by_size_.contains(size_bytes)) {
      ++misses_;
      return HostBuffer::Allocate(size_bytes, options_);  // mmap'd memory is zero
    }
  }
  ZINF_ASSIGN_OR_RETURN(HostBuffer buffer, Take(size_bytes));
  std::memset(buffer.data(), 0, buffer.size_bytes());
  return buffer;
}

void HostBufferCache::Give(HostBuffer buffer) {
  const size_t size = buffer.size_bytes();
  if (size == 0 || size > limit_bytes_) return;
  HostBuffer evicted;  // freed outside the lock, one at a time
  std::unique_lock lock(mu_);
  while (cached_bytes_ + size > limit_bytes_) {
    Entry oldest = buffers_.begin();
    auto [first, last] = by_size_.equal_range(oldest->size_bytes());
    while (first->second != oldest) ++first;
    by_size_.erase(first);
    cached_bytes_ -= oldest->size_bytes();
    evicted = std::move(*oldest);
    buffers_.erase(oldest);
    lock.unlock();
    evicted = HostBuffer();
    lock.lock();
  }
  buffers_.push_back(std::move(buffer));
  by_size_.emplace(size, std::prev(buffers_.end()));
  cached_bytes_ += size;
}

void HostBufferCache::Clear() {
  std::list<HostBuffer> freed;
  {
    std::lock_guard lock(mu_);
    freed.swap(buffers_);
    by_size_.clear();
    cached_bytes_ = 0;
  }
}

uint64_t HostBufferCache::cached_bytes() const {
  std::lock_guard lock(mu_);
  return cached_bytes_;
}

uint64_t HostBufferCache::hits() const {
  std::lock_guard lock(mu_);
  return hits_;
}

uint64_t HostBufferCache::misses() const {
  std::lock_guard lock(mu_);
  return misses_;
}

}  // namespace zinf
