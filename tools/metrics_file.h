// Reading the metrics files trainers write (train_gpt --metrics: one JSON object per line and
// step with "step", "loss", "step_s" and optionally the step's split into "compute_s",
// "param_wait_s", "grad_reduce_s", "optimizer_s"), for `zinf plot metrics`.
//
// Thread-safety: the functions are reentrant.
#ifndef ZINF_TOOLS_METRICS_FILE_H_
#define ZINF_TOOLS_METRICS_FILE_H_

#include <string>
#include <string_view>
#include <vector>

#include "zinf/status.h"

namespace zinf::tools {

// One run's metrics, a value per step for each key; the optional keys are empty when absent.
struct MetricsRun {
  std::string name;
  std::vector<double> step, loss, step_s, compute_s, param_wait_s, grad_reduce_s, optimizer_s;
};

// Parses a metrics file's text (the entry point for fuzzing); `source` names it in errors,
// with the line. InvalidArgument for a line that is not such an object, a value that is not
// a finite non-negative number (step_s: positive), an optional key on some lines only, or no
// steps at all. Never throws.
StatusOr<MetricsRun> ParseMetrics(std::string_view text, std::string_view source);

// Reads `path` (a regular file of at most 1 GiB: ReadInputFile) and parses it; the run's name
// is the file's name.
StatusOr<MetricsRun> ReadMetricsFile(const std::string& path);

}  // namespace zinf::tools

#endif  // ZINF_TOOLS_METRICS_FILE_H_
