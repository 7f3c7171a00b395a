// PipelinedOptimizer: bitwise equality with the in-memory CpuOptimizer::Step over several steps
// (state on NVMe, in host memory, and split by nvme_ratio; every ParamHandoff to the shard's
// ParamWriter), the budget checks, and NVMe errors surfacing with the shard and chunk named.
#include "offload/pipelined_optimizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/units.h"
#include "offload/tiered_store_internal.h"
#include "tests/nvme/nvme_test_util.h"
#include "tests/testing/faulty_engine.h"

namespace zinf {
namespace {

using ::testing::HasSubstr;
using testing_util::ScratchDir;

constexpr uint64_t kChunk = PipelinedOptimizerOptions::kMinChunkElements;

SwapStoreOptions StoreOptions(const std::string& path) {
  SwapStoreOptions o;
  o.paths = {path};
  o.capacity_bytes = 64 << 20;
  o.checksum = true;
  o.aio.block_size = 256 * 1024;
  return o;
}

PipelinedOptimizerOptions PipeOptions(double ratio) {
  PipelinedOptimizerOptions o;
  o.chunk_elements = kChunk;
  o.num_buffers = 3;
  o.host_budget_bytes = 3 * kChunk * PipelinedOptimizerOptions::kStagingBytesPerElement;
  o.nvme_ratio = ratio;
  return o;
}

// The step's tiered store: a host tier for the staging buffers and the host chunks and, with
// `swap`, an NVMe tier in `dir` with StoreOptions' aio settings.
std::unique_ptr<TieredStore> StepStore(const std::string& dir, bool swap = true) {
  TieredStoreOptions o;
  o.device = "";
  o.host_budget_bytes = 256 << 20;
  o.pin_host = false;  // accounting is the same; keeps the test within RLIMIT_MEMLOCK
  o.piece_bytes = 4 << 20;
  o.staging_buffers = 1;
  SwapStoreOptions so;
  if (swap) so = StoreOptions(dir);
  auto s = internal::TieredStoreAccess::Create(o, so, nullptr);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(*s) : nullptr;
}

// A tiered store with swap space in a scratch directory, an optimizer with `groups` default
// AdamW groups, and a pipelined optimizer over them at NVMe ratio `ratio`.
struct Piped {
  ScratchDir dir;
  std::unique_ptr<TieredStore> store;
  std::unique_ptr<CpuOptimizer> opt;
  std::unique_ptr<PipelinedOptimizer> piped;

  explicit Piped(double ratio, int groups = 1) {
    store = StepStore(dir.path());
    auto o = CpuOptimizer::Create();
    EXPECT_TRUE(o.ok());
    opt = std::move(*o);
    for (int g = 0; g < groups; ++g) EXPECT_TRUE(opt->AddParamGroup({}).ok());
    auto p = PipelinedOptimizer::Create(opt.get(), *store, PipeOptions(ratio));
    EXPECT_TRUE(p.ok()) << p.status();
    piped = std::move(*p);
  }
};

// Initial parameters and gradients of a shard of n elements (smooth, distinct per element),
// and the init visitor that writes those parameters.
struct SineShard {
  std::vector<float> init, grads;
  explicit SineShard(size_t n) : init(n), grads(n) {
    for (size_t i = 0; i < n; ++i) {
      init[i] = std::sin(0.001f * i);
      grads[i] = std::cos(0.003f * i);
    }
  }
  ChunkVisitor Fill() const {
    return [this](const ChunkView& c) {
      std::memcpy(c.params, init.data() + c.offset, c.count * 4);
      return OkStatus();
    };
  }
};

// A shard's fp32 parameters, as the visits read them (through the writer where it keeps them).
std::vector<float> ParamsOf(PipelinedOptimizer& piped, int shard, size_t n) {
  std::vector<float> out(n);
  Status visited = piped.Visit(
      shard,
      [&](const ChunkView& c) {
        std::memcpy(out.data() + c.offset, c.params, c.count * 4);
        return OkStatus();
      },
      /*write_back=*/false);
  EXPECT_TRUE(visited.ok()) << visited;
  return out;
}

// A ParamWriter that keeps a copy of the shard's parameters in an array of its own: with
// ParamHandoff::kCopy the update writes the bf16 copy there (Targets: the whole chunk, or with
// `gap` its first elements left out and the rest in two stretches); with kNewValues Updated
// copies the fp32 values into `values`. It counts what it hears.
struct ArrayWriter : ParamWriter {
  std::vector<uint16_t>* copy = nullptr;
  std::vector<float>* values = nullptr;
  size_t gap = 0;
  size_t written = 0;  // chunks Updated heard had their copy written
  size_t restarts = 0;

  StatusOr<std::vector<CopyTarget>> Targets(const ChunkView& c) override {
    uint16_t* dst = copy->data() + c.offset;
    if (gap == 0) return std::vector<CopyTarget>{{0, c.count, dst}};
    const uint64_t half = (c.count - gap) / 2;
    return std::vector<CopyTarget>{{0, gap, nullptr},
                                   {gap, half, dst + gap},
                                   {gap + half, c.count - gap - half, dst + gap + half}};
  }
  Status Updated(const ChunkView& c) override {
    written += c.copy_written ? 1 : 0;
    if (values != nullptr) std::memcpy(values->data() + c.offset, c.params, c.count * 4);
    return OkStatus();
  }
  Status Restart() override {
    ++restarts;
    return OkStatus();
  }
};

// One shard's arrays held in memory: the reference the pipelined step must match.
struct Reference {
  std::vector<float> params, m, v;
  std::vector<uint16_t> copy;
  ElementType grad_type;
  size_t grad_size;
  std::vector<uint8_t> grads;  // grad_type elements

  Reference(size_t n, uint32_t seed, ElementType type)
      : params(n),
        m(n),
        v(n),
        copy(n),
        grad_type(type),
        grad_size(ElementSize(type)),
        grads(n * grad_size) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& p : params) p = normal(rng);
  }
  void NewGrads(uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 0.1f);
    for (size_t i = 0; i < params.size(); ++i) {
      const float g = normal(rng);
      if (grad_type == ElementType::kFp32) {
        std::memcpy(&grads[4 * i], &g, 4);
      } else {  // bf16: the high half of the fp32 bits
        uint32_t bits;
        std::memcpy(&bits, &g, 4);
        const uint16_t high = static_cast<uint16_t>(bits >> 16);
        std::memcpy(&grads[2 * i], &high, 2);
      }
    }
  }
  OptimizerSpan Span(int state_count) {
    OptimizerSpan s;
    s.params = params.data();
    s.grads = grads.data();
    s.grad_type = grad_type;
    s.state0 = m.data();
    s.state1 = state_count == 2 ? v.data() : nullptr;
    s.param_copy = copy.data();
    s.param_copy_type = ElementType::kBf16;
    s.count = params.size();
    return s;
  }
};

struct StepCase {
  std::string label;
  double ratio;
  ParamHandoff handoff;
  bool writer = true;  // kNewValues without a writer: nobody sees the new parameters
  ElementType grad_type = ElementType::kFp32;
};
void PrintTo(const StepCase& c, std::ostream* os) { *os << c.label; }

class PipelinedStepTest : public ::testing::TestWithParam<StepCase> {};

TEST_P(PipelinedStepTest, BitwiseIdenticalToInMemoryStepOverSeveralSteps) {
  const StepCase& c = GetParam();
  ScratchDir dir;
  std::unique_ptr<TieredStore> store = StepStore(dir.path(), c.ratio > 0);
  ASSERT_NE(store, nullptr);
  PipelinedOptimizerOptions options = PipeOptions(c.ratio);
  // Two optimizers with the same groups: one streamed, one stepped in memory.
  auto piped_opt = CpuOptimizer::Create();
  auto ref_opt = CpuOptimizer::Create();
  ASSERT_TRUE(piped_opt.ok() && ref_opt.ok());
  OptimizerHyperParams adamw;
  adamw.weight_decay = 0.01;
  OptimizerHyperParams lion = OptimizerHyperParams::Defaults(OptimizerType::kLion);
  for (auto* opt : {piped_opt->get(), ref_opt->get()}) {
    ASSERT_TRUE(opt->AddParamGroup(adamw).ok());
    ASSERT_TRUE(opt->AddParamGroup(lion).ok());
  }
  auto piped = PipelinedOptimizer::Create(piped_opt->get(), *store, options);
  ASSERT_TRUE(piped.ok()) << piped.status();
  ASSERT_EQ((*piped)->chunk_elements(), kChunk);

  // Shard sizes: several chunks with a short tail, and a shard smaller than one chunk.
  const std::vector<size_t> sizes = {3 * kChunk + 1000, kChunk / 2 + 3};
  const std::vector<int> groups = {0, 1};
  std::vector<Reference> refs;
  std::vector<std::vector<uint16_t>> copies(sizes.size());
  std::vector<std::vector<float>> values(sizes.size());
  std::vector<ArrayWriter> writers(sizes.size());
  std::vector<int> ids;
  for (size_t s = 0; s < sizes.size(); ++s) {
    refs.emplace_back(sizes[s], 17 + s, c.grad_type);
    const int state_count = s == 0 ? 2 : 1;
    copies[s].assign(sizes[s], 0);
    values[s].assign(sizes[s], 0.0f);
    writers[s].copy = &copies[s];
    writers[s].values = &values[s];
    ShardSpec spec;
    spec.name = "layer" + std::to_string(s);
    spec.group = groups[s];
    spec.count = sizes[s];
    spec.grad_type = c.grad_type;
    spec.writer = c.writer ? &writers[s] : nullptr;
    spec.handoff = c.handoff;
    ASSERT_TRUE(ref_opt->get()->InitState(groups[s], refs[s].Span(state_count)).ok());
    Reference& ref = refs[s];
    auto id = (*piped)->AddShard(spec, [&](const ChunkView& chunk) {
      std::memcpy(chunk.params, ref.params.data() + chunk.offset, chunk.count * 4);
      return OkStatus();
    });
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }

  for (int step = 0; step < 3; ++step) {
    for (size_t s = 0; s < sizes.size(); ++s) {
      Reference& ref = refs[s];
      ref.NewGrads(1000 * step + s);
      // Deposit the gradients chunk by chunk into the shard's home.
      ASSERT_TRUE((*piped)
                      ->Visit(
                          ids[s],
                          [&](const ChunkView& chunk) {
                            std::memcpy(chunk.grads,
                                        ref.grads.data() + chunk.offset * ref.grad_size,
                                        chunk.count * ref.grad_size);
                            return OkStatus();
                          },
                          /*write_back=*/true)
                      .ok());
      zinf::StepOptions so;
      so.grad_scale = 0.5f;
      ASSERT_TRUE(ref_opt->get()->Step(groups[s], ref.Span(s == 0 ? 2 : 1), so).ok());
    }
    Status status = (*piped)->Step({}, 0.5f);
    ASSERT_TRUE(status.ok()) << status;
    const PipelinedStepStats& stats = (*piped)->last_step_stats();
    EXPECT_EQ(stats.chunks, 5u);
    if (c.ratio == 1.0) {
      EXPECT_GT(stats.bytes_read, 0u);
    }
    if (c.ratio == 0.0) {
      EXPECT_EQ(stats.bytes_read, 0u);
    }

    for (size_t s = 0; s < sizes.size(); ++s) {
      Reference& ref = refs[s];
      size_t mismatches = 0;
      ASSERT_TRUE(
          (*piped)
              ->Visit(
                  ids[s],
                  [&](const ChunkView& chunk) {
                    const size_t bytes = chunk.count * 4;
                    mismatches += std::memcmp(chunk.params, &ref.params[chunk.offset], bytes) != 0;
                    mismatches += std::memcmp(chunk.state0, &ref.m[chunk.offset], bytes) != 0;
                    if (chunk.state1 != nullptr) {
                      mismatches += std::memcmp(chunk.state1, &ref.v[chunk.offset], bytes) != 0;
                    }
                    return OkStatus();
                  },
                  /*write_back=*/false)
              .ok());
      EXPECT_EQ(mismatches, 0u) << "shard " << s << " step " << step;
      if (c.handoff == ParamHandoff::kCopy) {
        EXPECT_EQ(copies[s], ref.copy) << "shard " << s << " step " << step;
      }
      if (c.writer) {  // the writer heard of every chunk, with the new values
        EXPECT_EQ(std::memcmp(values[s].data(), ref.params.data(), sizes[s] * 4), 0)
            << "shard " << s << " step " << step;
      }
    }
  }
  if (c.handoff == ParamHandoff::kCopy) {
    EXPECT_EQ(writers[0].written, 3u * 4) << "every chunk's copy written, every step";
  }
  // The staging buffers fit the budget they were given.
  EXPECT_LE((*piped)->staging_bytes(), options.host_budget_bytes);
}

INSTANTIATE_TEST_SUITE_P(
    Tiers, PipelinedStepTest,
    ::testing::Values(StepCase{"nvme_copy", 1.0, ParamHandoff::kCopy},
                      StepCase{"host_copy", 0.0, ParamHandoff::kCopy},
                      StepCase{"split_copy", 0.5, ParamHandoff::kCopy},
                      StepCase{"split_new_values", 0.3, ParamHandoff::kNewValues},
                      StepCase{"nvme_no_writer", 1.0, ParamHandoff::kNewValues, false},
                      StepCase{"split_bf16_grads", 0.5, ParamHandoff::kCopy, true,
                               ElementType::kBf16}),
    [](const auto& info) { return info.param.label; });

TEST(PipelinedOptimizerTest, BudgetTooSmallForOneChunkNamesTheMinimum) {
  auto opt = CpuOptimizer::Create();
  ASSERT_TRUE(opt.ok());
  PipelinedOptimizerOptions options = PipeOptions(0.0);
  options.host_budget_bytes = 1 << 20;
  auto store = StepStore("", /*swap=*/false);
  auto piped = PipelinedOptimizer::Create(opt->get(), *store, options);
  ASSERT_FALSE(piped.ok());
  EXPECT_EQ(piped.status().code(), StatusCode::kInvalidArgument);
  const uint64_t minimum = 3 * kChunk * PipelinedOptimizerOptions::kStagingBytesPerElement;
  EXPECT_THAT(piped.status().message(), HasSubstr("host_budget_bytes"));
  EXPECT_THAT(piped.status().message(), HasSubstr("at least " + std::to_string(minimum)));
}

TEST(PipelinedOptimizerTest, LargeBudgetShrinksNothingAndSmallBudgetShrinksTheChunk) {
  auto opt = CpuOptimizer::Create();
  ASSERT_TRUE(opt.ok());
  PipelinedOptimizerOptions options = PipeOptions(0.0);
  options.chunk_elements = 16 * kChunk;
  options.host_budget_bytes =
      3 * 5 * kChunk * PipelinedOptimizerOptions::kStagingBytesPerElement + 100;
  auto store = StepStore("", /*swap=*/false);
  auto piped = PipelinedOptimizer::Create(opt->get(), *store, options);
  ASSERT_TRUE(piped.ok()) << piped.status();
  EXPECT_EQ((*piped)->chunk_elements(), 5 * kChunk);
  EXPECT_LE((*piped)->staging_bytes(), options.host_budget_bytes);
  EXPECT_EQ(store->stats().tiers[int(Tier::kHost)].in_use_bytes, (*piped)->staging_bytes());
}

TEST(PipelinedOptimizerTest, BadInputIsInvalidArgument) {
  auto opt = CpuOptimizer::Create();
  ASSERT_TRUE(opt.ok());
  auto store = StepStore("", /*swap=*/false);
  PipelinedOptimizerOptions options = PipeOptions(0.5);
  EXPECT_THAT(PipelinedOptimizer::Create(opt->get(), *store, options).status().message(),
              HasSubstr("no NVMe tier"));
  options = PipeOptions(1.5);
  EXPECT_THAT(PipelinedOptimizer::Create(opt->get(), *store, options).status().message(),
              HasSubstr("nvme_ratio"));
  options = PipeOptions(0.0);
  auto piped = PipelinedOptimizer::Create(opt->get(), *store, options);
  ASSERT_TRUE(piped.ok());
  ShardSpec spec;
  spec.count = 10;
  spec.group = 7;
  EXPECT_FALSE((*piped)->AddShard(spec).ok());  // no such group
  ASSERT_TRUE(opt->get()->AddParamGroup({}).ok());
  spec.group = 0;
  spec.handoff = ParamHandoff::kCopy;
  EXPECT_THAT((*piped)->AddShard(spec).status().message(), HasSubstr("writer"));
  spec.handoff = ParamHandoff::kInPlace;
  EXPECT_THAT((*piped)->AddShard(spec).status().message(), HasSubstr("writer"));
  ArrayWriter writer;
  spec.writer = &writer;
  spec.handoff = ParamHandoff::kCopy;
  spec.param_copy_type = ElementType::kFp32;
  EXPECT_THAT((*piped)->AddShard(spec).status().message(), HasSubstr("param_copy_type"));
  EXPECT_EQ((*piped)->Step({3}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*piped)
                ->Visit(
                    99, [](const ChunkView&) { return OkStatus(); }, false)
                .code(),
            StatusCode::kInvalidArgument);
}

// A writer that implements only Updated refuses what it was not made for: a shard that asks it
// for copy targets fails its step, naming the chunk, and one that has it keep the parameters
// fails its visits.
TEST(PipelinedOptimizerTest, AWriterRefusesWhatItDoesNotImplement) {
  Piped f(0.5);
  struct OnlyUpdated : ParamWriter {
    Status Updated(const ChunkView&) override { return OkStatus(); }
  } writer;
  ShardSpec spec;
  spec.name = "copy";
  spec.count = kChunk;
  spec.writer = &writer;
  spec.handoff = ParamHandoff::kCopy;
  auto copy = f.piped->AddShard(spec);
  ASSERT_TRUE(copy.ok()) << copy.status();
  Status stepped = f.piped->Step({*copy});
  EXPECT_EQ(stepped.code(), StatusCode::kFailedPrecondition) << stepped;
  EXPECT_THAT(stepped.message(), HasSubstr("shard 'copy'"));
  spec.name = "in place";
  spec.handoff = ParamHandoff::kInPlace;
  auto in_place = f.piped->AddShard(spec);
  ASSERT_TRUE(in_place.ok()) << in_place.status();
  EXPECT_EQ(f.piped
                ->Visit(
                    *in_place, [](const ChunkView&) { return OkStatus(); }, false)
                .code(),
            StatusCode::kFailedPrecondition);
}

// The step's staging buffers and host chunks are tensors of the store's host tier and its NVMe
// chunks tensors homed on NVMe: each counted in that tier, all of it given back with the
// optimizer, and the step bitwise the in-memory one.
TEST(PipelinedOptimizerTest, AsATieredStoresClientItsBytesCountInTheStoresTiers) {
  ScratchDir dir;
  TieredStoreOptions so;
  so.device = "";
  so.host_budget_bytes = 16 << 20;
  so.pin_host = false;
  so.nvme_paths = {dir.path()};
  so.nvme_capacity_bytes = 32 << 20;
  auto store = TieredStore::Create(so);
  ASSERT_TRUE(store.ok()) << store.status();
  auto opt = CpuOptimizer::Create();
  auto ref_opt = CpuOptimizer::Create();  // steps the same shard in memory
  ASSERT_TRUE(opt.ok() && ref_opt.ok());
  ASSERT_TRUE((*opt)->AddParamGroup({}).ok());
  ASSERT_TRUE((*ref_opt)->AddParamGroup({}).ok());
  auto tier_bytes = [&](Tier t) { return (*store)->stats().tiers[int(t)].in_use_bytes; };
  {
    auto piped = PipelinedOptimizer::Create(opt->get(), **store, PipeOptions(0.5));
    ASSERT_TRUE(piped.ok()) << piped.status();
    const uint64_t staging = (*piped)->staging_bytes();
    EXPECT_EQ(tier_bytes(Tier::kHost), staging);
    EXPECT_EQ(tier_bytes(Tier::kNvme), 0u);

    const size_t n = 4 * kChunk;  // two chunks in host memory, two on NVMe
    Reference ref(n, 7, ElementType::kFp32);
    auto shard = (*piped)->AddShard({.name = "s", .count = n}, [&](const ChunkView& c) {
      std::memcpy(c.params, ref.params.data() + c.offset, c.count * 4);
      return OkStatus();
    });
    ASSERT_TRUE(shard.ok()) << shard.status();
    EXPECT_EQ(tier_bytes(Tier::kHost), staging + 2 * PipelinedOptimizer::ChunkBytes(kChunk, 2));
    EXPECT_GE(tier_bytes(Tier::kNvme), 2 * kChunk * (12 + 4));  // state and gradients

    ASSERT_TRUE((*ref_opt)->InitState(0, ref.Span(2)).ok());
    ASSERT_TRUE((*ref_opt)->BeginStep(0).ok());
    ref.NewGrads(11);
    ASSERT_TRUE((*ref_opt)->Update(0, ref.Span(2)).ok());
    ASSERT_TRUE((*piped)
                    ->Visit(
                        *shard,
                        [&](const ChunkView& c) {
                          std::memcpy(c.grads, ref.grads.data() + c.offset * 4, c.count * 4);
                          return OkStatus();
                        },
                        /*write_back=*/true)
                    .ok());
    ASSERT_TRUE((*piped)->Step().ok());
    const std::vector<float> params = ParamsOf(**piped, *shard, n);
    EXPECT_EQ(std::memcmp(params.data(), ref.params.data(), n * 4), 0);
  }
  EXPECT_EQ(tier_bytes(Tier::kHost), 0u);
  EXPECT_EQ(tier_bytes(Tier::kNvme), 0u);

  // A host tier without room for the staging buffers, and a store without an NVMe tier.
  so.host_budget_bytes = 1 << 20;
  auto small = TieredStore::Create(so);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(PipelinedOptimizer::Create(opt->get(), **small, PipeOptions(0.5)).status().code(),
            StatusCode::kResourceExhausted);
  so.host_budget_bytes = 16 << 20;
  so.nvme_paths.clear();
  so.nvme_capacity_bytes = 0;
  auto host_only = TieredStore::Create(so);
  ASSERT_TRUE(host_only.ok()) << host_only.status();
  EXPECT_THAT(PipelinedOptimizer::Create(opt->get(), **host_only, PipeOptions(0.5)).status(),
              ::testing::Property(&Status::message, HasSubstr("no NVMe tier")));
  EXPECT_TRUE(PipelinedOptimizer::Create(opt->get(), **host_only, PipeOptions(0.0)).ok());
}

// Three ways to give the step its gradients (a visit, WriteChunkGradientsAsync chunk by chunk
// as the engine's gradients on NVMe do, a host array through ShardSpec::host_grads) give
// bitwise the same parameters.
TEST(PipelinedOptimizerTest, ChunkGradientsHostGradientsAndVisitsMatch) {
  Piped f(0.5);
  auto* opt = &f.opt;
  auto* piped = &f.piped;
  const size_t n = 3 * kChunk + 100;  // NVMe and host chunks, and a short last one
  const SineShard data(n);
  const std::vector<float>& init = data.init;
  std::vector<float> grads = data.grads;
  const ChunkVisitor fill = data.Fill();
  ShardSpec spec;
  spec.count = n;
  spec.name = "visited";
  auto a = (*piped)->AddShard(spec, fill);
  spec.name = "direct";
  auto b = (*piped)->AddShard(spec, fill);
  spec.name = "host gradients";
  spec.group = 1;  // stepped on its own: a group of its own keeps the same step count
  spec.host_grads = grads.data();
  ASSERT_TRUE((*opt)->AddParamGroup({}).ok());
  auto h = (*piped)->AddShard(spec, fill);
  ASSERT_TRUE(a.ok() && b.ok() && h.ok());
  auto chunks = (*piped)->Chunks(*b);
  ASSERT_TRUE(chunks.ok());
  auto buffer = HostBuffer::Allocate(PipelinedOptimizer::GradientBufferBytes(kChunk));
  ASSERT_TRUE(buffer.ok());
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE((*piped)
                    ->Visit(
                        *a,
                        [&](const ChunkView& c) {
                          std::memcpy(c.grads, grads.data() + c.offset, c.count * 4);
                          return OkStatus();
                        },
                        /*write_back=*/true)
                    .ok());
    for (size_t c = 0; c < chunks->size(); ++c) {
      const ChunkInfo& chunk = (*chunks)[c];
      std::memcpy(buffer->data(), grads.data() + chunk.offset, chunk.count * 4);
      IoWaiter done;
      done.Add(1);
      (*piped)->WriteChunkGradientsAsync(*b, c, buffer->data(), done.Callback());
      ASSERT_TRUE(done.Wait().ok());
    }
    ASSERT_TRUE((*piped)->Step({*a, *b}).ok());
    const uint64_t with_extents = (*piped)->last_step_stats().bytes_read;
    ASSERT_TRUE((*piped)->Step({*h}).ok());
    EXPECT_LT((*piped)->last_step_stats().bytes_read, with_extents / 2)
        << "host gradients are not read from NVMe";
  }
  const std::vector<float> via_visit = ParamsOf(**piped, *a, n);
  EXPECT_NE(via_visit, init) << "the steps must have changed the parameters";
  EXPECT_EQ(std::memcmp(via_visit.data(), ParamsOf(**piped, *b, n).data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(via_visit.data(), ParamsOf(**piped, *h, n).data(), n * 4), 0);
  // A visit of the host-gradient shard shows the caller's array as its gradients.
  ASSERT_TRUE((*piped)
                  ->Visit(
                      *h,
                      [&](const ChunkView& c) {
                        EXPECT_EQ(c.grads, grads.data() + c.offset);
                        return OkStatus();
                      },
                      /*write_back=*/false)
                  .ok());
}

// Note [Speculative step]: chunks stepped out of order and speculatively, then kept, give the
// bits of the whole step; dropped, the old state comes back, to be stepped again with another
// scale (clipping found late) or left alone (a skipped step).
TEST(PipelinedOptimizerTest, SpeculativeChunksKeptOrDroppedMatchTheWholeStep) {
  Piped f(1.0, /*groups=*/2);
  auto* piped = &f.piped;
  auto* opt = &f.opt;
  const size_t n = 4 * kChunk + 300;
  const SineShard data(n);
  const std::vector<float>& init = data.init;
  std::vector<float> grads = data.grads;
  const ChunkVisitor fill = data.Fill();
  // The parts' writer records the parameters it is handed.
  std::vector<float> seen(n);
  ArrayWriter writer;
  writer.values = &seen;
  ShardSpec spec;
  spec.count = n;
  spec.host_grads = grads.data();
  spec.name = "whole";
  auto whole = (*piped)->AddShard(spec, fill);
  spec.name = "parts";
  spec.group = 1;
  spec.writer = &writer;
  auto parts = (*piped)->AddShard(spec, fill);
  ASSERT_TRUE(whole.ok() && parts.ok());
  auto read = [&](int shard) { return ParamsOf(**piped, shard, n); };
  auto chunks = (*piped)->Chunks(*parts);
  ASSERT_TRUE(chunks.ok());
  ASSERT_EQ(chunks->size(), 5u);
  auto record = [&](const ChunkView& c) { return writer.Updated(c); };

  // Step 1: speculated last-to-first in two parts, kept.
  ASSERT_TRUE((*piped)->Step({*whole}, 0.5f).ok());
  ASSERT_TRUE((*piped)->BeginPartialStep(*parts).ok());
  ASSERT_TRUE((*piped)->StepChunks(*parts, {4, 3}, 0.5f, true).ok());
  ASSERT_TRUE((*piped)->StepChunks(*parts, {2, 1, 0}, 0.5f, true).ok());
  EXPECT_EQ((*piped)->StepChunks(*parts, {1}, 0.5f, true).code(), StatusCode::kInvalidArgument)
      << "a chunk speculated twice would lose its old state";
  auto kept = (*piped)->ResolveSpeculation(*parts, /*commit=*/true);
  ASSERT_TRUE(kept.ok());
  EXPECT_TRUE(kept->empty());
  const std::vector<float> after1 = read(*whole);
  EXPECT_NE(after1, init);
  EXPECT_EQ(std::memcmp(read(*parts).data(), after1.data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(seen.data(), after1.data(), n * 4), 0) << "the writer saw new values";
  EXPECT_EQ(writer.restarts, 0u) << "a kept speculation restarts nothing";

  // Step 2: speculated at 0.5, found to need 0.25: dropped and stepped again.
  ASSERT_TRUE((*piped)->Step({*whole}, 0.25f).ok());
  ASSERT_TRUE((*piped)->BeginPartialStep(*parts).ok());
  ASSERT_TRUE((*piped)->StepChunks(*parts, {3, 4}, 0.5f, true).ok());
  auto undone = (*piped)->ResolveSpeculation(*parts, /*commit=*/false);
  ASSERT_TRUE(undone.ok());
  EXPECT_EQ(*undone, (std::vector<size_t>{3, 4}));
  EXPECT_EQ(writer.restarts, 1u) << "the writer hears that the speculation is dropped";
  EXPECT_EQ(std::memcmp(read(*parts).data(), after1.data(), n * 4), 0) << "old state back";
  ASSERT_TRUE((*piped)->StepChunks(*parts, {0, 1, 2, 3, 4}, 0.25f, false).ok());
  const std::vector<float> after2 = read(*whole);
  EXPECT_EQ(std::memcmp(read(*parts).data(), after2.data(), n * 4), 0);

  // Step 3: speculated, then skipped (overflow): the state and the step count as before.
  auto before = (*opt)->group(1);
  ASSERT_TRUE((*piped)->BeginPartialStep(*parts).ok());
  ASSERT_TRUE((*piped)->StepChunks(*parts, {0, 2, 4}, 0.5f, true).ok());
  ASSERT_TRUE((*piped)->ResolveSpeculation(*parts, false).ok());
  ASSERT_TRUE((*opt)->SetStep(1, before->step).ok());
  ASSERT_TRUE((*piped)->VisitChunks(*parts, {0, 2, 4}, record).ok());
  EXPECT_EQ(std::memcmp(read(*parts).data(), after2.data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(seen.data(), after2.data(), kChunk * 4), 0);
  // And the next step matches the reference's next one.
  ASSERT_TRUE((*piped)->Step({*whole}, 1.0f).ok());
  ASSERT_TRUE((*piped)->Step({*parts}, 1.0f).ok());
  EXPECT_EQ(std::memcmp(read(*parts).data(), read(*whole).data(), n * 4), 0);
  EXPECT_EQ((*piped)->StepChunks(*parts, {9}, 1.0f, false).code(), StatusCode::kInvalidArgument);
}

TEST(PipelinedOptimizerTest, ChunkGradientsRoundTripAndBadInput) {
  Piped f(0.5);
  auto* piped = &f.piped;
  ShardSpec spec;
  spec.name = "grads";
  spec.count = 2 * kChunk + 10;  // an NVMe chunk, a host chunk, and a short one
  auto id = (*piped)->AddShard(spec);
  ASSERT_TRUE(id.ok());
  const uint64_t bytes = PipelinedOptimizer::GradientBufferBytes(kChunk);
  auto g = HostBuffer::Allocate(bytes);
  auto back = HostBuffer::Allocate(bytes);
  ASSERT_TRUE(g.ok() && back.ok());
  float* gf = static_cast<float*>(g->data());
  float* bf = static_cast<float*>(back->data());
  for (size_t c = 0; c < 3; ++c) {
    const size_t n = c < 2 ? kChunk : 10;
    for (size_t i = 0; i < n; ++i) gf[i] = 0.5f * i + c;
    IoWaiter done;
    done.Add(1);
    (*piped)->WriteChunkGradientsAsync(*id, c, g->data(), done.Callback());
    ASSERT_TRUE(done.Wait().ok());
  }
  for (size_t c = 0; c < 3; ++c) {
    const size_t n = c < 2 ? kChunk : 10;
    ASSERT_TRUE((*piped)->ReadChunkGradients(*id, c, back->data()).ok());
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(bf[i], 0.5f * i + c) << c << " " << i;
  }
  IoWaiter refused;
  refused.Add(1);
  (*piped)->WriteChunkGradientsAsync(*id, 3, g->data(), refused.Callback());
  EXPECT_EQ(refused.Wait().code(), StatusCode::kInvalidArgument) << "no chunk 3";
  EXPECT_EQ((*piped)->ReadChunkGradients(*id, 0, nullptr).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*piped)->ReadChunkGradients(*id, 0, bf + 1).code(), StatusCode::kInvalidArgument)
      << "not page-aligned";
  EXPECT_EQ((*piped)->ReadChunkGradients(7, 0, back->data()).code(), StatusCode::kInvalidArgument);
}

TEST(PipelinedOptimizerTest, SpeculationRefusesHostChunks) {
  Piped f(0.5);
  auto* piped = &f.piped;
  ShardSpec spec;
  spec.name = "split";
  spec.count = 2 * kChunk;
  auto id = (*piped)->AddShard(spec);
  ASSERT_TRUE(id.ok());
  auto chunks = (*piped)->Chunks(*id);
  ASSERT_TRUE(chunks.ok());
  const size_t host = (*chunks)[0].on_nvme ? 1 : 0;
  ASSERT_TRUE((*piped)->BeginPartialStep(*id).ok());
  Status refused = (*piped)->StepChunks(*id, {host}, 1.0f, true);
  EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("host memory"));
  EXPECT_TRUE((*piped)->StepChunks(*id, {1 - host}, 1.0f, true).ok());
  EXPECT_TRUE((*piped)->ResolveSpeculation(*id, true).ok());
}

// ParamHandoff::kCopy: the update writes each chunk's bf16 copy where the writer's targets
// say, stretch by stretch (here two per chunk into an array of the writer's, and a gap with no
// target), the writer hears that it did, and the parameters are the bits of a step without a
// copy; a shard without a writer is refused.
TEST(PipelinedOptimizerTest, CopyTargetsGetTheUpdatedParameters) {
  Piped f(1.0, /*groups=*/2);
  const size_t n = 2 * kChunk + 300;
  const SineShard data(n);
  std::vector<float> grads = data.grads;
  std::vector<uint16_t> copy(n, 0xFFFF);
  const size_t gap = 17;  // elements [c.offset, c.offset + gap) of each chunk get no target
  ArrayWriter writer;
  writer.copy = &copy;
  writer.gap = gap;
  ShardSpec plain;
  plain.name = "plain";
  plain.count = n;
  plain.host_grads = grads.data();
  ShardSpec fused = plain;
  fused.name = "fused";
  fused.group = 1;
  fused.writer = &writer;
  fused.handoff = ParamHandoff::kCopy;
  fused.param_copy_type = ElementType::kBf16;
  auto a = f.piped->AddShard(plain, data.Fill());
  auto b = f.piped->AddShard(fused, data.Fill());
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  ASSERT_TRUE(f.piped->Step({*a}).ok());
  ASSERT_TRUE(f.piped->Step({*b}).ok());
  EXPECT_EQ(writer.written, 3u) << "the writer hears of every chunk's copy";
  const std::vector<float> pa = ParamsOf(*f.piped, *a, n);
  const std::vector<float> pb = ParamsOf(*f.piped, *b, n);
  EXPECT_EQ(std::memcmp(pa.data(), pb.data(), n * 4), 0);
  std::vector<uint16_t> expected(n);
  ConvertFromFp32(pb.data(), ElementType::kBf16, expected.data(), n);
  for (size_t i = 0; i < n; ++i) {
    const bool targeted = i % kChunk >= gap;
    ASSERT_EQ(copy[i], targeted ? expected[i] : 0xFFFF) << "element " << i;
  }
  ShardSpec missing = fused;
  missing.writer = nullptr;
  EXPECT_EQ(f.piped->AddShard(missing).status().code(), StatusCode::kInvalidArgument);
}

// Note [Parameters kept by the caller]: a shard whose fp32 parameters live in the caller's
// memory steps them in place, stretch by stretch, to the bits of a shard that keeps them in
// its chunks, while moving two thirds of the chunk bytes; visits go through the writer's Read
// and Store; a dropped speculation puts the old parameters back.
TEST(PipelinedOptimizerTest, ParametersKeptByTheCallerStepInPlaceWithTwoThirdsTheBytes) {
  Piped f(1.0, /*groups=*/2);
  const size_t n = 3 * kChunk + 300;
  const SineShard data(n);
  std::vector<float> grads = data.grads;
  std::vector<float> kept = data.init;  // the caller's parameters
  ShardSpec plain;
  plain.name = "plain";
  plain.count = n;
  plain.host_grads = grads.data();
  // The caller's writer: the first elements of the shard are padding (no target), the rest of
  // each chunk two stretches of `kept`.
  const size_t gap = 5;
  struct KeptParams : ParamWriter {
    std::vector<float>* kept = nullptr;
    size_t gap = 0;
    size_t prefetched = 0;
    StatusOr<std::vector<CopyTarget>> Targets(const ChunkView& c) override {
      const uint64_t skip = c.offset == 0 ? gap : 0;
      const uint64_t half = (c.count - skip) / 2;
      std::vector<CopyTarget> t;
      if (skip > 0) t.push_back({0, skip, nullptr});
      t.push_back({skip, half, kept->data() + c.offset + skip});
      t.push_back({skip + half, c.count - skip - half, kept->data() + c.offset + skip + half});
      return t;
    }
    void Prefetch(const ChunkInfo&) override { ++prefetched; }
    Status Read(const ChunkView& c) override {
      std::memcpy(c.params, kept->data() + c.offset, c.count * 4);
      return OkStatus();
    }
    Status Store(const ChunkView& c) override {
      std::memcpy(kept->data() + c.offset, c.params, c.count * 4);
      return OkStatus();
    }
    Status Updated(const ChunkView& c) override {
      EXPECT_TRUE(c.params_in_place);
      return OkStatus();
    }
  } writer;
  writer.kept = &kept;
  writer.gap = gap;
  ShardSpec outside = plain;
  outside.name = "outside";
  outside.group = 1;
  outside.writer = &writer;
  outside.handoff = ParamHandoff::kInPlace;
  for (size_t i = 0; i < gap; ++i) kept[i] = 0;  // padding holds zeros, as the engine's does
  std::vector<float> init = data.init;
  for (size_t i = 0; i < gap; ++i) init[i] = 0;
  auto fill = [&](const ChunkView& c) {
    std::memcpy(c.params, init.data() + c.offset, c.count * 4);
    return OkStatus();
  };
  auto a = f.piped->AddShard(plain, fill);
  auto b = f.piped->AddShard(outside, fill);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  auto params_of = [&](int shard) { return ParamsOf(*f.piped, shard, n); };
  auto state_of = [&](int shard) {
    std::vector<float> m(n), v(n);
    EXPECT_TRUE(f.piped
                    ->Visit(
                        shard,
                        [&](const ChunkView& c) {
                          std::memcpy(m.data() + c.offset, c.state0, c.count * 4);
                          std::memcpy(v.data() + c.offset, c.state1, c.count * 4);
                          return OkStatus();
                        },
                        /*write_back=*/false)
                    .ok());
    m.insert(m.end(), v.begin(), v.end());
    return m;
  };
  auto same = [&](const std::vector<float>& x, const std::vector<float>& y) {
    // The padding's parameters are the caller's zeros; the plain shard's move.
    return std::memcmp(x.data() + gap, y.data() + gap, (n - gap) * 4) == 0;
  };

  ASSERT_TRUE(f.piped->Step({*a}, 0.5f).ok());
  const uint64_t plain_bytes = f.piped->last_step_stats().bytes_written;
  ASSERT_TRUE(f.piped->Step({*b}, 0.5f).ok());
  EXPECT_EQ(writer.prefetched, 4u) << "one prefetch per chunk";
  for (size_t i = 0; i < gap; ++i) EXPECT_EQ(kept[i], 0.0f) << "padding has no target";
  EXPECT_EQ(f.piped->last_step_stats().bytes_written * 3, plain_bytes * 2)
      << "the chunks hold the two state arrays, not the parameters";
  EXPECT_EQ(f.piped->last_step_stats().bytes_read, f.piped->last_step_stats().bytes_written);
  EXPECT_NE(kept, data.init);
  EXPECT_TRUE(same(kept, params_of(*a))) << "stepped in place, bitwise";
  EXPECT_TRUE(same(params_of(*b), kept)) << "a visit reads the caller's";
  EXPECT_EQ(state_of(*a), state_of(*b));

  // Speculated at 0.5, dropped: the caller's parameters are the old ones again; then stepped
  // at 0.25 to the plain shard's bits.
  const std::vector<float> before = kept;
  ASSERT_TRUE(f.piped->Step({*a}, 0.25f).ok());
  ASSERT_TRUE(f.piped->BeginPartialStep(*b).ok());
  ASSERT_TRUE(f.piped->StepChunks(*b, {3, 1}, 0.5f, /*speculative=*/true).ok());
  EXPECT_NE(kept, before);
  auto undone = f.piped->ResolveSpeculation(*b, /*commit=*/false);
  ASSERT_TRUE(undone.ok()) << undone.status();
  EXPECT_EQ(*undone, (std::vector<size_t>{1, 3}));
  EXPECT_EQ(kept, before) << "the old parameters written back";
  ASSERT_TRUE(f.piped->StepChunks(*b, {0, 1, 2, 3}, 0.25f, false).ok());
  EXPECT_TRUE(same(kept, params_of(*a)));
  EXPECT_EQ(state_of(*a), state_of(*b));

  // Speculated and kept.
  ASSERT_TRUE(f.piped->Step({*a}, 1.0f).ok());
  ASSERT_TRUE(f.piped->BeginPartialStep(*b).ok());
  ASSERT_TRUE(f.piped->StepChunks(*b, {2, 0, 1, 3}, 1.0f, /*speculative=*/true).ok());
  ASSERT_TRUE(f.piped->ResolveSpeculation(*b, /*commit=*/true).ok());
  EXPECT_TRUE(same(kept, params_of(*a)));
  EXPECT_EQ(state_of(*a), state_of(*b));

  // A visit that writes back stores the parameters through the caller's write.
  ASSERT_TRUE(f.piped
                  ->Visit(
                      *b,
                      [](const ChunkView& c) {
                        c.params[0] = 42.0f;
                        return OkStatus();
                      },
                      /*write_back=*/true)
                  .ok());
  EXPECT_EQ(kept[kChunk], 42.0f);
  EXPECT_EQ(kept[3 * kChunk], 42.0f);

  ShardSpec no_writer = outside;
  no_writer.writer = nullptr;
  EXPECT_EQ(f.piped->AddShard(no_writer).status().code(), StatusCode::kInvalidArgument);
}

// NVMe failures during the step surface with the shard and chunk named; a failed write stays
// sticky in the store.
struct FaultyFixture {
  ScratchDir dir;
  FaultyEngine* faulty = nullptr;
  std::unique_ptr<TieredStore> store;
  std::unique_ptr<CpuOptimizer> opt;
  std::unique_ptr<PipelinedOptimizer> piped;
  int shard = -1;

  void SetUp() {
    internal::SetTieredStoreEngineFactoryForTest(
        [this](const AioOptions& aio) -> StatusOr<std::unique_ptr<IoEngine>> {
          ZINF_ASSIGN_OR_RETURN(std::unique_ptr<IoEngine> base, CreateIoEngine(aio));
          auto wrapper = std::make_unique<FaultyEngine>(std::move(base));
          faulty = wrapper.get();
          return std::unique_ptr<IoEngine>(std::move(wrapper));
        });
    store = StepStore(dir.path());
    internal::SetTieredStoreEngineFactoryForTest(nullptr);
    ASSERT_NE(store, nullptr);
    ASSERT_NE(faulty, nullptr);
    auto o = CpuOptimizer::Create();
    ASSERT_TRUE(o.ok());
    opt = std::move(*o);
    ASSERT_TRUE(opt->AddParamGroup({}).ok());
    auto p = PipelinedOptimizer::Create(opt.get(), *store, PipeOptions(1.0));
    ASSERT_TRUE(p.ok()) << p.status();
    piped = std::move(*p);
    ShardSpec spec;
    spec.name = "wte";
    spec.count = 4 * kChunk;
    auto id = piped->AddShard(spec);
    ASSERT_TRUE(id.ok()) << id.status();
    shard = *id;
  }
};

TEST(PipelinedOptimizerFaults, WriteErrorSurfacesNamingShardAndIsSticky) {
  FaultyFixture f;
  ASSERT_NO_FATAL_FAILURE(f.SetUp());
  f.faulty->Arm(IoOp::kWrite, 1, Fault::kEio);
  Status status = f.piped->Step();
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), StatusCode::kIoError) << status;
  EXPECT_THAT(status.message(), HasSubstr("pipelined optimizer step"));
  EXPECT_THAT(status.message(), HasSubstr("wte"));
  EXPECT_FALSE(f.piped->Step().ok());  // the swap files' sticky error
}

TEST(PipelinedOptimizerFaults, ReadErrorAndCorruptReadSurface) {
  FaultyFixture f;
  ASSERT_NO_FATAL_FAILURE(f.SetUp());
  f.faulty->Arm(IoOp::kRead, 2, Fault::kEio);
  Status status = f.piped->Step();
  EXPECT_EQ(status.code(), StatusCode::kIoError) << status;
  EXPECT_THAT(status.message(), HasSubstr("wte"));
  f.faulty->Arm(IoOp::kRead, 0, Fault::kCorruptRead);
  status = f.piped->Step();
  EXPECT_EQ(status.code(), StatusCode::kDataLoss) << status;
  // Nothing was written wrongly: the next step works.
  EXPECT_TRUE(f.piped->Step().ok());
}

}  // namespace
}  // namespace zinf
