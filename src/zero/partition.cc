// See src/zero/partition.h and Note [ZeRO partitioning].
#include "zero/partition.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <numeric>

namespace zinf {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Element `index` of parameter `name`: N(0, std^2) from a counter-based generator, so any
// rank computes any element without the others.
float InitialValue(uint64_t key, uint64_t index, const ParamSpec& spec) {
  switch (spec.init) {
    case ParamInit::kZeros:
      return 0.0f;
    case ParamInit::kOnes:
      return 1.0f;
    case ParamInit::kNormal:
      break;
  }
  const uint64_t a = SplitMix64(key + 2 * index);
  const uint64_t b = SplitMix64(key + 2 * index + 1);
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;
  const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  return static_cast<float>(z * spec.init_std);
}

}  // namespace

uint64_t HashName(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull ^ SplitMix64(seed);
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return SplitMix64(h);
}

std::vector<int> OrderTrainableFirst(std::vector<Param>& params) {
  std::vector<int> order(params.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_partition(order.begin(), order.end(), [&](int i) { return params[i].trainable(); });
  std::vector<Param> ordered;
  ordered.reserve(params.size());
  std::vector<int> moved(params.size());
  for (size_t at = 0; at < order.size(); ++at) {
    moved[order[at]] = static_cast<int>(at);
    ordered.push_back(std::move(params[order[at]]));
  }
  params = std::move(ordered);
  return moved;
}

uint64_t Partition(std::vector<Param>& params, int world, int zero_stage,
                   uint64_t persistence_threshold) {
  uint64_t end = 0, shard_elements = 0;
  for (Param& p : params) {
    p.shard_size = (p.numel + world - 1) / world;
    p.flat_offset = end;
    end += p.shard_size;
    if (p.trainable()) shard_elements = end;
    p.persistent = zero_stage < 3 || p.numel < persistence_threshold;
  }
  return shard_elements;
}

Status FillShard(const std::vector<Param>& params, int rank, uint64_t begin, uint64_t count,
                 float* out, const ParamReader& read) {
  std::fill(out, out + count, 0.0f);  // padding
  auto it = std::upper_bound(params.begin(), params.end(), begin,
                             [](uint64_t b, const Param& p) { return b < p.flat_offset; });
  for (--it; it != params.end() && it->flat_offset < begin + count; ++it) {
    const Param& p = *it;
    const auto [first, last] = Overlap(begin, count, p);
    if (first >= last) continue;
    // This rank's elements of p begin at rank * shard_size; past numel is padding.
    const uint64_t element = static_cast<uint64_t>(rank) * p.shard_size + (first - p.flat_offset);
    const uint64_t end = std::min<uint64_t>(element + (last - first), p.numel);
    if (element >= end) continue;
    Status s = read(p, element, end - element, out + (first - begin));
    if (!s.ok()) return std::move(s).WithContext("parameter '" + p.spec.name + "'");
  }
  return OkStatus();
}

void FillInitial(const std::vector<Param>& params, uint64_t seed, int rank, uint64_t begin,
                 uint64_t count, float* out) {
  FillShard(params, rank, begin, count, out,
            [seed](const Param& p, uint64_t first, uint64_t n, float* values) {
              const uint64_t key = HashName(seed, p.spec.name);
              for (uint64_t i = 0; i < n; ++i) values[i] = InitialValue(key, first + i, p.spec);
              return OkStatus();
            })
      .IgnoreError();  // the reader never fails
}

}  // namespace zinf
