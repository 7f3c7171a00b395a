// `zinf bench adam`: the CPU optimizer step against this machine's memory bandwidth, measured
// in the same run over the same arrays.
//
// The limit is an in-place read-modify-write kernel that touches exactly the bytes the step
// touches (fp32 AdamW: reads p, g, m, v and writes p, m, v = 28 bytes per parameter; +2 for a
// bf16/fp16 copy written out) with one add per element, split across the same threads in the
// same chunks. It runs in several variants (cached or non-temporal stores, with or without
// software prefetch) and the fastest variant's median is the limit, so the efficiency is
// against the best this machine did with those bytes, not against a strawman. Steps and limit
// variants are interleaved (step, limits, step, limits, ...) because the machine's bandwidth
// drifts; the medians are reported. With --store auto the step's warm-up lets the optimizer
// pick its store mode and whether to prefetch, among the same four variants (Note [Store mode
// tuning]); the mode it settled on is printed.
//
// By default it measures two sizes, 1M parameters (in cache: the size of an NVMe pipeline
// chunk, where the kernel's arithmetic shows) and 64M (in memory), each on an idle machine and
// on a loaded one: --load N runs N threads of other work (a dependent floating-point chain, no
// memory traffic) beside the step and the limit, as other processes on a shared node would,
// which shows whether one slowed thread holds up the others' chunks (Note [Partitioning]).
//
// Single driver thread; the optimizer's threads do the work.
#include <fmt/core.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/units.h"
#include "cpu_optim/dispatch.h"
#include "cpu_optim/kernels.h"
#include "cpu_optim/parallel.h"
#include "tools/bench_measure.h"
#include "tools/bench_util.h"
#include "tools/commands.h"
#include "tools/plot.h"
#include "zinf/cpu_info.h"
#include "zinf/cpu_optimizer.h"
#include "zinf/dtype.h"
#include "zinf/host_memory.h"

namespace zinf::tools {
namespace {

struct AdamArgs {
  // Several of each (comma-separated) run every combination, sizes outer.
  // In cache and in memory, idle and with a thread of other work beside the step on every CPU.
  std::vector<std::string> params = {"1M", "64M"};
  std::vector<int> threads = {0};
  std::vector<int> load = {0, GetCpuInfo().usable_cpus};
  std::string dtype = "fp32";
  std::string param_copy = "none";
  std::string optimizer = "adamw";
  std::string isa = "auto";
  std::string store = "auto";
  size_t prefetch_bytes = 1024;
  int reps = 7;
  bool json = false;
  std::string plot;    // PNG file; empty: none
  bool quiet = false;  // print nothing (MeasureAdamRate)
};

// One configuration's figures, for the plot.
struct AdamResult {
  uint64_t params = 0;
  int threads = 0;
  int load = 0;
  double gbps = 0, limit_gbps = 0, params_per_s = 0;
};

template <typename Fn>
StatusOr<double> TimeIt(Fn&& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  ZINF_RETURN_IF_ERROR(fn());
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// `threads` threads spinning on a dependent floating-point chain until destroyed: the cores'
// other work, without memory traffic of its own.
class BusyLoad {
 public:
  explicit BusyLoad(int threads) {
    for (int i = 0; i < threads; ++i) {
      workers_.emplace_back([this] {
        double x = 1.0;
        while (!stop_.load(std::memory_order_relaxed)) {
          for (int k = 0; k < 4096; ++k) x = x * 1.0000001 + 1e-9;
        }
        sink_.store(x, std::memory_order_relaxed);
      });
    }
  }
  ~BusyLoad() { stop_.store(true); }  // the jthreads join after the flag is set

 private:
  std::atomic<bool> stop_{false};
  std::atomic<double> sink_{0};  // keeps the chain from being optimized away
  std::vector<std::jthread> workers_;
};

struct LimitVariant {
  const char* name;
  bool non_temporal;
  bool prefetch;
};
constexpr LimitVariant kLimitVariants[] = {
    {"cached", false, false},
    {"cached+prefetch", false, true},
    {"non_temporal", true, false},
    {"non_temporal+prefetch", true, true},
};

const char* StoreModeName(StoreMode mode) {
  switch (mode) {
    case StoreMode::kAuto:
      return "auto";
    case StoreMode::kCached:
      return "cached";
    case StoreMode::kNonTemporal:
      return "non_temporal";
  }
  return "?";
}

// Measures `count` parameters on `threads` threads (0: all), with `load` threads of other work
// beside them, and prints the result.
StatusOr<AdamResult> MeasureAdam(const AdamArgs& args, uint64_t count, int threads, int load) {
  CpuOptimizerOptions options;
  options.threads = threads;
  options.prefetch_bytes = args.prefetch_bytes;
  options.isa = args.isa == "scalar"   ? CpuKernelIsa::kScalar
                : args.isa == "avx2"   ? CpuKernelIsa::kAvx2
                : args.isa == "avx512" ? CpuKernelIsa::kAvx512
                                       : CpuKernelIsa::kAuto;
  options.store_mode = args.store == "cached"         ? StoreMode::kCached
                       : args.store == "non_temporal" ? StoreMode::kNonTemporal
                                                      : StoreMode::kAuto;
  ZINF_ASSIGN_OR_RETURN(auto opt, CpuOptimizer::Create(options));

  OptimizerHyperParams hp =
      OptimizerHyperParams::Defaults(args.optimizer == "adam"      ? OptimizerType::kAdam
                                     : args.optimizer == "adagrad" ? OptimizerType::kAdagrad
                                     : args.optimizer == "lion"    ? OptimizerType::kLion
                                                                   : OptimizerType::kAdamW);
  ZINF_ASSIGN_OR_RETURN(const int group, opt->AddParamGroup(hp));
  const ElementType grad_type = args.dtype == "bf16-grad" ? ElementType::kBf16 : ElementType::kFp32;
  const bool copy = args.param_copy != "none";
  const ElementType copy_type = args.param_copy == "fp16" ? ElementType::kFp16 : ElementType::kBf16;
  const int states = hp.state_count();
  const uint64_t read_bytes = 4 * (1 + states) + ElementSize(grad_type);
  const uint64_t write_bytes = 4 * (1 + states) + (copy ? 2 : 0);
  const uint64_t bytes_per_param = read_bytes + write_bytes;

  // Arrays: 2 MiB huge pages where the kernel gives them; first touched below by the same
  // thread split that updates them.
  HostAllocOptions alloc;
  alloc.alignment = 2 * kMiB;
  alloc.huge_pages = true;
  ZINF_ASSIGN_OR_RETURN(HostBuffer p, HostBuffer::Allocate(count * 4, alloc));
  ZINF_ASSIGN_OR_RETURN(HostBuffer g, HostBuffer::Allocate(count * ElementSize(grad_type), alloc));
  ZINF_ASSIGN_OR_RETURN(HostBuffer m, HostBuffer::Allocate(count * 4, alloc));
  HostBuffer v, c;
  if (states == 2) {
    ZINF_ASSIGN_OR_RETURN(v, HostBuffer::Allocate(count * 4, alloc));
  }
  if (copy) {
    ZINF_ASSIGN_OR_RETURN(c, HostBuffer::Allocate(count * 2, alloc));
  }
  OptimizerSpan span;
  span.params = p.as<float>();
  span.grads = g.data();
  span.grad_type = grad_type;
  span.state0 = m.as<float>();
  span.state1 = states == 2 ? v.as<float>() : nullptr;
  span.param_copy = copy ? c.data() : nullptr;
  span.param_copy_type = copy_type;
  span.count = count;

  ZINF_ASSIGN_OR_RETURN(auto par, cpu_optim::Parallel::Create(opt->threads()));
  ZINF_RETURN_IF_ERROR(opt->InitState(group, span));
  // Positive, well-scaled values: neither the step nor the limit's adds reach denormals or NaN.
  ZINF_RETURN_IF_ERROR(par->For(count, [&](size_t begin, size_t end) {
    float* pp = span.params;
    for (size_t i = begin; i < end; ++i) {
      pp[i] = 0.5f + static_cast<float>(i % 1000) * 1e-4f;
      const float gv = 1e-3f * static_cast<float>(i % 7 + 1);
      if (grad_type == ElementType::kFp32) {
        static_cast<float*>(g.data())[i] = gv;
      } else {
        ConvertFromFp32(&gv, ElementType::kBf16, static_cast<uint16_t*>(g.data()) + i, 1);
      }
      if (copy) static_cast<uint16_t*>(c.data())[i] = 0;
    }
  }));

  const cpu_optim::KernelTable& kernels = cpu_optim::KernelsFor(opt->isa());
  cpu_optim::StepArrays arrays;
  arrays.params = span.params;
  arrays.grads = span.grads;
  arrays.grad_type = static_cast<cpu_optim::Elem>(grad_type);
  arrays.state0 = span.state0;
  arrays.state1 = span.state1;
  arrays.copy = span.param_copy;
  arrays.copy_type = static_cast<cpu_optim::Elem>(copy_type);
  arrays.count = count;
  auto limit_run = [&](const LimitVariant& variant) {
    const size_t pf = variant.prefetch ? args.prefetch_bytes : 0;
    return par->For(count, [&](size_t begin, size_t end) {
      cpu_optim::StepArrays a = arrays;
      const size_t gsize = ElementSize(grad_type);
      a.params += begin;
      a.grads = static_cast<const char*>(a.grads) + begin * gsize;
      a.state0 += begin;
      if (a.state1) a.state1 += begin;
      if (a.copy) a.copy = static_cast<char*>(a.copy) + begin * 2;
      a.count = end - begin;
      kernels.limit(a, variant.non_temporal, pf);
    });
  };
  auto step_run = [&]() -> Status {
    ZINF_ASSIGN_OR_RETURN(int64_t step, opt->BeginStep(group));
    (void)step;
    return opt->Update(group, span, 1.0f / 1024.0f);
  };

  const CpuInfo& cpu = GetCpuInfo();
  if (!args.json && !args.quiet) {
    fmt::print(
        "zinf bench adam: {} {} params ({}), {} threads, {} threads of other work, kernel {}, "
        "grads {}, param copy {}\n",
        OptimizerTypeName(hp.type), count, FormatBytes(count * bytes_per_param), opt->threads(),
        load, CpuKernelIsaName(opt->isa()), ElementTypeName(grad_type), args.param_copy);
    fmt::print("  {} bytes/param (read {}, write {}), store {}, prefetch {} B, {} reps, cpu {}\n",
               bytes_per_param, read_bytes, write_bytes, args.store, args.prefetch_bytes, args.reps,
               cpu.model_name);
  }

  // Warm-up: page faults and first-use costs out of the timings, and with --store auto the
  // optimizer's tuning done (its first large calls try each variant in turn; a size too small
  // to tune stays kAuto, hence the cap).
  const BusyLoad busy(load);
  for (int i = 0; i < 7 || (opt->store_mode_in_use() == StoreMode::kAuto && i < 32); ++i) {
    ZINF_RETURN_IF_ERROR(step_run());
  }
  for (const LimitVariant& lv : kLimitVariants) ZINF_RETURN_IF_ERROR(limit_run(lv));

  std::vector<double> step_s;
  std::map<std::string, std::vector<double>> limit_s;
  for (int r = 0; r < args.reps; ++r) {
    ZINF_ASSIGN_OR_RETURN(double s, TimeIt(step_run));
    step_s.push_back(s);
    for (const LimitVariant& lv : kLimitVariants) {
      ZINF_ASSIGN_OR_RETURN(double t, TimeIt([&] { return limit_run(lv); }));
      limit_s[lv.name].push_back(t);
    }
  }

  const double bytes = static_cast<double>(count) * static_cast<double>(bytes_per_param);
  const double step_med = Median(step_s);
  const double gbps = bytes / step_med / 1e9;
  const double params_per_s = static_cast<double>(count) / step_med;
  nlohmann::json limits = nlohmann::json::object();
  double limit_gbps = 0.0;
  std::string limit_name;
  for (const LimitVariant& lv : kLimitVariants) {
    const double l = bytes / Median(limit_s[lv.name]) / 1e9;
    limits[lv.name] = l;
    if (l > limit_gbps) {
      limit_gbps = l;
      limit_name = lv.name;
    }
  }
  const double efficiency = gbps / limit_gbps;
  std::vector<double> step_gbps;
  for (double s : step_s) step_gbps.push_back(bytes / s / 1e9);

  if (args.quiet) {
    // The figures only.
  } else if (args.json) {
    nlohmann::json out = {
        {"bench", "adam"},
        {"optimizer", OptimizerTypeName(hp.type)},
        {"params", count},
        {"threads", opt->threads()},
        {"load_threads", load},
        {"isa", CpuKernelIsaName(opt->isa())},
        {"dtype", args.dtype},
        {"param_copy", args.param_copy},
        {"store", args.store},
        {"store_in_use", StoreModeName(opt->store_mode_in_use())},
        {"prefetch_bytes", args.prefetch_bytes},
        {"prefetch_bytes_in_use", opt->prefetch_bytes_in_use()},
        {"bytes_per_param", bytes_per_param},
        {"reps", args.reps},
        {"step_s", step_med},
        {"params_per_s", params_per_s},
        {"GBps", gbps},
        {"GBps_runs", step_gbps},
        {"limit_GBps", limit_gbps},
        {"limit_variant", limit_name},
        {"limits_GBps", limits},
        {"efficiency", efficiency},
    };
    fmt::print("{}\n", out.dump());
  } else {
    fmt::print("  step:  {:.3f} G params/s, {:.1f} GB/s moved (median of {}; runs:",
               params_per_s / 1e9, gbps, args.reps);
    for (double x : step_gbps) fmt::print(" {:.1f}", x);
    fmt::print(")\n");
    for (const LimitVariant& lv : kLimitVariants) {
      fmt::print("  limit {:<22} {:.1f} GB/s\n", lv.name, limits[lv.name].get<double>());
    }
    fmt::print("  limit: {:.1f} GB/s ({})  efficiency: {:.3f}  (step stores: {}, prefetch {} B)\n",
               limit_gbps, limit_name, efficiency, StoreModeName(opt->store_mode_in_use()),
               opt->prefetch_bytes_in_use());
  }
  return AdamResult{count, opt->threads(), load, gbps, limit_gbps, params_per_s};
}

// "64M" for 64 x 2^20, as --params takes it; the plain number otherwise.
std::string FormatCount(uint64_t n) {
  const char* units = "KMGT";
  int u = -1;
  while (n >= 1024 && n % 1024 == 0 && u < 3) {
    n /= 1024;
    ++u;
  }
  return u < 0 ? std::to_string(n) : fmt::format("{}{}", n, units[u]);
}

// Bandwidth against threads (one pair of curves, step and limit, per size) and against size
// (at the most threads).
Figure AdamFigure(const std::vector<AdamResult>& results, const std::string& what) {
  Figure f;
  f.title = fmt::format("zinf bench adam: {} step against the bandwidth limit", what);
  PlotPanel by_threads{.title = "bandwidth by thread count",
                       .x_label = "threads",
                       .y_label = "GB/s moved",
                       .log_x = true};
  std::map<uint64_t, std::pair<PlotSeries, PlotSeries>> per_size;  // step and limit
  int most_threads = 0;
  for (const AdamResult& r : results) {
    if (r.load != 0) continue;  // the plot is of the idle machine
    auto& [step, limit] = per_size[r.params];
    step.title = fmt::format("step, {} params", FormatCount(r.params));
    limit.title = fmt::format("limit, {} params", FormatCount(r.params));
    limit.dashed = true;
    step.color = limit.color = static_cast<int>(per_size.size());
    step.x.push_back(r.threads);
    step.y.push_back(r.gbps);
    limit.x.push_back(r.threads);
    limit.y.push_back(r.limit_gbps);
    most_threads = std::max(most_threads, r.threads);
  }
  for (auto& [size, curves] : per_size) {
    by_threads.series.push_back(curves.first);
    by_threads.series.push_back(curves.second);
  }
  // A panel over one thread count (or one size) would be single points: left out, unless
  // the run measured one configuration only.
  if (by_threads.series[0].x.size() > 1 || per_size.size() == 1) f.panels.push_back(by_threads);
  PlotPanel by_size{.title = fmt::format("bandwidth by size, {} thread(s)", most_threads),
                    .x_label = "parameters (M = 2^20)",
                    .y_label = "GB/s moved",
                    .log_x = true};
  PlotSeries step{.title = "step", .color = 1};
  PlotSeries limit{.title = "limit (same bytes, in-place add)", .dashed = true, .color = 1};
  for (const AdamResult& r : results) {
    if (r.threads != most_threads || r.load != 0) continue;
    step.x.push_back(static_cast<double>(r.params) / (1 << 20));
    step.y.push_back(r.gbps);
    limit.x.push_back(static_cast<double>(r.params) / (1 << 20));
    limit.y.push_back(r.limit_gbps);
  }
  by_size.series = {step, limit};
  if (per_size.size() > 1) f.panels.push_back(by_size);
  return f;
}

Status RunBenchAdam(const AdamArgs& args) {
  if (args.reps < 1)
    return InvalidArgument("--reps must be >= 1, got " + std::to_string(args.reps));
  std::vector<uint64_t> counts;
  for (const std::string& p : args.params) {
    ZINF_ASSIGN_OR_RETURN(uint64_t count, ParseBytes(p));
    if (count == 0) return InvalidArgument("--params must be > 0, got " + p);
    counts.push_back(count);
  }
  for (int t : args.threads) {
    if (t < 0) return InvalidArgument(fmt::format("--threads must be >= 0, got {}", t));
  }
  for (int n : args.load) {
    if (n < 0) return InvalidArgument(fmt::format("--load must be >= 0, got {}", n));
  }
  // An unwritable plot path or a missing gnuplot fails now, not after minutes of measuring.
  if (!args.plot.empty()) ZINF_RETURN_IF_ERROR(CheckPlotOutput(args.plot));
  std::vector<AdamResult> results;
  for (uint64_t count : counts) {
    for (int threads : args.threads) {
      for (int load : args.load) {
        ZINF_ASSIGN_OR_RETURN(AdamResult r, MeasureAdam(args, count, threads, load));
        results.push_back(r);
      }
    }
  }
  if (args.plot.empty()) return OkStatus();
  ZINF_RETURN_IF_ERROR(WritePlot(AdamFigure(results, args.optimizer), args.plot));
  if (!args.json) fmt::print("wrote {}\n", args.plot);
  return OkStatus();
}

}  // namespace

StatusOr<AdamFigures> MeasureAdamRate(uint64_t params, int threads, int reps) {
  AdamArgs args;
  args.reps = reps;
  args.quiet = true;
  ZINF_ASSIGN_OR_RETURN(AdamResult r, MeasureAdam(args, params, threads, /*load=*/0));
  return AdamFigures{r.threads, r.params_per_s, r.limit_gbps};
}

void AddBenchAdamCommand(CLI::App& bench) {
  auto args = std::make_shared<AdamArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "adam", "CPU optimizer step against an in-place bandwidth kernel on the same bytes");
  cmd->add_option("--params", args->params,
                  "Parameters in the shard (K, M, G are powers of 1024); a comma-separated list "
                  "measures each")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--threads", args->threads,
                  "Threads (0: every CPU in the affinity mask); a comma-separated list measures "
                  "each")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--load", args->load,
                  "Threads of other work (compute, no memory traffic) running beside the step: "
                  "a loaded machine; a comma-separated list measures each")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--dtype", args->dtype, "Gradient type: fp32 or bf16-grad")
      ->check(CLI::IsMember({"fp32", "bf16-grad"}))
      ->capture_default_str();
  cmd->add_option("--param-copy", args->param_copy, "Low-precision copy written in the same pass")
      ->check(CLI::IsMember({"none", "bf16", "fp16"}))
      ->capture_default_str();
  cmd->add_option("--optimizer", args->optimizer, "adamw, adam, adagrad or lion")
      ->check(CLI::IsMember({"adamw", "adam", "adagrad", "lion"}))
      ->capture_default_str();
  cmd->add_option("--isa", args->isa, "Kernel: auto, scalar, avx2 or avx512")
      ->check(CLI::IsMember({"auto", "scalar", "avx2", "avx512"}))
      ->capture_default_str();
  cmd->add_option("--store", args->store, "Step stores: auto, cached or non_temporal")
      ->check(CLI::IsMember({"auto", "cached", "non_temporal"}))
      ->capture_default_str();
  cmd->add_option("--prefetch", args->prefetch_bytes,
                  "Software prefetch distance in bytes (0: off); with --store auto the step "
                  "keeps it only if faster")
      ->capture_default_str();
  cmd->add_option("--reps", args->reps, "Repetitions (median reported)")->capture_default_str();
  cmd->add_flag("--json", args->json, "Print one JSON object (a line per configuration)");
  cmd->add_option("--plot", args->plot,
                  "Write a PNG of GB/s against threads and sizes, with the limit (gnuplot)");
  cmd->callback([args] { Report("zinf bench adam", RunBenchAdam(*args)); });
}

}  // namespace zinf::tools
