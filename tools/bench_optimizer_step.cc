// `zinf bench optimizer-step`: the pipelined AdamW step over --params fp32 parameters whose
// state (params, exp_avg, exp_avg_sq, fp32 gradients: 16 bytes a parameter) lives on NVMe or in
// pinned host memory, against its two limits measured in the same run: the I/O alone (every
// read and write, no update) and the compute alone (every update, no I/O). Repetitions
// interleave step, I/O-only and compute-only; medians are reported, and
//   overlap_ratio = step_s / max(io_only_s, compute_only_s)
// is 1.0 when the step hides the smaller half completely behind the larger.
//
// Also prints peak host memory: the process's peak RSS (getrusage) and the peaks of the
// staging and host-state pools.
//
// Single-threaded driver; CpuOptimizer's workers do the compute, io_uring the I/O.
#include <fmt/core.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/units.h"
#include "nvme/path_probe.h"
#include "offload/pipelined_optimizer.h"
#include "tools/bench_util.h"
#include "tools/commands.h"
#include "zinf/cpu_optimizer.h"
#include "zinf/host_memory.h"
#include "zinf/tiered_store.h"

namespace zinf::tools {
namespace {

struct OptimizerStepArgs {
  std::string params = "128M";
  std::string state_tier = "nvme";
  std::string path;
  std::string host_budget = "2GiB";
  std::string chunk = "1M";  // PipelinedOptimizerOptions default
  std::string param_tier;    // default: nvme with --state-tier nvme, host with cpu
  int buffers = PipelinedOptimizerOptions().num_buffers;
  int reps = 3;
  int threads = 0;
  std::string store_mode = "auto";
  bool checksum = false;
  bool json = false;
};

uint64_t PeakRssBytes() {
  struct rusage usage;
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<uint64_t>(usage.ru_maxrss) * 1024;  // KiB on Linux
}

// A cheap deterministic value per element (params near 1, gradients near 0).
inline float Pattern(uint64_t i, uint32_t salt) {
  uint32_t x = static_cast<uint32_t>(i * 2654435761u) ^ salt;
  x ^= x >> 15;
  x *= 2246822519u;
  x ^= x >> 13;
  return static_cast<float>(x & 0xFFFF) / 65536.0f - 0.5f;
}

Status RunOptimizerStep(const OptimizerStepArgs& args) {
  ZINF_ASSIGN_OR_RETURN(const uint64_t params, ParseBytes(args.params));
  ZINF_ASSIGN_OR_RETURN(const uint64_t host_budget, ParseBytes(args.host_budget));
  ZINF_ASSIGN_OR_RETURN(const uint64_t chunk, ParseBytes(args.chunk));
  if (params == 0) return InvalidArgument("--params must be > 0");
  if (args.reps < 1) return InvalidArgument(fmt::format("--reps must be >= 1, got {}", args.reps));
  const bool nvme = args.state_tier == "nvme";
  std::string param_tier = args.param_tier.empty() ? (nvme ? "nvme" : "host") : args.param_tier;
  if (nvme && args.path.empty()) return InvalidArgument("--state-tier nvme needs --path DIR");
  if (param_tier == "nvme" && args.path.empty())
    return InvalidArgument("--param-tier nvme needs --path DIR");

  PipelinedOptimizerOptions options;
  options.host_budget_bytes = host_budget;
  options.num_buffers = args.buffers;
  options.chunk_elements = chunk;
  options.nvme_ratio = nvme ? 1.0 : 0.0;

  // The step's tiers, as the engine gives them: a host tier for the staging buffers and the
  // host-resident chunks, and swap space when anything is on NVMe.
  TieredStoreOptions so;
  so.device = "";
  const uint64_t chunks = (params + chunk - 1) / chunk + 1;
  so.host_budget_bytes =
      host_budget + (nvme ? 0 : chunks * PipelinedOptimizer::ChunkBytes(chunk, 2)) + kGiB / 4;
  const bool swap = !args.path.empty() && (nvme || param_tier == "nvme");
  if (swap) {
    so.nvme_paths = {args.path};
    // 16 bytes of state and gradients and 2 of parameter copy per element, plus alignment.
    so.nvme_capacity_bytes = params * 18 + chunks * 3 * (1 << 20) + kGiB / 4;
    so.nvme_checksum = args.checksum;
  }
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<TieredStore> store, TieredStore::Create(so));
  StatusOr<PathProbe> probe = swap ? ProbePath(args.path) : StatusOr<PathProbe>(PathProbe());
  const bool direct_io = probe.ok() && probe->o_direct;
  CpuOptimizerOptions co;
  co.threads = args.threads;
  co.store_mode = args.store_mode == "cached" ? StoreMode::kCached
                  : args.store_mode == "nt"   ? StoreMode::kNonTemporal
                                              : StoreMode::kAuto;
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<CpuOptimizer> optimizer, CpuOptimizer::Create(co));
  OptimizerHyperParams hp;
  hp.weight_decay = 0.01;
  ZINF_ASSIGN_OR_RETURN(const int group, optimizer->AddParamGroup(hp));
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<PipelinedOptimizer> piped,
                        PipelinedOptimizer::Create(optimizer.get(), *store, options));

  HostBuffer host_copy;  // page-aligned, as a pinned parameter tier would be
  ShardSpec spec;
  spec.name = "bench";
  spec.group = group;
  spec.count = params;
  spec.param_copy_type = ElementType::kBf16;
  if (param_tier == "nvme") {
    spec.param_copy_tier = ParamCopyTier::kNvme;
  } else if (param_tier == "host") {
    ZINF_ASSIGN_OR_RETURN(host_copy, HostBuffer::Allocate(params * 2));
    spec.param_copy_tier = ParamCopyTier::kHost;
    spec.param_copy = host_copy.data();
  }

  const int threads = optimizer->threads();
  const std::string isa(CpuKernelIsaName(optimizer->isa()));
  if (!args.json) {
    fmt::print(
        "optimizer-step: {} params ({} of fp32 params+m+v+grads), state tier {}, param "
        "copy bf16 to {}\n",
        params, FormatBytes(params * 16), args.state_tier, param_tier);
    fmt::print(
        "  host budget {} -> {} buffers of {} elements ({} staging), cpu_optim {} x{} "
        "threads, {} stores, {} reps{}\n",
        FormatBytes(host_budget), piped->num_buffers(), piped->chunk_elements(),
        FormatBytes(piped->staging_bytes()), isa, threads, args.store_mode, args.reps,
        swap ? fmt::format(", swap {} (O_DIRECT {}, checksum {})", args.path,
                           direct_io ? "on" : "off", args.checksum ? "on" : "off")
             : "");
    std::fflush(stdout);
  }

  const auto setup_start = std::chrono::steady_clock::now();
  ZINF_ASSIGN_OR_RETURN(const int shard, piped->AddShard(spec, [](const ChunkView& c) {
    float* g = static_cast<float*>(c.grads);
    for (size_t i = 0; i < c.count; ++i) {
      c.params[i] = 1.0f + Pattern(c.offset + i, 1);
      g[i] = 0.01f * Pattern(c.offset + i, 2);
    }
    return OkStatus();
  }));
  const double setup_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - setup_start).count();

  // One warm-up step, then interleaved repetitions.
  ZINF_RETURN_IF_ERROR(piped->Step({shard}));
  std::vector<double> step_s, io_s, compute_s, wait_s;
  uint64_t bytes_read = 0, bytes_written = 0;
  for (int r = 0; r < args.reps; ++r) {
    ZINF_RETURN_IF_ERROR(piped->Step({shard}, 1.0f, StepMode::kFull));
    step_s.push_back(piped->last_step_stats().seconds);
    wait_s.push_back(piped->last_step_stats().wait_seconds);
    bytes_read = piped->last_step_stats().bytes_read;
    bytes_written = piped->last_step_stats().bytes_written;
    ZINF_RETURN_IF_ERROR(piped->Step({shard}, 1.0f, StepMode::kIoOnly));
    io_s.push_back(piped->last_step_stats().seconds);
    ZINF_RETURN_IF_ERROR(piped->Step({shard}, 1.0f, StepMode::kComputeOnly));
    compute_s.push_back(piped->last_step_stats().seconds);
    if (!args.json) {
      fmt::print(
          "  rep {}: step {:.3f} s (driver waited {:.3f} s), io-only {:.3f} s, compute-only {:.3f} "
          "s\n",
          r, step_s.back(), wait_s.back(), io_s.back(), compute_s.back());
      std::fflush(stdout);
    }
  }
  const double step = Median(step_s), io = Median(io_s), compute = Median(compute_s);
  const double bound = std::max(io, compute);
  const double ratio = bound > 0 ? step / bound : 0.0;
  const double vs_compute = compute > 0 ? step / compute : 0.0;
  // The disk's speed drifts between repetitions, so each repetition's own ratio (its step
  // against its I/O-only and compute-only runs, taken back to back) is reported as well.
  std::vector<double> rep_ratio;
  for (int r = 0; r < args.reps; ++r) {
    const double b = std::max(io_s[r], compute_s[r]);
    if (b > 0) rep_ratio.push_back(step_s[r] / b);
  }
  const double ratio_per_rep = rep_ratio.empty() ? 0.0 : Median(rep_ratio);
  // Best against best: the fastest step against the fastest each half ever ran, the least
  // favourable reading when the I/O-only runs are noisy.
  const double best_step = *std::min_element(step_s.begin(), step_s.end());
  const double best_bound = std::max(*std::min_element(io_s.begin(), io_s.end()),
                                     *std::min_element(compute_s.begin(), compute_s.end()));
  const double ratio_best = best_bound > 0 ? best_step / best_bound : 0.0;
  const uint64_t rss = PeakRssBytes();
  const uint64_t host_tier_peak = store->stats().tiers[int(Tier::kHost)].peak_bytes;
  const double io_GBps = io > 0 ? (bytes_read + bytes_written) / io / 1e9 : 0.0;
  const double params_per_s = compute > 0 ? params / compute : 0.0;

  nlohmann::json out = {
      {"params", params},
      {"state_tier", args.state_tier},
      {"param_tier", param_tier},
      {"host_budget_bytes", host_budget},
      {"chunk_elements", piped->chunk_elements()},
      {"buffers", piped->num_buffers()},
      {"threads", threads},
      {"isa", isa},
      {"store_mode", args.store_mode},
      {"reps", args.reps},
      {"setup_s", setup_s},
      {"step_s", step},
      {"io_only_s", io},
      {"compute_only_s", compute},
      {"overlap_ratio", ratio},
      {"step_vs_compute_only", vs_compute},
      {"overlap_ratio_per_rep_median", ratio_per_rep},
      {"overlap_ratio_best", ratio_best},
      {"bytes_read", bytes_read},
      {"bytes_written", bytes_written},
      {"io_only_GBps", io_GBps},
      {"compute_only_params_per_s", params_per_s},
      {"peak_rss_bytes", rss},
      {"staging_bytes", piped->staging_bytes()},
      {"host_tier_peak_bytes", host_tier_peak},
      {"step_s_runs", step_s},
      {"io_only_s_runs", io_s},
      {"compute_only_s_runs", compute_s},
  };
  if (args.json) {
    fmt::print("{}\n", out.dump());
    return OkStatus();
  }
  fmt::print(
      "median step_s {:.3f}  io_only_s {:.3f} ({:.2f} GB/s, {} read + {} written)  "
      "compute_only_s {:.3f} ({:.0f} M params/s)\n",
      step, io, io_GBps, FormatBytes(bytes_read), FormatBytes(bytes_written), compute,
      params_per_s / 1e6);
  fmt::print(
      "overlap_ratio {:.3f} (median step / max(median io, median compute)); median of "
      "per-rep ratios {:.3f}; best step / max(best io, best compute) {:.3f}; step / "
      "compute_only {:.3f}\n",
      ratio, ratio_per_rep, ratio_best, vs_compute);
  fmt::print(
      "peak host memory: RSS {} (staging budget {}), staging {}, host tier peak {} (staging "
      "and host-resident chunks)\n",
      FormatBytes(rss), FormatBytes(host_budget), FormatBytes(piped->staging_bytes()),
      FormatBytes(host_tier_peak));
  return OkStatus();
}

}  // namespace

void AddBenchOptimizerStepCommand(CLI::App& bench) {
  auto args = std::make_shared<OptimizerStepArgs>();
  CLI::App* cmd = bench.add_subcommand("optimizer-step",
                                       "Pipelined AdamW step over NVMe or pinned-host state vs its "
                                       "I/O-only and compute-only halves");
  cmd->add_option("--params", args->params, "Parameters (e.g. 512M = 512 Mi)")
      ->capture_default_str();
  cmd->add_option("--state-tier", args->state_tier, "Where params, state and gradients live")
      ->check(CLI::IsMember({"nvme", "cpu"}))
      ->capture_default_str();
  cmd->add_option("--path", args->path, "Directory for the swap files (NVMe tiers)");
  cmd->add_option("--host-budget", args->host_budget, "Host memory for staging buffers")
      ->capture_default_str();
  cmd->add_option("--chunk", args->chunk, "Elements per chunk (largest; shrunk to the budget)")
      ->capture_default_str();
  cmd->add_option("--buffers", args->buffers, "Staging buffers (>= 3)")->capture_default_str();
  cmd->add_option("--param-tier", args->param_tier,
                  "Where the bf16 parameter copy goes: nvme, host or none (default: nvme for "
                  "--state-tier nvme, host for cpu)")
      ->check(CLI::IsMember({"nvme", "host", "none"}));
  cmd->add_option("--reps", args->reps, "Repetitions (median reported)")->capture_default_str();
  cmd->add_option("--threads", args->threads, "Optimizer threads (0: all CPUs)")
      ->capture_default_str();
  cmd->add_option("--store-mode", args->store_mode,
                  "cpu_optim stores: auto, cached or nt (non-temporal)")
      ->check(CLI::IsMember({"auto", "cached", "nt"}))
      ->capture_default_str();
  cmd->add_flag("--checksum", args->checksum, "CRC32C on every NVMe write, verified on read");
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->callback([args] { Report("zinf bench optimizer-step", RunOptimizerStep(*args)); });
}

}  // namespace zinf::tools
