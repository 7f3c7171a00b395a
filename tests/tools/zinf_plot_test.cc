// The commands' --plot: `zinf plot metrics` over train_gpt's metrics lines, `zinf bench adam
// --plot` and `zinf bench nvme --sweep --plot` write a PNG; what cannot be read or written is
// an error that names it, before anything is measured. Tests that need gnuplot skip, saying
// so, where it is not installed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/nvme/nvme_test_util.h"
#include "tests/testing/temp_dir.h"
#include "tests/tools/run_zinf.h"

namespace {

using zinf::testing::RunZinf;
using zinf::testing::ZinfRun;
namespace fs = std::filesystem;

bool HaveGnuplot() { return std::system("command -v gnuplot >/dev/null 2>&1") == 0; }

// The file starts with the PNG signature and is more than a header.
void ExpectPng(const fs::path& path) {
  ASSERT_TRUE(fs::exists(path)) << path;
  std::ifstream in(path, std::ios::binary);
  char head[8] = {};
  in.read(head, 8);
  EXPECT_EQ(std::memcmp(head, "\x89PNG\r\n\x1a\n", 8), 0) << path;
  EXPECT_GT(fs::file_size(path), 1000u) << path;
}

class ZinfPlotTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
    return (dir_ / name).string();
  }
  // Runs `args`; it must fail with exit code 1 and `message`, and write no PNG.
  void ExpectRefused(const std::string& args, const std::string& message) {
    const ZinfRun run = RunZinf(args);
    EXPECT_EQ(run.exit_code, 1) << run.output;
    EXPECT_NE(run.output.find(message), std::string::npos) << run.output;
    EXPECT_FALSE(fs::exists(dir_ / "out.png"));
  }

  zinf::testing::TempDir tmp_{"zinf-plot-cmd"};
  const fs::path dir_ = tmp_.path();
};

// Lines as train_gpt --metrics writes them (fewer keys).
std::string Metrics(int steps) {
  std::string text;
  for (int s = 1; s <= steps; ++s) {
    text += "{\"step\":" + std::to_string(s) + ",\"loss\":" + std::to_string(5.5 / s) +
            ",\"step_s\":0.02,\"compute_s\":0.015,\"param_wait_s\":0.003,"
            "\"grad_reduce_s\":0.0,\"optimizer_s\":0.002}\n";
  }
  return text;
}

TEST_F(ZinfPlotTest, MetricsOfOneRunAndOfTwo) {
  if (!HaveGnuplot()) GTEST_SKIP() << "gnuplot is not installed (Debian: gnuplot-nox)";
  const std::string a = Write("a.jsonl", Metrics(30)), b = Write("b.jsonl", Metrics(20));
  ZinfRun run = RunZinf("plot metrics " + a + " --plot " + (dir_ / "one.png").string());
  EXPECT_EQ(run.exit_code, 0) << run.output;
  ExpectPng(dir_ / "one.png");
  run = RunZinf("plot metrics " + a + " " + b + " --plot " + (dir_ / "two.png").string());
  EXPECT_EQ(run.exit_code, 0) << run.output;
  ExpectPng(dir_ / "two.png");
}

TEST_F(ZinfPlotTest, BadMetricsAreRefusedNamingTheLine) {
  const std::string out = " --plot " + (dir_ / "out.png").string();
  ExpectRefused("plot metrics " + (dir_ / "missing.jsonl").string() + out,
                "opening metrics file " + (dir_ / "missing.jsonl").string() + ": No such file");
  ExpectRefused("plot metrics /dev/zero" + out, "metrics file /dev/zero is not a regular file");
  ExpectRefused("plot metrics " +
                    Write("deep.jsonl", std::string(100000, '[') + std::string(100000, ']')) + out,
                "deep.jsonl:1 nests arrays and objects more than 128 levels deep");
  ExpectRefused("plot metrics " + Write("empty.jsonl", "\n") + out, "has no steps");
  ExpectRefused("plot metrics " + Write("text.jsonl", Metrics(2) + "step 3 loss 1.0\n") + out,
                "text.jsonl:3 is not valid JSON");
  ExpectRefused("plot metrics " + Write("array.jsonl", Metrics(1) + "[1, 2]\n") + out,
                "array.jsonl:2: not a JSON object (train_gpt --metrics writes one per line), but "
                "2 elements (array)");
  ExpectRefused("plot metrics " + Write("noloss.jsonl", "{\"step\":1,\"step_s\":0.1}\n") + out,
                "noloss.jsonl:1: no \"loss\" in the object");
  ExpectRefused(
      "plot metrics " + Write("str.jsonl", "{\"step\":1,\"loss\":\"x\",\"step_s\":0.1}\n") + out,
      "\"loss\" must be a finite non-negative number, got \"x\"");
  ExpectRefused("plot metrics " +
                    Write("ragged.jsonl",
                          "{\"step\":1,\"loss\":1,\"step_s\":0.1}\n"
                          "{\"step\":2,\"loss\":1,\"step_s\":0.1,\"compute_s\":0.1}\n") +
                    out,
                "ragged.jsonl:2: \"compute_s\" is here but not on the lines before");
  ExpectRefused("plot metrics " +
                    Write("gap.jsonl",
                          "{\"step\":1,\"loss\":1,\"step_s\":0.1,\"compute_s\":0.1}\n"
                          "{\"step\":2,\"loss\":1,\"step_s\":0.1}\n") +
                    out,
                "gap.jsonl:2: \"compute_s\" is missing here but was on the lines before");
}

TEST_F(ZinfPlotTest, UnwritablePlotPathIsAnError) {
  const std::string missing = (dir_ / "no-such-dir" / "out.png").string();
  ExpectRefused("plot metrics " + Write("a.jsonl", Metrics(3)) + " --plot " + missing,
                "cannot write the plot " + missing);
}

TEST_F(ZinfPlotTest, MissingGnuplotSaysHowToInstallIt) {
  const std::string metrics = Write("a.jsonl", Metrics(3));
  setenv("ZINF_GNUPLOT", (dir_ / "no-gnuplot").c_str(), 1);  // the child inherits it
  ExpectRefused("plot metrics " + metrics + " --plot " + (dir_ / "out.png").string(),
                "apt-get install gnuplot-nox");
  unsetenv("ZINF_GNUPLOT");
}

TEST_F(ZinfPlotTest, BenchAdamPlotsSizesAndThreads) {
  if (!HaveGnuplot()) GTEST_SKIP() << "gnuplot is not installed (Debian: gnuplot-nox)";
  const fs::path png = dir_ / "adam.png";
  const ZinfRun run =
      RunZinf("bench adam --params 64K,256K --threads 1,2 --reps 1 --plot " + png.string());
  EXPECT_EQ(run.exit_code, 0) << run.output;
  ExpectPng(png);
}

TEST_F(ZinfPlotTest, BenchChecksThePlotPathBeforeMeasuring) {
  const std::string missing = (dir_ / "no-such-dir" / "out.png").string();
  ZinfRun run = RunZinf("bench adam --params 64K --reps 1 --plot " + missing);
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("cannot write the plot " + missing), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("G params/s"), std::string::npos) << "measured first: " << run.output;

  zinf::testing_util::ScratchDir scratch;
  run = RunZinf("bench nvme --path " + scratch.path() + " --size 16MiB --no-fio --sweep --plot " +
                missing);
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("cannot write the plot " + missing), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("zinf W"), std::string::npos) << "measured first: " << run.output;
  ExpectRefused(
      "bench nvme --path " + scratch.path() + " --size 16MiB --plot " + (dir_ / "out.png").string(),
      "--plot draws the --sweep grid: give --sweep too");
}

TEST_F(ZinfPlotTest, BenchNvmeSweepPlot) {
  if (!HaveGnuplot()) GTEST_SKIP() << "gnuplot is not installed (Debian: gnuplot-nox)";
  zinf::testing_util::ScratchDir scratch;
  const fs::path png = dir_ / "sweep.png";
  const ZinfRun run = RunZinf("bench nvme --path " + scratch.path() +
                              " --size 16MiB --reps 1 --no-fio --sweep --plot " + png.string());
  if (run.exit_code != 0 && run.output.find("O_DIRECT") != std::string::npos) {
    GTEST_SKIP() << "scratch directory refuses O_DIRECT: " << run.output;
  }
  EXPECT_EQ(run.exit_code, 0) << run.output;
  ExpectPng(png);
}

}  // namespace
