// Micro-benchmarks of the CPU optimizer step and of the bandwidth limit it is held to, per
// kernel ISA, for shards that fit in cache (1M params: the kernels' compute speed) and shards
// that do not (32M: memory bandwidth). Bytes are what the step moves (fp32 AdamW: 28 per
// param; +2 with a bf16 copy). The figures reported in RESULTS.md come from `zinf bench adam`,
// which interleaves step and limit; these are for quick A/B of kernel changes. BM_Accumulate:
// the gradient accumulation's pace on one thread and on the optimizer's threads.
#include <benchmark/benchmark.h>

#include <memory>
#include <vector>

#include "cpu_optim/dispatch.h"
#include "cpu_optim/kernels.h"
#include "cpu_optim/parallel.h"
#include "zinf/cpu_optimizer.h"
#include "zinf/host_memory.h"

namespace {

using zinf::CpuKernelIsa;

struct Shard {
  explicit Shard(size_t n) : n(n) {
    zinf::HostAllocOptions options;
    options.alignment = 2 << 20;
    p = std::move(zinf::HostBuffer::Allocate(n * 4, options)).value();
    g = std::move(zinf::HostBuffer::Allocate(n * 4, options)).value();
    m = std::move(zinf::HostBuffer::Allocate(n * 4, options)).value();
    v = std::move(zinf::HostBuffer::Allocate(n * 4, options)).value();
    c = std::move(zinf::HostBuffer::Allocate(n * 2, options)).value();
    for (size_t i = 0; i < n; ++i) {
      p.as<float>()[i] = 0.5f;
      g.as<float>()[i] = 1e-3f;
      m.as<float>()[i] = 0.0f;
      v.as<float>()[i] = 0.0f;
      c.as<uint16_t>()[i] = 0;
    }
  }
  zinf::OptimizerSpan Span(bool copy) const {
    zinf::OptimizerSpan s;
    s.params = p.as<float>();
    s.grads = g.data();
    s.state0 = m.as<float>();
    s.state1 = v.as<float>();
    s.param_copy = copy ? c.data() : nullptr;
    s.count = n;
    return s;
  }
  size_t n;
  zinf::HostBuffer p, g, m, v, c;
};

// Args: {isa, params, threads, bf16 copy}.
void BM_AdamWStep(benchmark::State& state) {
  const auto isa = static_cast<CpuKernelIsa>(state.range(0));
  if (!zinf::cpu_optim::IsaSupported(isa)) {
    state.SkipWithError("ISA not supported on this CPU");
    return;
  }
  const size_t n = static_cast<size_t>(state.range(1));
  zinf::CpuOptimizerOptions options;
  options.isa = isa;
  options.threads = static_cast<int>(state.range(2));
  auto opt = std::move(zinf::CpuOptimizer::Create(options)).value();
  const int group = *opt->AddParamGroup(zinf::OptimizerHyperParams());
  Shard shard(n);
  const bool copy = state.range(3) != 0;
  const zinf::OptimizerSpan span = shard.Span(copy);
  for (auto _ : state) {
    (void)opt->BeginStep(group);
    zinf::Status s = opt->Update(group, span, 1.0f);
    if (!s.ok()) state.SkipWithError(s.ToString().c_str());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * n));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * (copy ? 30 : 28)));
}

// The in-place limit kernel on the same bytes (non-temporal stores with prefetch).
void BM_Limit(benchmark::State& state) {
  const auto isa = static_cast<CpuKernelIsa>(state.range(0));
  if (!zinf::cpu_optim::IsaSupported(isa)) {
    state.SkipWithError("ISA not supported on this CPU");
    return;
  }
  const size_t n = static_cast<size_t>(state.range(1));
  auto par = std::move(zinf::cpu_optim::Parallel::Create(static_cast<int>(state.range(2)))).value();
  Shard shard(n);
  const bool copy = state.range(3) != 0;
  const zinf::cpu_optim::KernelTable& k = zinf::cpu_optim::KernelsFor(isa);
  for (auto _ : state) {
    (void)par->For(n, [&](size_t begin, size_t end) {
      zinf::cpu_optim::StepArrays a;
      a.params = shard.p.as<float>() + begin;
      a.grads = shard.g.as<float>() + begin;
      a.state0 = shard.m.as<float>() + begin;
      a.state1 = shard.v.as<float>() + begin;
      a.copy = copy ? shard.c.as<uint16_t>() + begin : nullptr;
      a.count = end - begin;
      k.limit(a, n >= (1u << 22), 1024);
    });
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * n));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * (copy ? 30 : 28)));
}

void Args(benchmark::internal::Benchmark* b) {
  for (int isa : {static_cast<int>(CpuKernelIsa::kScalar), static_cast<int>(CpuKernelIsa::kAvx2),
                  static_cast<int>(CpuKernelIsa::kAvx512)}) {
    for (int64_t n : {int64_t{1} << 20, int64_t{32} << 20}) {
      if (isa == static_cast<int>(CpuKernelIsa::kScalar) && n > (1 << 20)) continue;
      for (int copy : {0, 1}) b->Args({isa, n, 2, copy});
    }
  }
  b->ArgNames({"isa", "params", "threads", "bf16copy"})
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
}

// A reduced gradient added into its accumulator (OptimizerStep::Add): CpuOptimizer::Accumulate
// on `threads` of the optimizer's threads, 12 bytes a param (read both, write one). Against
// threads 1, what adding on the engine's thread alone gave.
void BM_Accumulate(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  zinf::CpuOptimizerOptions options;
  options.threads = static_cast<int>(state.range(1));
  auto opt = std::move(zinf::CpuOptimizer::Create(options)).value();
  Shard shard(n);
  for (auto _ : state) {
    (void)opt->Accumulate(shard.m.as<float>(), shard.g.as<float>(), n);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * n));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * n * 12));
}

BENCHMARK(BM_AdamWStep)->Apply(Args);
BENCHMARK(BM_Limit)->Apply(Args);
BENCHMARK(BM_Accumulate)
    ->Args({int64_t{64} << 20, 1})
    ->Args({int64_t{64} << 20, 2})
    ->ArgNames({"params", "threads"})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
