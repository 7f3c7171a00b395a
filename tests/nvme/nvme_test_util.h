// Helpers for the nvme tests: scratch directories, random data, small tmpfs mounts.
// Not thread-safe; one per test.
#ifndef ZINF_TESTS_NVME_NVME_TEST_UTIL_H_
#define ZINF_TESTS_NVME_NVME_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "tests/testing/temp_dir.h"

namespace zinf::testing_util {

// A fresh directory under $TMPDIR (or /tmp), removed with its contents at destruction; Sub
// makes a directory inside it.
class ScratchDir : public ::zinf::testing::TempDir {
 public:
  ScratchDir() : TempDir("zinf-nvme-test") {}
};

// A tmpfs of `size` mounted on a new directory (root only); unmounted at destruction.
// ok() is false, with why(), where mounting is not allowed.
class TmpfsMount {
 public:
  TmpfsMount(const ScratchDir& dir, const std::string& name, const std::string& options) {
    path_ = dir.Sub(name);
    if (geteuid() != 0) {
      why_ = "mounting a tmpfs needs root";
      return;
    }
    if (mount("zinf-test", path_.c_str(), "tmpfs", 0, options.c_str()) != 0) {
      why_ = std::string("mount tmpfs: ") + std::strerror(errno);
      return;
    }
    mounted_ = true;
  }
  // Remounts read-only.
  bool MakeReadOnly() {
    return mounted_ &&
           mount("zinf-test", path_.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, nullptr) == 0;
  }
  ~TmpfsMount() {
    if (mounted_) umount2(path_.c_str(), MNT_DETACH);
  }
  bool ok() const { return mounted_; }
  const std::string& why() const { return why_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string why_;
  bool mounted_ = false;
};

inline std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937_64 rng(seed);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t x = rng();
    std::memcpy(&v[i], &x, 8);
  }
  for (; i < n; ++i) v[i] = static_cast<uint8_t>(rng());
  return v;
}

}  // namespace zinf::testing_util

#endif  // ZINF_TESTS_NVME_NVME_TEST_UTIL_H_
