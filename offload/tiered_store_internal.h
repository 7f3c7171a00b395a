// TieredStore's private side (for zinf's own code): a store whose NVMe tier is a swap store
// configured in full (aio settings, file naming per rank), and a test hook that puts a
// fault-injecting IoEngine (tests/testing/faulty_engine.h) under the NVMe tier. Nothing reaches
// past the store to its swap store or pools: its clients use its tensors.
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
};

}  // namespace zinf::internal

#endif  // ZINF_OFFLOAD_TIERED_STORE_INTERNAL_H_
