// The measurements of `zinf bench nvme`, `adam` and `pcie` as functions, for `zinf bench
// profile` to take the same figures the benchmarks print (each is defined in its benchmark's
// file). They print nothing.
#ifndef ZINF_TOOLS_BENCH_MEASURE_H_
#define ZINF_TOOLS_BENCH_MEASURE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "zinf/status.h"

namespace zinf::tools {

// tools/bench_nvme.cc: sequential write then read of `size_bytes` through SwapStore striped
// over `paths` at the engine's aio defaults (O_DIRECT, io_uring), then half of it rewritten
// while the other half is read, all in flight together, `reps` times; the medians in MB/s
// (10^6 bytes; mixed: read and written bytes together). InvalidArgument for a path that is not
// a directory.
struct NvmeFigures {
  double write_MBps = 0, read_MBps = 0, mixed_MBps = 0;
};
StatusOr<NvmeFigures> MeasureNvmeDefaults(const std::vector<std::string>& paths,
                                          uint64_t size_bytes, int reps);

// tools/bench_nvme.cc: one request of `request_bytes` at a time through SwapStore at the
// engine's defaults, written then read back, `requests` times: the median time of each, in
// microseconds. What every separately written or read tensor pays beyond its bytes.
struct NvmeLatency {
  double write_us = 0, read_us = 0;
};
StatusOr<NvmeLatency> MeasureNvmeLatency(const std::vector<std::string>& paths,
                                         uint64_t request_bytes, int requests);

// tools/bench_adam.cc: the fp32 AdamW step over `params` elements with `threads` threads (0:
// all), and the in-place bandwidth limit over the same bytes (the best variant): medians of
// `reps`.
struct AdamFigures {
  int threads = 0;
  double params_per_s = 0;
  double limit_GBps = 0;  // 10^9 bytes/s, read + written
};
StatusOr<AdamFigures> MeasureAdamRate(uint64_t params, int threads, int reps);

// tools/bench_pcie.cc: pinned host<->device copies of `size_bytes`, each direction alone, on
// the first GPU where there is one, else on the host device behind ZINF_HOST_LINK_GBPS's
// modelled link (unset: memcpy). Medians of `reps` batches, GB/s.
struct LinkFigures {
  bool gpu = false;
  std::string device;
  double model_GBps = 0;  // the host device's modelled link (0: none)
  double h2d_GBps = 0, d2h_GBps = 0;
};
StatusOr<LinkFigures> MeasureLink(uint64_t size_bytes, int reps);

}  // namespace zinf::tools

#endif  // ZINF_TOOLS_BENCH_MEASURE_H_
