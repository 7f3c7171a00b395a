#include "nvme/path_probe.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <liburing.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "zinf/host_memory.h"

namespace zinf {
namespace {

std::string FilesystemName(long magic) {
  switch (static_cast<unsigned long>(magic)) {
    case 0xEF53:
      return "ext4";
    case 0x58465342:
      return "xfs";
    case 0x9123683E:
      return "btrfs";
    case 0x01021994:
      return "tmpfs";
    case 0x794C7630:
      return "overlayfs";
    case 0x6969:
      return "nfs";
    case 0xF2F52010:
      return "f2fs";
    case 0x2FC12FC1:
      return "zfs";
    default:
      return fmt::format("0x{:x}", static_cast<unsigned long>(magic));
  }
}

}  // namespace

StatusOr<uint64_t> FreeBytes(const std::string& path) {
  struct statvfs vfs {};
  if (statvfs(path.c_str(), &vfs) != 0) {
    return ErrnoStatus(errno, fmt::format("statvfs of {}", path));
  }
  return static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
}

StatusOr<PathProbe> ProbePath(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) {
    return InvalidArgument(fmt::format("path {} does not exist: {}", path, std::strerror(errno)));
  }
  if (!S_ISDIR(st.st_mode)) {
    return InvalidArgument(fmt::format("path {} is not a directory", path));
  }
  PathProbe probe;
  probe.path = path;
  struct statvfs vfs {};
  if (statvfs(path.c_str(), &vfs) == 0) {
    probe.free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    probe.total_bytes = static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize;
  }
  struct statfs fs {};
  if (statfs(path.c_str(), &fs) == 0) probe.filesystem = FilesystemName(fs.f_type);
  probe.writable = access(path.c_str(), W_OK) == 0;
  if (!probe.writable) {
    probe.o_direct_error = "directory is not writable";
    return probe;
  }

  // An unlinked temporary file: nothing is left behind even if we crash.
  std::string name = path + "/.zinf-probe-XXXXXX";
  const int fd = mkstemp(name.data());
  if (fd < 0) {
    probe.writable = false;
    probe.o_direct_error = fmt::format("cannot create a file: {}", std::strerror(errno));
    return probe;
  }
  unlink(name.c_str());
  const int flags = fcntl(fd, F_GETFL);
  if (fcntl(fd, F_SETFL, flags | O_DIRECT) != 0) {
    probe.o_direct_error = fmt::format("O_DIRECT refused: {}", std::strerror(errno));
    close(fd);
    return probe;
  }
  auto buffer = HostBuffer::Allocate(4096);
  if (!buffer.ok()) {
    close(fd);
    return buffer.status();
  }
  std::memset(buffer->data(), 0x5a, 4096);
  if (pwrite(fd, buffer->data(), 4096, 0) != 4096) {
    probe.o_direct_error = fmt::format("O_DIRECT write failed: {}", std::strerror(errno));
  } else if (pread(fd, buffer->data(), 4096, 0) != 4096) {
    probe.o_direct_error = fmt::format("O_DIRECT read failed: {}", std::strerror(errno));
  } else {
    probe.o_direct = true;
  }
  close(fd);
  return probe;
}

IoUringProbe ProbeIoUring() {
  IoUringProbe probe;
  struct utsname u {};
  if (uname(&u) == 0) probe.kernel = u.release;
  io_uring ring{};
  const int rc = io_uring_queue_init(4, &ring, 0);
  if (rc < 0) {
    probe.error = fmt::format("io_uring_queue_init: {}", std::strerror(-rc));
    return probe;
  }
  io_uring_queue_exit(&ring);
  probe.available = true;
  return probe;
}

}  // namespace zinf
