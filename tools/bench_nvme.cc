// `zinf bench nvme`: sequential write then read of --size through SwapStore with O_DIRECT,
// measured against fio (io_uring, direct=1, same size, block size and queue depth) run
// interleaved in the same invocation: zinf, fio, zinf, fio, ... The disk's speed drifts by
// tens of percent within minutes, so only interleaved runs are compared.
//
// Prints the configuration first, then the median MB/s (10^6 bytes) of each direction beside
// fio's and the ratio. --json prints one JSON object; --sweep runs the grid of block sizes and
// queue depths; --vs-fio-grid compares one configuration (the defaults unless flags say
// otherwise) with fio's best over that grid: the cell whose median over the repetitions is
// highest, each direction on its own (a maximum over cells per repetition would pick up noise).
//
// Note [Staging footprint]
// zinf moves every extent through one staging buffer of block size x queue depth x rings x
// paths bytes (at least 2 MiB, so that it is one transparent huge page), the bytes fio cycles
// its iodepth buffers of bs through, one job per path. On a virtual disk the host copies each
// request into guest memory, and there how much memory the reads land in changes the speed by a
// third: reads into 8 MiB of buffers ran at 3.7 GB/s, into 32 MiB or more at 2.6 GB/s, for fio as
// for zinf's engine (bench/RESULTS.md). A larger staging buffer than fio's would measure that, not
// the engine.
//
// Single-threaded driver; the engine's threads do the I/O.
#include <fmt/core.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config_reader.h"
#include "core/log.h"
#include "core/units.h"
#include "nvme/swap_store.h"
#include "tools/bench_measure.h"
#include "tools/bench_util.h"
#include "tools/commands.h"
#include "tools/plot.h"
#include "zinf/engine.h"
#include "zinf/host_memory.h"

namespace zinf::tools {
namespace {

struct NvmeArgs {
  std::vector<std::string> paths;
  std::string size = "4GiB";
  std::string block_size;  // empty: AioOptions default
  int queue_depth = -1;    // -1: AioOptions default
  int threads = -1;        // -1: AioOptions default
  std::string backend = "io_uring";
  int reps = 3;
  bool json = false;
  bool sweep = false;
  bool vs_fio_grid = false;
  bool no_fio = false;
  bool checksum = false;
  bool no_huge_pages = false;
  bool fio_huge_pages = false;
  int single_submit = -1;  // -1: AioOptions default
  std::string staging;     // empty: See Note [Staging footprint]
  std::string plot;        // with --sweep: PNG file; empty: none
};

struct Config {
  uint64_t size = 0;
  uint64_t block = 0;
  int qd = 0;
  int threads = 1;
  uint64_t staging = 0;  // 0: See Note [Staging footprint]
};

struct Pair {
  double write_MBps = 0;
  double read_MBps = 0;
  double mixed_MBps = 0;  // reads and writes in flight together; 0: not measured
};

// Grid of --sweep and --vs-fio-grid: {128 KiB, 1 MiB, 8 MiB} x {QD 8, 32}.
const uint64_t kGridBlocks[] = {128 * kKiB, kMiB, 8 * kMiB};
const int kGridDepths[] = {8, 32};

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// See Note [Staging footprint]. The store keeps queue depth pieces in flight per path, as fio
// runs one job of that depth per path.
uint64_t StagingBytes(const Config& c, size_t paths) {
  if (c.staging != 0) return c.staging;
  return std::max(2 * kMiB, c.block * static_cast<uint64_t>(c.qd * c.threads) * paths);
}

// One zinf run: open a SwapStore of `size`, write it all, read it all, close (which deletes
// the files). Memory: one staging buffer that every extent is written from and read into. With
// `mixed`, then also rewrite every other extent while reading the others back (into a second
// buffer), all in flight together, as the pipelined optimizer's pass does.
StatusOr<Pair> RunZinf(const NvmeArgs& args, const Config& c, bool mixed = false) {
  SwapStoreOptions o;
  o.paths = args.paths;
  o.capacity_bytes = c.size;
  o.checksum = args.checksum;
  o.aio.block_size = c.block;
  o.aio.queue_depth = c.qd;
  o.aio.thread_count = c.threads;
  if (args.single_submit != -1) o.aio.single_submit = args.single_submit != 0;
  o.aio.direct_io = DirectIo::kOn;
  o.aio.backend = args.backend == "posix"  ? IoBackend::kPosix
                  : args.backend == "auto" ? IoBackend::kAuto
                                           : IoBackend::kIoUring;
  ZINF_ASSIGN_OR_RETURN(auto store, SwapStore::Open(o));
  const uint64_t chunk =
      std::min(AlignUp(c.size, kDirectIoAlignment), StagingBytes(c, args.paths.size()));
  HostAllocOptions alloc;
  // Like for like: zinf stages on huge pages only where fio gets them too. On a virtual disk
  // a 1 MiB request into 4 KiB pages is split, into a 2 MiB page it is not: staging on huge
  // pages against fio's 4 KiB buffers measured the pages, not the engine (1.6-3.3x "over fio"
  // that was 0.98-1.28x like for like).
  alloc.huge_pages = args.fio_huge_pages && !args.no_huge_pages;
  ZINF_ASSIGN_OR_RETURN(HostBuffer buffer, HostBuffer::Allocate(chunk, alloc));
  for (uint64_t i = 0; i < chunk / 8; ++i) buffer.as<uint64_t>()[i] = i * 0x9E3779B97F4A7C15ull;
  Status reg = store->RegisterBuffer(buffer.data(), chunk);
  if (!reg.ok()) log::Warn("registering the staging buffer: {}", reg.ToString());

  std::vector<SwapExtent> extents;
  for (uint64_t pos = 0; pos < c.size; pos += chunk) {
    ZINF_ASSIGN_OR_RETURN(SwapExtent e, store->Allocate(std::min(chunk, c.size - pos),
                                                        fmt::format("chunk{}", pos / chunk)));
    extents.push_back(e);
  }
  IoWaiter waiter;
  const auto t0 = std::chrono::steady_clock::now();
  for (const SwapExtent& e : extents) {
    waiter.Add();
    store->WriteAsync(e, buffer.data(), waiter.Callback());
  }
  ZINF_RETURN_IF_ERROR(waiter.Wait());
  const auto t1 = std::chrono::steady_clock::now();
  for (const SwapExtent& e : extents) {
    waiter.Add();
    store->ReadAsync(e, buffer.data(), waiter.Callback());
  }
  ZINF_RETURN_IF_ERROR(waiter.Wait());
  const auto t2 = std::chrono::steady_clock::now();
  const double mb = static_cast<double>(c.size) / 1e6;
  Pair pair{mb / Seconds(t0, t1), mb / Seconds(t1, t2)};
  if (mixed) {
    ZINF_ASSIGN_OR_RETURN(HostBuffer into, HostBuffer::Allocate(chunk, alloc));
    const auto t3 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < extents.size(); ++i) {
      waiter.Add();
      if (i % 2 == 0) {
        store->WriteAsync(extents[i], buffer.data(), waiter.Callback());
      } else {
        store->ReadAsync(extents[i], into.data(), waiter.Callback());
      }
    }
    ZINF_RETURN_IF_ERROR(waiter.Wait());
    pair.mixed_MBps = mb / Seconds(t3, std::chrono::steady_clock::now());
  }
  return pair;
}

std::string FindFio() {
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string candidate = dirs.substr(start, end - start) + "/fio";
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return "";
}

std::string FioFile(const std::string& dir) { return dir + "/zinf-bench-fio.dat"; }

// The fio command for one direction: one job per path, SIZE split evenly, aggregated.
std::string FioCommand(const std::string& fio, const NvmeArgs& args, const Config& c,
                       const char* rw) {
  const uint64_t per_path = AlignUp(c.size / args.paths.size(), c.block);
  std::string cmd = fmt::format(
      "{} --ioengine=io_uring --direct=1 --rw={} --bs={} --iodepth={} --size={} "
      "--group_reporting --output-format=json{}",
      fio, rw, c.block, c.qd, per_path,
      args.fio_huge_pages ? " --mem=shmhuge --hugepage-size=2m" : "");
  for (size_t i = 0; i < args.paths.size(); ++i) {
    cmd += fmt::format(" --name=p{} --filename={}", i, FioFile(args.paths[i]));
  }
  return cmd;
}

StatusOr<double> RunFioOnce(const std::string& cmd, const char* rw) {
  FILE* pipe = popen((cmd + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return ErrnoStatus(errno, "starting fio");
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
  const int rc = pclose(pipe);
  if (rc != 0) {
    return IoError(
        fmt::format("fio failed (exit status {}): {}\n{}", rc, cmd, out.substr(0, 2000)));
  }
  // fio may print notes before the JSON object.
  const size_t brace = out.find('{');
  if (brace == std::string::npos) return IoError(fmt::format("fio printed no JSON: {}", out));
  try {
    ZINF_ASSIGN_OR_RETURN(const nlohmann::json j, ParseJson(out.substr(brace), "fio's output"));
    const double bw = j.at("jobs").at(0).at(rw).at("bw_bytes").get<double>();
    return bw / 1e6;
  } catch (const std::exception& e) {
    return IoError(fmt::format("parsing fio's JSON output: {}", e.what()));
  }
}

StatusOr<Pair> RunFio(const std::string& fio, const NvmeArgs& args, const Config& c) {
  Pair p;
  ZINF_ASSIGN_OR_RETURN(p.write_MBps, RunFioOnce(FioCommand(fio, args, c, "write"), "write"));
  ZINF_ASSIGN_OR_RETURN(p.read_MBps, RunFioOnce(FioCommand(fio, args, c, "read"), "read"));
  for (const std::string& dir : args.paths) unlink(FioFile(dir).c_str());
  return p;
}

// Repetitions of one configuration and their medians.
struct Runs {
  Config config;
  std::vector<Pair> runs;
  double write_MBps = 0, read_MBps = 0;

  void Summarize() {
    std::vector<double> w, r;
    for (const Pair& p : runs) w.push_back(p.write_MBps), r.push_back(p.read_MBps);
    write_MBps = Median(w), read_MBps = Median(r);
  }
};

struct Result {
  Runs zinf;
  // fio at zinf's configuration, or at every cell of the grid; empty without fio.
  std::vector<Runs> fio;
  // The fio runs compared with, per direction: the grid's best cell by median.
  size_t fio_write = 0, fio_read = 0;

  double zw() const { return zinf.write_MBps; }
  double zr() const { return zinf.read_MBps; }
  double fw() const { return fio.empty() ? 0 : fio[fio_write].write_MBps; }
  double fr() const { return fio.empty() ? 0 : fio[fio_read].read_MBps; }

  void Summarize() {
    zinf.Summarize();
    for (size_t i = 0; i < fio.size(); ++i) {
      fio[i].Summarize();
      if (fio[i].write_MBps > fio[fio_write].write_MBps) fio_write = i;
      if (fio[i].read_MBps > fio[fio_read].read_MBps) fio_read = i;
    }
  }
};

// Runs `c` reps times, interleaved with fio at the same configuration (or, with `grid`, with
// fio at every cell of the grid).
StatusOr<Result> Measure(const NvmeArgs& args, const std::string& fio, const Config& c, bool grid) {
  Result r;
  r.zinf.config = c;
  if (!fio.empty()) {
    if (grid) {
      for (uint64_t b : kGridBlocks) {
        for (int q : kGridDepths) r.fio.push_back(Runs{Config{c.size, b, q, 1}});
      }
    } else {
      r.fio.push_back(Runs{c});
    }
  }
  for (int rep = 0; rep < args.reps; ++rep) {
    ZINF_ASSIGN_OR_RETURN(Pair z, RunZinf(args, c));
    r.zinf.runs.push_back(z);
    if (!args.json) {
      fmt::print(stderr, "  rep {}: zinf write {:.0f} read {:.0f} MB/s", rep + 1, z.write_MBps,
                 z.read_MBps);
    }
    for (Runs& f : r.fio) {
      ZINF_ASSIGN_OR_RETURN(Pair p, RunFio(fio, args, f.config));
      f.runs.push_back(p);
      if (!args.json) {
        fmt::print(stderr, " | fio{} write {:.0f} read {:.0f}",
                   grid ? fmt::format(" {}/{}", FormatBytes(f.config.block), f.config.qd) : "",
                   p.write_MBps, p.read_MBps);
      }
    }
    if (!args.json) fmt::print(stderr, "\n");
  }
  r.Summarize();
  return r;
}

nlohmann::json RatioOrNull(double num, double den) {
  return den > 0 ? nlohmann::json(num / den) : nlohmann::json(nullptr);
}

nlohmann::json CellJson(const Runs& f) {
  return {{"block_size", f.config.block},
          {"queue_depth", f.config.qd},
          {"write_MBps", f.write_MBps},
          {"read_MBps", f.read_MBps}};
}

// The sweep as two panels, write and read: MB/s against block size, one curve per queue
// depth for zinf and (dashed, same color) for fio at the same settings.
struct SweepCell {
  uint64_t block = 0;
  int qd = 0;
  Pair zinf, fio;
};

Figure SweepFigure(const std::vector<SweepCell>& cells, bool have_fio, const std::string& what) {
  Figure f;
  f.title = "zinf bench nvme --sweep: " + what;
  for (int direction = 0; direction < 2; ++direction) {
    PlotPanel panel{.title = direction == 0 ? "sequential write" : "sequential read",
                    .x_label = "block size (KiB)",
                    .y_label = "MB/s",
                    .log_x = true};
    int color = 0;
    for (int q : kGridDepths) {
      ++color;
      PlotSeries z{.title = fmt::format("zinf, queue depth {}", q), .color = color};
      PlotSeries o{.title = fmt::format("fio, queue depth {}", q), .dashed = true, .color = color};
      for (const SweepCell& c : cells) {
        if (c.qd != q) continue;
        const double x = static_cast<double>(c.block) / kKiB;
        z.x.push_back(x);
        z.y.push_back(direction == 0 ? c.zinf.write_MBps : c.zinf.read_MBps);
        o.x.push_back(x);
        o.y.push_back(direction == 0 ? c.fio.write_MBps : c.fio.read_MBps);
      }
      panel.series.push_back(z);
      if (have_fio) panel.series.push_back(o);
    }
    f.panels.push_back(panel);
  }
  return f;
}

Status RunBenchNvme(const NvmeArgs& args) {
  AioOptions defaults;
  ZINF_ASSIGN_OR_RETURN(uint64_t size, ParseBytes(args.size));
  Config c;
  c.size = size;
  c.block = defaults.block_size;
  if (!args.block_size.empty()) {
    ZINF_ASSIGN_OR_RETURN(c.block, ParseBytes(args.block_size));
  }
  c.qd = args.queue_depth != -1 ? args.queue_depth : defaults.queue_depth;
  c.threads = args.threads != -1 ? args.threads : defaults.thread_count;
  const bool single_submit =
      args.single_submit != -1 ? args.single_submit != 0 : defaults.single_submit;
  if (args.reps < 1) return InvalidArgument(fmt::format("--reps must be >= 1, got {}", args.reps));
  if (!args.staging.empty()) {
    ZINF_ASSIGN_OR_RETURN(c.staging, ParseBytes(args.staging));
    if (c.staging == 0 || c.staging % kDirectIoAlignment != 0) {
      return InvalidArgument(fmt::format("--staging must be a positive multiple of {}, got {}",
                                         kDirectIoAlignment, args.staging));
    }
  }
  AioOptions check;
  check.block_size = c.block;
  check.queue_depth = c.qd;
  check.thread_count = c.threads;
  ZINF_RETURN_IF_ERROR(check.Validate());
  if (size < c.block) {
    return InvalidArgument(fmt::format("--size ({}) must be at least --block-size ({})",
                                       FormatBytes(size), FormatBytes(c.block)));
  }
  for (const std::string& p : args.paths) {
    struct stat st {};
    if (stat(p.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return InvalidArgument(fmt::format("--path {} is not an existing directory", p));
    }
  }
  if (!args.plot.empty()) {
    if (!args.sweep) return InvalidArgument("--plot draws the --sweep grid: give --sweep too");
    // Before the minutes of measuring: an unwritable path or a missing gnuplot fails now.
    ZINF_RETURN_IF_ERROR(CheckPlotOutput(args.plot));
  }
  const std::string fio = args.no_fio ? "" : FindFio();

  nlohmann::json out;
  out["benchmark"] = "nvme";
  out["config"] = {
      {"paths", args.paths},
      {"size_bytes", size},
      {"block_size", c.block},
      {"queue_depth", c.qd},
      {"thread_count", c.threads},
      {"single_submit", single_submit},
      {"staging_bytes",
       args.sweep ? nlohmann::json(nullptr) : nlohmann::json(StagingBytes(c, args.paths.size()))},
      {"backend", args.backend},
      {"direct_io", true},
      {"checksum", args.checksum},
      {"repetitions", args.reps},
      {"huge_pages", args.fio_huge_pages && !args.no_huge_pages},
      {"fio_huge_pages", args.fio_huge_pages},
      {"mode", args.sweep         ? "sweep"
               : args.vs_fio_grid ? "vs-fio-grid"
                                  : "single"}};
  out["fio"] = fio.empty() ? nlohmann::json(nullptr) : nlohmann::json(fio);
  if (!args.json) {
    fmt::print("zinf bench nvme: sequential write then read through SwapStore, O_DIRECT\n");
    fmt::print(
        "  paths {}  size {}  block {}  queue depth {}  rings {}  single submit {}  backend {}"
        "  checksum {}  repetitions {}{}\n",
        fmt::format("{}", fmt::join(args.paths, ",")), FormatBytes(size), FormatBytes(c.block),
        c.qd, c.threads, single_submit ? "on" : "off", args.backend, args.checksum ? "on" : "off",
        args.reps,
        fmt::format(
            "  staging {} in {}",
            args.sweep && c.staging == 0 ? "block x depth"
                                         : FormatBytes(StagingBytes(c, args.paths.size())),
            args.fio_huge_pages && !args.no_huge_pages ? "2 MiB huge pages" : "4 KiB pages"));
    if (fio.empty()) {
      fmt::print("  fio: {} — no limit measured\n", args.no_fio ? "disabled" : "not on PATH");
    } else {
      Config shown = c;
      fmt::print("  limit: {} (interleaved with zinf's runs{})\n",
                 FioCommand(fio, args, shown, "write|read"),
                 args.vs_fio_grid ? "; best of bs {128K,1M,8M} x iodepth {8,32}" : "");
    }
  }

  std::fflush(stdout);
  if (args.sweep) {
    if (!args.json) {
      fmt::print("\n{:>8} {:>4} | {:>9} {:>9} {:>6} | {:>9} {:>9} {:>6}\n", "block", "qd", "zinf W",
                 "fio W", "ratio", "zinf R", "fio R", "ratio");
    }
    nlohmann::json rows = nlohmann::json::array();
    std::vector<SweepCell> cells;
    for (uint64_t b : kGridBlocks) {
      for (int q : kGridDepths) {
        ZINF_ASSIGN_OR_RETURN(Result r,
                              Measure(args, fio, Config{size, b, q, c.threads, c.staging}, false));
        rows.push_back({{"block_size", b},
                        {"queue_depth", q},
                        {"write_MBps", r.zw()},
                        {"read_MBps", r.zr()},
                        {"fio_write_MBps", r.fw()},
                        {"fio_read_MBps", r.fr()},
                        {"write_ratio", RatioOrNull(r.zw(), r.fw())},
                        {"read_ratio", RatioOrNull(r.zr(), r.fr())}});
        cells.push_back({b, q, {r.zw(), r.zr()}, {r.fw(), r.fr()}});
        if (!args.json) {
          fmt::print("{:>8} {:>4} | {:>9.0f} {:>9.0f} {:>6.3f} | {:>9.0f} {:>9.0f} {:>6.3f}\n",
                     FormatBytes(b), q, r.zw(), r.fw(), r.fw() > 0 ? r.zw() / r.fw() : 0.0, r.zr(),
                     r.fr(), r.fr() > 0 ? r.zr() / r.fr() : 0.0);
          std::fflush(stdout);
        }
      }
    }
    out["sweep"] = rows;
    if (args.json) fmt::print("{}\n", out.dump());
    if (!args.plot.empty()) {
      const std::string what = fmt::format("{} through {}{}, median of {}", FormatBytes(size),
                                           fmt::format("{}", fmt::join(args.paths, ",")),
                                           args.checksum ? " with CRC32C" : "", args.reps);
      ZINF_RETURN_IF_ERROR(WritePlot(SweepFigure(cells, !fio.empty(), what), args.plot));
      if (!args.json) fmt::print("wrote {}\n", args.plot);
    }
    return OkStatus();
  }

  ZINF_ASSIGN_OR_RETURN(Result r, Measure(args, fio, c, args.vs_fio_grid));
  out["write_MBps"] = r.zw();
  out["read_MBps"] = r.zr();
  out["fio_write_MBps"] = fio.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.fw());
  out["fio_read_MBps"] = fio.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.fr());
  out["write_ratio"] = RatioOrNull(r.zw(), r.fw());
  out["read_ratio"] = RatioOrNull(r.zr(), r.fr());
  nlohmann::json runs = nlohmann::json::array();
  for (size_t i = 0; i < r.zinf.runs.size(); ++i) {
    const Pair& z = r.zinf.runs[i];
    nlohmann::json run = {{"write_MBps", z.write_MBps}, {"read_MBps", z.read_MBps}};
    if (!r.fio.empty()) {
      run["fio_write_MBps"] = r.fio[r.fio_write].runs[i].write_MBps;
      run["fio_read_MBps"] = r.fio[r.fio_read].runs[i].read_MBps;
    }
    runs.push_back(run);
  }
  if (args.vs_fio_grid && !r.fio.empty()) {
    nlohmann::json cells = nlohmann::json::array();
    for (const Runs& f : r.fio) cells.push_back(CellJson(f));
    out["fio_grid"] = cells;
    out["fio_best_write"] = CellJson(r.fio[r.fio_write]);
    out["fio_best_read"] = CellJson(r.fio[r.fio_read]);
  }
  out["runs"] = runs;
  if (args.json) {
    fmt::print("{}\n", out.dump());
    return OkStatus();
  }
  auto line = [&](const char* dir, double z, double f, size_t cell) {
    if (r.fio.empty()) {
      fmt::print("{:<5} zinf {:>7.0f} MB/s\n", dir, z);
      return;
    }
    const std::string what =
        args.vs_fio_grid ? fmt::format("fio best of grid ({} QD {})",
                                       FormatBytes(r.fio[cell].config.block), r.fio[cell].config.qd)
                         : "fio";
    fmt::print("{:<5} zinf {:>7.0f} MB/s   {} {:>7.0f} MB/s   ratio {:.3f}\n", dir, z, what, f,
               z / f);
  };
  fmt::print("median of {}:\n", args.reps);
  line("write", r.zw(), r.fw(), r.fio_write);
  line("read", r.zr(), r.fr(), r.fio_read);
  return OkStatus();
}

}  // namespace

StatusOr<NvmeFigures> MeasureNvmeDefaults(const std::vector<std::string>& paths,
                                          uint64_t size_bytes, int reps) {
  if (paths.empty()) return InvalidArgument("no NVMe path to measure");
  if (reps < 1) return InvalidArgument(fmt::format("reps must be >= 1, got {}", reps));
  for (const std::string& p : paths) {
    struct stat st {};
    if (stat(p.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return InvalidArgument(fmt::format("--path {} is not an existing directory", p));
    }
  }
  NvmeArgs args;  // the engine's defaults, as `zinf bench nvme` without flags
  args.paths = paths;
  args.checksum = EngineConfig().nvme_checksum;
  // Staged as the engine's host tier is (transparent huge pages where the kernel gives them),
  // since the plan prices the engine's transfers: on a virtual disk a 1 MiB request into 4 KiB
  // pages is split, and measured at a third of what the engine moves (bench/RESULTS.md).
  args.fio_huge_pages = HostAllocOptions().huge_pages;
  AioOptions defaults;
  Config c;
  c.size = std::max<uint64_t>(size_bytes, defaults.block_size);
  c.block = defaults.block_size;
  c.qd = defaults.queue_depth;
  c.threads = defaults.thread_count;
  std::vector<double> w, r, m;
  for (int i = 0; i < reps; ++i) {
    ZINF_ASSIGN_OR_RETURN(Pair p, RunZinf(args, c, /*mixed=*/true));
    w.push_back(p.write_MBps);
    r.push_back(p.read_MBps);
    m.push_back(p.mixed_MBps);
  }
  return NvmeFigures{Median(w), Median(r), Median(m)};
}

StatusOr<NvmeLatency> MeasureNvmeLatency(const std::vector<std::string>& paths,
                                         uint64_t request_bytes, int requests) {
  if (paths.empty()) return InvalidArgument("no NVMe path to measure");
  if (requests < 1) return InvalidArgument(fmt::format("requests must be >= 1, got {}", requests));
  SwapStoreOptions o;  // the engine's defaults
  o.paths = paths;
  o.capacity_bytes = std::max<uint64_t>(8 * kMiB, 2 * request_bytes);
  o.checksum = EngineConfig().nvme_checksum;
  ZINF_ASSIGN_OR_RETURN(auto store, SwapStore::Open(o));
  const uint64_t bytes = AlignUp(request_bytes, kDirectIoAlignment);
  ZINF_ASSIGN_OR_RETURN(HostBuffer buffer, HostBuffer::Allocate(bytes));
  std::memset(buffer.data(), 7, bytes);
  ZINF_ASSIGN_OR_RETURN(SwapExtent extent, store->Allocate(bytes, "latency"));
  IoWaiter waiter;
  std::vector<double> writes, reads;
  for (int i = 0; i < requests + 2; ++i) {  // two to warm up
    auto t0 = std::chrono::steady_clock::now();
    waiter.Add();
    store->WriteAsync(extent, buffer.data(), waiter.Callback());
    ZINF_RETURN_IF_ERROR(waiter.Wait());
    auto t1 = std::chrono::steady_clock::now();
    waiter.Add();
    store->ReadAsync(extent, buffer.data(), waiter.Callback());
    ZINF_RETURN_IF_ERROR(waiter.Wait());
    auto t2 = std::chrono::steady_clock::now();
    if (i >= 2) {
      writes.push_back(Seconds(t0, t1));
      reads.push_back(Seconds(t1, t2));
    }
  }
  return NvmeLatency{Median(writes) * 1e6, Median(reads) * 1e6};
}

void AddBenchNvmeCommand(CLI::App& bench) {
  auto args = std::make_shared<NvmeArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "nvme", "Sequential write and read through SwapStore (O_DIRECT) against fio, interleaved");
  cmd->add_option("--path", args->paths, "Directory for the swap files (repeat to stripe)")
      ->required();
  cmd->add_option("--size", args->size, "Bytes to write and read (e.g. 4GiB)")
      ->capture_default_str();
  cmd->add_option("--block-size", args->block_size, "aio.block_size (default: zinf's)");
  cmd->add_option("--queue-depth", args->queue_depth, "aio.queue_depth (default: zinf's)");
  cmd->add_option("--threads", args->threads, "aio.thread_count: rings (default: zinf's)");
  cmd->add_option("--backend", args->backend, "io_uring, posix or auto")
      ->check(CLI::IsMember({"io_uring", "posix", "auto"}))
      ->capture_default_str();
  cmd->add_option("--reps", args->reps, "Repetitions (median reported)")->capture_default_str();
  cmd->add_option("--single-submit", args->single_submit,
                  "aio.single_submit: 1 submits every piece alone, 0 in batches (default: zinf's)");
  cmd->add_option("--staging", args->staging,
                  "Bytes of staging buffer the extents move through (default: block size x queue "
                  "depth x rings x paths, the bytes fio's buffers span)");
  cmd->add_flag("--json", args->json, "Print one JSON object");
  cmd->add_flag("--sweep", args->sweep, "Grid of block sizes {128K,1M,8M} x queue depths {8,32}");
  cmd->add_option("--plot", args->plot,
                  "With --sweep: write a PNG of MB/s against block size per queue depth, zinf "
                  "and fio (gnuplot)");
  cmd->add_flag("--vs-fio-grid", args->vs_fio_grid,
                "Compare with fio's best over the sweep grid instead of fio at the same settings");
  cmd->add_flag("--no-fio", args->no_fio, "Do not run fio");
  cmd->add_flag("--checksum", args->checksum, "CRC32C on write, verified on read");
  cmd->add_flag("--fio-huge-pages", args->fio_huge_pages,
                "Both sides on 2 MiB pages: fio's buffers (--mem=shmhuge; needs vm.nr_hugepages "
                ">= block size x queue depth / 2 MiB) and zinf's staging (transparent huge "
                "pages); without it both are on 4 KiB pages");
  cmd->add_flag("--no-huge-pages", args->no_huge_pages,
                "zinf stages through 4 KiB pages even with --fio-huge-pages");
  cmd->callback([args] { Report("zinf bench nvme", RunBenchNvme(*args)); });
}

}  // namespace zinf::tools
