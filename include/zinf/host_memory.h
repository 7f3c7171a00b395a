// Aligned and pinned host memory with RAII owners.
//
// HostBuffer owns one page-aligned allocation made with mmap. Pages are not touched at
// allocation, so the thread that first writes a page places it on its own NUMA node
// (first touch) unless HostAllocOptions::numa_node binds it. A pinned buffer is page-locked
// for DMA: through the installed HostPinner (the CUDA device installs one that calls
// cudaHostRegister) or, without one, mlock.
//
// Thread-safety: a HostBuffer is a value; distinct buffers may be used concurrently.
// SetHostPinner must not race with allocations.
#ifndef ZINF_HOST_MEMORY_H_
#define ZINF_HOST_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "zinf/export.h"
#include "zinf/status.h"

namespace zinf {

struct HostAllocOptions {
  // Alignment of data(); a power of two. Default: one page, which O_DIRECT needs.
  size_t alignment = 4096;
  // Page-lock the memory so devices can DMA from it. Costs locked RAM; fails with
  // ResourceExhausted when RLIMIT_MEMLOCK (or the GPU driver) refuses.
  bool pinned = false;
  // Bind the pages to this NUMA node; -1 leaves placement to first touch.
  int numa_node = -1;
  // Ask for transparent huge pages on buffers of 2 MiB or more (fewer TLB misses when
  // streaming optimizer state).
  bool huge_pages = true;
};

// Page-locks memory for DMA. The CUDA device installs one (cudaHostRegister); the default
// uses mlock.
class ZINF_EXPORT HostPinner {
 public:
  virtual ~HostPinner() = default;
  virtual std::string_view name() const = 0;
  virtual Status Pin(void* data, size_t size_bytes) = 0;
  virtual void Unpin(void* data, size_t size_bytes) = 0;
};

// Installs `pinner` (not owned; must outlive every pinned buffer made while it is installed).
// nullptr restores mlock. Each buffer remembers the pinner that pinned it.
ZINF_EXPORT void SetHostPinner(HostPinner* pinner);

class ZINF_EXPORT HostBuffer {
 public:
  // Allocates `size_bytes` (0 gives an empty buffer). Errors: InvalidArgument for a bad
  // alignment or NUMA node; ResourceExhausted when memory or pinning is refused.
  static StatusOr<HostBuffer> Allocate(size_t size_bytes, const HostAllocOptions& options = {});

  HostBuffer() = default;
  HostBuffer(HostBuffer&& other) noexcept;
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer();

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t size_bytes() const { return size_bytes_; }
  bool pinned() const { return pinner_ != nullptr; }
  bool empty() const { return size_bytes_ == 0; }

 private:
  void Reset();

  void* data_ = nullptr;
  size_t size_bytes_ = 0;
  void* mapping_ = nullptr;  // what munmap takes (may start before data_ for large alignments)
  size_t mapping_bytes_ = 0;
  HostPinner* pinner_ = nullptr;
};

}  // namespace zinf

#endif  // ZINF_HOST_MEMORY_H_
