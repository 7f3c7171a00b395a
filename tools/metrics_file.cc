// See metrics_file.h.
#include "tools/metrics_file.h"

#include <fmt/core.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <utility>

#include "core/config_reader.h"
#include "zinf/input_file.h"

namespace zinf::tools {
namespace {

// A finite number at `key` of `line`; `required` keys must be there.
Status ReadNumber(const nlohmann::json& line, const char* key, bool required,
                  const std::string& where, std::vector<double>* out, size_t steps) {
  auto it = line.find(key);
  if (it == line.end()) {
    if (required) return InvalidArgument(fmt::format("{}: no \"{}\" in the object", where, key));
    return OkStatus();
  }
  // Step times are drawn on a log axis: they must be positive; parts may be 0.
  const bool positive = std::string_view(key) == "step_s";
  if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() < 0 ||
      (positive && it->get<double>() == 0)) {
    return InvalidArgument(fmt::format("{}: \"{}\" must be a {} number, got {}", where, key,
                                       positive ? "positive" : "finite non-negative",
                                       DescribeJson(*it)));
  }
  // An optional key present on some lines only would misalign the curve: all or none.
  if (out->size() != steps) {
    return InvalidArgument(
        fmt::format("{}: \"{}\" is here but not on the lines before", where, key));
  }
  out->push_back(it->get<double>());
  return OkStatus();
}

}  // namespace

StatusOr<MetricsRun> ParseMetrics(std::string_view text, std::string_view source) {
  MetricsRun run;
  int number = 0;
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line_text = text.substr(start, end - start);
    start = end + 1;
    ++number;
    if (line_text.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const std::string where = fmt::format("{}:{}", source, number);
    ZINF_ASSIGN_OR_RETURN(const nlohmann::json line, ParseJson(line_text, where));
    if (!line.is_object()) {
      return InvalidArgument(
          fmt::format("{}: not a JSON object (train_gpt --metrics writes one per line), but {}",
                      where, DescribeJson(line)));
    }
    const size_t n = run.step.size();
    ZINF_RETURN_IF_ERROR(ReadNumber(line, "step", true, where, &run.step, n));
    ZINF_RETURN_IF_ERROR(ReadNumber(line, "loss", true, where, &run.loss, n));
    ZINF_RETURN_IF_ERROR(ReadNumber(line, "step_s", true, where, &run.step_s, n));
    ZINF_RETURN_IF_ERROR(ReadNumber(line, "compute_s", false, where, &run.compute_s, n));
    ZINF_RETURN_IF_ERROR(ReadNumber(line, "param_wait_s", false, where, &run.param_wait_s, n));
    ZINF_RETURN_IF_ERROR(ReadNumber(line, "grad_reduce_s", false, where, &run.grad_reduce_s, n));
    ZINF_RETURN_IF_ERROR(ReadNumber(line, "optimizer_s", false, where, &run.optimizer_s, n));
    // ... and one there before must be on every line after.
    for (const auto& [key, curve] :
         {std::pair{"compute_s", &run.compute_s}, std::pair{"param_wait_s", &run.param_wait_s},
          std::pair{"grad_reduce_s", &run.grad_reduce_s},
          std::pair{"optimizer_s", &run.optimizer_s}}) {
      if (!curve->empty() && curve->size() != run.step.size()) {
        return InvalidArgument(
            fmt::format("{}: \"{}\" is missing here but was on the lines before", where, key));
      }
    }
  }
  if (run.step.empty()) return InvalidArgument(fmt::format("metrics file {} has no steps", source));
  return run;
}

StatusOr<MetricsRun> ReadMetricsFile(const std::string& path) {
  // A million steps of metrics are about 300 MB.
  ZINF_ASSIGN_OR_RETURN(const std::string text,
                        ReadInputFile(path, "metrics file", uint64_t{1} << 30));
  ZINF_ASSIGN_OR_RETURN(MetricsRun run, ParseMetrics(text, path));
  run.name = path.substr(path.find_last_of('/') + 1);
  return run;
}

}  // namespace zinf::tools
