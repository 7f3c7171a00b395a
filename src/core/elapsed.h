// Wall time elapsed since a point, in seconds: what the step summaries' timings are made of.
//
// Thread-safety: pure functions.
#ifndef ZINF_CORE_ELAPSED_H_
#define ZINF_CORE_ELAPSED_H_

#include <chrono>

namespace zinf {

using SteadyClock = std::chrono::steady_clock;

inline double SecondsSince(SteadyClock::time_point since) {
  return std::chrono::duration<double>(SteadyClock::now() - since).count();
}

}  // namespace zinf

#endif  // ZINF_CORE_ELAPSED_H_
