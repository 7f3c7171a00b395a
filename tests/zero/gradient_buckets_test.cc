// GradientBuckets (Note [Gradient buckets]): each parameter's full gradient is packed into a
// bucket rank-major, a bucket is reduce-scattered when the next gradient would overflow it,
// and this rank's reduced slice of each parameter goes to the sink at its flat offset, in the
// order the parameters were added; with one rank each bucket comes down whole. A
// gradient is read only after the event backward recorded, and one the caller keeps is copied
// before Add returns. Every case runs on the host device and behind its modelled link, where
// device memory is reached only through streams and the gradients come down to the host tier.
//
// Every gradient value is a small integer, so every sum is exact in fp32 whatever the order in
// which a collective adds: the reduced values are checked for equality, not closeness.
// - In one process, a communicator of `world` ranks that all sent the same bucket shows what
//   each bucket held, when it was reduced, and what a failed reduction or sink reports.
// - Forked ranks over Gloo on loopback reduce different gradients for real, at several bucket
//   sizes.
#include "zero/gradient_buckets.h"

#include <fmt/core.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "comm/tcp_store.h"
#include "tests/testing/fork_ranks.h"
#include "zinf/device.h"
#include "zinf/tiered_store.h"

namespace zinf {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

constexpr uint64_t kBudgetBytes = 64 << 20;

// Element `index` of parameter `param`'s full gradient as rank 0 computes it.
float GradValue(int param, uint64_t index) { return static_cast<float>(param * 1000 + index); }

// The host device, behind a modelled link or not, and a tiered store whose device tier is
// there; `backward` is the stream the gradients are written on, as a trainer's would be.
struct Rig {
  std::unique_ptr<Device> device;
  std::unique_ptr<TieredStore> store;
  std::unique_ptr<Stream> backward;
};

StatusOr<Rig> MakeRig(bool modelled_link) {
  Rig rig;
  ZINF_ASSIGN_OR_RETURN(
      rig.device, CreateHostDevice({.memory_budget_bytes = kBudgetBytes,
                                    .link_bytes_per_second = modelled_link ? 4000000000u : 0}));
  if (rig.device->host_addressable() == modelled_link) {
    return Internal("the modelled link decides whether the host may touch device memory");
  }
  TieredStoreOptions options;
  options.device = "host";
  options.device_budget_bytes = kBudgetBytes;
  options.host_budget_bytes = kBudgetBytes;
  options.pin_host = false;
  ZINF_ASSIGN_OR_RETURN(rig.store, TieredStore::Create(options, rig.device.get()));
  ZINF_ASSIGN_OR_RETURN(rig.backward, rig.device->CreateStream());
  return rig;
}

// One parameter's full gradient as backward leaves it: a device-tier tensor of the store,
// acquired, written on the backward stream. Backward's compute takes a little time before the
// write (a reader that does not wait for `ready` finds zeros) and after it (`landed` marks the
// values in place while `ready` is still to come). `host` is what was written; it stays alive
// as long as the copy might still read it.
struct Grad {
  TensorId tensor = 0;
  float* data = nullptr;
  std::unique_ptr<Event> landed, ready;
  std::vector<float> host;
};

Status Upload(Rig& rig, Grad& g) {
  auto compute = [] {
    std::this_thread::sleep_for(2ms);
    return OkStatus();
  };
  ZINF_RETURN_IF_ERROR(rig.backward->HostFunc(compute));
  if (!g.host.empty()) {
    ZINF_RETURN_IF_ERROR(rig.backward->Copy(g.data, g.host.data(), g.host.size() * sizeof(float),
                                            CopyKind::kHostToDevice));
  }
  ZINF_RETURN_IF_ERROR(rig.backward->Record(*g.landed));
  ZINF_RETURN_IF_ERROR(rig.backward->HostFunc(compute));
  return rig.backward->Record(*g.ready);
}

StatusOr<Grad> MakeGrad(Rig& rig, const std::string& name, std::vector<float> values) {
  Grad g;
  g.host = std::move(values);
  const uint64_t bytes = std::max<uint64_t>(g.host.size(), 1) * sizeof(float);
  ZINF_ASSIGN_OR_RETURN(g.tensor,
                        rig.store->CreateScratch(name + " (gradient)", bytes, Tier::kDevice));
  ZINF_ASSIGN_OR_RETURN(void* data, rig.store->Acquire(g.tensor, Tier::kDevice, Access::kWrite));
  g.data = static_cast<float*>(data);
  ZINF_ASSIGN_OR_RETURN(g.landed, rig.device->CreateEvent());
  ZINF_ASSIGN_OR_RETURN(g.ready, rig.device->CreateEvent());
  ZINF_RETURN_IF_ERROR(Upload(rig, g));
  return g;
}

// Parameter `param`'s full gradient over `world` ranks of `shard` elements, as `rank` computes
// it: rank 0's values times 2^rank, so that a sum over ranks tells which ranks it holds.
std::vector<float> FullGradient(int param, uint64_t shard, int world, int rank = 0) {
  std::vector<float> v(shard * world);
  for (uint64_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<float>(1 << rank) * GradValue(param, i);
  }
  return v;
}

bool Freed(TieredStore& store, TensorId tensor) {
  return store.ResidentTiers(tensor).status().code() == StatusCode::kFailedPrecondition;
}

// What the sink was handed, call by call.
struct Sunk {
  uint64_t flat_offset;
  std::vector<float> values;
  const float* at;  // where it read them
};

class Recorder final : public GradientSink {
 public:
  GradientSink* sink() { return this; }
  Status Add(uint64_t flat_offset, const float* reduced, uint64_t size) override {
    if (flat_offset == fail_offset_) return fail_;
    sunk_.push_back({flat_offset, std::vector<float>(reduced, reduced + size), reduced});
    return OkStatus();
  }
  // The buckets' own landing, always: what is handed over is checked piece by piece.
  float* LandingFor(uint64_t, uint64_t) override { return nullptr; }
  Status Landed(uint64_t, uint64_t) override { return Internal("no landing was given"); }
  // The sink returns `status` for the parameter at `flat_offset`.
  void FailAt(uint64_t flat_offset, Status status) {
    fail_offset_ = flat_offset;
    fail_ = std::move(status);
  }
  const std::vector<Sunk>& sunk() const { return sunk_; }

 private:
  std::vector<Sunk> sunk_;
  uint64_t fail_offset_ = UINT64_MAX;
  Status fail_;
};

// `world` ranks in this one process, seen from rank `rank`, as if every rank had sent the same
// bucket: a reduce-scatter records the bucket it was given (every rank's slice) and hands back
// this rank's slice times `world`. Its reduce-scatter number `fail_at` (from 0) fails, as one
// whose peer died would. On a modelled link it reads the device memory that the host device
// keeps in host memory, which only a test may.
class SameBucketWorld final : public Communicator {
 public:
  SameBucketWorld(int rank, int world, int fail_at = -1)
      : Communicator(rank, world), fail_at_(fail_at) {
    StartWorker();
  }
  ~SameBucketWorld() override { StopWorker(); }
  std::string_view backend() const override { return "same-bucket"; }
  std::vector<std::vector<float>> buckets() const {
    std::lock_guard lock(mu_);
    return buckets_;
  }

 protected:
  Status DoReduceScatter(void* send, void* recv, size_t count, ElementType type,
                         ReduceOp op) override {
    if (type != ElementType::kFp32 || op != ReduceOp::kSum) {
      return Internal("gradient buckets sum fp32");
    }
    std::lock_guard lock(mu_);
    const float* in = static_cast<const float*>(send);
    buckets_.emplace_back(in, in + count * world_size());
    if (static_cast<int>(buckets_.size()) - 1 == fail_at_) return Unavailable("rank 1 is gone");
    float* out = static_cast<float*>(recv);
    for (size_t i = 0; i < count; ++i) out[i] = in[rank() * count + i] * world_size();
    return OkStatus();
  }
  Status DoAllReduce(void*, size_t, ElementType, ReduceOp) override { return NotUsed(); }
  Status DoAllGather(const void*, void*, size_t, ElementType) override { return NotUsed(); }
  Status DoBroadcast(void*, size_t, ElementType, int) override { return NotUsed(); }
  Status DoBarrier() override { return NotUsed(); }

 private:
  static Status NotUsed() { return Internal("gradient buckets only reduce-scatter"); }
  mutable std::mutex mu_;
  std::vector<std::vector<float>> buckets_;
  const int fail_at_;
};

// The parameters of each bucket by Note [Gradient buckets]'s rule: in the order they were
// added, a bucket reduced when the next shard would overflow its slice of `slice` elements (a
// shard larger than that has a bucket of its own); empty shards are not reduced.
std::vector<std::vector<int>> BucketParams(const std::vector<uint64_t>& shards, uint64_t slice) {
  std::vector<std::vector<int>> buckets;
  uint64_t used = 0;
  for (int p = 0; p < static_cast<int>(shards.size()); ++p) {
    if (shards[p] == 0) continue;
    if (buckets.empty() || used + shards[p] > slice) {
      buckets.emplace_back();
      used = 0;
    }
    buckets.back().push_back(p);
    used += shards[p];
  }
  return buckets;
}

// What SameBucketWorld is handed for a bucket of `params` (in the order added): rank by rank,
// that rank's slice of each parameter's (rank 0's) full gradient, the last added first (each
// slice fills from its end, so that backward's reverse order lies in flat order).
std::vector<float> BucketContents(const std::vector<int>& params,
                                  const std::vector<uint64_t>& shards, int world) {
  std::vector<float> bucket;
  for (int r = 0; r < world; ++r) {
    for (int p : std::vector<int>(params.rbegin(), params.rend())) {
      for (uint64_t i = 0; i < shards[p]; ++i) bucket.push_back(GradValue(p, r * shards[p] + i));
    }
  }
  return bucket;
}

// Rank `rank`'s reduced shard of parameter `param` when the ranks' contributions sum to
// `factor` times rank 0's.
std::vector<float> ReducedShard(int param, uint64_t shard, int rank, float factor) {
  std::vector<float> v(shard);
  for (uint64_t i = 0; i < shard; ++i) v[i] = factor * GradValue(param, rank * shard + i);
  return v;
}

// Bytes the store moved down from the device tier: behind the link, each reduced slice (with
// one rank, each bucket) exactly once, and nothing else; where the host reads device memory in
// place, nothing.
uint64_t BytesDown(const TieredStore& store) { return store.stats().device_to_host.bytes; }
uint64_t SliceBytes(const std::vector<uint64_t>& shards) {
  uint64_t elements = 0;
  for (uint64_t s : shards) elements += s;
  return elements * sizeof(float);
}

std::vector<uint64_t> FlatOffsets(const std::vector<uint64_t>& shards) {
  std::vector<uint64_t> offsets;
  uint64_t at = 0;
  for (uint64_t s : shards) {
    offsets.push_back(at);
    at += s;
  }
  return offsets;
}

TEST(GradientBucketsSizeTest, SliceCapacityIsTheBucketsShareGrownToTheLargestShard) {
  EXPECT_EQ(GradientBuckets::SliceCapacity(1000, 4, 0), 250u);
  EXPECT_EQ(GradientBuckets::SliceCapacity(1000, 3, 0), 333u);
  EXPECT_EQ(GradientBuckets::SliceCapacity(3, 4, 0), 1u) << "at least one element a rank";
  EXPECT_EQ(GradientBuckets::SliceCapacity(1000, 4, 250), 250u);
  EXPECT_EQ(GradientBuckets::SliceCapacity(1000, 4, 251), 251u);
}

TEST(GradientBucketsSizeTest, NoDeviceIsRefused) {
  auto rig = MakeRig(false);
  ASSERT_TRUE(rig.ok()) << rig.status();
  SameBucketWorld comm(0, 2);
  Recorder recorder;
  auto buckets = GradientBuckets::Create(rig->store.get(), nullptr, &comm, 8, recorder.sink());
  EXPECT_EQ(buckets.status().code(), StatusCode::kFailedPrecondition) << buckets.status();
  EXPECT_THAT(buckets.status().message(), HasSubstr("device tier"));
}

// The parameter: whether the host device is behind its modelled link.
class GradientBucketsTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    auto rig = MakeRig(GetParam());
    ASSERT_TRUE(rig.ok()) << rig.status();
    rig_ = std::move(*rig);
  }
  // Gradients of `shards` for `world` ranks, named p0, p1, ...
  std::vector<Grad> MakeGrads(const std::vector<uint64_t>& shards, int world, int rank = 0) {
    std::vector<Grad> grads;
    for (int p = 0; p < static_cast<int>(shards.size()); ++p) {
      auto g = MakeGrad(rig_, "p" + std::to_string(p), FullGradient(p, shards[p], world, rank));
      EXPECT_TRUE(g.ok()) << g.status();
      grads.push_back(g.ok() ? std::move(*g) : Grad());
    }
    return grads;
  }
  Status Add(GradientBuckets& buckets, Grad& g, int p, uint64_t shard, uint64_t flat_offset) {
    return buckets.Add(g.data, shard, flat_offset, "p" + std::to_string(p), g.ready.get(),
                       g.tensor);
  }

  Rig rig_;
};

// One rank: nothing to reduce. Each gradient goes to the sink whole, in the order added, and
// its tensor is freed. On the host device the sink reads it where it is, at once. Behind the
// link the gradients are packed into buckets of 8 elements on the device, and each bucket
// comes down in one copy, into host memory the sink reads, when the bucket after it fills or
// at Finish: a copy and a wait per bucket, none per gradient.
TEST_P(GradientBucketsTest, OneRankHandsEachGradientToTheSinkInOrder) {
  auto comm = CreateLocalCommunicator();
  ASSERT_TRUE(comm.ok()) << comm.status();
  Recorder recorder;
  auto buckets =
      GradientBuckets::Create(rig_.store.get(), rig_.device.get(), comm->get(), 8, recorder.sink());
  ASSERT_TRUE(buckets.ok()) << buckets.status();
  std::vector<uint64_t> shards;
  for (int p = 0; p < 12; ++p) shards.push_back(1 + (p * 5) % 11);
  const std::vector<uint64_t> offsets = FlatOffsets(shards);
  const std::vector<std::vector<int>> in_bucket = BucketParams(shards, 8);
  std::vector<Grad> grads = MakeGrads(shards, 1);
  const TransferCounts before = rig_.store->transfer_counters().counts();
  size_t bucket = 0;  // the bucket the last gradient went into
  for (size_t p = 0; p < shards.size(); ++p) {
    ASSERT_TRUE(Add(**buckets, grads[p], p, shards[p], offsets[p]).ok()) << p;
    if (!GetParam()) {
      ASSERT_EQ(recorder.sunk().size(), p + 1) << "handed over during Add";
      EXPECT_EQ(recorder.sunk().back().at, grads[p].data) << "read where it is, not copied";
      continue;
    }
    while (std::find(in_bucket[bucket].begin(), in_bucket[bucket].end(), int(p)) ==
           in_bucket[bucket].end()) {
      ++bucket;
    }
    // Handed over: every bucket before the one just started.
    size_t handed = 0;
    for (size_t b = 0; b + 1 < bucket; ++b) handed += in_bucket[b].size();
    EXPECT_EQ(recorder.sunk().size(), handed) << "after adding p" << p;
  }
  ASSERT_TRUE((*buckets)->Finish().ok());
  const TransferCounts after = rig_.store->transfer_counters().counts();
  ASSERT_EQ(recorder.sunk().size(), shards.size());
  for (size_t p = 0; p < shards.size(); ++p) {
    EXPECT_EQ(recorder.sunk()[p].flat_offset, offsets[p]) << p;
    EXPECT_EQ(recorder.sunk()[p].values, FullGradient(p, shards[p], 1)) << p;
    if (GetParam()) {
      EXPECT_NE(recorder.sunk()[p].at, grads[p].data) << "came down to the host";
    }
    EXPECT_TRUE(Freed(*rig_.store, grads[p].tensor)) << p;
  }
  EXPECT_EQ((*buckets)->reductions(), 0u);
  EXPECT_EQ(BytesDown(*rig_.store), GetParam() ? SliceBytes(shards) : 0u) << "moved by the store";
  const uint64_t copies = GetParam() ? in_bucket.size() : 0;
  EXPECT_EQ(after.copies_down - before.copies_down, copies);
  EXPECT_EQ(after.bytes_down - before.bytes_down, GetParam() ? SliceBytes(shards) : 0u);
  EXPECT_EQ(after.copies_on_device - before.copies_on_device, GetParam() ? shards.size() : 0u);
  const uint64_t waits = after.host_waits - before.host_waits;
  if (GetParam()) {
    // One per bucket; and one for a gradient whose copy had not run while more than a
    // bucket's bytes of gradients were in flight (these buckets hold fewer than the largest).
    EXPECT_GE(waits, copies);
    EXPECT_LE(waits, copies + shards.size());
  } else {
    EXPECT_EQ(waits, shards.size()) << "each gradient read after backward's event";
  }
}

// With a bucket that holds them all, one rank's gradients come down in one copy, waited for
// once, at Finish.
TEST_P(GradientBucketsTest, OneRankWaitsOnceForABucketThatHoldsTheModel) {
  if (!GetParam()) GTEST_SKIP() << "the host reads gradients where they are: no bucket";
  auto comm = CreateLocalCommunicator();
  ASSERT_TRUE(comm.ok()) << comm.status();
  Recorder recorder;
  const std::vector<uint64_t> shards = {3, 1, 7, 2, 5};
  auto buckets = GradientBuckets::Create(rig_.store.get(), rig_.device.get(), comm->get(), 18,
                                         recorder.sink());
  ASSERT_TRUE(buckets.ok()) << buckets.status();
  const std::vector<uint64_t> offsets = FlatOffsets(shards);
  std::vector<Grad> grads = MakeGrads(shards, 1);
  const TransferCounts before = rig_.store->transfer_counters().counts();
  for (size_t p = 0; p < shards.size(); ++p) {
    ASSERT_TRUE(Add(**buckets, grads[p], p, shards[p], offsets[p]).ok()) << p;
  }
  EXPECT_TRUE(recorder.sunk().empty()) << "nothing handed over before Finish";
  ASSERT_TRUE((*buckets)->Finish().ok());
  const TransferCounts after = rig_.store->transfer_counters().counts();
  ASSERT_EQ(recorder.sunk().size(), shards.size());
  for (size_t p = 0; p < shards.size(); ++p) {
    EXPECT_EQ(recorder.sunk()[p].values, FullGradient(p, shards[p], 1)) << p;
    EXPECT_TRUE(Freed(*rig_.store, grads[p].tensor)) << p;
  }
  EXPECT_EQ(after.copies_down - before.copies_down, 1u);
  EXPECT_EQ(after.bytes_down - before.bytes_down, SliceBytes(shards));
  EXPECT_EQ(after.host_waits - before.host_waits, 1u);
}

// A sink whose accumulators a bucket may land in, kept as OptimizerStep keeps them: a
// parameter's first gradient of the batch is copied in (Add, or a landing), later ones added;
// it offers its accumulators for a range of whole parameters none of which holds anything yet.
class LandingSink final : public GradientSink {
 public:
  explicit LandingSink(const std::vector<uint64_t>& shards)
      : offsets_(FlatOffsets(shards)),
        accumulators_(SliceBytes(shards) / 4, -1.0f),
        written_(shards.size(), 0) {}
  Status Add(uint64_t flat_offset, const float* reduced, uint64_t size) override {
    added_.push_back(flat_offset);
    const int p = Param(flat_offset);
    for (uint64_t i = 0; i < size; ++i) {
      float& acc = accumulators_[flat_offset + i];
      acc = written_[p] == 0 ? reduced[i] : acc + reduced[i];
    }
    ++written_[p];
    return OkStatus();
  }
  float* LandingFor(uint64_t first, uint64_t count) override {
    const int begin = Param(first);
    if (begin < 0) return nullptr;
    uint64_t at = first;
    for (int p = begin; p < static_cast<int>(offsets_.size()) && at < first + count; ++p) {
      if (written_[p] != 0) return nullptr;
      at = p + 1 < static_cast<int>(offsets_.size()) ? offsets_[p + 1] : accumulators_.size();
    }
    return at == first + count ? accumulators_.data() + first : nullptr;
  }
  Status Landed(uint64_t first, uint64_t count) override {
    landed_.push_back({first, count});
    for (int p = Param(first); p < static_cast<int>(offsets_.size()) && offsets_[p] < first + count;
         ++p) {
      ++written_[p];
    }
    return OkStatus();
  }
  // What the accumulator of parameter `p` holds.
  std::vector<float> Of(int p) const {
    const uint64_t end =
        p + 1 < static_cast<int>(offsets_.size()) ? offsets_[p + 1] : accumulators_.size();
    return std::vector<float>(accumulators_.begin() + offsets_[p], accumulators_.begin() + end);
  }
  const std::vector<uint64_t>& added() const { return added_; }
  const std::vector<std::pair<uint64_t, uint64_t>>& landed() const { return landed_; }

 private:
  int Param(uint64_t flat_offset) const {
    auto it = std::find(offsets_.begin(), offsets_.end(), flat_offset);
    return it == offsets_.end() ? -1 : static_cast<int>(it - offsets_.begin());
  }
  std::vector<uint64_t> offsets_;
  std::vector<float> accumulators_;
  std::vector<int> written_;
  std::vector<uint64_t> added_;
  std::vector<std::pair<uint64_t, uint64_t>> landed_;
};

// One rank (the local communicator) or two, seen from rank 1 (SameBucketWorld), for the
// landing tests; what rank 1 is handed of parameter `p`'s gradient.
struct Ranks {
  explicit Ranks(int world) : world(world), local(std::move(CreateLocalCommunicator()).value()) {}
  Communicator* comm() { return world == 1 ? local.get() : &two; }
  std::vector<float> Reduced(int p, uint64_t shard) const {
    return world == 1 ? FullGradient(p, shard, 1) : ReducedShard(p, shard, 1, 2.0f);
  }
  const int world;
  std::unique_ptr<Communicator> local;
  SameBucketWorld two{/*rank=*/1, /*world=*/2};
};

// Behind the link, gradients added in reverse flat order, as backward hands them over, lie
// side by side in the bucket (each slice fills from its end) in the flat shard's order, so the
// bucket (one rank) or its reduced slice (two) comes down in one copy straight into the sink's
// accumulators, with no Add. Added in any other order, they come down beside them and each
// goes to Add.
TEST_P(GradientBucketsTest, ABucketInFlatOrderLandsInTheAccumulators) {
  if (!GetParam()) GTEST_SKIP() << "the host reads one rank's gradients where they are";
  const std::vector<uint64_t> shards = {3, 1, 7, 2, 5};
  const std::vector<uint64_t> offsets = FlatOffsets(shards);
  for (int world : {1, 2}) {
    for (bool backward_order : {true, false}) {
      SCOPED_TRACE(fmt::format("{} rank(s), {}", world,
                               backward_order ? "reverse flat order" : "flat order"));
      Ranks ranks(world);
      LandingSink sink(shards);
      auto buckets = GradientBuckets::Create(rig_.store.get(), rig_.device.get(), ranks.comm(),
                                             18 * world, &sink);
      ASSERT_TRUE(buckets.ok()) << buckets.status();
      std::vector<Grad> grads = MakeGrads(shards, world);
      for (size_t i = 0; i < shards.size(); ++i) {
        const size_t p = backward_order ? shards.size() - 1 - i : i;
        ASSERT_TRUE(Add(**buckets, grads[p], p, shards[p], offsets[p]).ok()) << p;
      }
      ASSERT_TRUE((*buckets)->Finish().ok());
      for (size_t p = 0; p < shards.size(); ++p) {
        EXPECT_EQ(sink.Of(p), ranks.Reduced(p, shards[p])) << p;
      }
      if (backward_order) {
        EXPECT_TRUE(sink.added().empty());
        EXPECT_EQ(sink.landed(),
                  (std::vector<std::pair<uint64_t, uint64_t>>{{0, SliceBytes(shards) / 4}}));
      } else {
        EXPECT_TRUE(sink.landed().empty());
        EXPECT_EQ(sink.added(), offsets);
      }
    }
  }
}

// Two micro-batches in flight at once (the buckets are finished only at the step): the first
// micro-batch's bucket lands in the accumulators, and the second's, of the same parameters,
// must be added after it, not land over it, though it starts before the first has reached the
// sink. Every accumulator holds the sum of both.
TEST_P(GradientBucketsTest, ALaterMicroBatchOfTheSameParametersIsAddedNotLandedOver) {
  if (!GetParam()) GTEST_SKIP() << "the host reads one rank's gradients where they are";
  const std::vector<uint64_t> shards = {3, 1, 7, 2, 5};
  const std::vector<uint64_t> offsets = FlatOffsets(shards);
  for (int world : {1, 2}) {
    SCOPED_TRACE(fmt::format("{} rank(s)", world));
    Ranks ranks(world);
    LandingSink sink(shards);
    auto buckets = GradientBuckets::Create(rig_.store.get(), rig_.device.get(), ranks.comm(),
                                           18 * world, &sink);
    ASSERT_TRUE(buckets.ok()) << buckets.status();
    std::vector<std::vector<Grad>> micro_batches;  // alive while their copies may run
    for (int micro = 0; micro < 2; ++micro) {
      std::vector<Grad>& grads = micro_batches.emplace_back(MakeGrads(shards, world));
      for (size_t i = 0; i < shards.size(); ++i) {
        const size_t p = shards.size() - 1 - i;
        ASSERT_TRUE(Add(**buckets, grads[p], p, shards[p], offsets[p]).ok()) << p;
      }
      if (micro == 1) ASSERT_TRUE((*buckets)->Finish().ok());
    }
    for (size_t p = 0; p < shards.size(); ++p) {
      std::vector<float> want = ranks.Reduced(p, shards[p]);
      for (float& v : want) v *= 2;
      EXPECT_EQ(sink.Of(p), want) << p;
    }
    EXPECT_EQ(sink.landed().size(), 1u) << "the first micro-batch's bucket";
    EXPECT_EQ(sink.added().size(), shards.size()) << "the second's, added piece by piece";
  }
}

// Note [Gradient buckets]: with two ranks and buckets of 8 elements (4 a rank), p0 (3) and p1
// (1) fill the first bucket; p2 (2) starts its reduction and goes into the second; p3 (5,
// larger than a slice) starts the second's and waits for the first's, whose reduced slices go
// to the sink then; Finish reduces p3's own bucket and hands over the rest, in order. Each
// bucket holds rank 0's slices of its parameters, then rank 1's; the sink gets rank 1's
// reduced slice of each.
TEST_P(GradientBucketsTest, BucketsHoldEachRanksSlicesAndAreReducedAsTheNextFills) {
  const std::vector<uint64_t> shards = {3, 1, 2, 5};
  const std::vector<uint64_t> offsets = FlatOffsets(shards);
  SameBucketWorld comm(/*rank=*/1, /*world=*/2);
  Recorder recorder;
  auto buckets =
      GradientBuckets::Create(rig_.store.get(), rig_.device.get(), &comm, 8, recorder.sink());
  ASSERT_TRUE(buckets.ok()) << buckets.status();
  std::vector<Grad> grads = MakeGrads(shards, 2);
  const std::vector<size_t> sunk_after_add = {0, 0, 0, 2};
  const std::vector<uint64_t> reductions_after_add = {0, 0, 1, 2};
  for (size_t p = 0; p < shards.size(); ++p) {
    ASSERT_TRUE(Add(**buckets, grads[p], p, shards[p], offsets[p]).ok()) << p;
    EXPECT_EQ(recorder.sunk().size(), sunk_after_add[p]) << "after adding p" << p;
    EXPECT_EQ((*buckets)->reductions(), reductions_after_add[p]) << "after adding p" << p;
  }
  ASSERT_TRUE((*buckets)->Finish().ok());
  EXPECT_EQ((*buckets)->reductions(), 3u);
  const std::vector<std::vector<int>> expected = {{0, 1}, {2}, {3}};
  ASSERT_EQ(BucketParams(shards, 4), expected);
  const std::vector<std::vector<float>> reduced = comm.buckets();
  ASSERT_EQ(reduced.size(), expected.size());
  for (size_t b = 0; b < expected.size(); ++b) {
    EXPECT_EQ(reduced[b], BucketContents(expected[b], shards, 2)) << "bucket " << b;
  }
  ASSERT_EQ(recorder.sunk().size(), shards.size());
  for (size_t p = 0; p < shards.size(); ++p) {
    EXPECT_EQ(recorder.sunk()[p].flat_offset, offsets[p]) << p;
    EXPECT_EQ(recorder.sunk()[p].values, ReducedShard(p, shards[p], 1, 2.0f)) << p;
    EXPECT_TRUE(Freed(*rig_.store, grads[p].tensor)) << p;
  }
  EXPECT_EQ(BytesDown(*rig_.store), GetParam() ? SliceBytes(shards) : 0u) << "moved by the store";
}

// A parameter's padding (past its own elements, to a multiple of the ranks) is never read: a
// trainer that overwrote only the parameter's elements leaves anything there (NaN here), and
// the bucket gets zeros in its place. Three ranks: p0 has 2 elements in shards of 2 (ranks 1
// and 2 hold padding only), p1 8 in shards of 3 (one element of padding).
TEST_P(GradientBucketsTest, APaddedParametersPaddingIsReducedAsZerosWhateverTheBufferHolds) {
  const std::vector<uint64_t> shards = {2, 3}, numels = {2, 8};
  const std::vector<uint64_t> offsets = FlatOffsets(shards);
  SameBucketWorld comm(/*rank=*/1, /*world=*/3);
  Recorder recorder;
  auto buckets =
      GradientBuckets::Create(rig_.store.get(), rig_.device.get(), &comm, 30, recorder.sink());
  ASSERT_TRUE(buckets.ok()) << buckets.status();
  std::vector<Grad> grads;
  for (int p = 0; p < 2; ++p) {
    std::vector<float> full = FullGradient(p, shards[p], 3);
    std::fill(full.begin() + numels[p], full.end(), std::nanf(""));
    auto g = MakeGrad(rig_, "p" + std::to_string(p), std::move(full));
    ASSERT_TRUE(g.ok()) << g.status();
    grads.push_back(std::move(*g));
    ASSERT_TRUE((*buckets)
                    ->Add(grads[p].data, shards[p], offsets[p], "p" + std::to_string(p),
                          grads[p].ready.get(), grads[p].tensor, 3 * shards[p] - numels[p])
                    .ok());
  }
  ASSERT_TRUE((*buckets)->Finish().ok());
  std::vector<float> expected = BucketContents({0, 1}, shards, 3);
  // Rank r's slice of the bucket: p1's 3 elements, then p0's 2 (the last added first).
  for (int r = 0; r < 3; ++r) {
    for (uint64_t i = 0; i < 3; ++i) {
      if (r * 3 + i >= numels[1]) expected[r * 5 + i] = 0.0f;
    }
    for (uint64_t i = 0; i < 2; ++i) {
      if (r * 2 + i >= numels[0]) expected[r * 5 + 3 + i] = 0.0f;
    }
  }
  ASSERT_EQ(comm.buckets().size(), 1u);
  EXPECT_EQ(comm.buckets()[0], expected);
  ASSERT_EQ(recorder.sunk().size(), 2u);
  EXPECT_EQ(recorder.sunk()[0].values, std::vector<float>(2, 0.0f)) << "padding only";
  EXPECT_EQ(recorder.sunk()[1].values, ReducedShard(1, 3, 1, 3.0f));
}

// A bucket reduced before it is full has a gap after each rank's slice, which is closed
// before the collective (reduce-scatter takes the slices back to back). With three ranks and
// slices of 5, p0 (4) leaves a gap of 1, so ranks 1 and 2's slices move by less than their
// own length (behind the link: in pieces no longer than the move), and p1 (3) one of 2. p2
// (9) grows a bucket to hold it, with no gap; p3 (2) then goes into the other bucket.
TEST_P(GradientBucketsTest, APartlyFilledBucketClosesItsGapsBeforeTheReduction) {
  const std::vector<uint64_t> shards = {4, 3, 9, 2};
  const std::vector<uint64_t> offsets = FlatOffsets(shards);
  SameBucketWorld comm(/*rank=*/2, /*world=*/3);
  Recorder recorder;
  auto buckets =
      GradientBuckets::Create(rig_.store.get(), rig_.device.get(), &comm, 15, recorder.sink());
  ASSERT_TRUE(buckets.ok()) << buckets.status();
  std::vector<Grad> grads = MakeGrads(shards, 3);
  for (size_t p = 0; p < shards.size(); ++p) {
    ASSERT_TRUE(Add(**buckets, grads[p], p, shards[p], offsets[p]).ok()) << p;
  }
  ASSERT_TRUE((*buckets)->Finish().ok());
  const std::vector<std::vector<int>> expected = {{0}, {1}, {2}, {3}};
  ASSERT_EQ(BucketParams(shards, 5), expected);
  const std::vector<std::vector<float>> reduced = comm.buckets();
  ASSERT_EQ(reduced.size(), expected.size());
  for (size_t b = 0; b < expected.size(); ++b) {
    EXPECT_EQ(reduced[b], BucketContents(expected[b], shards, 3)) << "bucket " << b;
  }
  ASSERT_EQ(recorder.sunk().size(), shards.size());
  for (size_t p = 0; p < shards.size(); ++p) {
    EXPECT_EQ(recorder.sunk()[p].flat_offset, offsets[p]) << p;
    EXPECT_EQ(recorder.sunk()[p].values, ReducedShard(p, shards[p], 2, 3.0f)) << p;
  }
  EXPECT_EQ(BytesDown(*rig_.store), GetParam() ? SliceBytes(shards) : 0u)
      << "this rank's slices alone, the gaps left behind";
}

// With `tensor` 0 the caller keeps its gradient: it is copied before Add returns, so that
// what the caller writes there afterwards reaches no bucket. One rank and two.
TEST_P(GradientBucketsTest, AGradientTheCallerKeepsIsCopiedBeforeAddReturns) {
  for (const int world : {1, 2}) {
    SCOPED_TRACE("world " + std::to_string(world));
    SameBucketWorld comm(0, world);
    Recorder recorder;
    auto buckets =
        GradientBuckets::Create(rig_.store.get(), rig_.device.get(), &comm, 64, recorder.sink());
    ASSERT_TRUE(buckets.ok()) << buckets.status();
    std::vector<Grad> grads = MakeGrads({6, 2}, world);
    for (int p = 0; p < 2; ++p) {
      ASSERT_TRUE(grads[p].landed->Synchronize().ok());
      ASSERT_TRUE((*buckets)
                      ->Add(grads[p].data, p == 0 ? 6 : 2, p == 0 ? 0 : 6, "p" + std::to_string(p),
                            grads[p].ready.get(), /*tensor=*/0)
                      .ok());
      // At once, from the host (the host device's memory is host memory even behind its link,
      // which only a test may touch), while `ready` is still to come: a copy Add left waiting
      // for it would read this.
      std::fill_n(grads[p].data, grads[p].host.size(), -1.0f);
    }
    ASSERT_TRUE((*buckets)->Finish().ok());
    ASSERT_EQ(recorder.sunk().size(), 2u);
    EXPECT_EQ(recorder.sunk()[0].values, ReducedShard(0, 6, 0, world));
    EXPECT_EQ(recorder.sunk()[1].values, ReducedShard(1, 2, 0, world));
    for (Grad& g : grads) {
      EXPECT_FALSE(Freed(*rig_.store, g.tensor)) << "the caller's to free";
      ASSERT_TRUE(rig_.store->Release(g.tensor, Tier::kDevice).ok());
      ASSERT_TRUE(rig_.store->Free(g.tensor).ok());
    }
  }
}

// An empty shard (a rank past the end of a small parameter's padding) is nothing to reduce:
// no collective, no sink call; its tensor is still freed.
TEST_P(GradientBucketsTest, AnEmptyShardIsNotReducedAndItsTensorIsFreed) {
  SameBucketWorld comm(0, 2);
  Recorder recorder;
  auto buckets =
      GradientBuckets::Create(rig_.store.get(), rig_.device.get(), &comm, 8, recorder.sink());
  ASSERT_TRUE(buckets.ok()) << buckets.status();
  std::vector<Grad> grads = MakeGrads({0}, 2);
  ASSERT_TRUE(Add(**buckets, grads[0], 0, 0, 0).ok());
  ASSERT_TRUE((*buckets)->Finish().ok());
  EXPECT_TRUE(recorder.sunk().empty());
  EXPECT_EQ((*buckets)->reductions(), 0u);
  EXPECT_TRUE(Freed(*rig_.store, grads[0].tensor));
}

// A reduction that fails is reported with the parameters of its bucket named, and what was in
// that bucket never reaches the sink.
TEST_P(GradientBucketsTest, AFailedReductionNamesTheParametersOfItsBucket) {
  const std::vector<uint64_t> shards = {2, 2, 3};
  {
    SameBucketWorld comm(0, 2, /*fail_at=*/0);
    Recorder recorder;
    auto buckets =
        GradientBuckets::Create(rig_.store.get(), rig_.device.get(), &comm, 8, recorder.sink());
    ASSERT_TRUE(buckets.ok()) << buckets.status();
    std::vector<Grad> grads = MakeGrads(shards, 2);
    const std::vector<uint64_t> offsets = FlatOffsets(shards);
    for (size_t p = 0; p < shards.size(); ++p) {
      ASSERT_TRUE(Add(**buckets, grads[p], p, shards[p], offsets[p]).ok()) << p;
    }
    const Status finished = (*buckets)->Finish();
    EXPECT_EQ(finished.code(), StatusCode::kUnavailable) << finished;
    EXPECT_THAT(finished.message(), HasSubstr("reducing the gradients of 'p0' ... 'p1' (2 in one "
                                              "bucket)"));
    EXPECT_THAT(finished.message(), HasSubstr("rank 1 is gone"));
    EXPECT_TRUE(recorder.sunk().empty());
  }
  SameBucketWorld comm(0, 2, /*fail_at=*/0);
  Recorder recorder;
  auto buckets =
      GradientBuckets::Create(rig_.store.get(), rig_.device.get(), &comm, 8, recorder.sink());
  ASSERT_TRUE(buckets.ok()) << buckets.status();
  std::vector<Grad> grads = MakeGrads({7}, 2);
  ASSERT_TRUE(Add(**buckets, grads[0], 0, 7, 0).ok());
  const Status finished = (*buckets)->Finish();
  EXPECT_THAT(finished.message(), HasSubstr("reducing the gradient of 'p0'")) << finished;
}

// The sink's error comes back from the call that handed the slice over, naming the parameter,
// and stops the reduction: no later parameter reaches the sink, not even one whose copy was
// already in flight (one rank behind the link), and every later call returns the error.
TEST_P(GradientBucketsTest, TheSinksErrorStopsTheReductionNamingTheParameter) {
  const std::vector<uint64_t> shards = {2, 2, 3};
  const std::vector<uint64_t> offsets = FlatOffsets(shards);
  for (const int world : {1, 2}) {
    SCOPED_TRACE("world " + std::to_string(world));
    SameBucketWorld comm(0, world);
    Recorder recorder;
    recorder.FailAt(offsets[1], IoError("the accumulators' disk is full"));
    auto buckets =
        GradientBuckets::Create(rig_.store.get(), rig_.device.get(), &comm, 16, recorder.sink());
    ASSERT_TRUE(buckets.ok()) << buckets.status();
    std::vector<Grad> grads = MakeGrads(shards, world);
    Status first;
    for (size_t p = 0; p < shards.size() && first.ok(); ++p) {
      first = Add(**buckets, grads[p], p, shards[p], offsets[p]);
    }
    if (first.ok()) first = (*buckets)->Finish();
    EXPECT_EQ(first.code(), StatusCode::kIoError) << first;
    EXPECT_THAT(first.message(), HasSubstr("the gradient of 'p1'"));
    EXPECT_THAT(first.message(), HasSubstr("the accumulators' disk is full"));
    ASSERT_GE(recorder.sunk().size(), 1u);
    EXPECT_EQ(recorder.sunk()[0].flat_offset, 0u);
    EXPECT_EQ(recorder.sunk().size(), 1u) << "p2 is not handed over after p1 failed";
    Status again = Add(**buckets, grads[2], 2, shards[2], offsets[2]);
    EXPECT_EQ(again.code(), StatusCode::kIoError) << again;
    EXPECT_THAT(again.message(), HasSubstr("the gradient of 'p1'"));
    EXPECT_EQ((*buckets)->Finish().code(), StatusCode::kIoError);
    EXPECT_EQ(recorder.sunk().size(), 1u);
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, GradientBucketsTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "ModelledLink" : "HostDevice");
                         });

// A failed check in a forked rank prints and exits non-zero; the parent sees the exit code.
#define RANK_CHECK(cond, code)                                                             \
  do {                                                                                     \
    if (!(cond)) {                                                                         \
      std::fprintf(stderr, "rank check failed at %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      return code;                                                                         \
    }                                                                                      \
  } while (false)
#define RANK_OK(expr, code)                                                       \
  do {                                                                            \
    const Status s_ = (expr);                                                     \
    if (!s_.ok()) {                                                               \
      std::fprintf(stderr, "rank call failed at %s:%d: %s\n", __FILE__, __LINE__, \
                   s_.ToString().c_str());                                        \
      return code;                                                                \
    }                                                                             \
  } while (false)

// One forked rank of `world`: reduces the gradients of `shards` (rank r's being 2^r times rank
// 0's) through a Gloo group at each bucket size, and checks that the sink gets exactly the sum
// over the ranks of its slice of each, in order, whatever the bucket size; the number of
// reductions follows the bucketing rule.
int ReduceOverGloo(int rank, int world, int port, bool modelled_link,
                   const std::vector<uint64_t>& shards,
                   const std::vector<uint64_t>& bucket_elements) {
  auto rig = MakeRig(modelled_link);
  RANK_OK(rig.status(), 10);
  auto store = TcpStore::Create(
      {.port = static_cast<uint16_t>(port), .is_server = rank == 0, .timeout = 20000ms});
  RANK_OK(store.status(), 11);
  auto comm =
      CreateGlooCommunicator(**store, {.rank = rank, .world_size = world, .timeout = 20000ms});
  RANK_OK(comm.status(), 12);
  const std::vector<uint64_t> offsets = FlatOffsets(shards);
  const float all_ranks = static_cast<float>((1 << world) - 1);
  for (const uint64_t elements : bucket_elements) {
    Recorder recorder;
    auto buckets = GradientBuckets::Create(rig->store.get(), rig->device.get(), comm->get(),
                                           elements, recorder.sink());
    RANK_OK(buckets.status(), 13);
    std::vector<Grad> grads;
    for (size_t p = 0; p < shards.size(); ++p) {
      auto g = MakeGrad(*rig, "p" + std::to_string(p), FullGradient(p, shards[p], world, rank));
      RANK_OK(g.status(), 14);
      grads.push_back(std::move(*g));
      RANK_OK((*buckets)->Add(grads[p].data, shards[p], offsets[p], "p" + std::to_string(p),
                              grads[p].ready.get(), grads[p].tensor),
              15);
    }
    RANK_OK((*buckets)->Finish(), 16);
    const uint64_t slice = GradientBuckets::SliceCapacity(elements, world, 0);
    RANK_CHECK((*buckets)->reductions() == BucketParams(shards, slice).size(), 17);
    RANK_CHECK(recorder.sunk().size() == shards.size(), 18);
    for (size_t p = 0; p < shards.size(); ++p) {
      RANK_CHECK(recorder.sunk()[p].flat_offset == offsets[p], 19);
      RANK_CHECK(recorder.sunk()[p].values == ReducedShard(p, shards[p], rank, all_ranks), 20);
      RANK_CHECK(Freed(*rig->store, grads[p].tensor), 21);
    }
  }
  return 0;
}

// The parameters: ranks, and whether the host device is behind its modelled link.
class GradientBucketsGlooTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

// Every bucket size gives every rank exactly the sum of the ranks' gradients over its slice:
// one bucket for all, a bucket for each parameter (one element a rank), and buckets that
// several parameters share while larger ones grow them.
TEST_P(GradientBucketsGlooTest, EveryBucketSizeGivesEachRankTheExactSumOfItsSlice) {
  const auto [world, modelled_link] = GetParam();
  const std::vector<uint64_t> shards = {5, 1, 8, 3, 13, 2, 4};
  // Buckets take their whole size in device memory: one of 64 elements a rank holds them all.
  const std::vector<uint64_t> bucket_elements = {static_cast<uint64_t>(64 * world),
                                                 static_cast<uint64_t>(world),
                                                 static_cast<uint64_t>(7 * world)};
  ASSERT_EQ(BucketParams(shards, 64).size(), 1u);
  ASSERT_EQ(BucketParams(shards, 1).size(), shards.size());
  ASSERT_EQ(BucketParams(shards, 7).size(), 5u) << "buckets of 7 a rank are shared";
  const std::vector<int> codes = testing::RunRanks(world, [&](int rank, int port) {
    return ReduceOverGloo(rank, world, port, modelled_link, shards, bucket_elements);
  });
  EXPECT_EQ(codes, std::vector<int>(world, 0));
}

INSTANTIATE_TEST_SUITE_P(Ranks, GradientBucketsGlooTest,
                         ::testing::Combine(::testing::Values(2, 3), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<int, bool>>& info) {
                           return std::to_string(std::get<0>(info.param)) + "Ranks" +
                                  (std::get<1>(info.param) ? "ModelledLink" : "HostDevice");
                         });

}  // namespace
}  // namespace zinf
