// HostBuffer: mmap-backed aligned allocations, optionally NUMA-bound and page-locked.
#include "zinf/host_memory.h"

#include <fmt/core.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "core/log.h"
#include "core/units.h"

namespace zinf {
namespace {

class MlockPinner final : public HostPinner {
 public:
  std::string_view name() const override { return "mlock"; }
  Status Pin(void* data, size_t size_bytes) override {
    if (mlock(data, size_bytes) == 0) return OkStatus();
    const int err = errno;
    rlimit limit{};
    getrlimit(RLIMIT_MEMLOCK, &limit);
    const std::string limit_text =
        limit.rlim_cur == RLIM_INFINITY ? std::string("unlimited") : FormatBytes(limit.rlim_cur);
    return ResourceExhausted(fmt::format(
        "pinning {} of host memory with mlock failed: {} (RLIMIT_MEMLOCK is {}; raise it with "
        "'ulimit -l' or run with CAP_IPC_LOCK, or turn pin_memory off)",
        FormatBytes(size_bytes), std::strerror(err), limit_text));
  }
  void Unpin(void* data, size_t size_bytes) override { munlock(data, size_bytes); }
};

MlockPinner g_mlock_pinner;
std::atomic<HostPinner*> g_pinner{&g_mlock_pinner};

constexpr size_t kPageBytes = 4096;
constexpr size_t kHugePageBytes = 2 * 1024 * 1024;

}  // namespace

void SetHostPinner(HostPinner* pinner) {
  g_pinner.store(pinner != nullptr ? pinner : &g_mlock_pinner);
}

StatusOr<HostBuffer> HostBuffer::Allocate(size_t size_bytes, const HostAllocOptions& options) {
  if (!IsPowerOfTwo(options.alignment)) {
    return InvalidArgument(
        fmt::format("host alignment must be a power of two, got {}", options.alignment));
  }
  if (options.numa_node < -1 || options.numa_node >= 1024) {
    return InvalidArgument(
        fmt::format("numa_node must be -1 (first touch) or a node id, got {}", options.numa_node));
  }
  HostBuffer buffer;
  if (size_bytes == 0) return buffer;

  // mmap gives page alignment; a larger alignment is over-mapped and the edges trimmed.
  const size_t alignment = std::max(options.alignment, kPageBytes);
  const size_t rounded = AlignUp(size_bytes, kPageBytes);
  const size_t map_bytes = rounded + (alignment > kPageBytes ? alignment : 0);
  void* mapping =
      mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapping == MAP_FAILED) {
    return ErrnoStatus(errno, fmt::format("allocating {} of host memory", FormatBytes(size_bytes)));
  }
  auto base = reinterpret_cast<uintptr_t>(mapping);
  const uintptr_t aligned = AlignUp(base, alignment);
  if (alignment > kPageBytes) {
    if (aligned > base) munmap(mapping, aligned - base);
    const uintptr_t end = base + map_bytes;
    const uintptr_t keep_end = aligned + rounded;
    if (end > keep_end) munmap(reinterpret_cast<void*>(keep_end), end - keep_end);
  }
  buffer.mapping_ = reinterpret_cast<void*>(aligned);
  buffer.mapping_bytes_ = rounded;
  buffer.data_ = buffer.mapping_;
  buffer.size_bytes_ = size_bytes;

  if (options.huge_pages && rounded >= kHugePageBytes) {
    madvise(buffer.mapping_, rounded, MADV_HUGEPAGE);  // advisory: failure changes nothing
  }
  if (options.numa_node >= 0) {
    // mbind(2) via syscall: avoids a libnuma dependency for one call.
    unsigned long mask[1024 / (8 * sizeof(unsigned long))] = {};
    mask[options.numa_node / (8 * sizeof(unsigned long))] |=
        1UL << (options.numa_node % (8 * sizeof(unsigned long)));
    constexpr int kMpolBind = 2;
    if (syscall(SYS_mbind, buffer.mapping_, rounded, kMpolBind, mask, 1024, 0) != 0) {
      return ErrnoStatus(errno,
                         fmt::format("binding host memory to NUMA node {}", options.numa_node));
    }
  }
  if (options.pinned) {
    HostPinner* pinner = g_pinner.load();
    ZINF_RETURN_IF_ERROR(pinner->Pin(buffer.mapping_, rounded));
    buffer.pinner_ = pinner;
  }
  return buffer;
}

HostBuffer::HostBuffer(HostBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_bytes_(std::exchange(other.size_bytes_, 0)),
      mapping_(std::exchange(other.mapping_, nullptr)),
      mapping_bytes_(std::exchange(other.mapping_bytes_, 0)),
      pinner_(std::exchange(other.pinner_, nullptr)) {}

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
    mapping_ = std::exchange(other.mapping_, nullptr);
    mapping_bytes_ = std::exchange(other.mapping_bytes_, 0);
    pinner_ = std::exchange(other.pinner_, nullptr);
  }
  return *this;
}

HostBuffer::~HostBuffer() { Reset(); }

void HostBuffer::Reset() {
  if (mapping_ == nullptr) return;
  if (pinner_ != nullptr) pinner_->Unpin(mapping_, mapping_bytes_);
  if (munmap(mapping_, mapping_bytes_) != 0) {
    log::Error("munmap of {} failed: {}", FormatBytes(mapping_bytes_), std::strerror(errno));
  }
  mapping_ = data_ = nullptr;
  mapping_bytes_ = size_bytes_ = 0;
  pinner_ = nullptr;
}

}  // namespace zinf
