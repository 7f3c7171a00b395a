// TieredStore's scratch tensors and bookkeeping (Note [Scratch tensors]): a loop that makes and
// frees the same tensors leaves the store's bookkeeping the size it had after its first pass,
// a reused scratch tensor reads as zeros like a new one, parked memory gives way to tensors
// that need it, and freed ids stay errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "tests/nvme/nvme_test_util.h"
#include "tests/offload/tiered_store_testing.h"
#include "zinf/tiered_store.h"

namespace zinf {
namespace {

using ::testing::HasSubstr;
using testing_util::ScratchDir;

// What a training step does to the store, once: shards homed on NVMe are prefetched to the
// device, gathered into scratch tensors, released and written back; gradients are scratch
// tensors in the device tier and staging buffers in the host tier.
class GatherCycle {
 public:
  explicit GatherCycle(TieredStore* store) : store_(store) {}

  Status Init() {
    for (int i = 0; i < 4; ++i) {
      ZINF_ASSIGN_OR_RETURN(TensorId id,
                            store_->Create("shard " + std::to_string(i), Bytes(i), Tier::kNvme));
      shards_.push_back(id);
    }
    return OkStatus();
  }

  Status Run() {
    ZINF_RETURN_IF_ERROR(store_->Prefetch(shards_, Tier::kDevice).get());
    for (size_t i = 0; i < shards_.size(); ++i) {
      ZINF_ASSIGN_OR_RETURN(void* shard, store_->Acquire(shards_[i], Tier::kDevice, Access::kRead));
      ZINF_ASSIGN_OR_RETURN(TensorId gathered,
                            store_->CreateScratch("gathered", 2 * Bytes(i), Tier::kDevice));
      ZINF_ASSIGN_OR_RETURN(void* full,
                            store_->Acquire(gathered, Tier::kDevice, Access::kOverwrite));
      std::memcpy(full, shard, Bytes(i));
      std::memcpy(static_cast<char*>(full) + Bytes(i), shard, Bytes(i));
      ZINF_RETURN_IF_ERROR(store_->Release(shards_[i], Tier::kDevice));
      ZINF_ASSIGN_OR_RETURN(TensorId grad,
                            store_->CreateScratch("gradient", Bytes(i), Tier::kDevice));
      ZINF_ASSIGN_OR_RETURN(void* g, store_->Acquire(grad, Tier::kDevice, Access::kWrite));
      ZINF_ASSIGN_OR_RETURN(TensorId staging,
                            store_->CreateScratch("staging", Bytes(i), Tier::kHost));
      ZINF_ASSIGN_OR_RETURN(void* host, store_->Acquire(staging, Tier::kHost, Access::kOverwrite));
      std::memcpy(host, g, Bytes(i));
      for (auto [id, tier] : {std::pair{gathered, Tier::kDevice}, std::pair{grad, Tier::kDevice},
                              std::pair{staging, Tier::kHost}}) {
        ZINF_RETURN_IF_ERROR(store_->Release(id, tier));
        ZINF_RETURN_IF_ERROR(store_->Free(id));
      }
      // The update writes the shard, which goes home with the others.
      ZINF_ASSIGN_OR_RETURN(void* updated,
                            store_->Acquire(shards_[i], Tier::kHost, Access::kWrite));
      static_cast<char*>(updated)[0] += 1;
      ZINF_RETURN_IF_ERROR(store_->Release(shards_[i], Tier::kHost));
    }
    ZINF_RETURN_IF_ERROR(store_->EvictAsync(shards_, Tier::kDevice).get());
    return store_->EvictAsync(shards_, Tier::kHost).get();
  }

 private:
  static uint64_t Bytes(size_t i) { return 16 * kKiB + 4096 * i; }
  TieredStore* store_;
  std::vector<TensorId> shards_;
};

TEST(TieredStoreScratchTest, BookkeepingIsTheSameAfterOneAndTenThousandCycles) {
  ScratchDir dir;
  auto store = TieredStore::Create(Options(dir));
  ASSERT_TRUE(store.ok()) << store.status();
  GatherCycle cycle(store->get());
  ASSERT_TRUE(cycle.Init().ok());
  ASSERT_TRUE(cycle.Run().ok());
  const TieredStoreStats after_one = (*store)->stats();
  for (int i = 1; i < 10000; ++i) {
    Status s = cycle.Run();
    ASSERT_TRUE(s.ok()) << "cycle " << i << ": " << s;
  }
  const TieredStoreStats after_many = (*store)->stats();
  EXPECT_EQ(after_many.tensors, after_one.tensors);
  EXPECT_EQ(after_many.idle_scratch, after_one.idle_scratch);
  EXPECT_EQ(after_many.bookkeeping_entries, after_one.bookkeeping_entries);
  EXPECT_EQ(after_many.tiers[int(Tier::kDevice)].in_use_bytes,
            after_one.tiers[int(Tier::kDevice)].in_use_bytes);
  EXPECT_EQ(after_many.tiers[int(Tier::kHost)].in_use_bytes,
            after_one.tiers[int(Tier::kHost)].in_use_bytes);
  EXPECT_EQ(after_many.tiers[int(Tier::kNvme)].in_use_bytes,
            after_one.tiers[int(Tier::kNvme)].in_use_bytes);
  EXPECT_GT(after_one.idle_scratch, 0u);  // the scratch tensors were parked, not dropped
}

TEST(TieredStoreScratchTest, AReusedScratchTensorReadsAsZerosUnderANewId) {
  ScratchDir dir;
  auto store = TieredStore::Create(Options(dir));
  ASSERT_TRUE(store.ok()) << store.status();
  auto first = (*store)->CreateScratch("first", 8 * kKiB, Tier::kDevice);
  ASSERT_TRUE(first.ok()) << first.status();
  auto p = (*store)->Acquire(*first, Tier::kDevice, Access::kOverwrite);
  ASSERT_TRUE(p.ok());
  std::memset(*p, 0x5a, 8 * kKiB);
  ASSERT_TRUE((*store)->Release(*first, Tier::kDevice).ok());
  ASSERT_TRUE((*store)->Free(*first).ok());
  EXPECT_EQ((*store)->stats().idle_scratch, 1u);

  auto second = (*store)->CreateScratch("second", 8 * kKiB, Tier::kDevice);
  ASSERT_TRUE(second.ok());
  EXPECT_NE(*second, *first);
  EXPECT_EQ((*store)->stats().idle_scratch, 0u);  // the parked one, taken again
  auto q = (*store)->Acquire(*second, Tier::kDevice, Access::kRead);
  ASSERT_TRUE(q.ok());
  const std::vector<char> zeros(8 * kKiB, 0);
  EXPECT_EQ(std::memcmp(*q, zeros.data(), zeros.size()), 0);
  ASSERT_TRUE((*store)->Release(*second, Tier::kDevice).ok());

  // The first id stays freed, by name.
  auto stale = (*store)->Acquire(*first, Tier::kDevice, Access::kRead);
  EXPECT_EQ(stale.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(stale.status().message(), HasSubstr("('first') was freed"));
}

TEST(TieredStoreScratchTest, ParkedMemoryGivesWayToATensorThatNeedsIt) {
  ScratchDir dir;
  TieredStoreOptions options = Options(dir);
  options.device_budget_bytes = 1 * kMiB;
  auto store = TieredStore::Create(options);
  ASSERT_TRUE(store.ok()) << store.status();
  for (int i = 0; i < 3; ++i) {  // three quarters of the tier, parked
    auto id = (*store)->CreateScratch("parked", 256 * kKiB, Tier::kDevice);
    ASSERT_TRUE(id.ok());
    ASSERT_TRUE((*store)->Free(*id).ok());
    id = (*store)->CreateScratch("parked", 256 * kKiB, Tier::kDevice);  // reused, not added
    ASSERT_TRUE(id.ok());
    ASSERT_TRUE((*store)->Free(*id).ok());
  }
  EXPECT_EQ((*store)->stats().idle_scratch, 1u);
  std::vector<TensorId> parked;
  for (int i = 0; i < 3; ++i) {
    auto id = (*store)->CreateScratch("parked", 256 * kKiB, Tier::kDevice);
    ASSERT_TRUE(id.ok());
    parked.push_back(*id);
  }
  for (TensorId id : parked) ASSERT_TRUE((*store)->Free(id).ok());
  EXPECT_EQ((*store)->stats().idle_scratch, 3u);
  // 768 KiB is free only once the parked memory goes back.
  auto big = (*store)->Create("big", 768 * kKiB, Tier::kDevice);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_LT((*store)->stats().idle_scratch, 3u);
  EXPECT_LE((*store)->stats().tiers[int(Tier::kDevice)].peak_bytes, 1 * kMiB);
}

TEST(TieredStoreScratchTest, ScratchOnNvmeOrWithoutSizeIsRefused) {
  ScratchDir dir;
  auto store = TieredStore::Create(Options(dir));
  ASSERT_TRUE(store.ok()) << store.status();
  auto nvme = (*store)->CreateScratch("on nvme", 4096, Tier::kNvme);
  EXPECT_EQ(nvme.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(nvme.status().message(), HasSubstr("'on nvme'"));
  EXPECT_EQ((*store)->CreateScratch("empty", 0, Tier::kHost).status().code(),
            StatusCode::kInvalidArgument);
}

// The names of freed tensors are kept for a while, not forever: an old id is still an error,
// without its name.
TEST(TieredStoreScratchTest, LongFreedIdsStayErrors) {
  ScratchDir dir;
  auto store = TieredStore::Create(Options(dir));
  ASSERT_TRUE(store.ok()) << store.status();
  auto old = (*store)->Create("old", 4096, Tier::kHost);
  ASSERT_TRUE(old.ok());
  ASSERT_TRUE((*store)->Free(*old).ok());
  const uint64_t entries = (*store)->stats().bookkeeping_entries;
  for (int i = 0; i < 1000; ++i) {
    auto id = (*store)->Create("t" + std::to_string(i), 4096, Tier::kHost);
    ASSERT_TRUE(id.ok());
    ASSERT_TRUE((*store)->Free(*id).ok());
  }
  EXPECT_EQ((*store)->stats().bookkeeping_entries, entries);
  auto p = (*store)->Acquire(*old, Tier::kHost, Access::kRead);
  EXPECT_EQ(p.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(p.status().message(), HasSubstr("was freed"));
}

}  // namespace
}  // namespace zinf
