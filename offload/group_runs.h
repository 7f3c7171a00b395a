// Parameter groups over a flat shard: which CpuOptimizer parameter group steps each stretch of
// it. A shard holds many parameters back to back; a trainer puts some in one group (weights
// with weight decay) and some in another (biases and norms without), so a shard's elements
// fall into runs of consecutive elements of one group. Stepping a shard is then BeginStep once
// per group and an Update per run (or per part of a run that lies in one chunk): the update is
// element-wise, so this is bitwise what separate shards of each group would give.
//
// Thread-safety: plain values and functions.
#ifndef ZINF_OFFLOAD_GROUP_RUNS_H_
#define ZINF_OFFLOAD_GROUP_RUNS_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "zinf/cpu_optimizer.h"
#include "zinf/status.h"

namespace zinf {

// Run i covers the shard's elements [runs[i].begin, runs[i + 1].begin), the last run to the
// shard's end; the first begins at 0 and begins increase.
struct GroupRun {
  uint64_t begin = 0;
  int group = 0;
};

// InvalidArgument naming `what` unless `runs` is non-empty, begins at 0 with strictly
// increasing begins below `count`, and names groups of `optimizer` that share one type (and
// so one state layout).
Status CheckGroupRuns(const std::vector<GroupRun>& runs, uint64_t count,
                      const CpuOptimizer& optimizer, const std::string& what);

// The groups `runs` name, each once, in increasing order.
std::vector<int> GroupsOf(const std::vector<GroupRun>& runs);

// Calls visit(group, begin, n) for each stretch [begin, begin + n) of [offset, offset + count)
// that lies in one run, in order; stops at the first error and returns it.
Status ForEachGroupRun(const std::vector<GroupRun>& runs, uint64_t offset, uint64_t count,
                       const std::function<Status(int group, uint64_t begin, uint64_t n)>& visit);

}  // namespace zinf

#endif  // ZINF_OFFLOAD_GROUP_RUNS_H_
