// What the TieredStore tests share: the options of a small store on every tier, over a scratch
// directory for its swap files.
#ifndef ZINF_TESTS_OFFLOAD_TIERED_STORE_TESTING_H_
#define ZINF_TESTS_OFFLOAD_TIERED_STORE_TESTING_H_

#include <cstdint>

#include "tests/nvme/nvme_test_util.h"
#include "zinf/tiered_store.h"

namespace zinf {

inline constexpr uint64_t kKiB = 1024;
inline constexpr uint64_t kMiB = 1024 * kKiB;

// A host device and a host tier of 8 MiB each (unpinned), 96 MiB of swap in `dir`, pieces of
// 256 KiB, two staging buffers and two transfer threads.
inline TieredStoreOptions Options(const testing_util::ScratchDir& dir) {
  TieredStoreOptions o;
  o.device = "host";
  o.device_budget_bytes = 8 * kMiB;
  o.host_budget_bytes = 8 * kMiB;
  o.pin_host = false;
  o.nvme_paths = {dir.path()};
  o.nvme_capacity_bytes = 96 * kMiB;
  o.piece_bytes = 256 * kKiB;
  o.staging_buffers = 2;
  o.transfer_threads = 2;
  return o;
}

}  // namespace zinf

#endif  // ZINF_TESTS_OFFLOAD_TIERED_STORE_TESTING_H_
