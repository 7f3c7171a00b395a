// TempDir: a fresh scratch directory for one test, removed with everything in it when the
// object goes out of scope, also when an ASSERT ends the test early.
//
// Forked ranks: ForkRanks' children end with _exit and run no destructors, so a TempDir made
// in the parent is removed by the parent alone, after the children are done. A child must not
// make a TempDir of its own (it would be left behind).
//
// Thread-safety: a value; not for use from several threads at once.
#ifndef ZINF_TESTS_TESTING_TEMP_DIR_H_
#define ZINF_TESTS_TESTING_TEMP_DIR_H_

#include <stdlib.h>

#include <cerrno>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

namespace zinf::testing {

class TempDir {
 public:
  // Makes `base`/`prefix`-XXXXXX by mkdtemp (unique, mode 0700). `base` defaults to the
  // system's temporary directory ($TMPDIR, else /tmp); a test that needs a particular file
  // system (O_DIRECT wants a real disk, not a tmpfs) names its own. Throws
  // std::filesystem::filesystem_error where the directory cannot be made, as
  // create_directories does; GoogleTest reports it as the test's failure.
  explicit TempDir(std::string_view prefix = "zinf-test", std::filesystem::path base = {}) {
    if (base.empty()) base = std::filesystem::temp_directory_path();
    std::string pattern = (base / (std::string(prefix) + "-XXXXXX")).string();
    if (mkdtemp(pattern.data()) == nullptr) {
      throw std::filesystem::filesystem_error("mkdtemp", pattern,
                                              std::error_code(errno, std::generic_category()));
    }
    path_ = std::move(pattern);
  }
  // Best effort: a tree it cannot remove is left behind, never an exception.
  ~TempDir() {
    if (path_.empty()) return;
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(TempDir&& other) noexcept : path_(std::exchange(other.path_, {})) {}
  TempDir& operator=(TempDir&&) = delete;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // The directory, absolute when $TMPDIR or `base` is.
  const std::string& path() const { return path_; }
  // path()/name, which need not exist.
  std::string operator/(std::string_view name) const { return path_ + "/" + std::string(name); }
  // Makes path()/name, with any missing parents, and returns it.
  std::string Sub(std::string_view name) const {
    std::string sub = *this / name;
    std::filesystem::create_directories(sub);
    return sub;
  }

 private:
  std::string path_;
};

}  // namespace zinf::testing

#endif  // ZINF_TESTS_TESTING_TEMP_DIR_H_
