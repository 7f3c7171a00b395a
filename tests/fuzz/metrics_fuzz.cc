// libFuzzer target: a metrics file (`zinf plot metrics FILE`), hostile or damaged, through
// tools::ParseMetrics. Any input must give a run whose curves have one value per step each
// (or none, for an optional key), every value finite and non-negative, or a Status.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "tools/metrics_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto run = zinf::tools::ParseMetrics(text, "fuzz");
  if (!run.ok()) {
    if (run.status().code() == zinf::StatusCode::kInternal) std::abort();
    return 0;
  }
  const size_t steps = run->step.size();
  if (steps == 0 || run->loss.size() != steps || run->step_s.size() != steps) std::abort();
  for (const std::vector<double>* curve :
       {&run->step, &run->loss, &run->step_s, &run->compute_s, &run->param_wait_s,
        &run->grad_reduce_s, &run->optimizer_s}) {
    if (!curve->empty() && curve->size() != steps) std::abort();
    for (double v : *curve) {
      if (!std::isfinite(v) || v < 0) std::abort();
    }
  }
  return 0;
}
