// gnuplot driven through a script file: see plot.h.
#include "tools/plot.h"

#include <fcntl.h>
#include <fmt/core.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

extern char** environ;

namespace zinf::tools {
namespace {

// A gnuplot single-quoted string: only the quote itself is special, written twice. Newlines
// would end the command, so they become spaces.
std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "''";
    } else if (c == '\n' || c == '\r') {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string Number(double v) { return fmt::format("{:.17g}", v); }

// A file removed when this goes out of scope unless Keep() was called.
class ScopedFile {
 public:
  explicit ScopedFile(std::string path) : path_(std::move(path)) {}
  ~ScopedFile() {
    if (!path_.empty()) unlink(path_.c_str());
  }
  ScopedFile(const ScopedFile&) = delete;
  ScopedFile& operator=(const ScopedFile&) = delete;
  const std::string& path() const { return path_; }
  void Keep() { path_.clear(); }

 private:
  std::string path_;
};

std::string ReadAll(const std::string& path, size_t limit) {
  std::ifstream in(path, std::ios::binary);
  std::string out(limit, '\0');
  in.read(out.data(), static_cast<std::streamsize>(limit));
  out.resize(static_cast<size_t>(in.gcount()));
  return out;
}

// Runs `program script` with stdout and stderr into `log`. The exit status, or -errno when
// it could not be started.
int RunGnuplot(const std::string& program, const std::string& script, const std::string& log) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::string arg0 = program, arg1 = script;
  char* argv[] = {arg0.data(), arg1.data(), nullptr};
  pid_t pid = 0;
  const int err = posix_spawnp(&pid, program.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (err != 0) return -err;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -errno;
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

constexpr unsigned char kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

}  // namespace

std::string GnuplotProgram() {
  const char* env = std::getenv("ZINF_GNUPLOT");
  return env != nullptr && env[0] != '\0' ? env : "gnuplot";
}

Status ValidateFigure(const Figure& figure) {
  if (figure.width_px < 100 || figure.width_px > 10000 || figure.panel_height_px < 100 ||
      figure.panel_height_px > 10000) {
    return InvalidArgument(fmt::format("plot size must be in [100, 10000] pixels, got {} x {}",
                                       figure.width_px, figure.panel_height_px));
  }
  if (figure.panels.empty()) return InvalidArgument("plot has no panels");
  for (size_t i = 0; i < figure.panels.size(); ++i) {
    const PlotPanel& panel = figure.panels[i];
    const std::string where = fmt::format("plot panel {} ('{}')", i, panel.title);
    if (panel.series.empty()) return InvalidArgument(where + " has no series");
    for (const PlotSeries& s : panel.series) {
      if (s.x.empty()) {
        return InvalidArgument(fmt::format("{}: series '{}' has no points", where, s.title));
      }
      if (s.x.size() != s.y.size()) {
        return InvalidArgument(fmt::format("{}: series '{}' has {} x values and {} y values", where,
                                           s.title, s.x.size(), s.y.size()));
      }
      for (size_t k = 0; k < s.x.size(); ++k) {
        const double x = s.x[k], y = s.y[k];
        if (!std::isfinite(x) || !std::isfinite(y) || (panel.log_x && x <= 0) ||
            (panel.log_y && y <= 0)) {
          return InvalidArgument(fmt::format(
              "{}: series '{}' point {} is ({}, {}), expected finite values{}", where, s.title, k,
              x, y, panel.log_x || panel.log_y ? ", positive on a log axis" : ""));
        }
      }
    }
    for (const PlotLimit& limit : panel.limits) {
      if (!std::isfinite(limit.y) || (panel.log_y && limit.y <= 0)) {
        return InvalidArgument(fmt::format("{}: limit '{}' is {}, expected a finite value{}", where,
                                           limit.title, limit.y,
                                           panel.log_y ? ", positive on a log axis" : ""));
      }
    }
  }
  return OkStatus();
}

std::string GnuplotScript(const Figure& figure, const std::string& png_path) {
  std::ostringstream s;
  const int height = figure.panel_height_px * static_cast<int>(figure.panels.size());
  // noenhanced: titles are shown as written ('_' and '^' are not sub- and superscripts).
  s << "set terminal pngcairo size " << figure.width_px << "," << height
    << " noenhanced font ',10'\n";
  s << "set output " << Quote(png_path) << "\n";
  for (size_t i = 0; i < figure.panels.size(); ++i) {
    for (size_t j = 0; j < figure.panels[i].series.size(); ++j) {
      const PlotSeries& series = figure.panels[i].series[j];
      s << "$d" << i << "_" << j << " << EOD\n";
      for (size_t k = 0; k < series.x.size(); ++k) {
        s << Number(series.x[k]) << " " << Number(series.y[k]) << "\n";
      }
      s << "EOD\n";
    }
  }
  s << "set multiplot layout " << figure.panels.size() << ",1";
  if (!figure.title.empty()) s << " title " << Quote(figure.title) << " font ',12'";
  // The legend right of the plot, and the same plot area in every panel whatever the
  // legends' widths, so that the panels' x axes line up.
  s << "\nset grid\nset format x '%g'\nset format y '%g'\nset key outside right top vertical\n"
    << "set lmargin 12\nset rmargin at screen 0.72\n";
  for (size_t i = 0; i < figure.panels.size(); ++i) {
    const PlotPanel& panel = figure.panels[i];
    s << "set title " << Quote(panel.title) << "\n";
    s << "set xlabel " << Quote(panel.x_label) << "\n";
    s << "set ylabel " << Quote(panel.y_label) << "\n";
    s << (panel.log_x ? "set logscale x 2\n" : "unset logscale x\n");
    s << (panel.log_y ? "set logscale y\nset yrange [*:*]\n" : "unset logscale y\n");
    if (!panel.log_y) {
      // From zero when every value is positive, so that ratios read off the heights.
      bool positive = true;
      for (const PlotSeries& series : panel.series) {
        for (double y : series.y) positive = positive && y >= 0;
      }
      for (const PlotLimit& limit : panel.limits) positive = positive && limit.y >= 0;
      s << (positive ? "set yrange [0:*]\n" : "set yrange [*:*]\n");
    }
    s << "plot ";
    for (size_t j = 0; j < panel.series.size(); ++j) {
      const PlotSeries& series = panel.series[j];
      s << (j > 0 ? ", " : "") << "$d" << i << "_" << j << " using 1:2 with "
        << (series.points ? "linespoints pt 7 ps 0.8" : "lines") << " lw 2"
        << (series.dashed ? " dashtype 2" : "")
        << (series.color > 0 ? fmt::format(" linecolor {}", series.color) : "") << " title "
        << Quote(series.title);
    }
    for (const PlotLimit& limit : panel.limits) {
      s << ", " << Number(limit.y) << " with lines dashtype 2 lw 2 title " << Quote(limit.title);
    }
    s << "\n";
  }
  s << "unset multiplot\nset output\n";
  return s.str();
}

namespace {

Status CannotRun(const std::string& gnuplot, int err, const std::string& path) {
  return FailedPrecondition(fmt::format(
      "cannot run gnuplot ('{}': {}), which draws the plot {}; install it (Debian: apt-get "
      "install gnuplot-nox) or set ZINF_GNUPLOT to its path",
      gnuplot, std::strerror(err), path));
}

// Creates the temporary output beside `path`, empty: what gnuplot will write.
StatusOr<std::string> CreateTemporaryOutput(const std::string& path) {
  if (path.empty()) return InvalidArgument("plot output path is empty");
  const std::string tmp_path = fmt::format("{}.tmp-{}", path, getpid());
  const int fd = open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, fmt::format("cannot write the plot {}", path));
  close(fd);
  return tmp_path;
}

}  // namespace

Status CheckPlotOutput(const std::string& path, const std::string& gnuplot) {
  ZINF_ASSIGN_OR_RETURN(const std::string tmp_path, CreateTemporaryOutput(path));
  ScopedFile tmp(tmp_path);
  // An empty script: gnuplot starts, reads nothing and exits 0.
  const int rc = RunGnuplot(gnuplot, "/dev/null", "/dev/null");
  if (rc < 0) return CannotRun(gnuplot, -rc, path);
  if (rc != 0) {
    return FailedPrecondition(
        fmt::format("gnuplot ('{}') exits with status {} on an empty script", gnuplot, rc));
  }
  return OkStatus();
}

Status WritePlot(const Figure& figure, const std::string& path, const std::string& gnuplot) {
  ZINF_RETURN_IF_ERROR(ValidateFigure(figure));
  // gnuplot writes beside the target, so that the rename below is atomic and a failure
  // leaves the old file; creating it here first turns an unwritable directory into our error
  // rather than one of gnuplot's warnings.
  ZINF_ASSIGN_OR_RETURN(const std::string tmp_path, CreateTemporaryOutput(path));
  ScopedFile tmp(tmp_path);

  const char* tmpdir = std::getenv("TMPDIR");
  std::string script_path =
      std::string(tmpdir != nullptr && tmpdir[0] != '\0' ? tmpdir : "/tmp") + "/zinf-plot-XXXXXX";
  const int script_fd = mkstemp(script_path.data());
  if (script_fd < 0) {
    return ErrnoStatus(errno, fmt::format("creating gnuplot's script {}", script_path));
  }
  ScopedFile script(script_path);
  ScopedFile log(script_path + ".log");
  const std::string text = GnuplotScript(figure, tmp_path);
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = write(script_fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      close(script_fd);
      return ErrnoStatus(err, fmt::format("writing gnuplot's script {}", script_path));
    }
    done += static_cast<size_t>(n);
  }
  close(script_fd);

  const int rc = RunGnuplot(gnuplot, script_path, log.path());
  if (rc < 0) return CannotRun(gnuplot, -rc, path);
  const std::string messages = ReadAll(log.path(), 2000);
  if (rc != 0) {
    return Internal(fmt::format("gnuplot ('{}') failed with exit status {} drawing {}: {}", gnuplot,
                                rc, path, messages.empty() ? "(no message)" : messages));
  }
  const std::string head = ReadAll(tmp_path, sizeof(kPngSignature));
  if (head.size() != sizeof(kPngSignature) ||
      std::memcmp(head.data(), kPngSignature, sizeof(kPngSignature)) != 0) {
    return Internal(fmt::format("gnuplot ('{}') wrote no PNG drawing {}{}{}", gnuplot, path,
                                messages.empty() ? "" : ": ", messages));
  }
  if (rename(tmp_path.c_str(), path.c_str()) != 0) {
    return ErrnoStatus(errno, fmt::format("renaming {} to {}", tmp_path, path));
  }
  tmp.Keep();
  return OkStatus();
}

}  // namespace zinf::tools
