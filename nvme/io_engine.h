// IoEngine: asynchronous reads and writes of (file, offset, buffer, length).
//
// A request completes exactly once, through its callback or an IoWaiter, with OK only when
// every byte was transferred: the engine splits a request into AioOptions::block_size pieces,
// keeps up to queue_depth pieces in flight, and resubmits the rest of a short read or write.
// A read that meets the end of the file fails; it never reports a partial buffer as success.
//
// Backends: UringEngine (io_uring; nvme/uring_engine.h) and PosixEngine (pread/pwrite on a
// thread pool; nvme/posix_engine.h). CreateIoEngine picks one from AioOptions::backend. Tests
// and fault injection wrap an engine (tests/testing/faulty_engine.h).
//
// Direct I/O (See Note [Direct I/O alignment]): a file added with direct=true needs offsets
// that are multiples of kDirectIoAlignment. The engine stages the pieces of an unaligned
// buffer address or length through aligned slots of one block (Note [Staging unaligned direct
// I/O], engine_base.h); for a write with an unaligned length it writes zeros from
// the end of the data to the next alignment boundary, so the caller must own that padding
// (SwapStore's extents do).
//
// Thread-safety: Submit, AddFile and Drain may be called from any thread. Callbacks run on an
// engine thread (or on the submitting thread for requests rejected up front); they must not
// block on other requests of the same engine, and may submit new ones. RegisterBuffer must not
// race with I/O.
#ifndef ZINF_NVME_IO_ENGINE_H_
#define ZINF_NVME_IO_ENGINE_H_

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "nvme/aio_options.h"
#include "zinf/status.h"

namespace zinf {

// Note [Direct I/O alignment]
// O_DIRECT needs the file offset, the length and the memory address aligned to the device's
// logical block (512 B or 4 KiB; statx STATX_DIOALIGN reports it). zinf always uses 4096:
// it is a multiple of every logical block size in use, equals the page size HostBuffer aligns
// to, and keeps swap files portable between devices.
inline constexpr uint64_t kDirectIoAlignment = 4096;

enum class IoOp : uint8_t { kRead, kWrite };
std::string_view IoOpName(IoOp op);  // "read", "write"

struct IoRequest {
  IoOp op = IoOp::kRead;
  int file = -1;           // from IoEngine::AddFile
  uint64_t offset = 0;     // bytes into the file
  void* buffer = nullptr;  // read into / write from; must stay valid until completion
  uint64_t length = 0;
};

// Called once when a request completes: OK, or the error naming file, offset and length.
using IoCallback = std::function<void(Status)>;

// Waits for a group of requests: Add before each submission, then Wait. Keeps the first error.
// Must outlive the requests counted in it. Thread-safe.
class IoWaiter {
 public:
  IoWaiter() = default;
  IoWaiter(const IoWaiter&) = delete;
  IoWaiter& operator=(const IoWaiter&) = delete;
  ~IoWaiter();  // waits for outstanding requests: their callbacks reference this object

  void Add(int count = 1);
  void Done(Status status);
  // A callback that calls Done; Add(1) first.
  IoCallback Callback();
  // Blocks until every counted request completed; returns the first error (or OK) and resets.
  [[nodiscard]] Status Wait();
  bool Idle() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int64_t pending_ = 0;
  Status first_error_;
};

// An open file descriptor; closed on destruction.
class IoFile {
 public:
  IoFile() = default;
  IoFile(int fd, std::string path, bool direct)
      : fd_(fd), path_(std::move(path)), direct_(direct) {}
  IoFile(IoFile&& other) noexcept;
  IoFile& operator=(IoFile&& other) noexcept;
  IoFile(const IoFile&) = delete;
  IoFile& operator=(const IoFile&) = delete;
  ~IoFile();

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  bool direct() const { return direct_; }

 private:
  int fd_ = -1;
  std::string path_;
  bool direct_ = false;
};

// Opens `path` read-write (creating it when `create`), with O_DIRECT as `mode` says. With
// kAuto, a file system that refuses O_DIRECT (EINVAL) gets buffered I/O and a warning.
// Errors: InvalidArgument (missing directory, not a regular file), FailedPrecondition
// (read-only file system or no permission), Unavailable (O_DIRECT required and refused).
StatusOr<IoFile> OpenIoFile(const std::string& path, bool create, DirectIo mode);

class IoEngine {
 public:
  virtual ~IoEngine() = default;

  // "io_uring" or "posix" (wrappers add their own prefix).
  virtual std::string_view name() const = 0;
  virtual const AioOptions& options() const = 0;

  // Makes `file` usable in requests and returns its id. `file` is not owned and must stay open
  // until the engine is destroyed. ResourceExhausted beyond kMaxFiles files.
  static constexpr int kMaxFiles = 256;
  virtual StatusOr<int> AddFile(const IoFile& file) = 0;

  // Registers [data, data + size_bytes) for fixed-buffer I/O (io_uring READ_FIXED/WRITE_FIXED).
  // Requests within a registered range then skip per-I/O page pinning. Optional: backends
  // without the notion return OK. Must not race with I/O.
  [[nodiscard]] virtual Status RegisterBuffer(void* data, uint64_t size_bytes) {
    (void)data;
    (void)size_bytes;
    return OkStatus();
  }

  // Starts `request`; `done` runs once it has completed. Never blocks on the device: pieces
  // beyond queue_depth wait in the engine. A request rejected up front (bad file id, null
  // buffer, unaligned direct offset) completes at once on this thread with InvalidArgument.
  virtual void Submit(const IoRequest& request, IoCallback done) = 0;

  // Submit counted in `waiter` (which must outlive the request).
  void Submit(const IoRequest& request, IoWaiter* waiter);

  // Blocks until every request submitted so far has completed (callbacks included).
  virtual void Drain() = 0;
};

// Creates the engine `options` asks for. With IoBackend::kAuto an io_uring that the kernel
// refuses (ENOSYS, or EPERM under seccomp or io_uring_disabled) gives the POSIX engine and an
// info log naming the reason. Errors: InvalidArgument from options.Validate(); Unavailable
// when io_uring was required and is refused.
StatusOr<std::unique_ptr<IoEngine>> CreateIoEngine(const AioOptions& options);

}  // namespace zinf

#endif  // ZINF_NVME_IO_ENGINE_H_
