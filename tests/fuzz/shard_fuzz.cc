// libFuzzer target: a checkpoint shard file (rank-<r>.zshard), truncated, corrupt or hostile,
// through ShardReader: its trailer, section table and checksums. Any input must be read or
// refused with a Status; a crash, an exception, a huge allocation or undefined behaviour is a
// bug. The bytes live in a memfd, so the run touches no disk.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "ckpt/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const int fd = memfd_create("zinf-shard-fuzz", 0);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != static_cast<ssize_t>(size)) return 0;
  auto reader = zinf::ckpt::ShardReader::Open(path, "step-1", 0);
  if (!reader.ok()) return 0;
  for (const char* name : {"params", "state0", "state1", "optimizer"}) {
    if (!reader->HasSection(name)) continue;
    (void)reader->Verify(name, nullptr, 1 << 16);
    auto bytes = reader->SectionBytes(name);
    if (bytes.ok() && *bytes >= 8) {
      char head[8];
      (void)reader->Read(name, 0, head, sizeof head);
    }
  }
  return 0;
}
