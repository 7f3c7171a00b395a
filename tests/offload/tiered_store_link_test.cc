// TieredStore behind a device link (tests/offload/tiered_store_test.cc has the rest): the host
// device with a modelled link, where the host reaches device memory only through streams, as
// on a GPU. Moves ordered after device work, and several tensors moved to device memory as one
// batch, their memory placed as runs (Note [Batched write-backs] in offload/tiered_store.cc,
// Note [Runs of blocks] in offload/memory_pool.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/offload/tiered_store_testing.h"
#include "zinf/device.h"
#include "zinf/tiered_store.h"

namespace zinf {
namespace {

using ::testing::HasSubstr;
using testing_util::ScratchDir;

// A store whose device tier is the host device behind a modelled link, without NVMe.
struct LinkedStore {
  ScratchDir dir;
  std::unique_ptr<Device> device;
  std::unique_ptr<TieredStore> store;
  FaultyEngine* faulty = nullptr;  // with NVMe
  Status Open(bool nvme = false) {
    ZINF_ASSIGN_OR_RETURN(device, CreateHostDevice({.memory_budget_bytes = 8 * kMiB,
                                                    .link_bytes_per_second = 4'000'000'000u}));
    TieredStoreOptions options = Options(dir);
    if (!nvme) {
      options.nvme_paths.clear();
      ZINF_ASSIGN_OR_RETURN(store, TieredStore::Create(options, device.get()));
      return OkStatus();
    }
    ZINF_ASSIGN_OR_RETURN(store, CreateWithFaultyEngine(options, &faulty, device.get()));
    return OkStatus();
  }
  // The bytes of tensor `id`'s device copy, brought down.
  StatusOr<std::vector<char>> DeviceBytes(TensorId id, uint64_t size) {
    ZINF_RETURN_IF_ERROR(store->Acquire(id, Tier::kDevice, Access::kRead).status());
    std::vector<char> back(size);
    Status copied = store->CopyDownAsync(id, 0, size, back.data(), nullptr).get();
    ZINF_RETURN_IF_ERROR(store->Release(id, Tier::kDevice));
    ZINF_RETURN_IF_ERROR(copied);
    return back;
  }
};

// Device work that writes `values` into device memory `at` a little later than enqueued (a
// backward's gradient), on a stream of its own, recording `written` after the write: a reader
// that does not wait for the event finds what was there before.
struct LateWrite {
  std::unique_ptr<Stream> stream;
  std::unique_ptr<Event> written;
  Status Start(Device& device, void* at, const std::vector<uint8_t>& values) {
    ZINF_ASSIGN_OR_RETURN(stream, device.CreateStream());
    ZINF_ASSIGN_OR_RETURN(written, device.CreateEvent());
    ZINF_RETURN_IF_ERROR(stream->HostFunc([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      return OkStatus();
    }));
    ZINF_RETURN_IF_ERROR(stream->Copy(at, values.data(), values.size(), CopyKind::kHostToDevice));
    return stream->Record(*written);
  }
};

// A tensor that device work is still writing (a gradient backward has just enqueued) comes
// down once that work's event says so: Prefetch's `after` orders the store's move after it,
// and the caller never waits on the host.
TEST(TieredStoreTest, PrefetchAfterAnEventMovesWhatTheDeviceWorkWrote) {
  constexpr uint64_t kSize = 1 * kMiB;
  LinkedStore linked;
  ASSERT_TRUE(linked.Open().ok());
  Device* device = linked.device.get();
  TieredStore* store = linked.store.get();
  auto id = store->Create("gradient", kSize, Tier::kDevice);
  ASSERT_TRUE(id.ok()) << id.status();
  auto at = store->Acquire(*id, Tier::kDevice, Access::kOverwrite);
  ASSERT_TRUE(at.ok()) << at.status();
  std::vector<uint8_t> values(kSize);
  Fill(values.data(), kSize, 7, 1);
  LateWrite backward;
  ASSERT_TRUE(backward.Start(*device, *at, values).ok());
  ASSERT_TRUE(store->Release(*id, Tier::kDevice).ok());
  std::shared_future<Status> landed = store->Prefetch(*id, Tier::kHost, backward.written.get());
  ASSERT_TRUE(landed.get().ok()) << landed.get();
  auto host = store->Acquire(*id, Tier::kHost, Access::kRead);
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_EQ(Check(*host, kSize, 7, 1), -1) << "moved before the device work had written it";
  ASSERT_TRUE(store->Release(*id, Tier::kHost).ok());
  EXPECT_EQ(store->stats().device_to_host.bytes, kSize);
  ASSERT_TRUE(backward.stream->Synchronize().ok());
}

// CopyDownAsync: part of a device tensor, after device work's event, into the caller's host
// memory, metered on the device-to-host link; refused for a copy not acquired (it could move)
// and for bytes past the tensor's end.
TEST(TieredStoreTest, CopyDownAsyncCopiesPartOfADeviceTensorAfterAnEvent) {
  constexpr uint64_t kSize = 1 * kMiB, kOffset = 4096, kBytes = 64 * kKiB;
  LinkedStore linked;
  ASSERT_TRUE(linked.Open().ok());
  Device* device = linked.device.get();
  TieredStore* store = linked.store.get();
  auto id = store->Create("bucket", kSize, Tier::kDevice);
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<uint8_t> out(kBytes);
  EXPECT_EQ(store->CopyDownAsync(*id, 0, kBytes, out.data()).get().code(),
            StatusCode::kFailedPrecondition)
      << "not acquired";
  auto at = store->Acquire(*id, Tier::kDevice, Access::kOverwrite);
  ASSERT_TRUE(at.ok()) << at.status();
  EXPECT_EQ(store->CopyDownAsync(*id, kSize - 4, 8, out.data()).get().code(),
            StatusCode::kInvalidArgument);
  std::vector<uint8_t> values(kSize);
  Fill(values.data(), kSize, 9, 1);
  LateWrite backward;
  ASSERT_TRUE(backward.Start(*device, *at, values).ok());
  const uint64_t before = store->stats().device_to_host.bytes;
  Status copied =
      store->CopyDownAsync(*id, kOffset, kBytes, out.data(), backward.written.get()).get();
  ASSERT_TRUE(copied.ok()) << copied;
  EXPECT_TRUE(std::equal(out.begin(), out.end(), values.begin() + kOffset))
      << "copied before the device work had written it, or the wrong bytes";
  EXPECT_EQ(store->stats().device_to_host.bytes - before, kBytes);
  ASSERT_TRUE(store->Release(*id, Tier::kDevice).ok());
  ASSERT_TRUE(backward.stream->Synchronize().ok());
}

// Host copies written home to device memory behind a link (a step's new parameters on a GPU)
// go as one batch (Note [Batched write-backs]): each copied up once, one wait for them all on
// the transfer thread, and each home current afterwards while the host copy stays.
TEST(TieredStoreTest, WriteBackToDeviceMemoryWaitsOnceForTheBatch) {
  LinkedStore linked;
  ASSERT_TRUE(linked.Open().ok());
  TieredStore& store = *linked.store;
  const std::vector<uint64_t> sizes = {3 * 4096, 700 * kKiB, 1000, 64};
  const std::vector<TensorId> ids = WrittenInHostTier(store, sizes, Tier::kDevice, 5);
  ASSERT_EQ(ids.size(), sizes.size());
  const TransferCounts before = store.transfer_counters().counts();
  ASSERT_TRUE(store.WriteBackAsync(ids, Tier::kHost).get().ok());
  const TransferCounts after = store.transfer_counters().counts();
  // The homes and the host copies were placed alike (small blocks from the top down, both
  // tiers a page apart), so the four lie together in both: one copy, in the order of the host
  // copies (64, 1000, 700 KiB, 12 KiB), carrying the first two's rounding to a page (Note
  // [Runs of blocks]).
  EXPECT_EQ(after.copies_up - before.copies_up, 1u);
  EXPECT_EQ(after.bytes_up - before.bytes_up, 4096 + 4096 + 700 * kKiB + 3 * 4096);
  EXPECT_EQ(after.worker_waits - before.worker_waits, 1u) << "one wait for the batch";
  EXPECT_EQ(store.stats().write_backs, ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    auto resident = store.ResidentTiers(ids[i]);
    ASSERT_TRUE(resident.ok());
    EXPECT_EQ(*resident, (std::vector<Tier>{Tier::kDevice, Tier::kHost})) << "tensor " << i;
    ASSERT_TRUE(store.Evict(ids[i], Tier::kHost).ok());  // clean: nothing more goes up
    auto p = store.Acquire(ids[i], Tier::kDevice, Access::kRead);
    ASSERT_TRUE(p.ok()) << p.status();
    auto host = store.Acquire(ids[i], Tier::kHost, Access::kRead);  // brought down to check
    ASSERT_TRUE(host.ok()) << host.status();
    EXPECT_EQ(Check(*host, sizes[i], ids[i], 5), -1) << "tensor " << i;
    ASSERT_TRUE(store.Release(ids[i], Tier::kHost).ok());
    ASSERT_TRUE(store.Release(ids[i], Tier::kDevice).ok());
  }
  EXPECT_EQ(store.transfer_counters().counts().copies_up, after.copies_up);
}

// Place lays host copies out as their device homes lie (Note [Runs of blocks]): written between
// other allocations, as a step writes its parameters between the optimizer's, they still go
// home as one copy per run of homes (without it, three copies here).
TEST(TieredStoreTest, PlacedHostCopiesGoHomeAsOneCopyPerRunOfHomes) {
  LinkedStore linked;
  ASSERT_TRUE(linked.Open().ok());
  TieredStore& store = *linked.store;
  // Large homes from the bottom of the device tier, small ones from the top: two runs.
  const std::vector<uint64_t> sizes = {1536 * kKiB, 1000, kMiB, 64};
  std::vector<TensorId> ids;
  for (uint64_t size : sizes) {
    auto id = store.Create("p" + std::to_string(ids.size()), size, Tier::kDevice);
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  ASSERT_TRUE(store.Place(ids, Tier::kHost).ok());
  std::vector<TensorId> others;
  for (size_t i = 0; i < ids.size(); ++i) {
    auto other = store.Create("other" + std::to_string(i), kMiB + 4096 * i, Tier::kHost);
    ASSERT_TRUE(other.ok()) << other.status();
    others.push_back(*other);
    auto p = store.Acquire(ids[i], Tier::kHost, Access::kOverwrite);
    ASSERT_TRUE(p.ok()) << p.status();
    Fill(*p, sizes[i], ids[i], 8);
    ASSERT_TRUE(store.Release(ids[i], Tier::kHost).ok());
  }
  const TransferCounts before = store.transfer_counters().counts();
  ASSERT_TRUE(store.EvictAsync(ids, Tier::kHost).get().ok());
  const TransferCounts after = store.transfer_counters().counts();
  EXPECT_EQ(after.copies_up - before.copies_up, 2u);
  EXPECT_EQ(after.worker_waits - before.worker_waits, 1u);
  for (size_t i = 0; i < ids.size(); ++i) {
    auto back = linked.DeviceBytes(ids[i], sizes[i]);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(Check(back->data(), sizes[i], ids[i], 8), -1) << "tensor " << i;
  }
  // Nothing to place: each has host memory again only once acquired; bad tiers are refused.
  EXPECT_EQ(store.Place(ids, Tier::kNvme).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(store.Free(ids[0]).ok());
  EXPECT_EQ(store.Place(ids, Tier::kHost).code(), StatusCode::kFailedPrecondition);
}

// A home never moves, even where a prefetch would lay stale device copies out again as a run:
// torch may hold it as a parameter's own memory (resident parameters).
TEST(TieredStoreTest, APrefetchNeverMovesADeviceHome) {
  LinkedStore linked;
  ASSERT_TRUE(linked.Open().ok());
  TieredStore& store = *linked.store;
  // Homes with others between them; host copies written one after another, so lying together.
  const std::vector<uint64_t> sizes = {256 * kKiB, 128 * kKiB, 512 * kKiB};
  std::vector<TensorId> ids, spacers;
  std::vector<void*> homes;
  for (uint64_t size : sizes) {
    auto id = store.Create("p" + std::to_string(ids.size()), size, Tier::kDevice);
    ASSERT_TRUE(id.ok()) << id.status();
    auto home = store.Acquire(*id, Tier::kDevice, Access::kRead);
    ASSERT_TRUE(home.ok()) << home.status();
    homes.push_back(*home);
    ASSERT_TRUE(store.Release(*id, Tier::kDevice).ok());
    ids.push_back(*id);
    auto spacer = store.Create("spacer" + std::to_string(ids.size()), 64 * kKiB, Tier::kDevice);
    ASSERT_TRUE(spacer.ok()) << spacer.status();
    spacers.push_back(*spacer);
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    auto p = store.Acquire(ids[i], Tier::kHost, Access::kOverwrite);
    ASSERT_TRUE(p.ok()) << p.status();
    Fill(*p, sizes[i], ids[i], 9);
    ASSERT_TRUE(store.Release(ids[i], Tier::kHost).ok());
  }
  ASSERT_TRUE(store.Prefetch(ids, Tier::kDevice).get().ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    auto home = store.Acquire(ids[i], Tier::kDevice, Access::kRead);
    ASSERT_TRUE(home.ok()) << home.status();
    EXPECT_EQ(*home, homes[i]) << "tensor " << i;
    ASSERT_TRUE(store.Release(ids[i], Tier::kDevice).ok());
    auto back = linked.DeviceBytes(ids[i], sizes[i]);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(Check(back->data(), sizes[i], ids[i], 9), -1) << "tensor " << i;
  }
}

// Prefetch of tensors homed in host memory into device memory behind a link (a module's
// parameters fetched to a GPU; Note [Batched write-backs]): one wait for the batch, and their
// device memory one run at the distances of their host copies, so that the whole batch goes
// up as one copy with the rounding between them (Note [Runs of blocks]); each device copy
// then holds its tensor's bytes.
TEST(TieredStoreTest, PrefetchToDeviceMemoryIsOneCopyForTensorsThatLieTogether) {
  LinkedStore linked;
  ASSERT_TRUE(linked.Open().ok());
  TieredStore& store = *linked.store;
  const std::vector<uint64_t> sizes = {3 * 4096, 1000, 700 * kKiB, 64};
  const std::vector<TensorId> ids = WrittenInHostTier(store, sizes, Tier::kHost, 6);
  ASSERT_EQ(ids.size(), sizes.size());
  const TransferCounts before = store.transfer_counters().counts();
  ASSERT_TRUE(store.Prefetch(ids, Tier::kDevice).get().ok());
  const TransferCounts after = store.transfer_counters().counts();
  EXPECT_EQ(after.copies_up - before.copies_up, 1u);
  EXPECT_EQ(after.worker_waits - before.worker_waits, 1u) << "one wait for the batch";
  // The tensors and the rounding between them: 64 and 1000 bytes each fill a page.
  EXPECT_EQ(after.bytes_up - before.bytes_up, 4096 + 4096 + 700 * kKiB + 3 * 4096);
  for (size_t i = 0; i < ids.size(); ++i) {
    auto back = linked.DeviceBytes(ids[i], sizes[i]);  // current: acquired with no copy
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(Check(back->data(), sizes[i], ids[i], 6), -1) << "tensor " << i;
  }
  EXPECT_EQ(store.transfer_counters().counts().copies_up, after.copies_up);
  // Written again in host memory, a tensor's device copy is stale: the next prefetch copies
  // only it, into the memory it has.
  auto p = store.Acquire(ids[1], Tier::kHost, Access::kOverwrite);
  ASSERT_TRUE(p.ok()) << p.status();
  Fill(*p, sizes[1], ids[1], 7);
  ASSERT_TRUE(store.Release(ids[1], Tier::kHost).ok());
  ASSERT_TRUE(store.Prefetch(ids, Tier::kDevice).get().ok());
  EXPECT_EQ(store.transfer_counters().counts().copies_up, after.copies_up + 1);
  EXPECT_EQ(store.transfer_counters().counts().bytes_up, after.bytes_up + sizes[1]);
  auto back = linked.DeviceBytes(ids[1], sizes[1]);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(Check(back->data(), sizes[1], ids[1], 7), -1);
}

// Tensors homed on NVMe, prefetched into device memory behind a link (ZeRO-Infinity's
// parameters on a GPU): every read in flight at once into host memory placed as one run, then
// up as one batch, one copy for the run (Note [Batched write-backs]), where a piece at a time
// through a staging buffer cost a read, a copy and two waits per piece. The host copies go once
// the device copies are up: the host tier holds no more than it did.
TEST(TieredStoreTest, PrefetchFromNvmeToDeviceMemoryReadsAllThenCopiesUpOnce) {
  LinkedStore linked;
  ASSERT_TRUE(linked.Open(/*nvme=*/true).ok());
  TieredStore& store = *linked.store;
  const std::vector<TensorId> ids = WrittenOnNvme(store, "layer", 4, 300 * kKiB);
  ASSERT_EQ(ids.size(), 4u);
  ASSERT_TRUE(store.EvictAsync(ids, Tier::kHost).get().ok());
  const TransferCounts before = store.transfer_counters().counts();
  const uint64_t read_before = store.stats().nvme_to_host.bytes;
  ASSERT_TRUE(store.Prefetch(ids, Tier::kDevice).get().ok());
  const TransferCounts after = store.transfer_counters().counts();
  EXPECT_EQ(after.copies_up - before.copies_up, 1u);
  EXPECT_EQ(after.bytes_up - before.bytes_up, 4 * 300 * kKiB);
  EXPECT_EQ(after.worker_waits - before.worker_waits, 1u) << "one wait for the copy up";
  EXPECT_EQ(store.stats().nvme_to_host.bytes - read_before, 4 * 300 * kKiB);
  for (TensorId id : ids) {
    auto resident = store.ResidentTiers(id);
    ASSERT_TRUE(resident.ok());
    EXPECT_EQ(*resident, (std::vector<Tier>{Tier::kDevice, Tier::kNvme}));
    auto back = linked.DeviceBytes(id, 300 * kKiB);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(Check(back->data(), 300 * kKiB, id, 1), -1) << "tensor " << id;
  }
  EXPECT_EQ(store.transfer_counters().counts().copies_up, after.copies_up);
}

// A read that fails in that batch reports its tensor and leaves it for the next Acquire, which
// reads it again; the others go up as if nothing had failed.
TEST(TieredStoreTest, AFailedReadOnTheWayToDeviceMemoryIsReadAgain) {
  LinkedStore linked;
  ASSERT_TRUE(linked.Open(/*nvme=*/true).ok());
  TieredStore& store = *linked.store;
  const std::vector<TensorId> ids = WrittenOnNvme(store, "block", 4, 64 * kKiB);
  ASSERT_EQ(ids.size(), 4u);
  ASSERT_TRUE(store.EvictAsync(ids, Tier::kHost).get().ok());
  linked.faulty->Arm(IoOp::kRead, 1, Fault::kEio);
  Status s = store.Prefetch(ids, Tier::kDevice).get();
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s;
  EXPECT_THAT(s.message(), HasSubstr("from nvme to host"));
  EXPECT_THAT(s.message(), HasSubstr("block"));
  for (TensorId id : ids) {
    auto back = linked.DeviceBytes(id, 64 * kKiB);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(Check(back->data(), 64 * kKiB, id, 1), -1) << "tensor " << id;
  }
}

}  // namespace
}  // namespace zinf
