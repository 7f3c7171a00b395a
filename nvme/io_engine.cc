// IoWaiter, IoFile, OpenIoFile and CreateIoEngine (backend choice). Thread-safety: see
// io_engine.h.
#include "nvme/io_engine.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/log.h"
#include "nvme/posix_engine.h"
#include "nvme/uring_engine.h"

namespace zinf {

std::string_view IoOpName(IoOp op) { return op == IoOp::kRead ? "read" : "write"; }

// ---------------------------------------------------------------------------------------------
// IoWaiter

IoWaiter::~IoWaiter() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return pending_ == 0; });
}

void IoWaiter::Add(int count) {
  std::lock_guard<std::mutex> lock(mu_);
  pending_ += count;
}

void IoWaiter::Done(Status status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!status.ok() && first_error_.ok()) first_error_ = std::move(status);
  if (--pending_ == 0) cv_.notify_all();
}

IoCallback IoWaiter::Callback() {
  return [this](Status s) { Done(std::move(s)); };
}

Status IoWaiter::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return pending_ == 0; });
  Status s = std::move(first_error_);
  first_error_ = OkStatus();
  return s;
}

bool IoWaiter::Idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_ == 0;
}

void IoEngine::Submit(const IoRequest& request, IoWaiter* waiter) {
  waiter->Add(1);
  Submit(request, waiter->Callback());
}

// ---------------------------------------------------------------------------------------------
// IoFile

IoFile::IoFile(IoFile&& other) noexcept
    : fd_(other.fd_), path_(std::move(other.path_)), direct_(other.direct_) {
  other.fd_ = -1;
}

IoFile& IoFile::operator=(IoFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    direct_ = other.direct_;
    other.fd_ = -1;
  }
  return *this;
}

IoFile::~IoFile() {
  if (fd_ >= 0 && close(fd_) != 0) {
    log::Warn("closing {}: {}", path_, std::strerror(errno));
  }
}

StatusOr<IoFile> OpenIoFile(const std::string& path, bool create, DirectIo mode) {
  int flags = O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0);
  const bool want_direct = mode != DirectIo::kOff;
  int fd = open(path.c_str(), flags | (want_direct ? O_DIRECT : 0), 0600);
  bool direct = want_direct;
  if (fd < 0 && want_direct && errno == EINVAL) {
    if (mode == DirectIo::kOn) {
      return Unavailable(fmt::format(
          "opening {} with O_DIRECT: the file system refuses it (aio.direct_io=on); use a "
          "path on a disk file system or set aio.direct_io to auto",
          path));
    }
    log::Warn(
        "{}: the file system refuses O_DIRECT; using buffered I/O, which goes through "
        "the page cache and is slower for swap traffic",
        path);
    fd = open(path.c_str(), flags, 0600);
    direct = false;
  }
  if (fd < 0) {
    const int err = errno;
    switch (err) {
      case ENOENT:
        return InvalidArgument(
            fmt::format("opening {}: the file or its directory does not exist", path));
      case EROFS:
        return FailedPrecondition(
            fmt::format("opening {} for writing: read-only file system", path));
      case EACCES:
      case EPERM:
        return FailedPrecondition(fmt::format("opening {} for writing: permission denied", path));
      case EISDIR:
        return InvalidArgument(fmt::format("opening {}: is a directory, expected a file", path));
      default:
        return ErrnoStatus(err, fmt::format("opening {}", path));
    }
  }
  IoFile file(fd, path, direct);
  struct stat st {};
  if (fstat(fd, &st) != 0) return ErrnoStatus(errno, fmt::format("fstat {}", path));
  if (!S_ISREG(st.st_mode)) {
    return InvalidArgument(fmt::format("{} is not a regular file", path));
  }
  return file;
}

// ---------------------------------------------------------------------------------------------
// CreateIoEngine

StatusOr<std::unique_ptr<IoEngine>> CreateIoEngine(const AioOptions& options) {
  ZINF_RETURN_IF_ERROR(options.Validate());
  if (options.backend == IoBackend::kPosix) return CreatePosixEngine(options);
  auto uring = CreateUringEngine(options);
  if (uring.ok()) return uring;
  if (options.backend == IoBackend::kIoUring || uring.status().code() != StatusCode::kUnavailable) {
    return std::move(uring).status();
  }
  log::Info("io_uring is not available ({}); using the POSIX thread-pool engine",
            uring.status().message());
  return CreatePosixEngine(options);
}

}  // namespace zinf
