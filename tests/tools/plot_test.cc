// tools/plot: figures drawn by gnuplot into PNG files, and the errors for what cannot be drawn
// or written. Tests that need gnuplot skip, saying so, where it is not installed.
#include "tools/plot.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/testing/temp_dir.h"

namespace zinf::tools {
namespace {

namespace fs = std::filesystem;

// Whether `program` can be run: the same PATH search the plot module does.
bool HaveGnuplot() {
  const std::string command = "command -v '" + GnuplotProgram() + "' >/dev/null 2>&1";
  return std::system(command.c_str()) == 0;
}

Figure TwoPanels() {
  Figure f;
  f.title = "zinf bench nvme --sweep";
  PlotPanel bw;
  bw.title = "write, it's O_DIRECT";  // a quote and an underscore, shown as written
  bw.x_label = "block (KiB)";
  bw.y_label = "MB/s";
  bw.log_x = true;
  bw.series.push_back({"zinf qd 8", {128, 1024, 8192}, {900, 1800, 2100}});
  bw.series.push_back({"fio qd 8", {128, 1024, 8192}, {950, 1850, 2050}});
  bw.limits.push_back({"limit", 2200});
  f.panels.push_back(bw);
  PlotPanel loss;
  loss.title = "loss";
  loss.x_label = "step";
  loss.y_label = "nats";
  loss.series.push_back({"loss", {1, 2, 3, 4}, {5.5, 3.1, 2.0, 1.2}, /*points=*/false});
  f.panels.push_back(loss);
  return f;
}

class PlotTest : public ::testing::Test {
 protected:
  // A directory the test made unwritable is removable again.
  void TearDown() override { chmod(dir_.c_str(), 0755); }
  // No file but `keep` is left in the directory (no temporary output, no script).
  void ExpectOnly(const std::string& keep) {
    for (const auto& entry : fs::directory_iterator(dir_)) {
      EXPECT_EQ(entry.path().filename().string(), keep) << "left behind: " << entry.path();
    }
  }
  testing::TempDir tmp_{"zinf-plot-test"};
  const fs::path dir_ = tmp_.path();
};

TEST_F(PlotTest, WritesAPng) {
  if (!HaveGnuplot()) GTEST_SKIP() << "gnuplot is not installed (Debian: gnuplot-nox)";
  const std::string path = (dir_ / "sweep.png").string();
  ASSERT_TRUE(WritePlot(TwoPanels(), path).ok());
  std::ifstream in(path, std::ios::binary);
  char head[8] = {};
  in.read(head, 8);
  ASSERT_EQ(in.gcount(), 8);
  EXPECT_EQ(std::memcmp(head, "\x89PNG\r\n\x1a\n", 8), 0);
  // The IHDR chunk: width and height, big endian, at bytes 16..23.
  unsigned char ihdr[8] = {};
  in.seekg(16);
  in.read(reinterpret_cast<char*>(ihdr), 8);
  const uint32_t width = (ihdr[0] << 24) | (ihdr[1] << 16) | (ihdr[2] << 8) | ihdr[3];
  const uint32_t height = (ihdr[4] << 24) | (ihdr[5] << 16) | (ihdr[6] << 8) | ihdr[7];
  EXPECT_EQ(width, 1000u);
  EXPECT_EQ(height, 2u * 420u);
  EXPECT_GT(fs::file_size(path), 1000u);
  ExpectOnly("sweep.png");
}

TEST_F(PlotTest, ReplacesAnExistingFile) {
  if (!HaveGnuplot()) GTEST_SKIP() << "gnuplot is not installed (Debian: gnuplot-nox)";
  const std::string path = (dir_ / "out.png").string();
  std::ofstream(path) << "old";
  ASSERT_TRUE(WritePlot(TwoPanels(), path).ok());
  EXPECT_GT(fs::file_size(path), 1000u);
}

TEST_F(PlotTest, EmptyInputsAreRefusedNamingThem) {
  const std::string path = (dir_ / "out.png").string();
  Figure none;
  Status s = WritePlot(none, path);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("no panels"), std::string::npos) << s;

  Figure f = TwoPanels();
  f.panels[1].series[0].x.clear();
  f.panels[1].series[0].y.clear();
  s = WritePlot(f, path);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("series 'loss' has no points"), std::string::npos) << s;

  f = TwoPanels();
  f.panels[0].series.clear();
  s = WritePlot(f, path);
  EXPECT_NE(s.message().find("has no series"), std::string::npos) << s;

  f = TwoPanels();
  f.panels[0].series[1].y.pop_back();
  s = WritePlot(f, path);
  EXPECT_NE(s.message().find("'fio qd 8' has 3 x values and 2 y values"), std::string::npos) << s;

  f = TwoPanels();
  f.panels[1].series[0].y[2] = std::nan("");
  s = WritePlot(f, path);
  EXPECT_NE(s.message().find("point 2"), std::string::npos) << s;

  f = TwoPanels();
  f.panels[0].series[0].x[0] = 0;  // log axis
  s = WritePlot(f, path);
  EXPECT_NE(s.message().find("positive on a log axis"), std::string::npos) << s;
  EXPECT_FALSE(fs::exists(path));
}

TEST_F(PlotTest, UnwritablePathIsAnIoErrorNamingIt) {
  const std::string missing = (dir_ / "no-such-dir" / "out.png").string();
  Status s = WritePlot(TwoPanels(), missing);
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s;
  EXPECT_NE(s.message().find(missing), std::string::npos) << s;
  EXPECT_NE(s.message().find("No such file or directory"), std::string::npos) << s;

  std::ofstream(dir_ / "a-file") << "x";
  const std::string under_file = (dir_ / "a-file" / "out.png").string();
  s = WritePlot(TwoPanels(), under_file);
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s;
  EXPECT_NE(s.message().find("Not a directory"), std::string::npos) << s;
}

TEST_F(PlotTest, ReadOnlyDirectoryIsAnIoError) {
  if (geteuid() == 0) GTEST_SKIP() << "root may write into a read-only directory";
  ASSERT_EQ(chmod(dir_.c_str(), 0555), 0);
  const std::string read_only = (dir_ / "out.png").string();
  const Status s = WritePlot(TwoPanels(), read_only);
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s;
  EXPECT_NE(s.message().find("Permission denied"), std::string::npos) << s;
}

TEST_F(PlotTest, MissingGnuplotSaysHowToInstallIt) {
  const std::string path = (dir_ / "out.png").string();
  const Status s = WritePlot(TwoPanels(), path, (dir_ / "no-gnuplot-here").string());
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("apt-get install gnuplot-nox"), std::string::npos) << s;
  ExpectOnly("");  // not even the temporary output
}

TEST_F(PlotTest, CheckPlotOutputRefusesBeforeAnythingIsDrawn) {
  const std::string path = (dir_ / "out.png").string();
  Status s = CheckPlotOutput(path, (dir_ / "no-gnuplot-here").string());
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("gnuplot-nox"), std::string::npos) << s;
  const std::string missing = (dir_ / "no-such-dir" / "out.png").string();
  s = CheckPlotOutput(missing);
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s;
  EXPECT_NE(s.message().find(missing), std::string::npos) << s;
  ExpectOnly("");
  if (!HaveGnuplot()) GTEST_SKIP() << "gnuplot is not installed (Debian: gnuplot-nox)";
  EXPECT_TRUE(CheckPlotOutput(path).ok());
  ExpectOnly("");  // checked, nothing written
}

TEST_F(PlotTest, GnuplotFailureCarriesItsMessages) {
  // A "gnuplot" that fails as gnuplot does on a bad script: a message and exit status 1.
  const fs::path fake = dir_ / "fake-gnuplot";
  std::ofstream(fake) << "#!/bin/sh\necho 'line 3: unknown terminal type' >&2\nexit 1\n";
  fs::permissions(fake, fs::perms::owner_all);
  const Status s = WritePlot(TwoPanels(), (dir_ / "out.png").string(), fake.string());
  EXPECT_EQ(s.code(), StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("exit status 1"), std::string::npos) << s;
  EXPECT_NE(s.message().find("unknown terminal type"), std::string::npos) << s;
  EXPECT_FALSE(fs::exists(dir_ / "out.png"));
}

TEST_F(PlotTest, OutputThatIsNotAPngIsAnError) {
  // A "gnuplot" that succeeds without drawing anything.
  const fs::path fake = dir_ / "fake-gnuplot";
  std::ofstream(fake) << "#!/bin/sh\nexit 0\n";
  fs::permissions(fake, fs::perms::owner_all);
  const Status s = WritePlot(TwoPanels(), (dir_ / "out.png").string(), fake.string());
  EXPECT_EQ(s.code(), StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("wrote no PNG"), std::string::npos) << s;
  EXPECT_FALSE(fs::exists(dir_ / "out.png"));
}

TEST(GnuplotScriptTest, DataInlineAndTitlesQuoted) {
  const std::string script = GnuplotScript(TwoPanels(), "/tmp/x.png");
  EXPECT_NE(script.find("set terminal pngcairo size 1000,840"), std::string::npos) << script;
  EXPECT_NE(script.find("$d0_1 << EOD\n128 950\n1024 1850\n8192 2050\nEOD\n"), std::string::npos)
      << script;
  EXPECT_NE(script.find("'write, it''s O_DIRECT'"), std::string::npos) << script;
  EXPECT_NE(script.find("set logscale x 2"), std::string::npos) << script;
  EXPECT_NE(script.find("2200 with lines dashtype 2 lw 2 title 'limit'"), std::string::npos)
      << script;
}

}  // namespace
}  // namespace zinf::tools
