// `zinf ckpt export` on checkpoints it cannot read: every failure is an error message naming
// the path and exit code 1, never an uncaught exception (std::filesystem threw on a directory
// it could not search, and the process aborted).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/testing/temp_dir.h"
#include "tests/tools/run_zinf.h"

namespace {

using zinf::testing::RunZinf;
using zinf::testing::ZinfRun;
namespace fs = std::filesystem;

class ZinfCkptTest : public ::testing::Test {
 protected:
  // A directory the test made unreadable is removable again.
  void TearDown() override { chmod((dir_ / "ckpt").c_str(), 0755); }

  // Exports `from`; the run must fail cleanly with `message` and write nothing.
  void ExpectRefused(const std::string& from, const std::string& message) {
    const std::string out = (dir_ / "out.safetensors").string();
    const ZinfRun run = RunZinf("ckpt export " + from + " --out " + out);
    EXPECT_EQ(run.exit_code, 1) << run.output;
    EXPECT_NE(run.output.find("zinf ckpt export: "), std::string::npos) << run.output;
    EXPECT_NE(run.output.find(message), std::string::npos) << run.output;
    EXPECT_EQ(run.output.find("terminate called"), std::string::npos) << run.output;
    EXPECT_FALSE(fs::exists(out));
  }

  zinf::testing::TempDir tmp_{"zinf-ckpt-cmd"};
  const fs::path dir_ = tmp_.path();
};

TEST_F(ZinfCkptTest, DirectoryThatCannotBeSearchedIsAnError) {
  fs::create_directory_symlink(dir_ / "loop-b", dir_ / "loop-a");
  fs::create_directory_symlink(dir_ / "loop-a", dir_ / "loop-b");
  ExpectRefused((dir_ / "loop-a").string(),
                "IoError: searching checkpoint directory " + (dir_ / "loop-a").string());
  ExpectRefused((dir_ / "loop-a").string(), "Too many levels of symbolic links");
}

TEST_F(ZinfCkptTest, DirectoryWithoutPermissionIsAnError) {
  if (geteuid() == 0) GTEST_SKIP() << "running as root: permissions do not stop a search";
  fs::create_directories(dir_ / "ckpt");
  ASSERT_EQ(chmod((dir_ / "ckpt").c_str(), 0), 0);
  ExpectRefused((dir_ / "ckpt").string(), "Permission denied");
}

TEST_F(ZinfCkptTest, MissingOrForeignDirectoryIsAnError) {
  ExpectRefused((dir_ / "nowhere").string(), "is not a zinf checkpoint");
  fs::create_directories(dir_ / "ckpt");
  std::ofstream((dir_ / "ckpt" / "latest").string()) << "../../etc\n";
  ExpectRefused((dir_ / "ckpt").string(), "latest names '../../etc'");
}

}  // namespace
