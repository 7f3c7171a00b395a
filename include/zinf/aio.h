// AioOptions: how zinf's NVMe engine does its I/O — DeepSpeed's "aio" config keys and zinf's
// own. Plain data; nvme/aio_options.h reads them from JSON.
//
// Thread-safety: plain data.
#ifndef ZINF_AIO_H_
#define ZINF_AIO_H_

#include <cstdint>

#include "zinf/export.h"
#include "zinf/status.h"

namespace zinf {

enum class IoBackend {
  kAuto,     // io_uring when the kernel allows it, else the POSIX pool (the reason is logged)
  kIoUring,  // io_uring or an Unavailable error
  kPosix,    // a thread pool doing pread/pwrite
};

enum class DirectIo {
  kAuto,  // O_DIRECT where the file system takes it; buffered I/O with a warning elsewhere
  kOn,    // O_DIRECT or an error naming the file system
  kOff,   // buffered I/O through the page cache
};

// The deepest queue AioOptions::queue_depth accepts.
inline constexpr int kMaxAioQueueDepth = 4096;

struct ZINF_EXPORT AioOptions {
  // Largest single I/O the engine issues; larger requests are split into pieces of this size.
  // Bigger pieces mean fewer system calls, smaller ones more parallelism for one request.
  // A multiple of 4096 in [4 KiB, 256 MiB]. DeepSpeed: aio.block_size.
  uint64_t block_size = 1 << 20;
  // Pieces in flight per ring. Deeper queues keep more of a device busy; 8 MiB in flight
  // saturates the disks measured (See Note [Default aio options]). In [1, 4096].
  // DeepSpeed: aio.queue_depth.
  int queue_depth = 8;
  // Rings, each with its own completion thread (POSIX backend: a multiplier on its workers).
  // More than one helps only when a single core cannot keep the device busy (several drives).
  // In [1, 64]. DeepSpeed: aio.thread_count or aio.intra_op_parallelism.
  int thread_count = 1;
  // Submit every piece with its own system call. false batches the pieces ready at once into
  // one call, which saves system calls but lets the block layer merge adjacent pieces into
  // requests larger than block_size (See Note [Default aio options]). DeepSpeed:
  // aio.single_submit.
  bool single_submit = true;
  // DeepSpeed overlaps submission and completion when true. io_uring always does; the key is
  // accepted and has no effect. DeepSpeed: aio.overlap_events.
  bool overlap_events = true;

  // zinf's own keys.
  IoBackend backend = IoBackend::kAuto;  // aio.backend: "auto", "io_uring", "posix"
  DirectIo direct_io = DirectIo::kAuto;  // aio.direct_io: "auto", "on", "off"
  // Register caller buffers with the ring (READ_FIXED/WRITE_FIXED: no per-I/O page pinning).
  // Needs RLIMIT_MEMLOCK room; when refused the engine logs it and uses plain I/O.
  bool register_buffers = true;
  // Register file descriptors with the ring (no per-I/O file lookup).
  bool register_files = true;

  // InvalidArgument naming the field, its value and the allowed range.
  [[nodiscard]] Status Validate() const;
};

}  // namespace zinf

#endif  // ZINF_AIO_H_
