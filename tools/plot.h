// PNG plots for the `zinf` commands (`--plot FILE`): a figure of one or more panels of x/y
// series, drawn by gnuplot (Debian's `gnuplot-nox`), which the tool runs as a child process
// with a script whose data sit in inline data blocks, so that nothing but the PNG is left on
// disk.
//
// Thread-safety: the functions are pure, apart from WritePlot's child process and files.
#ifndef ZINF_TOOLS_PLOT_H_
#define ZINF_TOOLS_PLOT_H_

#include <string>
#include <vector>

#include "zinf/status.h"

namespace zinf::tools {

// One curve: y against x, the same number of finite values each.
struct PlotSeries {
  std::string title;  // the legend's entry
  std::vector<double> x, y;
  bool points = true;   // lines with points; false: lines only (long series)
  bool dashed = false;  // a dashed line, e.g. for a limit measured at each x
  int color = 0;        // 0: the next of gnuplot's colors; k > 0: gnuplot's k-th (to pair curves)
};

// A horizontal line across a panel, such as a limit measured in the same run.
struct PlotLimit {
  std::string title;
  double y = 0;
};

struct PlotPanel {
  std::string title, x_label, y_label;
  bool log_x = false;  // log-2 axes suit block sizes and thread counts
  bool log_y = false;
  std::vector<PlotSeries> series;  // at least one
  std::vector<PlotLimit> limits;
};

// Panels are stacked top to bottom in one PNG of width_px x (panel_height_px x panels).
struct Figure {
  std::string title;  // above all the panels; may be empty
  std::vector<PlotPanel> panels;
  int width_px = 1000;  // the legend sits right of each panel
  int panel_height_px = 420;
};

// The gnuplot executable WritePlot runs: $ZINF_GNUPLOT when set, else "gnuplot" (found on
// PATH).
std::string GnuplotProgram();

// InvalidArgument naming the panel and series when `figure` cannot be drawn: no panels, a
// panel without series, a series without points, x and y of different lengths, a value that
// is not finite (or not positive on a log axis), a size outside [100, 10000] pixels.
Status ValidateFigure(const Figure& figure);

// The gnuplot script that draws `figure` into `png_path` (pngcairo terminal), data inline.
// `figure` must pass ValidateFigure.
std::string GnuplotScript(const Figure& figure, const std::string& png_path);

// Checks, before a long measurement, that WritePlot will be able to write `path` and run
// `gnuplot`: the same errors as WritePlot's (IoError, FailedPrecondition), nothing written.
Status CheckPlotOutput(const std::string& path, const std::string& gnuplot = GnuplotProgram());

// Draws `figure` into the PNG file `path`, replacing it only when the new one is complete:
// gnuplot writes a temporary file beside it, which is checked for the PNG signature and
// renamed over `path`. Errors: InvalidArgument from ValidateFigure; IoError naming `path` and
// the reason when its directory cannot be written; FailedPrecondition when `gnuplot` cannot be
// run (saying how to install it); Internal with gnuplot's messages when it fails. On error
// nothing is left at `path` that was not there before.
Status WritePlot(const Figure& figure, const std::string& path,
                 const std::string& gnuplot = GnuplotProgram());

}  // namespace zinf::tools

#endif  // ZINF_TOOLS_PLOT_H_
