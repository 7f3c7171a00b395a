// Bounded reading of untrusted input files: see zinf/input_file.h.
//
// Note [Bounded input]
// A trainer reads files it did not write: a downloaded safetensors file, a config from a
// template, a profile from another machine. Two things about such a file must never take the
// process down. Its size: reading "until end of file" from /dev/zero, a FIFO or a file that
// keeps growing allocates until the OOM killer comes, so only regular files are read, at most
// a cap, and the read stops at the cap even if the file grew after fstat. Its nesting: JSON
// parsed into a tree is copied, destroyed and dumped recursively, so 50,000 nested brackets
// overflow the stack; CheckJsonDepth scans the brackets before any parser sees the text. The
// rule is enforced: tests/layering/json_parse_test.sh fails on a JSON parse anywhere but the
// two functions that call CheckJsonDepth first (zinf::ParseJson and the examples' own).
#include "zinf/input_file.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

namespace zinf {
namespace {

// Reads from `fd` until end of file or until more than `max_bytes` arrived.
StatusOr<std::string> ReadCapped(int fd, std::string_view label, uint64_t max_bytes) {
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = read(fd, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, fmt::format("reading {}", label));
    if (n == 0) return text;
    if (text.size() + static_cast<uint64_t>(n) > max_bytes) {
      return ResourceExhausted(
          fmt::format("{} is over {} bytes, the most zinf reads from it", label, max_bytes));
    }
    text.append(buffer, static_cast<size_t>(n));
  }
}

// The whole of `fd` when it is a regular file of at most `max_bytes`.
StatusOr<std::string> ReadRegular(int fd, std::string_view label, uint64_t max_bytes) {
  struct stat st {};
  if (fstat(fd, &st) != 0) return ErrnoStatus(errno, fmt::format("stat of {}", label));
  if (!S_ISREG(st.st_mode)) {
    return InvalidArgument(fmt::format(
        "{} is not a regular file (a directory, device, FIFO or socket); give a file, or - for "
        "standard input",
        label));
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return ResourceExhausted(
        fmt::format("{} is {} bytes; zinf reads at most {} from it", label, st.st_size, max_bytes));
  }
  // O_NONBLOCK only kept open() from blocking on a FIFO; a regular file ignores it.
  return ReadCapped(fd, label, max_bytes);
}

}  // namespace

StatusOr<std::string> ReadInputFile(const std::string& path, std::string_view what,
                                    uint64_t max_bytes) {
  const std::string label =
      path == "-" ? fmt::format("{} (standard input)", what) : fmt::format("{} {}", what, path);
  if (path == "-") return ReadCapped(STDIN_FILENO, label, max_bytes);
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ErrnoStatus(errno, fmt::format("opening {}", label));
  StatusOr<std::string> text = ReadRegular(fd, label, max_bytes);
  close(fd);
  return text;
}

Status CheckJsonDepth(std::string_view text, std::string_view source, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character, which may be a quote
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        return InvalidArgument(
            fmt::format("{} nests arrays and objects more than {} levels deep (at byte {}); "
                        "zinf reads at most {}",
                        source, max_depth, i, max_depth));
      }
    } else if (c == ']' || c == '}') {
      depth = std::max(depth - 1, 0);  // unbalanced text: the parser reports it
    }
  }
  return OkStatus();
}

}  // namespace zinf
