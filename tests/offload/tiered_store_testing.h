// What the TieredStore tests share: the options of a small store on every tier, over a scratch
// directory for its swap files; a byte pattern per tensor and version; a store whose NVMe
// engine injects faults; tensors written in the host tier.
#ifndef ZINF_TESTS_OFFLOAD_TIERED_STORE_TESTING_H_
#define ZINF_TESTS_OFFLOAD_TIERED_STORE_TESTING_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "offload/tiered_store_internal.h"
#include "tests/nvme/nvme_test_util.h"
#include "tests/testing/faulty_engine.h"
#include "zinf/device.h"
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

inline uint8_t PatternByte(uint64_t id, uint64_t version, uint64_t i) {
  uint64_t x = (id * 0x9E3779B97F4A7C15ull) ^ (version * 0xC2B2AE3D27D4EB4Full) ^ (i / 8);
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return static_cast<uint8_t>(x >> (8 * (i % 8)));
}

inline void Fill(void* p, uint64_t size, uint64_t id, uint64_t version) {
  auto* b = static_cast<uint8_t*>(p);
  for (uint64_t i = 0; i < size; ++i) b[i] = PatternByte(id, version, i);
}

// Index of the first wrong byte, or -1.
inline int64_t Check(const void* p, uint64_t size, uint64_t id, uint64_t version) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (uint64_t i = 0; i < size; ++i) {
    if (b[i] != PatternByte(id, version, i)) return static_cast<int64_t>(i);
  }
  return -1;
}

// A store whose NVMe engine injects the faults `*faulty` is armed with.
inline StatusOr<std::unique_ptr<TieredStore>> CreateWithFaultyEngine(
    const TieredStoreOptions& options, FaultyEngine** faulty, Device* device = nullptr) {
  internal::SetTieredStoreEngineFactoryForTest(
      [faulty](const AioOptions& aio) -> StatusOr<std::unique_ptr<IoEngine>> {
        ZINF_ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> base, CreateIoEngine(aio));
        auto wrapper = std::make_unique<FaultyEngine>(std::move(base));
        *faulty = wrapper.get();
        return std::unique_ptr<IoEngine>(std::move(wrapper));
      });
  auto store =
      device != nullptr ? TieredStore::Create(options, device) : TieredStore::Create(options);
  internal::SetTieredStoreEngineFactoryForTest(nullptr);
  return store;
}

// Tensors of `sizes` homed in `home`, named prefix0, prefix1, ..., each written in the host
// tier with its Fill pattern of `version` (and, homed elsewhere, not yet written back).
inline std::vector<TensorId> WrittenInHostTier(TieredStore& store,
                                               const std::vector<uint64_t>& sizes, Tier home,
                                               uint64_t version, const std::string& prefix = "p") {
  std::vector<TensorId> ids;
  for (uint64_t size : sizes) {
    auto id = store.Create(prefix + std::to_string(ids.size()), size, home);
    EXPECT_TRUE(id.ok()) << id.status();
    if (!id.ok()) return {};
    auto p = store.Acquire(*id, Tier::kHost, Access::kOverwrite);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return {};
    Fill(*p, size, *id, version);
    EXPECT_TRUE(store.Release(*id, Tier::kHost).ok());
    ids.push_back(*id);
  }
  return ids;
}

// `count` tensors of `size` bytes homed on NVMe, named prefix0, prefix1, ..., each written
// in the host tier with its Fill pattern (version 1) and not yet written back.
inline std::vector<TensorId> WrittenOnNvme(TieredStore& store, const std::string& prefix, int count,
                                           uint64_t size) {
  return WrittenInHostTier(store, std::vector<uint64_t>(count, size), Tier::kNvme, 1, prefix);
}

}  // namespace zinf

#endif  // ZINF_TESTS_OFFLOAD_TIERED_STORE_TESTING_H_
