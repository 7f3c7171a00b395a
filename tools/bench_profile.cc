// `zinf bench profile`: measures this machine once, into the JSON machine profile `zinf plan`
// reads (tools/plan_model.h, MachineProfile::FromJson): the 2-rank collectives (Gloo on
// loopback: latency and all-gather / reduce-scatter bandwidth), NVMe write and read through
// SwapStore at the engine's aio defaults (`zinf bench nvme`'s code), the CPU optimizer's rate
// per thread count and the machine's memory bandwidth (`zinf bench adam`'s code and limit
// kernel), the host/device link (`zinf bench pcie`'s code: the GPU's PCIe link, else the host
// device's modelled link or memcpy), oneDNN matmul throughput in fp32 and bf16 per thread
// count (the GPT example's kernels), and a plain fp32 loop on one thread (the MLP example's).
// --quick measures small sizes once each, in seconds, for tests; the default takes a minute
// or two.
//
// Progress goes to stderr (a bar on a terminal, a line per stage otherwise); the profile to
// --out, or stdout.
//
// The collectives run first, in two forked processes, before this process starts any thread.
#include <fmt/core.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/units.h"
#include "tools/bench_kernels.h"
#include "tools/bench_measure.h"
#include "tools/bench_util.h"
#include "tools/commands.h"
#include "zero/process_group.h"
#include "zinf/cpu_info.h"
#include "zinf/device.h"
#include "zinf/engine.h"

namespace zinf::tools {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// CPU seconds this process has run, every thread, user and system.
double ProcessCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

struct ProfileArgs {
  std::vector<std::string> paths;
  std::string out;
  bool quick = false;
  bool no_collective = false;
  // Bytes each NVMe figure writes and reads. A virtual disk with a cache in front of it
  // answers a few GiB from the cache: measure at the swap space the run will use.
  std::string nvme_size = "2GiB";
};

// Progress on stderr: a bar redrawn in place on a terminal, one line per stage otherwise.
class Progress {
 public:
  explicit Progress(int stages) : stages_(stages), tty_(isatty(STDERR_FILENO) != 0) {}
  void Start(const std::string& what) {
    ++done_;
    constexpr int kWidth = 24;
    const int filled = kWidth * (done_ - 1) / stages_;
    if (tty_) {
      fmt::print(stderr, "\r[{}{}] {}/{} {:<48}", std::string(filled, '#'),
                 std::string(kWidth - filled, '-'), done_, stages_, what);
    } else {
      fmt::print(stderr, "[{}/{}] {}\n", done_, stages_, what);
    }
    std::fflush(stderr);
  }
  void Finish() {
    if (tty_)
      fmt::print(stderr, "\r[{}] {}/{} {:<48}\n", std::string(24, '#'), stages_, stages_, "done");
  }

 private:
  const int stages_;
  const bool tty_;
  int done_ = 0;
};

// ---- Collectives: two ranks over Gloo on loopback ----

// The mean time a fetch waits for its module's all-gather after `compute_us` of compute on
// the rank's thread (Note [Loaded rendezvous]).
struct LoadedWait {
  double compute_us = 0, wait_us = 0;
  double step_us = 0;  // Engine::Step, whose norm all-reduce is the batch's first rendezvous
};

// Engine::Step of the two-rank fetch loop, parameters in memory and then on NVMe (Note
// [Loaded shard writes]).
struct LoadedWrites {
  int shards = 0;  // per rank, each written once a step
  uint64_t shard_bytes = 0;
  double memory_step_us = 0, nvme_step_us = 0;
};

struct CollectiveFigures {
  double latency_us = 0;
  double allgather_GBps = 0, reduce_scatter_GBps = 0;  // full buffer bytes / time
  // A rank's CPU time (every thread of its process, user and system), per one-element
  // collective and per byte of the full buffer (Note [Collectives' CPU]).
  double cpu_us_per_collective = 0, cpu_ns_per_byte = 0;
  std::vector<LoadedWait> loaded;
  LoadedWrites writes;  // measured when the profile has an NVMe path
};

StatusOr<int> FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return ErrnoStatus(errno, "socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const int err = errno;
    close(fd);
    return ErrnoStatus(err, "finding a free port");
  }
  close(fd);
  return ntohs(addr.sin_port);
}

// Note [Collectives' CPU]
// A collective over Gloo on loopback is CPU work: the communicator's thread packs and hands the
// buffers over, Gloo's own thread receives, the kernel copies every byte through the socket
// twice and wakes the threads on both ends. With two ranks on two cores, their compute threads
// fill the machine, and that CPU comes out of the compute: the demo GPT's forward and backward
// take about a fifth longer on two ranks than two independent one-rank runs side by side, about
// what its ranks' helper threads spend (their time in /proc/PID/task/*/stat; the threads are
// named zinf-*). So the profile reads the rank's CPU clock (every thread, user and system)
// around its collectives: per one-element collective, and per byte of a 4 MiB one beyond that,
// each over a whole loop, since other threads' time reaches the clock only at their context
// switches. The plan charges the step's collectives at these rates to the compute when every
// core computes.
//
// Note [Loaded rendezvous]
// An idle ping-pong measures a collective's latency when both ranks are waiting for it. In
// training neither is: each rank computes while its next module's all-gather is in flight
// (ParamTier::PrefetchGathers), and the collective needs both ranks' communicator threads to
// run. Where the ranks' threads fill every core (two ranks on two cores) those threads wait for
// the scheduler, and a rank that reaches the fetch first waits for the other's compute to
// finish: each rendezvous costs far more than its idle latency, and how much depends on how
// much compute there was to hide it. So the profile runs the engine's own fetch loop on two
// ranks (small stage-3 modules gathered per fetch, a fixed burst of compute on the rank's
// thread between fetches, forward then backward, as a trainer does) and records the mean wait
// per fetch (StepSummary: seconds_gather / gather_collectives) for bursts from 0.25 to 8 ms.
// The plan charges each gather the wait measured after the compute it had to hide behind.

// A burst of fp32 work on this thread; `rounds` sets its length.
float Burst(std::vector<float>& x, int rounds) {
  float s = 0;
  for (int r = 0; r < rounds; ++r)
    for (float& v : x) s += v = v * 0.999f + 1e-3f;
  return s;
}

// Burst rounds a microsecond on this thread.
double BurstRoundsPerMicrosecond(std::vector<float>& x) {
  volatile float sink = Burst(x, 4);
  const auto t0 = Clock::now();
  sink = sink + Burst(x, 64);
  return 64 / (Since(t0) * 1e6);
}

// One batch of a trainer's fetch loop over `modules` modules: forward then backward, a burst
// of `rounds` after each fetch, backward's gradients reduced. Adds the bursts' seconds to
// `computed` and their count to `bursts`; the caller steps.
Status FetchLoopBatch(Engine& engine, int modules, std::vector<float>& x, int rounds,
                      double* computed, int* bursts) {
  volatile float sink = 0;
  for (int k = 0; k < 2 * modules; ++k) {
    const int id = k < modules ? k : 2 * modules - 1 - k;
    ZINF_RETURN_IF_ERROR(engine.Fetch(id).status());
    const auto t0 = Clock::now();
    sink = sink + Burst(x, rounds);
    *computed += Since(t0);
    ++*bursts;
    if (k >= modules) {
      ZINF_RETURN_IF_ERROR(engine.Gradients(id).status());
      ZINF_RETURN_IF_ERROR(engine.ReduceGradients(id));
    }
    ZINF_RETURN_IF_ERROR(engine.Release(id));
  }
  return OkStatus();
}

StatusOr<std::vector<LoadedWait>> MeasureLoadedWaits(int rank, int port, bool quick) {
  ZINF_ASSIGN_OR_RETURN(EngineConfig config, EngineConfig::FromJson(R"({
      "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}})"));
  ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                        Engine::Create(config, {.device = "host",
                                                .rank = rank,
                                                .world_size = 2,
                                                .master_port = port,
                                                .timeout = std::chrono::seconds(60),
                                                .optimizer_threads = 1}));
  constexpr int kModules = 8;
  for (int i = 0; i < kModules; ++i) {
    ZINF_RETURN_IF_ERROR(
        engine->RegisterModule(fmt::format("m{}", i), {{fmt::format("w{}", i), {1024}}}).status());
  }
  ZINF_RETURN_IF_ERROR(engine->Initialize());
  std::vector<float> x(16 * 1024, 1.0f);
  const double rounds_per_us = BurstRoundsPerMicrosecond(x);
  std::vector<LoadedWait> out;
  const std::vector<double> bursts_us = quick
                                            ? std::vector<double>{500, 2000}
                                            : std::vector<double>{250, 500, 1000, 2000, 4000, 8000};
  for (const double us : bursts_us) {
    const int rounds = std::max(1, static_cast<int>(std::lround(us * rounds_per_us)));
    double waited = 0, collectives = 0, computed = 0, stepped = 0;
    int computed_n = 0;
    const int steps = quick ? 4 : 22;
    for (int step = 0; step < steps; ++step) {
      ZINF_RETURN_IF_ERROR(FetchLoopBatch(*engine, kModules, x, rounds, &computed, &computed_n));
      const auto t0 = Clock::now();
      ZINF_ASSIGN_OR_RETURN(StepSummary summary, engine->Step());
      if (step >= 2) {  // the first batch records the fetch order the prefetch follows
        stepped += Since(t0);
        waited += summary.seconds_gather;
        collectives += static_cast<double>(summary.gather_collectives);
      }
    }
    out.push_back({.compute_us = computed / computed_n * 1e6,
                   .wait_us = collectives > 0 ? waited / collectives * 1e6 : 0,
                   .step_us = stepped / (steps - 2) * 1e6});
  }
  return out;
}

// Note [Loaded shard writes]
// With its parameters on NVMe, every step writes each updated shard back to its swap file
// (ParamTier::WriteFp32), one request a shard, all in flight together (Note [Batched
// write-backs] in offload/tiered_store.cc). Alone, they cost the disk's latency per queue
// depth of them. With two ranks on a machine whose cores they fill, each request also waits
// for a core: to be submitted, and for the ring's reaper to complete it. So the profile runs the
// fetch loop on two ranks with many small shards (1 KiB a rank: the bytes cost nothing), once with
// the parameters in memory and once on NVMe, and takes the difference of their Steps per shard
// as what a rank pays per shard it writes back. The plan charges it for each shard of a step's
// write-back on several ranks.
StatusOr<LoadedWrites> MeasureLoadedWrites(int rank, const int ports[2],
                                           const std::string& nvme_path, bool quick) {
  constexpr int kModules = 8, kParams = 8;
  constexpr uint64_t kElements = 512;
  std::vector<float> x(16 * 1024, 1.0f);
  // 1 ms of compute a fetch, about the demo GPT's.
  const int rounds =
      std::max(1, static_cast<int>(std::lround(1000 * BurstRoundsPerMicrosecond(x))));
  LoadedWrites out{.shards = kModules * kParams, .shard_bytes = kElements / 2 * 4};
  for (int nvme = 0; nvme < 2; ++nvme) {
    const std::string placement =
        nvme ? fmt::format(R"({{"device": "nvme", "nvme_path": "{}"}})", nvme_path)
             : R"({"device": "none"})";
    ZINF_ASSIGN_OR_RETURN(
        EngineConfig config,
        EngineConfig::FromJson(fmt::format(
            R"({{"zero_optimization": {{"stage": 3, "stage3_param_persistence_threshold": 0,
                 "offload_param": {}, "offload_optimizer": {{"device": "cpu"}}}}}})",
            placement)));
    ZINF_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine,
                          Engine::Create(config, {.device = "host",
                                                  .rank = rank,
                                                  .world_size = 2,
                                                  .master_port = ports[nvme],
                                                  .timeout = std::chrono::seconds(60),
                                                  .optimizer_threads = 1}));
    for (int i = 0; i < kModules; ++i) {
      std::vector<ParamSpec> params;
      for (int j = 0; j < kParams; ++j)
        params.push_back({fmt::format("w{}_{}", i, j), {kElements}});
      ZINF_RETURN_IF_ERROR(engine->RegisterModule(fmt::format("m{}", i), params).status());
    }
    ZINF_RETURN_IF_ERROR(engine->Initialize());
    std::vector<double> steps;
    double computed = 0;
    int bursts = 0;
    for (int step = 0; step < (quick ? 4 : 22); ++step) {
      ZINF_RETURN_IF_ERROR(FetchLoopBatch(*engine, kModules, x, rounds, &computed, &bursts));
      const auto t0 = Clock::now();
      ZINF_RETURN_IF_ERROR(engine->Step().status());
      if (step >= 2) steps.push_back(Since(t0));  // after the batch that records the order
    }
    (nvme ? out.nvme_step_us : out.memory_step_us) = Median(steps) * 1e6;
  }
  return out;
}

// One rank's part: latency of a one-element all-gather, then all-gathers and reduce-scatters
// of `elements` fp32 in all (the gathered, and the reduced, buffer). Rank 0's figures.
StatusOr<CollectiveFigures> RunRank(int rank, const int ports[4], const std::string& nvme_path,
                                    uint64_t elements, int reps, bool quick) {
  ProcessPlace place;
  place.global_rank = place.rank = place.local_rank = rank;
  place.global_size = place.size = 2;
  place.name = "profile";
  place.master_addr = "127.0.0.1";
  place.master_port = ports[0];
  ZINF_ASSIGN_OR_RETURN(ProcessGroup group, ConnectProcessGroup(place, std::chrono::seconds(60)));
  Communicator& comm = *group.comm;
  CollectiveFigures f;
  std::vector<float> one(1), two(2);
  // The CPU clock over the whole loop: other threads' time reaches it only at their context
  // switches and ticks, too coarse for one collective.
  std::vector<double> lat;
  const int small = quick ? 100 : 400;
  double cpu0 = 0;
  for (int i = 0; i < 10 + small; ++i) {
    if (i == 10) cpu0 = ProcessCpuSeconds();
    const auto t0 = Clock::now();
    ZINF_RETURN_IF_ERROR(comm.AllGather(one.data(), two.data(), 1, ElementType::kFp32));
    if (i >= 10) lat.push_back(Since(t0));
  }
  const double small_cpu = (ProcessCpuSeconds() - cpu0) / small;
  f.latency_us = Median(lat) * 1e6;
  f.cpu_us_per_collective = small_cpu * 1e6;
  std::vector<float> full(elements, 1.0f), part(elements / 2, 1.0f);
  std::vector<double> ag, rs;
  for (int i = 0; i < reps + 1; ++i) {
    ZINF_RETURN_IF_ERROR(comm.Barrier());
    auto t0 = Clock::now();
    ZINF_RETURN_IF_ERROR(
        comm.AllGather(part.data(), full.data(), elements / 2, ElementType::kFp32));
    if (i > 0) ag.push_back(Since(t0));
    ZINF_RETURN_IF_ERROR(comm.Barrier());
    t0 = Clock::now();
    ZINF_RETURN_IF_ERROR(comm.ReduceScatter(full.data(), part.data(), elements / 2,
                                            ElementType::kFp32, ReduceOp::kSum));
    if (i > 0) rs.push_back(Since(t0));
  }
  const double bytes = static_cast<double>(elements / 2 * 2) * 4;
  f.allgather_GBps = bytes / Median(ag) / 1e9;
  f.reduce_scatter_GBps = bytes / Median(rs) / 1e9;
  // The CPU per byte at a module's size (4 MiB gathered), which stays in the cache as the
  // engine's buckets and gathered modules do: all-gathers and reduce-scatters back to back.
  constexpr uint64_t kModuleElements = 1u << 20;
  const int module_reps = quick ? 8 : 32;
  ZINF_RETURN_IF_ERROR(comm.Barrier());
  cpu0 = ProcessCpuSeconds();
  for (int i = 0; i < module_reps; ++i) {
    ZINF_RETURN_IF_ERROR(
        comm.AllGather(part.data(), full.data(), kModuleElements / 2, ElementType::kFp32));
    ZINF_RETURN_IF_ERROR(comm.ReduceScatter(full.data(), part.data(), kModuleElements / 2,
                                            ElementType::kFp32, ReduceOp::kSum));
  }
  const double module_cpu = (ProcessCpuSeconds() - cpu0) / (2 * module_reps);
  f.cpu_ns_per_byte = std::max(0.0, module_cpu - small_cpu) / (kModuleElements * 4.0) * 1e9;
  ZINF_ASSIGN_OR_RETURN(f.loaded, MeasureLoadedWaits(rank, ports[1], quick));
  if (!nvme_path.empty()) {
    ZINF_ASSIGN_OR_RETURN(f.writes, MeasureLoadedWrites(rank, ports + 2, nvme_path, quick));
  }
  return f;
}

// Forks the two ranks; rank 0's figures come back through a pipe.
StatusOr<CollectiveFigures> MeasureCollectives(const std::string& nvme_path, bool quick) {
  int ports[4];
  for (int& port : ports) {
    ZINF_ASSIGN_OR_RETURN(port, FreePort());
  }
  const uint64_t elements = quick ? (1u << 20) : (16u << 20);
  const int reps = quick ? 2 : 5;
  int fds[2];
  if (pipe(fds) != 0) return ErrnoStatus(errno, "pipe");
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pids[2] = {-1, -1};
  for (int rank = 0; rank < 2; ++rank) {
    pids[rank] = fork();
    if (pids[rank] < 0) return ErrnoStatus(errno, "fork");
    if (pids[rank] == 0) {
      close(fds[0]);
      StatusOr<CollectiveFigures> f = RunRank(rank, ports, nvme_path, elements, reps, quick);
      std::string line = "error " + f.status().ToString() + "\n";
      if (f.ok()) {
        line = fmt::format("ok {} {} {} {} {} {}", f->latency_us, f->allgather_GBps,
                           f->reduce_scatter_GBps, f->cpu_us_per_collective, f->cpu_ns_per_byte,
                           f->loaded.size());
        for (const LoadedWait& w : f->loaded) {
          line += fmt::format(" {} {} {}", w.compute_us, w.wait_us, w.step_us);
        }
        const LoadedWrites& v = f->writes;
        line +=
            fmt::format(" {} {} {} {}", v.shards, v.shard_bytes, v.memory_step_us, v.nvme_step_us);
        line += "\n";
      }
      if (rank == 0 || !f.ok()) (void)!write(fds[1], line.data(), line.size());
      _exit(f.ok() ? 0 : 1);
    }
  }
  close(fds[1]);
  std::string text;
  char buf[512];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) text.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  for (pid_t pid : pids) waitpid(pid, nullptr, 0);
  CollectiveFigures f;
  std::istringstream in(text);
  std::string ok;
  size_t loaded = 0;
  in >> ok >> f.latency_us >> f.allgather_GBps >> f.reduce_scatter_GBps >>
      f.cpu_us_per_collective >> f.cpu_ns_per_byte >> loaded;
  f.loaded.resize(in ? loaded : 0);
  for (LoadedWait& w : f.loaded) in >> w.compute_us >> w.wait_us >> w.step_us;
  LoadedWrites& v = f.writes;
  in >> v.shards >> v.shard_bytes >> v.memory_step_us >> v.nvme_step_us;
  if (ok != "ok" || !in) {
    return Unavailable(fmt::format("the 2-rank collectives failed: {}",
                                   text.empty() ? "no figures from rank 0" : text));
  }
  return f;
}

// ---- Compute ----

std::vector<int> ThreadCounts(int cpus) {
  std::vector<int> counts;
  for (int t = 1; t < cpus; t *= 2) counts.push_back(t);
  counts.push_back(cpus);
  return counts;
}

Status RunProfile(const ProfileArgs& args) {
  const CpuInfo& cpu = GetCpuInfo();
  const int cpus = std::max(1, cpu.usable_cpus);
  const std::vector<int> thread_counts = ThreadCounts(cpus);
  std::vector<std::string> paths = args.paths;
  if (paths.empty()) paths.push_back(".");
  uint64_t nvme_size = 64 * kMiB;
  if (!args.quick) {
    ZINF_ASSIGN_OR_RETURN(nvme_size, ParseBytes(args.nvme_size));
    if (nvme_size < kMiB) {
      return InvalidArgument(
          fmt::format("--nvme-size must be at least 1MiB (one request), got {}", args.nvme_size));
    }
  }
  // Three repetitions of a few GiB; one of a file that long, which averages over its length.
  const int nvme_reps = args.quick || nvme_size > 8 * kGiB ? 1 : 3;
  const int stages =
      3 + 2 * static_cast<int>(thread_counts.size()) + (args.no_collective ? 0 : 1) + 1;
  Progress progress(stages);
  nlohmann::json out;
  out["zinf_profile"] = 1;
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  out["date"] = date;
  out["quick"] = args.quick;
  out["machine"] = {{"host", host},
                    {"cpu", cpu.model_name},
                    {"isa", IsaSummary(cpu.isa)},
                    {"cores", cpus},
                    {"memory_bytes", cpu.total_memory_bytes},
                    {"gpu_memory_bytes", nullptr}};

  // Collectives first: fork before any thread exists.
  if (!args.no_collective) {
    progress.Start("collectives: 2 ranks over Gloo on loopback");
    StatusOr<CollectiveFigures> c = MeasureCollectives(paths.front(), args.quick);
    if (c.ok()) {
      out["collective"] = {{"world_size", 2},
                           {"backend", "gloo"},
                           {"latency_us", c->latency_us},
                           {"allgather_GBps", c->allgather_GBps},
                           {"reduce_scatter_GBps", c->reduce_scatter_GBps},
                           {"cpu_us_per_collective", c->cpu_us_per_collective},
                           {"cpu_ns_per_byte", c->cpu_ns_per_byte},
                           {"loaded", nlohmann::json::array()}};
      for (const LoadedWait& w : c->loaded) {
        out["collective"]["loaded"].push_back(
            {{"compute_us", w.compute_us}, {"wait_us", w.wait_us}, {"step_us", w.step_us}});
      }
      const LoadedWrites& v = c->writes;
      out["collective"]["loaded_writes"] = {{"shards", v.shards},
                                            {"shard_bytes", v.shard_bytes},
                                            {"memory_step_us", v.memory_step_us},
                                            {"nvme_step_us", v.nvme_step_us}};
    } else {
      out["collective"] = {{"error", c.status().ToString()}};
    }
  }

  // Free space before the measurement's own files take any (freeing a large file's blocks can
  // lag behind its unlink).
  uint64_t free_bytes = 0;
  std::set<unsigned long> filesystems;
  for (const std::string& p : paths) {
    struct statvfs st {};
    if (statvfs(p.c_str(), &st) == 0 && filesystems.insert(st.f_fsid).second) {
      free_bytes += static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
    }
  }
  progress.Start(
      "NVMe write, read and both at once at the engine's aio defaults, and one request's latency");
  ZINF_ASSIGN_OR_RETURN(NvmeFigures nvme, MeasureNvmeDefaults(paths, nvme_size, nvme_reps));
  ZINF_ASSIGN_OR_RETURN(NvmeLatency latency,
                        MeasureNvmeLatency(paths, 64 * kKiB, args.quick ? 10 : 50));
  // Each path on its own too, where the swap files stripe over several.
  nlohmann::json per_path = nlohmann::json::array();
  if (paths.size() > 1) {
    for (const std::string& p : paths) {
      ZINF_ASSIGN_OR_RETURN(NvmeFigures one, MeasureNvmeDefaults({p}, nvme_size, nvme_reps));
      per_path.push_back(
          {{"path", p}, {"write_MBps", one.write_MBps}, {"read_MBps", one.read_MBps}});
    }
  }
  out["nvme"] = {{"paths", paths},
                 {"per_path", per_path},
                 {"size_bytes", nvme_size},
                 {"write_MBps", nvme.write_MBps},
                 {"read_MBps", nvme.read_MBps},
                 {"mixed_MBps", nvme.mixed_MBps},
                 {"write_latency_us", latency.write_us},
                 {"read_latency_us", latency.read_us},
                 {"free_bytes", free_bytes}};

  double memory_GBps = 0;
  nlohmann::json optimizer = nlohmann::json::array();
  const uint64_t adam_params = args.quick ? (2u << 20) : (32u << 20);
  for (int t : thread_counts) {
    progress.Start(fmt::format("CPU AdamW and memory bandwidth, {} thread(s)", t));
    ZINF_ASSIGN_OR_RETURN(AdamFigures a, MeasureAdamRate(adam_params, t, args.quick ? 2 : 5));
    optimizer.push_back(
        {{"threads", a.threads}, {"params_per_s", a.params_per_s}, {"limit_GBps", a.limit_GBps}});
    memory_GBps = std::max(memory_GBps, a.limit_GBps);
  }
  out["cpu_optimizer"] = optimizer;
  out["memory_GBps"] = memory_GBps;

  progress.Start("host/device link");
  ZINF_ASSIGN_OR_RETURN(LinkFigures link,
                        MeasureLink(args.quick ? 4 * kMiB : 64 * kMiB, args.quick ? 2 : 5));
  out["link"] = {{"kind", link.gpu              ? "pcie"
                          : link.model_GBps > 0 ? "host-model"
                                                : "host-memcpy"},
                 {"device", link.device},
                 {"model_GBps", link.model_GBps},
                 {"h2d_GBps", link.h2d_GBps},
                 {"d2h_GBps", link.d2h_GBps}};
  // The GPU whose link was measured (cuda:0) is the one a plan from this profile computes
  // on: without its memory the plan would place everything as on the host device.
  if (link.gpu) {
    const GpuReport gpus = ProbeGpus();
    if (!gpus.gpus.empty()) {
      out["machine"]["gpu"] = gpus.gpus.front().name;
      out["machine"]["gpu_memory_bytes"] = gpus.gpus.front().total_memory_bytes;
    }
  }
  // A link that is memcpy has no rate of its own: the plan uses memory bandwidth for it.
  if (!link.gpu && link.model_GBps == 0) {
    out["link"]["h2d_GBps"] = nullptr;
    out["link"]["d2h_GBps"] = nullptr;
    out["link"]["memcpy_h2d_GBps"] = link.h2d_GBps;
  }

  nlohmann::json matmul = nlohmann::json::array();
  nlohmann::json call_overhead = nlohmann::json::array();
  for (int t : thread_counts) {
    progress.Start(fmt::format("oneDNN matmul fp32 and bf16, {} thread(s)", t));
    for (int64_t tokens : {128, 512}) {
      for (int64_t d : {128, 512, 2048}) {
        nlohmann::json row = {{"threads", t},
                              {"d", d},
                              {"tokens", tokens},
                              {"fp32_GFLOPs", nullptr},
                              {"bf16_GFLOPs", nullptr}};
#ifdef ZINF_TOOLS_HAVE_DNNL
        ZINF_ASSIGN_OR_RETURN(row["fp32_GFLOPs"], OneDnnGflops(false, t, d, tokens, args.quick));
        if (HasNativeBf16()) {
          ZINF_ASSIGN_OR_RETURN(row["bf16_GFLOPs"], OneDnnGflops(true, t, d, tokens, args.quick));
        }
#endif
        matmul.push_back(row);
      }
    }
#ifdef ZINF_TOOLS_HAVE_DNNL
    ZINF_ASSIGN_OR_RETURN(const double call_us, OneDnnCallMicros(t));
    ZINF_ASSIGN_OR_RETURN(const double attention, OneDnnAttentionGflops(t, args.quick));
    ZINF_ASSIGN_OR_RETURN(const GeluRates gelu, OneDnnGeluRates(t, args.quick));
    call_overhead.push_back({{"threads", t},
                             {"us", call_us},
                             {"attention_GFLOPs", attention},
                             {"gelu_forward_Gelem_per_s", gelu.forward / 1e9},
                             {"gelu_backward_Gelem_per_s", gelu.backward / 1e9}});
#endif
  }
  out["kernel_call"] = call_overhead;
  progress.Start("plain fp32 loops (the MLP example's layer, std::exp), 1 thread");
  const double loop = PlainLoopGflops(args.quick);
  out["exp_per_s"] = ExpPerSecond(args.quick);
  // Without oneDNN the GPT has no kernels here; the loop's rate stands in for fp32.
  for (auto& row : matmul) {
    if (row["fp32_GFLOPs"].is_null()) row["fp32_GFLOPs"] = loop;
  }
  out["matmul"] = matmul;
  out["loop_fp32_GFLOPs"] = loop;
  progress.Start("writing the profile");
  progress.Finish();

  const std::string text = out.dump(2) + "\n";
  if (args.out.empty()) {
    fmt::print("{}", text);
    return OkStatus();
  }
  std::ofstream file(args.out, std::ios::trunc);
  file << text;
  file.close();
  if (!file) return IoError(fmt::format("--out {}: cannot write", args.out));
  fmt::print(stderr, "wrote {}\n", args.out);
  return OkStatus();
}

}  // namespace

void AddBenchProfileCommand(CLI::App& bench) {
  auto args = std::make_shared<ProfileArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "profile", "Measure this machine once into a JSON profile for `zinf plan`");
  cmd->add_option("--path", args->paths,
                  "Directory for the NVMe swap files (repeat to stripe; default: the current "
                  "directory)");
  cmd->add_option("--out", args->out, "Write the profile here (default: stdout)");
  cmd->add_flag("--quick", args->quick, "Small sizes, one repetition: seconds, for tests");
  cmd->add_option("--nvme-size", args->nvme_size,
                  "Bytes each NVMe figure writes and reads (default 2GiB; 3 repetitions, 1 above "
                  "8GiB): a virtual disk with a cache in front of it is faster on a small file, "
                  "so give the swap space the run will use (`zinf plan` says when it outgrows "
                  "what was measured)")
      ->capture_default_str();
  cmd->add_flag("--no-collective", args->no_collective, "Skip the 2-rank collectives");
  cmd->callback([args] { Report("zinf bench profile", RunProfile(*args)); });
}

}  // namespace zinf::tools
