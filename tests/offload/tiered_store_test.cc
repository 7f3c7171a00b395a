// TieredStore: a randomized multi-threaded workload over all three tiers (every byte read is the
// last byte written; no budget is ever exceeded), pieces larger than the staging buffers,
// eviction order, and bad input (freed tensors, NVMe path errors, full tiers).
#include "zinf/tiered_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <random>
#include <thread>
#include <vector>

#include "offload/tiered_store_internal.h"
#include "tests/nvme/nvme_test_util.h"
#include "tests/offload/tiered_store_testing.h"
#include "tests/testing/faulty_engine.h"
#include "zinf/device.h"
#include "zinf/host_memory.h"

namespace zinf {
namespace {

using ::testing::HasSubstr;
using testing_util::ScratchDir;

TEST(TieredStoreTest, RandomWorkloadKeepsEveryByteAndEveryBudget) {
  ScratchDir dir;
  TieredStoreOptions options = Options(dir);
  auto store_or = TieredStore::Create(options);
  ASSERT_TRUE(store_or.ok()) << store_or.status();
  TieredStore& store = **store_or;

  struct Owned {
    TensorId id;
    uint64_t size;
    Tier home;
    uint64_t version = 0;  // 0: never written (reads as zeros)
  };
  constexpr int kThreads = 4;
  constexpr int kPerThread = 10;
  std::mt19937 setup(7);
  std::vector<std::vector<Owned>> owned(kThreads);
  std::vector<TensorId> all;
  uint64_t home_bytes[3] = {0, 0, 0};
  for (int t = 0; t < kThreads; ++t) {
    for (int k = 0; k < kPerThread; ++k) {
      // Sizes from a few bytes to 3 pieces; about one in five is larger than a staging buffer.
      uint64_t size = 1 + setup() % (k % 5 == 0 ? 3 * options.piece_bytes : 200 * kKiB);
      Tier home = static_cast<Tier>(setup() % 3);
      if (home != Tier::kNvme && home_bytes[static_cast<int>(home)] + size > 2 * kMiB)
        home = Tier::kNvme;
      home_bytes[static_cast<int>(home)] += size;
      auto id = store.Create("t" + std::to_string(t) + "." + std::to_string(k), size, home);
      ASSERT_TRUE(id.ok()) << id.status();
      owned[t].push_back({*id, size, home});
      all.push_back(*id);
    }
  }

  std::atomic<int> failures{0};
  std::atomic<int> over_budget{0};
  std::atomic<int> verified{0};
  std::vector<std::string> errors(kThreads);
  auto check_budgets = [&] {
    TieredStoreStats s = store.stats();
    for (const TierStats& t : s.tiers) {
      if (t.budget_bytes != 0 && t.in_use_bytes > t.budget_bytes) ++over_budget;
    }
  };
  auto worker = [&](int me) {
    std::mt19937 rng(100 + me);
    auto fast_tier = [&] { return rng() % 2 == 0 ? Tier::kDevice : Tier::kHost; };
    auto fail = [&](const std::string& what) {
      if (failures++ == 0 || errors[me].empty()) errors[me] = what;
    };
    for (int op = 0; op < 250; ++op) {
      Owned& mine = owned[me][rng() % kPerThread];
      switch (rng() % 6) {
        case 0:
        case 1: {  // write a new version in a random fast tier
          Tier tier = fast_tier();
          auto p = store.Acquire(mine.id, tier, Access::kWrite);
          if (!p.ok()) {
            fail("write acquire: " + p.status().ToString());
            break;
          }
          Fill(*p, mine.size, mine.id, ++mine.version);
          if (!store.Release(mine.id, tier).ok()) fail("release after write");
          break;
        }
        case 2:
        case 3: {  // read it back from a random fast tier
          Tier tier = fast_tier();
          auto p = store.Acquire(mine.id, tier, Access::kRead);
          if (!p.ok()) {
            fail("read acquire: " + p.status().ToString());
            break;
          }
          int64_t bad = mine.version == 0 ? -1 : Check(*p, mine.size, mine.id, mine.version);
          if (mine.version == 0) {
            const auto* b = static_cast<const uint8_t*>(*p);
            for (uint64_t i = 0; i < mine.size && bad < 0; ++i) {
              if (b[i] != 0) bad = static_cast<int64_t>(i);
            }
          }
          if (bad >= 0) {
            fail("byte " + std::to_string(bad) + " of tensor " + std::to_string(mine.id) +
                 " read in the " + std::string(TierName(tier)) + " tier differs from version " +
                 std::to_string(mine.version));
          } else {
            ++verified;
          }
          if (!store.Release(mine.id, tier).ok()) fail("release after read");
          break;
        }
        case 4: {  // prefetch anyone's tensor, sometimes waiting for it
          TensorId any = all[rng() % all.size()];
          auto f = store.Prefetch(any, fast_tier());
          if (rng() % 2 == 0) {
            Status s = f.get();
            if (!s.ok() && s.code() != StatusCode::kResourceExhausted)
              fail("prefetch: " + s.ToString());
          }
          if (rng() % 3 == 0) store.SetNextUse(any, rng() % 100).IgnoreError();
          break;
        }
        case 5: {  // evict anyone's cached copy
          TensorId any = all[rng() % all.size()];
          Status s = store.Evict(any, fast_tier());
          // The home tier and copies pinned by their owner are refused, as documented.
          if (!s.ok() && s.code() != StatusCode::kInvalidArgument &&
              s.code() != StatusCode::kFailedPrecondition) {
            fail("evict: " + s.ToString());
          }
          break;
        }
      }
      check_budgets();
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& t : threads) t.join();
  for (int t = 0; t < kThreads; ++t)
    EXPECT_TRUE(errors[t].empty()) << "thread " << t << ": " << errors[t];
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(over_budget.load(), 0);
  EXPECT_GT(verified.load(), 100);

  // Everything back home, every cached copy dropped, then each tensor read once more.
  ASSERT_TRUE(store.Flush().ok());
  for (auto& list : owned) {
    for (Owned& o : list) {
      for (Tier tier : {Tier::kDevice, Tier::kHost}) {
        if (tier != o.home) {
          ASSERT_TRUE(store.Evict(o.id, tier).ok());
        }
      }
      auto resident = store.ResidentTiers(o.id);
      ASSERT_TRUE(resident.ok());
      EXPECT_EQ(*resident, std::vector<Tier>{o.home});
      auto p = store.Acquire(o.id, Tier::kHost, Access::kRead);
      ASSERT_TRUE(p.ok()) << p.status();
      if (o.version > 0) {
        EXPECT_EQ(Check(*p, o.size, o.id, o.version), -1) << "tensor " << o.id;
      }
      ASSERT_TRUE(store.Release(o.id, Tier::kHost).ok());
    }
  }
  TieredStoreStats s = store.stats();
  for (int t = 0; t < 2; ++t) EXPECT_LE(s.tiers[t].peak_bytes, s.tiers[t].budget_bytes);
  EXPECT_GT(s.nvme_to_host.bytes, 0u);
  EXPECT_GT(s.host_to_nvme.bytes, 0u);
  EXPECT_GT(s.host_to_device.bytes + s.device_to_host.bytes, 0u);
  EXPECT_GT(s.evictions, 0u);
}

TEST(TieredStoreTest, TensorLargerThanStagingAndHostBudgetMovesInPieces) {
  ScratchDir dir;
  TieredStoreOptions options = Options(dir);
  options.host_budget_bytes = kMiB;  // smaller than the tensor: the host tier is bypassed
  options.device_budget_bytes = 8 * kMiB;
  auto store = TieredStore::Create(options);
  ASSERT_TRUE(store.ok()) << store.status();
  const uint64_t size = 5 * kMiB + 123;  // 21 pieces of 256 KiB
  auto id = (*store)->Create("big", size, Tier::kNvme);
  ASSERT_TRUE(id.ok());
  auto p = (*store)->Acquire(*id, Tier::kDevice, Access::kWrite);
  ASSERT_TRUE(p.ok()) << p.status();
  Fill(*p, size, 1, 1);
  ASSERT_TRUE((*store)->Release(*id, Tier::kDevice).ok());
  ASSERT_TRUE((*store)->Evict(*id, Tier::kDevice).ok());  // written back piece by piece
  TieredStoreStats s = (*store)->stats();
  EXPECT_EQ(s.host_to_nvme.bytes, size);
  EXPECT_EQ(s.write_backs, 1u);
  p = (*store)->Acquire(*id, Tier::kDevice, Access::kRead);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(Check(*p, size, 1, 1), -1);
  ASSERT_TRUE((*store)->Release(*id, Tier::kDevice).ok());
  // The host tier cannot hold it: a clear ResourceExhausted, not a crash.
  auto h = (*store)->Acquire(*id, Tier::kHost, Access::kRead);
  EXPECT_EQ(h.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(h.status().message(), HasSubstr("host tier"));
}

TEST(TieredStoreTest, HostLinkFromTheEnvironment) {
  // ZINF_HOST_LINK_GBPS puts the host device tier behind a modelled link
  // (Note [Host link model] in offload/host/host_device.cc); a bad value is refused up front.
  constexpr const char* kVariable = "ZINF_HOST_LINK_GBPS";
  const char* saved = std::getenv(kVariable);
  const std::string saved_value = saved != nullptr ? saved : "";
  ScratchDir dir;
  TieredStoreOptions options = Options(dir);
  options.nvme_paths.clear();
  setenv(kVariable, "fast", 1);
  auto refused = TieredStore::Create(options);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr(kVariable));
  setenv(kVariable, "0.5", 1);  // 500 MB/s: 4 MiB in 8.4 ms
  auto store = TieredStore::Create(options);
  if (saved != nullptr) {
    setenv(kVariable, saved_value.c_str(), 1);
  } else {
    unsetenv(kVariable);
  }
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_THAT((*store)->device_name(), HasSubstr("link 0.50 GB/s"));
  constexpr uint64_t kSize = 4 * kMiB;
  auto id = (*store)->Create("w", kSize, Tier::kHost);
  ASSERT_TRUE(id.ok()) << id.status();
  auto home = (*store)->Acquire(*id, Tier::kHost, Access::kWrite);
  ASSERT_TRUE(home.ok()) << home.status();
  Fill(*home, kSize, 1, 1);  // a never-written tensor is zeros and would not be copied
  ASSERT_TRUE((*store)->Release(*id, Tier::kHost).ok());
  auto p = (*store)->Acquire(*id, Tier::kDevice, Access::kRead);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(Check(*p, kSize, 1, 1), -1);
  ASSERT_TRUE((*store)->Release(*id, Tier::kDevice).ok());
  const LinkStats up = (*store)->stats().host_to_device;
  EXPECT_EQ(up.bytes, kSize);
  EXPECT_GT(up.GBps(), 0.0);
  EXPECT_LE(up.GBps(), 0.5 / 0.9) << "the upload went over the modelled link";
}

TEST(TieredStoreTest, EvictionFollowsNextUseHintsThenLru) {
  ScratchDir dir;
  TieredStoreOptions options = Options(dir);
  options.host_budget_bytes = 3 * kMiB;
  auto store = TieredStore::Create(options);
  ASSERT_TRUE(store.ok());
  std::vector<TensorId> ids;
  for (int i = 0; i < 5; ++i) {
    auto id = (*store)->Create("t" + std::to_string(i), kMiB, Tier::kNvme);
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  auto resident_in_host = [&](TensorId id) {
    auto r = (*store)->ResidentTiers(id);
    return r.ok() && std::find(r->begin(), r->end(), Tier::kHost) != r->end();
  };
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*store)->Prefetch(ids[i], Tier::kHost).get().ok());
  ASSERT_TRUE((*store)->SetNextUse(ids[0], 5).ok());
  ASSERT_TRUE((*store)->SetNextUse(ids[1], 1).ok());
  ASSERT_TRUE((*store)->SetNextUse(ids[2], 9).ok());
  ASSERT_TRUE((*store)->Prefetch(ids[3], Tier::kHost).get().ok());
  EXPECT_FALSE(resident_in_host(ids[2]));  // needed furthest in the future
  EXPECT_TRUE(resident_in_host(ids[0]) && resident_in_host(ids[1]));
  // ids[3] has no hint: it goes before hinted ones.
  ASSERT_TRUE((*store)->Prefetch(ids[4], Tier::kHost).get().ok());
  EXPECT_FALSE(resident_in_host(ids[3]));
  // No hints at all: least recently used first.
  for (TensorId id : ids) ASSERT_TRUE((*store)->SetNextUse(id, -1).ok());
  ASSERT_TRUE((*store)->Acquire(ids[0], Tier::kHost, Access::kRead).ok());  // ids[0] is now recent
  ASSERT_TRUE((*store)->Release(ids[0], Tier::kHost).ok());
  ASSERT_TRUE((*store)->Prefetch(ids[2], Tier::kHost).get().ok());
  EXPECT_FALSE(resident_in_host(ids[1]));
  EXPECT_TRUE(resident_in_host(ids[0]));
}

TEST(TieredStoreTest, PinnedCopiesAreNeverEvictedAndAFullTierSaysSo) {
  ScratchDir dir;
  TieredStoreOptions options = Options(dir);
  options.host_budget_bytes = 2 * kMiB;
  auto store = TieredStore::Create(options);
  ASSERT_TRUE(store.ok());
  auto a = (*store)->Create("a", 1536 * kKiB, Tier::kNvme);
  auto b = (*store)->Create("b", kMiB, Tier::kNvme);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*store)->Acquire(*a, Tier::kHost, Access::kWrite).ok());
  auto pb = (*store)->Acquire(*b, Tier::kHost, Access::kRead);
  EXPECT_EQ(pb.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(pb.status().message(), HasSubstr("'b'"));
  EXPECT_EQ((*store)->Evict(*a, Tier::kHost).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*store)->Free(*a).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*store)->Release(*a, Tier::kHost).ok());
  EXPECT_EQ((*store)->Release(*a, Tier::kHost).code(), StatusCode::kFailedPrecondition);
  pb = (*store)->Acquire(*b, Tier::kHost, Access::kRead);  // a is evicted (written back) now
  EXPECT_TRUE(pb.ok()) << pb.status();
}

// Pool memory is reused: a tensor created where another one's bytes were still reads as zeros
// in its home tier, and kOverwrite hands out memory without reading the current bytes.
TEST(TieredStoreTest, NeverWrittenReadsAsZerosAndOverwriteReadsNothing) {
  ScratchDir dir;
  auto store = TieredStore::Create(Options(dir));
  ASSERT_TRUE(store.ok()) << store.status();
  for (Tier home : {Tier::kHost, Tier::kDevice}) {
    auto first = (*store)->Create("first", 64 * kKiB, home);
    ASSERT_TRUE(first.ok());
    auto p = (*store)->Acquire(*first, home, Access::kOverwrite);
    ASSERT_TRUE(p.ok()) << p.status();
    Fill(*p, 64 * kKiB, 1, 1);
    ASSERT_TRUE((*store)->Release(*first, home).ok());
    ASSERT_TRUE((*store)->Free(*first).ok());
    auto second = (*store)->Create("second", 64 * kKiB, home);  // the same pool memory
    ASSERT_TRUE(second.ok());
    p = (*store)->Acquire(*second, home, Access::kRead);
    ASSERT_TRUE(p.ok()) << p.status();
    const auto* bytes = static_cast<const uint8_t*>(*p);
    EXPECT_EQ(std::count(bytes, bytes + 64 * kKiB, 0), 64 * kKiB) << TierName(home);
    ASSERT_TRUE((*store)->Release(*second, home).ok());
    ASSERT_TRUE((*store)->Free(*second).ok());
  }
  auto id = (*store)->Create("on disk", 512 * kKiB, Tier::kNvme);
  ASSERT_TRUE(id.ok());
  auto p = (*store)->Acquire(*id, Tier::kHost, Access::kOverwrite);
  ASSERT_TRUE(p.ok()) << p.status();
  Fill(*p, 512 * kKiB, 2, 1);
  ASSERT_TRUE((*store)->Release(*id, Tier::kHost).ok());
  auto done = (*store)->EvictAsync(*id, Tier::kHost);  // written back on a transfer thread
  ASSERT_TRUE(done.get().ok());
  p = (*store)->Acquire(*id, Tier::kHost, Access::kOverwrite);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE((*store)->Release(*id, Tier::kHost).ok());
  TieredStoreStats s = (*store)->stats();
  EXPECT_EQ(s.nvme_to_host.bytes, 0u);  // neither overwrite read the disk
  EXPECT_EQ(s.host_to_nvme.bytes, 512 * kKiB);
  ASSERT_TRUE((*store)->Evict(*id, Tier::kHost).ok());
  p = (*store)->Acquire(*id, Tier::kHost, Access::kRead);  // the overwrite's bytes
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(Check(*p, 512 * kKiB, 2, 1), -1);
  ASSERT_TRUE((*store)->Release(*id, Tier::kHost).ok());
}

// A writer streaming tensors through a host tier that holds two of them at a time: each
// Acquire waits for the write-backs in flight instead of failing with a full tier.
TEST(TieredStoreTest, FullTierWaitsForWriteBacksInFlight) {
  ScratchDir dir;
  TieredStoreOptions options = Options(dir);
  options.host_budget_bytes = 2 * kMiB;
  options.transfer_threads = 2;
  auto store = TieredStore::Create(options);
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<TensorId> ids;
  std::vector<std::shared_future<Status>> written;
  for (int i = 0; i < 12; ++i) {
    auto id = (*store)->Create("t" + std::to_string(i), kMiB, Tier::kNvme);
    ASSERT_TRUE(id.ok());
    auto p = (*store)->Acquire(*id, Tier::kHost, Access::kOverwrite);
    ASSERT_TRUE(p.ok()) << "tensor " << i << ": " << p.status();
    Fill(*p, kMiB, *id, 1);
    ASSERT_TRUE((*store)->Release(*id, Tier::kHost).ok());
    written.push_back((*store)->EvictAsync(*id, Tier::kHost));
    ids.push_back(*id);
  }
  for (auto& w : written) EXPECT_TRUE(w.get().ok());
  EXPECT_LE((*store)->stats().tiers[int(Tier::kHost)].peak_bytes, 2 * kMiB);
  for (TensorId id : ids) {
    auto p = (*store)->Acquire(id, Tier::kHost, Access::kRead);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(Check(*p, kMiB, id, 1), -1);
    ASSERT_TRUE((*store)->Release(id, Tier::kHost).ok());
  }
}

// EvictAsync of several tensors (Note [Batched write-backs]): the host copies and the direct
// device copies go home together, unaligned sizes included; a clean copy is dropped without a
// write; one being written when the job runs stays as it is, one being read is written home
// and kept (Note [Evicting a held copy]), and neither fails the job.
TEST(TieredStoreTest, BatchedEvictionWritesEveryIdleTensorHome) {
  ScratchDir dir;
  auto store = TieredStore::Create(Options(dir));
  ASSERT_TRUE(store.ok()) << store.status();
  const uint64_t sizes[] = {3 * 4096, 700 * kKiB, 1000, 4096 + 12};  // pieces of 256 KiB
  std::vector<TensorId> host_ids, device_ids;
  for (int i = 0; i < 8; ++i) {
    const uint64_t size = sizes[i % 4];
    auto id = (*store)->Create("t" + std::to_string(i), size, Tier::kNvme);
    ASSERT_TRUE(id.ok()) << id.status();
    const Tier tier = i < 4 ? Tier::kHost : Tier::kDevice;
    auto p = (*store)->Acquire(*id, tier, Access::kOverwrite);
    ASSERT_TRUE(p.ok()) << p.status();
    Fill(*p, size, *id, 1);
    ASSERT_TRUE((*store)->Release(*id, tier).ok());
    (i < 4 ? host_ids : device_ids).push_back(*id);
  }
  // A clean cached copy: read from home, nothing to write back.
  auto clean = (*store)->Create("clean", 4096, Tier::kNvme);
  ASSERT_TRUE(clean.ok());
  auto p = (*store)->Acquire(*clean, Tier::kHost, Access::kRead);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE((*store)->Release(*clean, Tier::kHost).ok());
  host_ids.push_back(*clean);
  // One being written, and one newer than its home being read, when the job runs.
  TensorId held[2];
  for (int i = 0; i < 2; ++i) {
    auto id = (*store)->Create(i == 0 ? "written" : "read", 8192, Tier::kNvme);
    ASSERT_TRUE(id.ok());
    p = (*store)->Acquire(*id, Tier::kHost, Access::kOverwrite);
    ASSERT_TRUE(p.ok());
    Fill(*p, 8192, *id, 1);
    held[i] = *id;
    host_ids.push_back(*id);
  }
  const TensorId written = held[0], read = held[1];
  ASSERT_TRUE((*store)->Release(read, Tier::kHost).ok());
  ASSERT_TRUE((*store)->Acquire(read, Tier::kHost, Access::kRead).ok());

  Status evicted = (*store)->EvictAsync(host_ids, Tier::kHost).get();
  EXPECT_TRUE(evicted.ok()) << evicted;
  EXPECT_TRUE((*store)->EvictAsync(device_ids, Tier::kDevice).get().ok());
  const TieredStoreStats stats = (*store)->stats();
  EXPECT_EQ(stats.write_backs, 9u);
  EXPECT_EQ(stats.evictions, 9u);

  auto resident = (*store)->ResidentTiers(written);
  ASSERT_TRUE(resident.ok());
  EXPECT_EQ(*resident, std::vector<Tier>{Tier::kHost});
  ASSERT_TRUE((*store)->Release(written, Tier::kHost).ok());
  resident = (*store)->ResidentTiers(read);
  ASSERT_TRUE(resident.ok());
  EXPECT_EQ(*resident, (std::vector<Tier>{Tier::kHost, Tier::kNvme}));
  ASSERT_TRUE((*store)->Release(read, Tier::kHost).ok());
  // The holders done, both go home: the written one with a write, the read one without.
  ASSERT_TRUE((*store)->EvictAsync(std::vector<TensorId>{written, read}, Tier::kHost).get().ok());
  EXPECT_EQ((*store)->stats().write_backs, 10u);
  for (TensorId id : {written, read}) {
    resident = (*store)->ResidentTiers(id);
    ASSERT_TRUE(resident.ok());
    EXPECT_EQ(*resident, std::vector<Tier>{Tier::kNvme});
    p = (*store)->Acquire(id, Tier::kHost, Access::kRead);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(Check(*p, 8192, id, 1), -1);
    ASSERT_TRUE((*store)->Release(id, Tier::kHost).ok());
  }
  for (int i = 0; i < 8; ++i) {
    const TensorId id = i < 4 ? host_ids[i] : device_ids[i - 4];
    resident = (*store)->ResidentTiers(id);
    ASSERT_TRUE(resident.ok());
    EXPECT_EQ(*resident, std::vector<Tier>{Tier::kNvme}) << "tensor " << i;
    p = (*store)->Acquire(id, Tier::kHost, Access::kRead);  // from the disk
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(Check(*p, sizes[i % 4], id, 1), -1) << "tensor " << i;
    ASSERT_TRUE((*store)->Release(id, Tier::kHost).ok());
  }
}

// WriteBackAsync: the copies go home as EvictAsync sends them, and stay, current in both
// tiers: a later read takes the host copy (no NVMe read) and a later eviction writes nothing;
// the bytes on disk are the ones written.
TEST(TieredStoreTest, WriteBackKeepsTheCopyCurrentInBothTiers) {
  ScratchDir dir;
  auto store = TieredStore::Create(Options(dir));
  ASSERT_TRUE(store.ok()) << store.status();
  const uint64_t sizes[] = {3 * 4096, 700 * kKiB, 1000};
  std::vector<TensorId> ids;
  for (int i = 0; i < 3; ++i) {
    auto id = (*store)->Create("w" + std::to_string(i), sizes[i], Tier::kNvme);
    ASSERT_TRUE(id.ok()) << id.status();
    auto p = (*store)->Acquire(*id, Tier::kHost, Access::kOverwrite);
    ASSERT_TRUE(p.ok()) << p.status();
    Fill(*p, sizes[i], *id, 3);
    ASSERT_TRUE((*store)->Release(*id, Tier::kHost).ok());
    ids.push_back(*id);
  }
  ASSERT_TRUE((*store)->WriteBackAsync(ids, Tier::kHost).get().ok());
  TieredStoreStats stats = (*store)->stats();
  EXPECT_EQ(stats.write_backs, 3u);
  EXPECT_EQ(stats.evictions, 0u);
  const uint64_t read_before = stats.nvme_to_host.bytes;
  for (int i = 0; i < 3; ++i) {
    auto resident = (*store)->ResidentTiers(ids[i]);
    ASSERT_TRUE(resident.ok());
    EXPECT_EQ(*resident, (std::vector<Tier>{Tier::kHost, Tier::kNvme})) << "tensor " << i;
    auto p = (*store)->Acquire(ids[i], Tier::kDevice, Access::kRead);  // from the host copy
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(Check(*p, sizes[i], ids[i], 3), -1) << "tensor " << i;
    ASSERT_TRUE((*store)->Release(ids[i], Tier::kDevice).ok());
  }
  EXPECT_EQ((*store)->stats().nvme_to_host.bytes, read_before) << "nothing read from NVMe";
  // A second write-back has nothing to write; eviction drops the clean copies.
  ASSERT_TRUE((*store)->WriteBackAsync(ids, Tier::kHost).get().ok());
  for (TensorId id : ids) ASSERT_TRUE((*store)->Evict(id, Tier::kHost).ok());
  ASSERT_TRUE((*store)->EvictAsync(ids, Tier::kDevice).get().ok());
  stats = (*store)->stats();
  EXPECT_EQ(stats.write_backs, 3u);
  for (int i = 0; i < 3; ++i) {
    auto p = (*store)->Acquire(ids[i], Tier::kHost, Access::kRead);  // from the disk
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(Check(*p, sizes[i], ids[i], 3), -1) << "tensor " << i;
    ASSERT_TRUE((*store)->Release(ids[i], Tier::kHost).ok());
  }
  EXPECT_GT((*store)->stats().nvme_to_host.bytes, read_before);
}

// Prefetch of several tensors (Note [Batched write-backs]): each ends resident with the bytes
// last written, whether it was read in the batch or needed room made (a device tier that holds
// three of them evicts the copies not needed); a freed tensor is reported by name.
TEST(TieredStoreTest, BatchedPrefetchReadsEveryTensor) {
  ScratchDir dir;
  TieredStoreOptions options = Options(dir);
  options.device_budget_bytes = 1200 * kKiB;  // three of them
  auto store = TieredStore::Create(options);
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<TensorId> ids;
  for (int i = 0; i < 5; ++i) {
    auto id = (*store)->Create("p" + std::to_string(i), 300 * kKiB + 100 * i, Tier::kNvme);
    ASSERT_TRUE(id.ok());
    auto p = (*store)->Acquire(*id, Tier::kHost, Access::kOverwrite);
    ASSERT_TRUE(p.ok()) << p.status();
    Fill(*p, 300 * kKiB + 100 * i, *id, 2);
    ASSERT_TRUE((*store)->Release(*id, Tier::kHost).ok());
    ids.push_back(*id);
  }
  ASSERT_TRUE((*store)->EvictAsync(ids, Tier::kHost).get().ok());
  const std::vector<TensorId> first(ids.begin(), ids.begin() + 3);
  ASSERT_TRUE((*store)->Prefetch(first, Tier::kDevice).get().ok());
  for (TensorId id : first) {
    auto resident = (*store)->ResidentTiers(id);
    ASSERT_TRUE(resident.ok());
    EXPECT_EQ(*resident, (std::vector<Tier>{Tier::kDevice, Tier::kNvme}));
  }
  EXPECT_EQ((*store)->stats().nvme_to_host.bytes, 3 * 300 * kKiB + 300);
  // No room for the last two: they evict the first ones, one at a time.
  const std::vector<TensorId> rest(ids.begin() + 3, ids.end());
  ASSERT_TRUE((*store)->Prefetch(rest, Tier::kDevice).get().ok());
  EXPECT_LE((*store)->stats().tiers[int(Tier::kDevice)].peak_bytes, 1200 * kKiB);
  for (int i = 0; i < 5; ++i) {
    auto p = (*store)->Acquire(ids[i], Tier::kDevice, Access::kRead);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(Check(*p, 300 * kKiB + 100 * i, ids[i], 2), -1) << "tensor " << i;
    ASSERT_TRUE((*store)->Release(ids[i], Tier::kDevice).ok());
  }
  ASSERT_TRUE((*store)->Free(ids[4]).ok());
  Status s = (*store)->Prefetch(ids, Tier::kDevice).get();
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("p4"));
  EXPECT_EQ((*store)->Prefetch(first, Tier::kNvme).get().code(), StatusCode::kInvalidArgument);
}

TEST(TieredStoreTest, AcquireOfFreedTensorIsAClearError) {
  ScratchDir dir;
  auto store = TieredStore::Create(Options(dir));
  ASSERT_TRUE(store.ok());
  auto id = (*store)->Create("wte", 4096, Tier::kHost);
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE((*store)->Free(*id).ok());
  auto p = (*store)->Acquire(*id, Tier::kDevice, Access::kRead);
  EXPECT_EQ(p.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(p.status().message(), HasSubstr("('wte') was freed"));
  EXPECT_EQ((*store)->Prefetch(*id, Tier::kDevice).get().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*store)->Free(*id).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ((*store)->Acquire(999, Tier::kHost, Access::kRead).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(TieredStoreTest, BadOptionsAndNvmePathErrorsSurface) {
  ScratchDir dir;
  TieredStoreOptions o = Options(dir);
  o.nvme_paths = {dir.path() + "/missing"};
  auto s = TieredStore::Create(o);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.status().message(), HasSubstr("missing"));
  o = Options(dir);
  o.host_budget_bytes = 0;
  EXPECT_THAT(TieredStore::Create(o).status().message(), HasSubstr("host_budget_bytes"));
  o = Options(dir);
  o.device = "tpu:0";
  EXPECT_EQ(TieredStore::Create(o).status().code(), StatusCode::kInvalidArgument);
  o = Options(dir);
  o.nvme_paths.clear();
  auto no_nvme = TieredStore::Create(o);
  ASSERT_TRUE(no_nvme.ok());
  EXPECT_EQ((*no_nvme)->Create("x", 10, Tier::kNvme).status().code(), StatusCode::kInvalidArgument);
  auto id = (*no_nvme)->Create("x", 10, Tier::kHost);
  ASSERT_TRUE(id.ok());
  EXPECT_EQ((*no_nvme)->Acquire(*id, Tier::kNvme, Access::kRead).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ((*no_nvme)->Evict(*id, Tier::kHost).code(), StatusCode::kInvalidArgument);
}

// The NVMe tier is configured in full through the public options: the rank that names the
// swap files (so the ranks of a job share a path) and the aio settings.
TEST(TieredStoreTest, TheNvmeTiersRankAndAioAreOptions) {
  ScratchDir dir;
  TieredStoreOptions o = Options(dir);
  o.nvme_rank = -1;
  EXPECT_THAT(TieredStore::Create(o).status().message(), HasSubstr("nvme_rank"));
  o = Options(dir);
  o.nvme_aio.queue_depth = 0;
  auto refused = TieredStore::Create(o);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("queue_depth"));
  o = Options(dir);
  o.nvme_aio.block_size = 256 * 1024;
  auto rank0 = TieredStore::Create(o);
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  o.nvme_rank = 1;
  auto rank1 = TieredStore::Create(o);  // the same path, files of its own
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  TieredStore* stores[] = {rank0->get(), rank1->get()};
  TensorId ids[2];
  for (int r = 0; r < 2; ++r) {
    auto id = stores[r]->Create("w", 4096, Tier::kNvme);
    ASSERT_TRUE(id.ok()) << id.status();
    ids[r] = *id;
    auto p = stores[r]->Acquire(ids[r], Tier::kHost, Access::kOverwrite);
    ASSERT_TRUE(p.ok()) << p.status();
    std::memset(*p, r + 1, 4096);
    ASSERT_TRUE(stores[r]->Release(ids[r], Tier::kHost).ok());
    ASSERT_TRUE(stores[r]->Evict(ids[r], Tier::kHost).ok());  // to its own swap file
  }
  for (int r = 0; r < 2; ++r) {
    auto p = stores[r]->Acquire(ids[r], Tier::kHost, Access::kRead);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(static_cast<const uint8_t*>(*p)[4095], r + 1);
    ASSERT_TRUE(stores[r]->Release(ids[r], Tier::kHost).ok());
  }
}

TEST(TieredStoreTest, NvmeCapacityExhaustionNamesTheTensor) {
  ScratchDir dir;
  TieredStoreOptions o = Options(dir);
  o.nvme_capacity_bytes = 4 * kMiB;
  auto store = TieredStore::Create(o);
  ASSERT_TRUE(store.ok()) << store.status();
  auto a = (*store)->Create("fits", 3 * kMiB, Tier::kNvme);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = (*store)->Create("too-big", 3 * kMiB, Tier::kNvme);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kResourceExhausted);
  EXPECT_THAT(b.status().ToString(), HasSubstr("too-big"));
}

// NVMe failures at run time reach the call that needed the transfer, with the tensor named; a
// failed write-back keeps the cached copy, so nothing is lost.
TEST(TieredStoreTest, NvmeIoErrorsSurfaceAndLoseNothing) {
  ScratchDir dir;
  FaultyEngine* faulty = nullptr;
  auto store = CreateWithFaultyEngine(Options(dir), &faulty);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_NE(faulty, nullptr);
  const uint64_t size = 600 * kKiB;  // three pieces

  // A read error: reported with the tensor named, and not sticky.
  auto a = (*store)->Create("attn.qkv", size, Tier::kNvme);
  ASSERT_TRUE(a.ok());
  auto p = (*store)->Acquire(*a, Tier::kHost, Access::kWrite);
  ASSERT_TRUE(p.ok());
  Fill(*p, size, 3, 1);
  ASSERT_TRUE((*store)->Release(*a, Tier::kHost).ok());
  ASSERT_TRUE((*store)->Evict(*a, Tier::kHost).ok());
  faulty->Arm(IoOp::kRead, 0, Fault::kEio);
  auto r = (*store)->Acquire(*a, Tier::kHost, Access::kRead);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kIoError) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("attn.qkv"));
  r = (*store)->Acquire(*a, Tier::kHost, Access::kRead);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Check(*r, size, 3, 1), -1);
  ASSERT_TRUE((*store)->Release(*a, Tier::kHost).ok());

  // A write-back error: Evict fails naming the tensor and keeps the only current copy.
  auto b = (*store)->Create("mlp.w1", size, Tier::kNvme);
  ASSERT_TRUE(b.ok());
  p = (*store)->Acquire(*b, Tier::kDevice, Access::kWrite);
  ASSERT_TRUE(p.ok());
  Fill(*p, size, 4, 1);
  ASSERT_TRUE((*store)->Release(*b, Tier::kDevice).ok());
  faulty->Arm(IoOp::kWrite, 1, Fault::kEio);
  Status evicted = (*store)->Evict(*b, Tier::kDevice);
  ASSERT_FALSE(evicted.ok());
  EXPECT_EQ(evicted.code(), StatusCode::kIoError) << evicted;
  EXPECT_THAT(evicted.message(), HasSubstr("mlp.w1"));
  auto resident = (*store)->ResidentTiers(*b);
  ASSERT_TRUE(resident.ok());
  EXPECT_EQ(*resident, std::vector<Tier>{Tier::kDevice});
  r = (*store)->Acquire(*b, Tier::kHost, Access::kRead);  // from the surviving device copy
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Check(*r, size, 4, 1), -1);
  ASSERT_TRUE((*store)->Release(*b, Tier::kHost).ok());
  // The swap store's sticky error: Flush reports it too.
  EXPECT_FALSE((*store)->Flush().ok());
}

// Streams (ReadHome, WriteHome) move an NVMe-homed tensor's bytes straight between its home
// and the caller's buffer, in pieces, metered like any move, and agree with the cache: what a
// stream wrote, Acquire reads. A tensor the cache holds, one homed elsewhere, an unaligned
// buffer, a freed tensor and an I/O error are each refused with the tensor named.
TEST(TieredStoreTest, StreamsMoveTheHomeThroughTheCallersBuffer) {
  ScratchDir dir;
  FaultyEngine* faulty = nullptr;
  auto store = CreateWithFaultyEngine(Options(dir), &faulty);
  ASSERT_TRUE(store.ok()) << store.status();
  TieredStore& s = **store;
  const uint64_t size = 600 * kKiB + 123;  // three pieces, the last one short
  auto id = s.Create("chunk 7 state", size, Tier::kNvme);
  ASSERT_TRUE(id.ok());
  auto buffer = HostBuffer::Allocate((size + 4095) / 4096 * 4096);
  ASSERT_TRUE(buffer.ok());
  char* b = static_cast<char*>(buffer->data());

  std::memset(b, 0xAB, buffer->size_bytes());
  ASSERT_TRUE(s.ReadHome(*id, b).ok());  // never written: zeros, and no I/O
  EXPECT_TRUE(std::all_of(b, b + buffer->size_bytes(), [](char c) { return c == 0; }));
  Fill(b, size, 7, 1);
  ASSERT_TRUE(s.WriteHome(*id, b).ok());
  std::memset(b, 0, buffer->size_bytes());
  std::promise<Status> read;
  s.ReadHomeAsync(*id, b, [&](Status st) { read.set_value(std::move(st)); });
  ASSERT_TRUE(read.get_future().get().ok());
  EXPECT_EQ(Check(b, size, 7, 1), -1);
  TieredStoreStats stats = s.stats();
  EXPECT_EQ(stats.host_to_nvme.bytes, size);
  EXPECT_EQ(stats.nvme_to_host.bytes, size);

  // The cache sees what the stream wrote; while it holds a copy, streams are refused.
  auto p = s.Acquire(*id, Tier::kHost, Access::kRead);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(Check(*p, size, 7, 1), -1);
  Status refused = s.ReadHome(*id, b);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("chunk 7 state"));
  ASSERT_TRUE(s.Release(*id, Tier::kHost).ok());
  ASSERT_TRUE(s.Evict(*id, Tier::kHost).ok());
  EXPECT_TRUE(s.ReadHome(*id, b).ok());

  // Bad input.
  EXPECT_EQ(s.ReadHome(*id, b + 8).code(), StatusCode::kInvalidArgument);
  auto host = s.Create("host homed", 4096, Tier::kHost);
  ASSERT_TRUE(host.ok());
  Status elsewhere = s.WriteHome(*host, b);
  EXPECT_EQ(elsewhere.code(), StatusCode::kInvalidArgument) << elsewhere;
  EXPECT_THAT(elsewhere.message(), HasSubstr("not NVMe"));

  // An I/O error names the tensor and loses nothing: the next read has the bytes.
  faulty->Arm(IoOp::kRead, 1, Fault::kEio);
  Status failed = s.ReadHome(*id, b);
  EXPECT_EQ(failed.code(), StatusCode::kIoError) << failed;
  EXPECT_THAT(failed.message(), HasSubstr("chunk 7 state"));
  std::memset(b, 0, buffer->size_bytes());
  ASSERT_TRUE(s.ReadHome(*id, b).ok());
  EXPECT_EQ(Check(b, size, 7, 1), -1);

  ASSERT_TRUE(s.Free(*id).ok());
  EXPECT_EQ(s.ReadHome(*id, b).code(), StatusCode::kFailedPrecondition);
}

// A batched write-back that fails (Note [Batched write-backs]): the error names a tensor, and
// every tensor whose writes failed keeps its copy, so every value is still there.
TEST(TieredStoreTest, FailedBatchedWriteBackLosesNothing) {
  ScratchDir dir;
  FaultyEngine* faulty = nullptr;
  auto store = CreateWithFaultyEngine(Options(dir), &faulty);
  ASSERT_TRUE(store.ok()) << store.status();
  const std::vector<TensorId> ids = WrittenOnNvme(**store, "layer", 6, 64 * kKiB);
  ASSERT_EQ(ids.size(), 6u);
  faulty->Arm(IoOp::kWrite, 2, Fault::kEio);
  Status evicted = (*store)->EvictAsync(ids, Tier::kHost).get();
  ASSERT_FALSE(evicted.ok());
  EXPECT_EQ(evicted.code(), StatusCode::kIoError) << evicted;
  EXPECT_THAT(evicted.message(), HasSubstr("layer"));
  int kept = 0;
  for (TensorId id : ids) {
    auto resident = (*store)->ResidentTiers(id);
    ASSERT_TRUE(resident.ok());
    ASSERT_EQ(resident->size(), 1u);  // the host copy, or the home it reached
    kept += resident->front() == Tier::kHost;
    auto p = (*store)->Acquire(id, Tier::kHost, Access::kRead);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(Check(*p, 64 * kKiB, id, 1), -1);
    ASSERT_TRUE((*store)->Release(id, Tier::kHost).ok());
  }
  EXPECT_GE(kept, 1);
}

// A batched read that fails reports the tensor; the next Acquire reads it again.
TEST(TieredStoreTest, FailedBatchedPrefetchIsReadAgain) {
  ScratchDir dir;
  FaultyEngine* faulty = nullptr;
  auto store = CreateWithFaultyEngine(Options(dir), &faulty);
  ASSERT_TRUE(store.ok()) << store.status();
  const std::vector<TensorId> ids = WrittenOnNvme(**store, "block", 4, 64 * kKiB);
  ASSERT_EQ(ids.size(), 4u);
  ASSERT_TRUE((*store)->EvictAsync(ids, Tier::kHost).get().ok());
  faulty->Arm(IoOp::kRead, 1, Fault::kEio);
  Status s = (*store)->Prefetch(ids, Tier::kDevice).get();
  EXPECT_EQ(s.code(), StatusCode::kIoError) << s;
  EXPECT_THAT(s.message(), HasSubstr("block"));
  for (TensorId id : ids) {
    auto p = (*store)->Acquire(id, Tier::kDevice, Access::kRead);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(Check(*p, 64 * kKiB, id, 1), -1);
    ASSERT_TRUE((*store)->Release(id, Tier::kDevice).ok());
  }
}

}  // namespace
}  // namespace zinf
