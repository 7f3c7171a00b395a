// NvmeGradients (Note [Gradients on NVMe]): gradients added a piece at a time, in backward's
// order and over micro-batches, land in the chunks' extents as the host accumulators would
// hold them (acc + g per micro-batch), with their norm; the staging stays within its bound
// however fast the pieces come; a micro-batch too many is refused.
#include "zero/nvme_gradients.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

#include "offload/tiered_store_internal.h"
#include "tests/nvme/nvme_test_util.h"

namespace zinf {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr uint64_t kChunk = PipelinedOptimizerOptions::kMinChunkElements;

// An engine whose writes complete 20 ms late: slower than the gradients come, so that
// writes in flight would pile up without the staging bound.
class SlowWrites final : public IoEngine {
 public:
  explicit SlowWrites(std::unique_ptr<IoEngine> base) : base_(std::move(base)) {}
  std::string_view name() const override { return "slow writes"; }
  const AioOptions& options() const override { return base_->options(); }
  StatusOr<int> AddFile(const IoFile& file) override { return base_->AddFile(file); }
  void Submit(const IoRequest& request, IoCallback done) override {
    if (request.op != IoOp::kWrite) return base_->Submit(request, std::move(done));
    base_->Submit(request, [done = std::move(done)](Status s) {
      std::this_thread::sleep_for(20ms);
      done(std::move(s));
    });
  }
  using IoEngine::Submit;
  void Drain() override { base_->Drain(); }

 private:
  std::unique_ptr<IoEngine> base_;
};

TEST(NvmeGradientsTest, AccumulatesLikeHostMemoryWithinTheStagingBound) {
  testing_util::ScratchDir dir;
  // One store, as the engine has: the step's chunks and staging, and the gradients' staging.
  SwapStoreOptions so;
  so.paths = {dir.path()};
  so.capacity_bytes = 128 << 20;
  so.aio.block_size = 256 * 1024;
  const uint64_t buffer = PipelinedOptimizer::GradientBufferBytes(kChunk);
  const uint64_t step_staging = 3 * kChunk * PipelinedOptimizerOptions::kStagingBytesPerElement;
  TieredStoreOptions to;
  to.device = "";
  to.host_budget_bytes = step_staging + NvmeGradients::StagingBudget(kChunk, 3 * buffer);
  to.pin_host = false;
  to.piece_bytes = 4 << 20;
  to.staging_buffers = 1;
  internal::SetTieredStoreEngineFactoryForTest(
      [](const AioOptions& aio) -> StatusOr<std::unique_ptr<IoEngine>> {
        ZINF_ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> base, CreateIoEngine(aio));
        return std::unique_ptr<IoEngine>(std::make_unique<SlowWrites>(std::move(base)));
      });
  auto tiers = internal::TieredStoreAccess::Create(to, so, nullptr);
  internal::SetTieredStoreEngineFactoryForTest(nullptr);
  ASSERT_TRUE(tiers.ok()) << tiers.status();
  auto opt = CpuOptimizer::Create();
  ASSERT_TRUE(opt.ok());
  ASSERT_TRUE((*opt)->AddParamGroup({}).ok());
  PipelinedOptimizerOptions po;
  po.chunk_elements = kChunk;
  po.num_buffers = 3;
  po.host_budget_bytes = step_staging;
  auto piped = PipelinedOptimizer::Create(opt->get(), **tiers, po);
  ASSERT_TRUE(piped.ok()) << piped.status();
  const uint64_t n = 6 * kChunk + 500;  // seven chunks, the last one short
  ShardSpec spec;
  spec.name = "gradients";
  spec.count = n;
  auto shard = (*piped)->AddShard(spec);
  ASSERT_TRUE(shard.ok());
  struct Finals final : FinalChunks {
    void MarkChunkFinal(size_t chunk) override { chunks.push_back(chunk); }
    std::vector<size_t> chunks;
  } finals;
  auto grads = NvmeGradients::Create(piped->get(), *shard, opt->get(), tiers->get(),
                                     /*accumulation_steps=*/2, &finals,
                                     /*max_staging_bytes=*/3 * buffer);
  ASSERT_TRUE(grads.ok()) << grads.status();

  // "Parameters" of uneven sizes, added last first, as backward does.
  const std::vector<uint64_t> cuts = {0, 1000, 70000, 200000, 300001, n};
  std::vector<double> expected(n);
  for (int micro = 0; micro < 2; ++micro) {
    std::vector<float> g(n);
    for (uint64_t i = 0; i < n; ++i) g[i] = std::sin(0.001f * i + micro);
    for (uint64_t i = 0; i < n; ++i) {
      expected[i] = micro == 0 ? g[i] : static_cast<float>(static_cast<float>(expected[i]) + g[i]);
    }
    for (size_t p = cuts.size() - 1; p > 0; --p) {
      ASSERT_TRUE((*grads)->Add(cuts[p - 1], g.data() + cuts[p - 1], cuts[p] - cuts[p - 1]).ok());
    }
  }
  auto stats = (*grads)->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_TRUE(stats->finite);
  double sum = 0;
  for (double e : expected) sum += e * e;
  EXPECT_NEAR(stats->sum_squares, sum, 1e-9 * sum);
  EXPECT_EQ(finals.chunks.size(), 7u) << "every chunk was announced final once";
  // Within the bound: the chunk being filled may exceed it by the pieces that span chunks.
  EXPECT_LE((*grads)->peak_staging_bytes(), 3 * buffer + 2 * buffer);
  // The staging is the store's: its host tier's peak is that and the step's staging, no more.
  EXPECT_EQ((*tiers)->stats().tiers[int(Tier::kHost)].peak_bytes,
            (*piped)->staging_bytes() + (*grads)->peak_staging_bytes());
  auto back = HostBuffer::Allocate(buffer);
  ASSERT_TRUE(back.ok());
  for (size_t c = 0; c < 7; ++c) {
    ASSERT_TRUE((*piped)->ReadChunkGradients(*shard, c, back->data()).ok());
    const float* got = static_cast<const float*>(back->data());
    const uint64_t count = c < 6 ? kChunk : 500;
    for (uint64_t i = 0; i < count; ++i) {
      ASSERT_EQ(got[i], static_cast<float>(expected[c * kChunk + i])) << c << " " << i;
    }
  }
  // A third micro-batch in a batch of two is refused, naming the elements.
  std::vector<float> g(kChunk, 1.0f);
  Status extra = (*grads)->Add(0, g.data(), kChunk);
  EXPECT_EQ(extra.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(extra.message(), HasSubstr("more than the 2 of the batch"));
  // A new batch starts over.
  (*grads)->EndBatch();
  EXPECT_EQ((*grads)->Stats().status().code(), StatusCode::kFailedPrecondition);
  // A short last window (Note [Short last window]): one micro-batch of the two, its
  // statistics read back from what was written.
  (*grads)->EndBatch();
  std::vector<float> once(n);
  double once_sum = 0;
  for (uint64_t i = 0; i < n; ++i) {
    once[i] = std::cos(0.002f * i);
    once_sum += double(once[i]) * once[i];
  }
  ASSERT_TRUE((*grads)->Add(0, once.data(), n).ok());
  auto short_stats = (*grads)->Stats();
  ASSERT_TRUE(short_stats.ok()) << short_stats.status();
  EXPECT_NEAR(short_stats->sum_squares, once_sum, 1e-6 * once_sum);
  EXPECT_TRUE(short_stats->finite);
}

}  // namespace
}  // namespace zinf
