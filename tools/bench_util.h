// What every `zinf bench` subcommand needs: medians of repetitions.
#ifndef ZINF_TOOLS_BENCH_UTIL_H_
#define ZINF_TOOLS_BENCH_UTIL_H_

#include <algorithm>
#include <vector>

namespace zinf::tools {

// The median (mean of the middle two for an even count); 0 for no values.
inline double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace zinf::tools

#endif  // ZINF_TOOLS_BENCH_UTIL_H_
