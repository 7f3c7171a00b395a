// Test hooks of TieredStore (private to zinf): lets tests put a fault-injecting IoEngine
// (nvme/faulty_engine.h) under the store's NVMe tier.
//
// Thread-safety: set the hook before creating stores, and clear it after; not synchronized.
#ifndef ZINF_OFFLOAD_TIERED_STORE_INTERNAL_H_
#define ZINF_OFFLOAD_TIERED_STORE_INTERNAL_H_

#include <functional>
#include <memory>

#include "nvme/io_engine.h"
#include "zinf/status.h"

namespace zinf::internal {

// When set, TieredStore::Create opens its swap store on the engine this returns (given the
// options' aio settings) instead of the default one. nullptr clears it.
using TieredStoreEngineFactory =
    std::function<StatusOr<std::unique_ptr<IoEngine>>(const AioOptions& options)>;
void SetTieredStoreEngineFactoryForTest(TieredStoreEngineFactory factory);

}  // namespace zinf::internal

#endif  // ZINF_OFFLOAD_TIERED_STORE_INTERNAL_H_
