// `zinf bench optimizer-step`: the pipelined AdamW step over --params fp32 parameters whose
// state (params, exp_avg, exp_avg_sq, fp32 gradients: 16 bytes a parameter) lives on NVMe or in
// pinned host memory, its bf16 parameter copy handed to a writer that keeps it in host memory
// or on NVMe (as an engine's parameter tier would), against its two limits measured in the
// same run: the I/O alone (every read and write, no update) and the compute alone (every
// update, no I/O). Both halves are this file's, on the store's and the optimizer's public
// calls (IoHalf, ComputeHalf): the same bytes through the same pipeline, the same kernel over
// the same chunks. Repetitions interleave step, I/O-only and compute-only; medians are
// reported, and
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
#include "nvme/io_engine.h"
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

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

uint64_t Aligned(uint64_t bytes) { return AlignUp(bytes, 4096); }

// The chunks of a shard of `params` elements, as the pipelined step cuts it.
std::vector<uint64_t> ChunkCounts(uint64_t params, uint64_t chunk) {
  std::vector<uint64_t> counts;
  for (uint64_t offset = 0; offset < params; offset += chunk) {
    counts.push_back(std::min(chunk, params - offset));
  }
  return counts;
}

// Where the step hands each chunk's bf16 parameter copy (ParamHandoff::kCopy), as an engine's
// parameter tier takes it: a host array (--param-tier host), or one NVMe-homed tensor per
// chunk, written from `buffers` rotating page-aligned buffers while the step goes on
// (--param-tier nvme). Drain waits for the writes.
class CopyWriter final : public ParamWriter {
 public:
  static StatusOr<std::unique_ptr<CopyWriter>> Create(TieredStore* store, bool nvme,
                                                      uint64_t params, uint64_t chunk,
                                                      int buffers) {
    std::unique_ptr<CopyWriter> w(new CopyWriter(store, chunk));
    if (!nvme) {
      ZINF_ASSIGN_OR_RETURN(w->host_, HostBuffer::Allocate(params * 2));
      return w;
    }
    for (uint64_t count : ChunkCounts(params, chunk)) {
      ZINF_ASSIGN_OR_RETURN(TensorId t,
                            store->Create(fmt::format("bench copy {}", w->tensors_.size()),
                                          Aligned(count * 2), Tier::kNvme));
      w->tensors_.push_back(t);
    }
    ZINF_ASSIGN_OR_RETURN(w->host_, HostBuffer::Allocate(buffers * Aligned(chunk * 2)));
    w->writes_ = std::vector<IoWaiter>(buffers);
    return w;
  }
  ~CopyWriter() override { Drain().IgnoreError(); }

  StatusOr<std::vector<CopyTarget>> Targets(const ChunkView& c) override {
    char* base = static_cast<char*>(host_.data());
    if (tensors_.empty()) return std::vector<CopyTarget>{{0, c.count, base + c.offset * 2}};
    // The buffer this chunk's copy goes to, once its last write is out.
    buffer_ = next_++ % writes_.size();
    ZINF_RETURN_IF_ERROR(writes_[buffer_].Wait());
    return std::vector<CopyTarget>{{0, c.count, base + buffer_ * Aligned(chunk_ * 2)}};
  }
  Status Updated(const ChunkView& c) override {
    if (tensors_.empty()) return OkStatus();
    const char* data = static_cast<const char*>(host_.data()) + buffer_ * Aligned(chunk_ * 2);
    writes_[buffer_].Add(1);
    store_->WriteHomeAsync(tensors_[c.offset / chunk_], data, writes_[buffer_].Callback());
    bytes_written_ += Aligned(c.count * 2);
    return OkStatus();
  }
  Status Drain() {
    Status first;
    for (IoWaiter& w : writes_) {
      Status s = w.Wait();
      if (first.ok()) first = s;
    }
    return first;
  }
  // The whole shard's copy in host memory (--param-tier host), else null.
  void* host_copy() const { return tensors_.empty() ? host_.data() : nullptr; }
  // NVMe bytes written since the last call.
  uint64_t TakeBytesWritten() { return std::exchange(bytes_written_, 0); }

 private:
  CopyWriter(TieredStore* store, uint64_t chunk) : store_(store), chunk_(chunk) {}
  TieredStore* const store_;
  const uint64_t chunk_;
  HostBuffer host_;                // the host copy, or the rotating buffers
  std::vector<TensorId> tensors_;  // by chunk, on NVMe
  std::vector<IoWaiter> writes_;   // by buffer
  size_t next_ = 0, buffer_ = 0;
  uint64_t bytes_written_ = 0;
};

// The step's I/O alone: each chunk's state (params and both moments) and fp32 gradients read
// from NVMe into one of `buffers` staging buffers, up to buffers - 1 chunks ahead, and its
// state (and bf16 copy, with --param-tier nvme) written back behind, as Note [Pipelined step]
// moves them; on NVMe tensors of its own with the chunks' sizes (the optimizer's are its
// own), so the swap files hold the state twice.
class IoHalf {
 public:
  static StatusOr<IoHalf> Create(TieredStore* store, uint64_t params, uint64_t chunk, int buffers,
                                 bool state_on_nvme, bool copy_on_nvme) {
    IoHalf io(store, buffers);
    io.stride_ = Aligned(chunk * 4) * 4 + Aligned(chunk * 2);
    ZINF_ASSIGN_OR_RETURN(io.staging_, HostBuffer::Allocate(buffers * io.stride_));
    std::memset(io.staging_.data(), 0, buffers * io.stride_);
    for (uint64_t count : ChunkCounts(params, chunk)) {
      Chunk c{.state_bytes = Aligned(count * 4) * 3, .grad_bytes = Aligned(count * 4)};
      const size_t i = io.chunks_.size();
      auto create = [&](uint64_t bytes, std::string_view part) {
        return store->Create(fmt::format("bench io {} {}", i, part), bytes, Tier::kNvme);
      };
      if (state_on_nvme) {
        ZINF_ASSIGN_OR_RETURN(c.state, create(c.state_bytes, "state"));
        ZINF_ASSIGN_OR_RETURN(c.grads, create(c.grad_bytes, "grads"));
        // Written once, so that every read finds data (and its checksums).
        ZINF_RETURN_IF_ERROR(store->WriteHome(c.state, io.staging_.data()));
        ZINF_RETURN_IF_ERROR(store->WriteHome(c.grads, io.staging_.data()));
      }
      if (copy_on_nvme) {
        c.copy_bytes = Aligned(count * 2);
        ZINF_ASSIGN_OR_RETURN(c.copy, create(c.copy_bytes, "copy"));
      }
      io.chunks_.push_back(c);
    }
    return io;
  }

  // One pass; its seconds, and the bytes it moved into `read` and `written`.
  StatusOr<double> Run(uint64_t* read, uint64_t* written) {
    const auto start = std::chrono::steady_clock::now();
    const size_t n = chunks_.size(), k = reads_.size();
    *read = *written = 0;
    Status failure;
    for (size_t j = 0; j < std::min(n, k - 1) && failure.ok(); ++j) failure = Read(j, read);
    for (size_t i = 0; i < n && failure.ok(); ++i) {
      failure = reads_[i % k].Wait();
      if (!failure.ok()) break;
      const Chunk& c = chunks_[i];
      char* base = Buffer(i);
      if (c.state != 0) Write(i, c.state, base, c.state_bytes, written);
      if (c.copy != 0) Write(i, c.copy, base + c.state_bytes + c.grad_bytes, c.copy_bytes, written);
      if (i + k - 1 < n) failure = Read(i + k - 1, read);
    }
    for (size_t b = 0; b < k; ++b) {  // drained whatever happened: the buffers are targets
      Status r = reads_[b].Wait(), w = writes_[b].Wait();
      if (failure.ok()) failure = r.ok() ? w : r;
    }
    ZINF_RETURN_IF_ERROR(failure);
    return SecondsSince(start);
  }

 private:
  struct Chunk {
    TensorId state = 0, grads = 0, copy = 0;  // 0: not on NVMe
    uint64_t state_bytes = 0, grad_bytes = 0, copy_bytes = 0;
  };
  IoHalf(TieredStore* store, int buffers) : store_(store), reads_(buffers), writes_(buffers) {}
  char* Buffer(size_t i) {
    return static_cast<char*>(staging_.data()) + (i % reads_.size()) * stride_;
  }
  // Buffer j % k for chunk j: its last writes out, then the reads started.
  Status Read(size_t j, uint64_t* read) {
    IoWaiter& waiter = reads_[j % reads_.size()];
    ZINF_RETURN_IF_ERROR(writes_[j % writes_.size()].Wait());
    const Chunk& c = chunks_[j];
    if (c.state == 0) return OkStatus();
    waiter.Add(2);
    store_->ReadHomeAsync(c.state, Buffer(j), waiter.Callback());
    store_->ReadHomeAsync(c.grads, Buffer(j) + c.state_bytes, waiter.Callback());
    *read += c.state_bytes + c.grad_bytes;
    return OkStatus();
  }
  void Write(size_t i, TensorId t, const char* data, uint64_t bytes, uint64_t* written) {
    IoWaiter& waiter = writes_[i % writes_.size()];
    waiter.Add(1);
    store_->WriteHomeAsync(t, data, waiter.Callback());
    *written += bytes;
  }

  TieredStore* store_;
  std::vector<IoWaiter> reads_, writes_;  // by buffer
  HostBuffer staging_;
  uint64_t stride_ = 0;
  std::vector<Chunk> chunks_;
};

// The update alone: CpuOptimizer::ApplyStep at the group's hyper-parameters and step (at least
// 1, not advanced) over each chunk's count of elements, on the arrays of `buffers` rotating
// host buffers of one chunk each, its bf16 copy where the step's goes (the host copy) or into
// the buffer: no I/O, and nothing of the shard changed.
class ComputeHalf {
 public:
  static StatusOr<ComputeHalf> Create(uint64_t params, uint64_t chunk, int buffers) {
    ComputeHalf c;
    c.counts_ = ChunkCounts(params, chunk);
    c.chunk_ = chunk;
    c.stride_ = chunk * 4 * 4 + Aligned(chunk * 2);  // params, m, v, grads, bf16 copy
    ZINF_ASSIGN_OR_RETURN(c.arrays_, HostBuffer::Allocate(buffers * c.stride_));
    c.buffers_ = buffers;
    for (int b = 0; b < buffers; ++b) {
      float* f = reinterpret_cast<float*>(static_cast<char*>(c.arrays_.data()) + b * c.stride_);
      for (uint64_t i = 0; i < chunk; ++i) {
        f[i] = 1.0f + Pattern(i, 1);
        f[chunk + i] = f[2 * chunk + i] = 0.0f;
        f[3 * chunk + i] = 0.01f * Pattern(i, 2);
      }
    }
    return c;
  }

  // One pass; its seconds. `host_copy`: the step's host copy of the whole shard, or null.
  StatusOr<double> Run(const CpuOptimizer& optimizer, int group, void* host_copy, bool copy) {
    ZINF_ASSIGN_OR_RETURN(const ParamGroupState g, optimizer.group(group));
    const auto start = std::chrono::steady_clock::now();
    uint64_t offset = 0;
    for (size_t i = 0; i < counts_.size(); ++i) {
      char* base = static_cast<char*>(arrays_.data()) + (i % buffers_) * stride_;
      float* f = reinterpret_cast<float*>(base);
      OptimizerSpan span;
      span.params = f;
      span.state0 = f + chunk_;
      span.state1 = f + 2 * chunk_;
      span.grads = f + 3 * chunk_;
      span.count = counts_[i];
      if (host_copy != nullptr) {
        span.param_copy = static_cast<char*>(host_copy) + offset * 2;
      } else if (copy) {
        span.param_copy = base + chunk_ * 16;
      }
      ZINF_RETURN_IF_ERROR(
          optimizer.ApplyStep(g.hyper_params, std::max<int64_t>(g.step, 1), 1.0f, span));
      offset += counts_[i];
    }
    return SecondsSince(start);
  }

 private:
  std::vector<uint64_t> counts_;
  uint64_t chunk_ = 0, stride_ = 0;
  int buffers_ = 0;
  HostBuffer arrays_;
};

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
  // host-resident chunks, and swap space when anything is on NVMe (twice: IoHalf's tensors
  // beside the optimizer's).
  TieredStoreOptions so;
  so.device = "";
  const uint64_t chunks = (params + chunk - 1) / chunk + 1;
  so.host_budget_bytes =
      host_budget + (nvme ? 0 : chunks * PipelinedOptimizer::ChunkBytes(chunk, 2)) + kGiB / 4;
  const bool swap = !args.path.empty() && (nvme || param_tier == "nvme");
  if (swap) {
    so.nvme_paths = {args.path};
    // 16 bytes of state and gradients and 2 of parameter copy per element, plus alignment,
    // for the step and again for IoHalf.
    so.nvme_capacity_bytes = 2 * (params * 18 + chunks * 3 * (1 << 20)) + kGiB / 4;
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

  ShardSpec spec;
  spec.name = "bench";
  spec.group = group;
  spec.count = params;
  spec.param_copy_type = ElementType::kBf16;
  std::unique_ptr<CopyWriter> copies;
  if (param_tier != "none") {
    ZINF_ASSIGN_OR_RETURN(copies, CopyWriter::Create(store.get(), param_tier == "nvme", params,
                                                     piped->chunk_elements(), args.buffers));
    spec.writer = copies.get();
    spec.handoff = ParamHandoff::kCopy;
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
  ZINF_ASSIGN_OR_RETURN(IoHalf io_half, IoHalf::Create(store.get(), params, piped->chunk_elements(),
                                                       args.buffers, nvme, param_tier == "nvme"));
  ZINF_ASSIGN_OR_RETURN(ComputeHalf compute_half,
                        ComputeHalf::Create(params, piped->chunk_elements(), args.buffers));
  const double setup_s = SecondsSince(setup_start);
  // The step, until its copies are written too.
  auto step_once = [&]() -> StatusOr<double> {
    const auto start = std::chrono::steady_clock::now();
    ZINF_RETURN_IF_ERROR(piped->Step({shard}));
    if (copies != nullptr) ZINF_RETURN_IF_ERROR(copies->Drain());
    return SecondsSince(start);
  };
  void* host_copy = copies != nullptr ? copies->host_copy() : nullptr;

  // One warm-up step, then interleaved repetitions.
  ZINF_RETURN_IF_ERROR(step_once().status());
  std::vector<double> step_s, io_s, compute_s, wait_s;
  uint64_t bytes_read = 0, bytes_written = 0, io_read = 0, io_written = 0;
  for (int r = 0; r < args.reps; ++r) {
    if (copies != nullptr) copies->TakeBytesWritten();
    ZINF_ASSIGN_OR_RETURN(const double step, step_once());
    step_s.push_back(step);
    wait_s.push_back(piped->last_step_stats().wait_seconds);
    bytes_read = piped->last_step_stats().bytes_read;
    bytes_written =
        piped->last_step_stats().bytes_written + (copies ? copies->TakeBytesWritten() : 0);
    ZINF_ASSIGN_OR_RETURN(const double io, io_half.Run(&io_read, &io_written));
    io_s.push_back(io);
    ZINF_ASSIGN_OR_RETURN(const double compute,
                          compute_half.Run(*optimizer, group, host_copy, param_tier != "none"));
    compute_s.push_back(compute);
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
  const double io_GBps = io > 0 ? (io_read + io_written) / io / 1e9 : 0.0;
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
