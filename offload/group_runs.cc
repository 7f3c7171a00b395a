// Parameter groups over a flat shard: see offload/group_runs.h.
#include "offload/group_runs.h"

#include <fmt/core.h>

#include <algorithm>
#include <iterator>
#include <set>
#include <string>

namespace zinf {

Status CheckGroupRuns(const std::vector<GroupRun>& runs, uint64_t count,
                      const CpuOptimizer& optimizer, const std::string& what) {
  if (runs.empty() || runs[0].begin != 0) {
    return InvalidArgument(what + ": the group runs must begin at element 0");
  }
  StatusOr<ParamGroupState> first = optimizer.group(runs[0].group);
  ZINF_RETURN_IF_ERROR_CTX(first.status(), what);
  for (size_t i = 0; i < runs.size(); ++i) {
    if (i > 0 && (runs[i].begin <= runs[i - 1].begin || runs[i].begin >= count)) {
      return InvalidArgument(fmt::format(
          "{}: group run {} begins at element {}, after run {}'s {} and before {} expected", what,
          i, runs[i].begin, i - 1, runs[i - 1].begin, count));
    }
    StatusOr<ParamGroupState> group = optimizer.group(runs[i].group);
    ZINF_RETURN_IF_ERROR_CTX(group.status(), what);
    if (group->hyper_params.type != first->hyper_params.type) {
      return InvalidArgument(fmt::format(
          "{}: parameter groups {} ({}) and {} ({}) differ in type; a shard's groups share one",
          what, runs[0].group, OptimizerTypeName(first->hyper_params.type), runs[i].group,
          OptimizerTypeName(group->hyper_params.type)));
    }
  }
  return OkStatus();
}

std::vector<int> GroupsOf(const std::vector<GroupRun>& runs) {
  std::set<int> groups;
  for (const GroupRun& run : runs) groups.insert(run.group);
  return {groups.begin(), groups.end()};
}

Status ForEachGroupRun(const std::vector<GroupRun>& runs, uint64_t offset, uint64_t count,
                       const std::function<Status(int group, uint64_t begin, uint64_t n)>& visit) {
  // The run holding `offset`: the last one that begins at or before it.
  auto it = std::upper_bound(runs.begin(), runs.end(), offset,
                             [](uint64_t at, const GroupRun& run) { return at < run.begin; });
  if (it != runs.begin()) --it;
  const uint64_t end = offset + count;
  for (uint64_t at = offset; at < end; ++it) {
    const uint64_t stop = std::next(it) == runs.end() ? end : std::min(end, std::next(it)->begin);
    if (stop <= at) continue;
    ZINF_RETURN_IF_ERROR(visit(it->group, at, stop - at));
    at = stop;
  }
  return OkStatus();
}

}  // namespace zinf
