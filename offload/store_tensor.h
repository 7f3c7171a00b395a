// StoreTensor and TierCopy: the tiered store's record of one tensor and of its copy in each
// tier (offload/tensor_catalog.h keeps them; TieredStore::Impl decides on them; TierMover
// moves their bytes).
//
// Thread-safety: a record's fields are the store's to read and write with its mutex held,
// except while `busy`: a transfer then uses the copies without the mutex, and nothing else
// evicts, frees or overwrites them (the header of offload/tiered_store.cc).
#ifndef ZINF_OFFLOAD_STORE_TENSOR_H_
#define ZINF_OFFLOAD_STORE_TENSOR_H_

#include <array>
#include <cstdint>
#include <future>
#include <string>
#include <vector>

#include "nvme/swap_store.h"
#include "offload/memory_pool.h"
#include "zinf/status.h"
#include "zinf/tiered_store.h"

namespace zinf {

inline constexpr int kTiers = 3;
inline int Index(Tier tier) { return static_cast<int>(tier); }

struct TierCopy {
  bool present = false;  // memory held in this tier
  bool valid = false;    // holds the current bytes
  bool zero = false;     // current bytes are all zero and the memory was never written
  int pins = 0;
  PoolBlock block;                  // device and host tiers
  std::vector<SwapExtent> extents;  // NVMe tier: pieces of at most piece_bytes
};

struct StoreTensor {
  TensorId id = 0;
  std::string name;
  uint64_t size = 0;
  Tier home = Tier::kHost;
  std::array<TierCopy, kTiers> copies;
  bool busy = false;     // a transfer uses the copies
  bool writer = false;   // acquired for writing
  bool scratch = false;  // Free parks it for reuse: Note [Scratch tensors]
  int64_t next_use = -1;
  uint64_t last_use = 0;
  std::array<std::shared_future<Status>, kTiers> prefetch;  // in flight, if valid()

  int pins() const { return copies[0].pins + copies[1].pins + copies[2].pins; }
};

}  // namespace zinf

#endif  // ZINF_OFFLOAD_STORE_TENSOR_H_
