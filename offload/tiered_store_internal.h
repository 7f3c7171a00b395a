// TieredStore's private side (for zinf's own code): a store whose NVMe tier is a swap store
// configured in full (aio settings, file naming per rank); for offload/'s clients of the store
// that keep state in its swap files and host tier (PipelinedOptimizer::Create on a store),
// that swap store and pool; and a test hook that puts a fault-injecting IoEngine
// (tests/testing/faulty_engine.h) under the NVMe tier. The engine (src/zero) uses only Create:
// tests/layering/layering_test.sh fails on the rest there.
//
// Thread-safety: set the hook before creating stores, and clear it after; not synchronized.
// The rest as TieredStore.
#ifndef ZINF_OFFLOAD_TIERED_STORE_INTERNAL_H_
#define ZINF_OFFLOAD_TIERED_STORE_INTERNAL_H_

#include <functional>
#include <memory>

#include "nvme/io_engine.h"
#include "nvme/swap_store.h"
#include "offload/memory_pool.h"
#include "zinf/device.h"
#include "zinf/status.h"
#include "zinf/tiered_store.h"

namespace zinf::internal {

// When set, TieredStore::Create opens its swap store on the engine this returns (given the
// options' aio settings) instead of the default one. nullptr clears it.
using TieredStoreEngineFactory =
    std::function<StatusOr<std::unique_ptr<IoEngine>>(const AioOptions& options)>;
void SetTieredStoreEngineFactoryForTest(TieredStoreEngineFactory factory);

struct TieredStoreAccess {
  // TieredStore::Create on `device`, with the NVMe tier opened from `swap` (when swap.paths is
  // not empty) instead of options.nvme_paths, nvme_capacity_bytes and nvme_checksum.
  static StatusOr<std::unique_ptr<TieredStore>> Create(const TieredStoreOptions& options,
                                                       const SwapStoreOptions& swap,
                                                       Device* device);
  // The store's swap store, or null without an NVMe tier. It outlives nothing: valid while the
  // store is. Extents allocated on it by others are theirs to free.
  static SwapStore* Swap(TieredStore& store);
  // The host tier's pool, for clients whose buffers are not tensors (the pipelined optimizer
  // step's staging and host-resident chunks): blocks of it count in the host tier's budget and
  // stats, and are never evicted. Valid while the store is.
  static MemoryPool* HostPool(TieredStore& store);
};

}  // namespace zinf::internal

#endif  // ZINF_OFFLOAD_TIERED_STORE_INTERNAL_H_
