// UringEngine: the io_uring IoEngine. See Note [io_uring rings] in uring_engine.cc.
//
// thread_count rings, each with its own completion thread; pieces are dealt to rings in turn.
// Each ring keeps up to queue_depth pieces in flight, submits them one io_uring_enter per
// piece (or, with single_submit off, one per Submit or per batch of completions) and reaps on
// its own thread so that the submitter never waits for the device. Short reads
// and writes are resubmitted for the rest; registered buffers use READ_FIXED/WRITE_FIXED and
// registered files IOSQE_FIXED_FILE.
//
// Thread-safety: as IoEngine.
#ifndef ZINF_NVME_URING_ENGINE_H_
#define ZINF_NVME_URING_ENGINE_H_

#include <memory>

#include "nvme/io_engine.h"

namespace zinf {

// Errors: InvalidArgument from options.Validate(); Unavailable when the kernel refuses
// io_uring (ENOSYS, EPERM) or its memory (ENOMEM under RLIMIT_MEMLOCK); IoError otherwise.
StatusOr<std::unique_ptr<IoEngine>> CreateUringEngine(const AioOptions& options);

}  // namespace zinf

#endif  // ZINF_NVME_URING_ENGINE_H_
