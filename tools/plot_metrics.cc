// `zinf plot metrics FILE... --plot OUT.png`: loss and step time per step from the JSON lines
// a trainer writes (train_gpt --metrics: one object per step with "step", "loss", "step_s"
// and the step's split into "compute_s", "param_wait_s", "grad_reduce_s", "optimizer_s").
// Several files are drawn as one curve each, to compare runs; one file also shows where its
// step time went.
#include <fmt/core.h>

#include <cmath>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tools/commands.h"
#include "tools/metrics_file.h"
#include "tools/plot.h"

namespace zinf::tools {
namespace {

struct MetricsArgs {
  std::vector<std::string> files;
  std::string plot;
  int width_px = Figure().width_px;
  int panel_height_px = Figure().panel_height_px;
};

Figure MetricsFigure(const std::vector<MetricsRun>& runs) {
  Figure f;
  f.title = runs.size() == 1 ? "training metrics: " + runs[0].name : "training metrics";
  PlotPanel loss{.title = "loss", .x_label = "step", .y_label = "loss (nats per token)"};
  // Log scale: a step that a busy machine stretched tenfold would flatten the rest.
  PlotPanel time{
      .title = "step time", .x_label = "step", .y_label = "seconds (log scale)", .log_y = true};
  for (const MetricsRun& r : runs) {
    const bool points = r.step.size() <= 50;
    loss.series.push_back(
        {.title = runs.size() == 1 ? "loss" : r.name, .x = r.step, .y = r.loss, .points = points});
    time.series.push_back({.title = runs.size() == 1 ? "step" : r.name,
                           .x = r.step,
                           .y = r.step_s,
                           .points = points});
    if (runs.size() > 1) continue;
    // One run: where the time went, each part the trainer recorded.
    const std::pair<const char*, const std::vector<double>*> parts[] = {
        {"compute", &r.compute_s},
        {"parameter gathers", &r.param_wait_s},
        {"gradient reduction", &r.grad_reduce_s},
        {"optimizer", &r.optimizer_s}};
    for (const auto& [title, values] : parts) {
      if (values->size() != r.step.size()) continue;
      // Steps where a part took no time (gradient reduction on one rank) have no place on a
      // log axis: left out, and a part that never took time is not drawn.
      PlotSeries part{.title = title, .points = points, .dashed = true};
      for (size_t i = 0; i < values->size(); ++i) {
        if ((*values)[i] <= 0) continue;
        part.x.push_back(r.step[i]);
        part.y.push_back((*values)[i]);
      }
      if (!part.x.empty()) time.series.push_back(part);
    }
  }
  f.panels = {loss, time};
  return f;
}

}  // namespace

void AddPlotCommands(CLI::App& app) {
  CLI::App* plot = app.add_subcommand("plot", "Draw PNG plots of what zinf and its trainers wrote");
  plot->require_subcommand(1);
  auto args = std::make_shared<MetricsArgs>();
  CLI::App* cmd = plot->add_subcommand(
      "metrics",
      "Loss and step time per step from train_gpt --metrics files (several: one curve each)");
  cmd->add_option("files", args->files, "JSON-lines metrics files")->required();
  cmd->add_option("--plot", args->plot, "Output PNG file")->required();
  cmd->add_option("--width", args->width_px, "Image width in pixels")->capture_default_str();
  cmd->add_option("--panel-height", args->panel_height_px,
                  "Height of each of the two panels in pixels")
      ->capture_default_str();
  cmd->callback([args] {
    auto run = [&]() -> Status {
      std::vector<MetricsRun> runs;
      for (const std::string& file : args->files) {
        ZINF_ASSIGN_OR_RETURN(MetricsRun r, ReadMetricsFile(file));
        runs.push_back(std::move(r));
      }
      Figure figure = MetricsFigure(runs);
      figure.width_px = args->width_px;
      figure.panel_height_px = args->panel_height_px;
      return WritePlot(figure, args->plot);
    };
    const Status s = run();
    if (!Report("zinf plot metrics", s)) return;
    fmt::print("wrote {}\n", args->plot);
  });
}

}  // namespace zinf::tools
