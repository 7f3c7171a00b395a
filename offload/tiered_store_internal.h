// TieredStore's test side: a hook that puts a fault-injecting IoEngine
// (tests/testing/faulty_engine.h) under the NVMe tier, and a Create for tests that describe
// the NVMe tier as a swap store's options. zinf's own code creates its stores with the public
// TieredStore::Create: the NVMe tier's settings are TieredStoreOptions' (nvme_*). Nothing
// reaches past the store to its swap store or pools: its clients use its tensors.
//
// Thread-safety: set the hook before creating stores, and clear it after; not synchronized.
// The rest as TieredStore.
#ifndef ZINF_OFFLOAD_TIERED_STORE_INTERNAL_H_
#define ZINF_OFFLOAD_TIERED_STORE_INTERNAL_H_

#include <functional>
#include <memory>

#include "nvme/io_engine.h"
#include "nvme/swap_store.h"
#include "zinf/device.h"
#include "zinf/status.h"
#include "zinf/tiered_store.h"

namespace zinf::internal {

// When set, TieredStore::Create opens its NVMe tier on the engine this returns (given the
// options' aio settings) instead of the default one. nullptr clears it.
using TieredStoreEngineFactory =
    std::function<StatusOr<std::unique_ptr<IoEngine>>(const AioOptions& options)>;
void SetTieredStoreEngineFactoryForTest(TieredStoreEngineFactory factory);

struct TieredStoreAccess {
  // TieredStore::Create on `device`, with the NVMe tier described by `swap` (none when
  // swap.paths is empty) instead of options' nvme_* fields. swap's stripe_bytes and
  // lock_wait_ms are not the store's to set: the defaults are used.
  static StatusOr<std::unique_ptr<TieredStore>> Create(const TieredStoreOptions& options,
                                                       const SwapStoreOptions& swap,
                                                       Device* device) {
    TieredStoreOptions with_swap = options;
    with_swap.nvme_paths = swap.paths;
    with_swap.nvme_capacity_bytes = swap.capacity_bytes;
    with_swap.nvme_checksum = swap.checksum;
    with_swap.nvme_rank = swap.rank;
    with_swap.nvme_aio = swap.aio;
    return TieredStore::Create(with_swap, device);
  }
};

}  // namespace zinf::internal

#endif  // ZINF_OFFLOAD_TIERED_STORE_INTERNAL_H_
