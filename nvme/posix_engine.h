// PosixEngine: the fallback IoEngine — a pool of threads doing pread/pwrite, used where
// io_uring is refused (old kernels, seccomp, io_uring_disabled) or when
// AioOptions::backend is "posix".
//
// Parallelism: min(queue_depth, 32) x thread_count workers (at most 256), each with one piece
// in flight.
// Short transfers are continued by the same worker; EINTR/EAGAIN are retried.
//
// Thread-safety: as IoEngine.
#ifndef ZINF_NVME_POSIX_ENGINE_H_
#define ZINF_NVME_POSIX_ENGINE_H_

#include <memory>

#include "nvme/io_engine.h"

namespace zinf {

// Errors: InvalidArgument from options.Validate().
StatusOr<std::unique_ptr<IoEngine>> CreatePosixEngine(const AioOptions& options);

}  // namespace zinf

#endif  // ZINF_NVME_POSIX_ENGINE_H_
