// What the plan's files share (tools/plan_memory.cc, tools/plan_time.cc): the model laid out
// as Partition lays it out, and the step's fetches simulated against the device tier's cache.
//
// Thread-safety: plain functions over values.
#ifndef ZINF_TOOLS_PLAN_INTERNAL_H_
#define ZINF_TOOLS_PLAN_INTERNAL_H_

#include <cstdint>
#include <vector>

#include "tools/plan_model.h"
#include "zero/tier_budgets.h"

namespace zinf::plan::internal {

inline constexpr uint64_t kPage = 4096;
inline uint64_t PageUp(uint64_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }
inline uint64_t ElementBytes(const EngineConfig& c) { return c.bf16 || c.fp16 ? 2 : 4; }
inline double SafeDiv(double a, double b) { return b > 0 ? a / b : 0.0; }
// The engine's tiered store reads ahead and writes back its shards in batches, as many
// requests in flight as the aio rings hold (Note [Batched write-backs] in
// offload/tiered_store.cc).
inline double RequestsInFlight(const EngineConfig& c) {
  return static_cast<double>(c.aio.queue_depth) * c.aio.thread_count;
}

// A parameter as Partition lays it out (src/zero/partition.cc).
struct Laid {
  uint64_t numel = 0, shard = 0;
  bool persistent = false;
};

struct Layout {
  std::vector<std::vector<Laid>> modules;
  uint64_t shard_elements = 0;
  uint64_t total = 0;
  bool fp32_view = true;  // 16-bit parameters are also widened to fp32 (the host device)
};

Layout LayOut(const ModelSpec& model, const EngineConfig& c, int world, bool fp32_view = true);
// The engine's tier budgets for the layout (Note [Tier budgets] in src/zero/tier_budgets.h),
// on the host device (the fp32 view handed out).
TierBudgets Budgets(const Layout& l, const EngineConfig& c, int world);

// The bytes the device tier holds for one module while it is fetched, beyond the shard copies
// (which the cache simulation counts): the gathered copy with several ranks, the fp32 widening
// of a 16-bit tier (with the fp32 view), and backward's fp32 gradients.
uint64_t LiveBeyondShards(const std::vector<Laid>& params, uint64_t element, int world,
                          bool fp32_view);
uint64_t ShardBytes(const std::vector<Laid>& params, uint64_t element);
uint64_t CountNonPersistent(const std::vector<Laid>& params);

// The step's fetches against the device tier's cache of shard copies (ParamTier keeps them
// until the budget needs their room; eviction follows the recorded order, which makes the
// store drop the copy needed last: Belady's choice).
struct CacheSim {
  std::vector<int> order;      // one step's fetches
  std::vector<uint64_t> miss;  // bytes each fetch brings to the device tier
  uint64_t cached_at_end = 0;  // shard bytes cached after the last fetch
  // The most the device tier holds at a fetch, the parameter tier itself not counted: cached
  // shard copies, persistent parameters, the fetched module's gathered, widened and gradient
  // buffers, and with several ranks the next module's gathers started ahead.
  uint64_t peak = 0;
};
CacheSim SimulateCache(const ModelSpec& model, const EngineConfig& c, int world, const Layout& l,
                       uint64_t device_budget);

// y at `log_x`, linear in log(x) between rows sorted by it, flat outside them: rates and
// waits measured at a few sizes. log_x_of and y_of read a row.
template <typename Row, typename LogX, typename Y>
double InterpolateInLog(const std::vector<Row>& rows, double log_x, LogX log_x_of, Y y_of) {
  if (log_x <= log_x_of(rows.front())) return y_of(rows.front());
  for (size_t i = 1; i < rows.size(); ++i) {
    const double x1 = log_x_of(rows[i]);
    if (log_x <= x1) {
      const double x0 = log_x_of(rows[i - 1]), y0 = y_of(rows[i - 1]), y1 = y_of(rows[i]);
      return x1 > x0 ? y0 + (y1 - y0) * (log_x - x0) / (x1 - x0) : y1;
    }
  }
  return y_of(rows.back());
}

}  // namespace zinf::plan::internal

#endif  // ZINF_TOOLS_PLAN_INTERNAL_H_
