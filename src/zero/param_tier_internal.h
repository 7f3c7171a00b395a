// The private state of ParamTier (param_tier.h), shared by the files that implement it:
// param_tier.cc (fetching, gathering, prefetch) and param_tier_writes.cc (writing the tier).
#ifndef ZINF_ZERO_PARAM_TIER_INTERNAL_H_
#define ZINF_ZERO_PARAM_TIER_INTERNAL_H_

#include <memory>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "zero/param_tier.h"

namespace zinf {

// Note [Coalesced gathers]
// A module's parameters are gathered with one collective, not one each: every collective is a
// rendezvous of all ranks, and where the ranks share a node's cores its latency, not its bytes,
// is what a module's gathers cost (DeepSpeed's allgather_coalesced does the same). The shards
// are packed side by side into a send tensor and all-gathered into a receive tensor, rank-major
// (rank r's shards of every parameter together); the first Gather of any of the parameters
// copies each rank's piece of each one into that parameter's gathered tensor and frees both.
// Those copies are the price: the module's bytes once more through device memory, for a
// rendezvous saved per parameter. Every rank packs the same parameters in the same order (the
// same fetches and prefetch decisions, Note [Prefetch]), so the collectives stay in step.
struct ParamTier::Coalesced {
  TieredStore* store = nullptr;
  std::vector<int> params;
  std::vector<uint64_t> at;  // each parameter's offset in a rank's slice, in elements
  uint64_t slice = 0;        // elements of one rank's slice
  TensorId send = 0, receive = 0;
  void* send_data = nullptr;
  void* receive_data = nullptr;  // null once unpacked
  std::shared_ptr<CommWork> work;

  ~Coalesced() {
    if (work != nullptr) (void)work->Wait();
    FreeBuffers();
  }
  void FreeBuffers() {
    for (auto [id, data] : {std::pair{&send, &send_data}, std::pair{&receive, &receive_data}}) {
      if (*data != nullptr) store->Release(*id, Tier::kDevice).IgnoreError();
      if (*id != 0) store->Free(*id).IgnoreError();
      *id = 0;
      *data = nullptr;
    }
  }
};

struct ParamTier::State {
  TensorId shard = 0;
  TensorId gathered = 0;       // several ranks: the all-gather's destination
  TensorId widened = 0;        // 16-bit: the fp32 copy
  void* shard_data = nullptr;  // the shard, pinned in the device tier while set
  void* full = nullptr;        // the gathered parameter, compute precision
  float* fp32 = nullptr;       // the gathered parameter, fp32
  bool current = false;        // full (and fp32) hold the current values
  bool prefetched = false;     // brought in ahead and not yet gathered
  std::shared_ptr<CommWork> gathering;
  std::shared_ptr<Coalesced> coalesced;  // gathered with others: unpacked by the first Gather
};

}  // namespace zinf

#endif  // ZINF_ZERO_PARAM_TIER_INTERNAL_H_
