// What a storage path and the kernel can do for zinf: O_DIRECT, free space, io_uring.
//
// Used by `zinf info` and by SwapStore when it opens. Thread-safe (no shared state).
#ifndef ZINF_NVME_PATH_PROBE_H_
#define ZINF_NVME_PATH_PROBE_H_

#include <cstdint>
#include <string>

#include "zinf/status.h"

namespace zinf {

struct PathProbe {
  std::string path;
  uint64_t free_bytes = 0;  // available to this (unprivileged) user
  uint64_t total_bytes = 0;
  std::string filesystem;  // "ext4", "xfs", "tmpfs", ...
  bool writable = false;
  bool o_direct = false;       // an aligned O_DIRECT write + read round-trip worked
  std::string o_direct_error;  // why not, when o_direct is false
};

// Bytes free for this (unprivileged) user on the file system of `path`; the errno of statvfs
// as an error.
StatusOr<uint64_t> FreeBytes(const std::string& path);

// Probes directory `path`. Errors: InvalidArgument when it does not exist or is not a
// directory; other problems (read-only, no O_DIRECT) are reported in the fields.
StatusOr<PathProbe> ProbePath(const std::string& path);

struct IoUringProbe {
  bool available = false;
  std::string error;   // why not: "io_uring_setup: Function not implemented" (ENOSYS), EPERM...
  std::string kernel;  // uname -r
};

// Tries to set up (and tear down) a small ring.
IoUringProbe ProbeIoUring();

}  // namespace zinf

#endif  // ZINF_NVME_PATH_PROBE_H_
