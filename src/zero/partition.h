// The ZeRO partitioning of a model: which elements of each parameter this rank owns and where
// they sit in its flat shard, and the initial values, which depend only on (seed, name,
// index) so that every world size builds the same model.
//
// Note [ZeRO partitioning]
// Each parameter is flattened and padded to a multiple of the world size; rank r owns
// elements [r * s, (r + 1) * s) of it, s = padded / world. This rank's pieces of all
// parameters sit back to back in one flat shard, so that the master copy, the gradient
// accumulator and the optimizer state are each one array and one optimizer call updates
// them all. Padding elements have zero value, zero gradient and zero state, so every
// optimizer leaves them at zero.
//
// Note [Frozen parameters]
// A parameter with ParamSpec::trainable false (a LoRA base, a reference model) has no fp32
// master, gradient accumulator or optimizer state: its shard lives only in the parameter
// tier, in the compute precision, where Fetch gathers it as any other's, so a frozen model's
// bytes per rank fall with the ranks as a trained one's do. The frozen parameters are laid
// out after every trainable one: the flat shard [0, trainable elements) is the optimizer's
// alone, and a frozen parameter's flat_offset lies past its end, an address that only a
// checkpoint's "params" section (every parameter's values, fp32) uses. The engine keeps its
// parameters in that flat order (OrderTrainableFirst), which every search by flat offset needs.
//
// Thread-safety: plain data and pure functions.
#ifndef ZINF_ZERO_PARTITION_H_
#define ZINF_ZERO_PARTITION_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "zinf/engine.h"

namespace zinf {

struct Param {
  ParamSpec spec;
  bool trainable() const { return spec.trainable; }
  int module = 0;
  uint64_t numel = 0;
  uint64_t shard_size = 0;   // padded / world
  uint64_t flat_offset = 0;  // where this rank's shard sits in the flat arrays
  bool persistent = false;   // stays gathered between Fetch/Release
};

struct Module {
  std::string name;
  std::vector<int> params;
  bool fetched = false;
  int reductions = 0;  // ReduceGradients calls since the last Step
  // Whether it holds a trainable parameter, which Step needs reduced (set at Initialize): a
  // module of frozen parameters alone has no gradient (Note [Frozen parameters]).
  bool trains = false;
};

// The elements [first, last) of the flat shard that [begin, begin + count) shares with
// parameter `p`'s shard; first >= last when none.
struct Span {
  uint64_t first, last;
};
inline Span Overlap(uint64_t begin, uint64_t count, const Param& p) {
  return {std::max(begin, p.flat_offset), std::min(begin + count, p.flat_offset + p.shard_size)};
}

// Reorders `params` into flat order: the trainable ones, then the frozen ones, each in the
// order given. Returns each parameter's new index, by its old one.
std::vector<int> OrderTrainableFirst(std::vector<Param>& params);

// The trainable parameters of `params` in flat order: its prefix that the optimizer owns.
inline std::span<const Param> Trained(const std::vector<Param>& params) {
  const auto end = std::partition_point(params.begin(), params.end(),
                                        [](const Param& p) { return p.trainable(); });
  return {params.data(), static_cast<size_t>(end - params.begin())};
}

// Lays out `params` (in flat order: OrderTrainableFirst) for `world` ranks (shard_size,
// flat_offset, persistent) and returns the flat shard's length: the trainable parameters'
// elements per rank, padding included. The frozen ones follow it (Note [Frozen parameters]).
uint64_t Partition(std::vector<Param>& params, int world, int zero_stage,
                   uint64_t persistence_threshold);

// Where the laid-out `params` end: the flat shard and the frozen parameters after it.
inline uint64_t FlatEnd(const std::vector<Param>& params) {
  return params.empty() ? 0 : params.back().flat_offset + params.back().shard_size;
}

// Writes elements [first, first + count) of parameter `p`'s flattened value into `out`.
using ParamReader =
    std::function<Status(const Param& p, uint64_t first, uint64_t count, float* out)>;

// The flat shard's elements [begin, begin + count) of rank `rank` into `out`: each piece of a
// parameter from `read` (called in flat order, once per parameter the range touches, never
// with count 0), the padding zero. `params` is laid out (Partition) and ordered by
// flat_offset. Returns the first error of `read`, with the parameter named.
Status FillShard(const std::vector<Param>& params, int rank, uint64_t begin, uint64_t count,
                 float* out, const ParamReader& read);

// The initial values (ParamSpec::init) of the flat shard's elements [begin, begin + count) of
// rank `rank` into `out`, as FillShard lays them out.
void FillInitial(const std::vector<Param>& params, uint64_t seed, int rank, uint64_t begin,
                 uint64_t count, float* out);

// A 64-bit hash of `name` under `seed` (FNV-1a mixed by SplitMix64): stable across builds.
uint64_t HashName(uint64_t seed, const std::string& name);

}  // namespace zinf

#endif  // ZINF_ZERO_PARTITION_H_
