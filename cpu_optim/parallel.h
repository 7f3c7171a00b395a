// The one place cpu_optim splits work across threads (oneTBB, or the process's OpenMP team; no
// TBB type leaves this file pair). See Note [Partitioning].
//
// Thread-safety: For and Sum may be called from several threads at once; they share the
// arena's workers.
#ifndef ZINF_CPU_OPTIM_PARALLEL_H_
#define ZINF_CPU_OPTIM_PARALLEL_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include "zinf/cpu_optimizer.h"
#include "zinf/status.h"

namespace zinf::cpu_optim {

// Note [Partitioning]
// The element range [0, count) is cut into chunks of kChunkElems (64 KiB of each fp32 array:
// big enough that the per-chunk overhead and the prefetchers' ramp-up are noise, small enough
// that two threads still get an even split of a 1M-element shard). Chunks start at multiples
// of kChunkElems from the span's start, so every chunk keeps the span's alignment. Threads take
// contiguous runs of chunks dynamically (tbb::auto_partitioner, split further only when a
// thread runs out of work): a thread the OS does not run, because another process holds its
// core, or that wakes late, does not hold up the call; the others take its chunks. (A static
// split, one fixed run per thread, made a 2-thread step as slow as a 1-thread one on a loaded
// machine.) Element-wise updates are independent of the split, and reductions are summed per
// chunk and the partial sums added in chunk order, so results do not depend on the thread
// count or on which thread ran which chunk. ForEach chunks several ranges the same way and
// shares all their chunks out as one sequence: a torch model's parameters are hundreds of
// tensors, most of them (biases, norms) under a chunk, and each alone would run inline.

// Note [Whose threads]
// The engine's optimizer runs on a oneTBB arena of its own. zinf.optim runs inside a torch
// training loop, whose ops run on torch's OpenMP team: libgomp's threads spin for a while after
// each parallel region, so right after backward torch's threads hold every core and a second
// pool's workers wait for them. Measured on a 2-vCPU AMD EPYC, a 1M-element step right after a
// torch op ran at 0.58-0.61x DeepSpeed's CPU Adam, whose OpenMP loop runs on those same threads
// (bench/RESULTS.md, 2026-11-29). CpuWorkers::kProcessOpenMp runs the chunks on the OpenMP
// runtime already loaded in the process (found by its GOMP_parallel entry, which libgomp, LLVM's
// libomp and Intel's libiomp5 all export): the calling thread's team, which is torch's. Its
// threads take runs of chunks from a shared counter (guided: half the remaining work split
// among the threads at a time), so the split is as dynamic as oneTBB's and results are the same
// bits; unlike oneTBB, the team's end is a barrier, so a team thread that another process keeps
// off its core delays the call until it is scheduled, as it delays torch's own ops. See Note
// [Held up by the team].

// Note [Held up by the team]
// On a machine shared with busy processes, a team thread may wake a scheduler slice late: a
// small step (1M elements, under a millisecond) then waits 3-6 ms at the team's barrier, and a
// run of such steps comes out bimodal, near 40 or near 4 GB/s on a 2-vCPU EPYC, as does
// DeepSpeed's OpenMP loop beside it (bench/RESULTS.md, 2026-11-29). oneTBB's caller takes every
// chunk no worker has started, so it never waits for a thread that has not arrived. So each
// call on the team times the caller: when it waited at the barrier longer than it worked, and
// longer than kHeldUpFloor (under that it is a wake-up, not a slice), the calls of the next
// kOneTbbAfterHeldUp run on the oneTBB arena instead, and then the team is tried again. A
// step that is not held up stays on the team (right after a torch op its threads are spinning
// and arrive at once). Which pool ran a call changes no result (Note [Partitioning]).
inline constexpr size_t kChunkElems = size_t{1} << 14;
inline constexpr std::chrono::nanoseconds kHeldUpFloor = std::chrono::milliseconds(1);
inline constexpr std::chrono::nanoseconds kOneTbbAfterHeldUp = std::chrono::seconds(1);

class Parallel {
 public:
  // threads >= 1 (the calling thread included). Internal when TBB cannot make the arena.
  // CpuWorkers::kProcessOpenMp falls back to oneTBB where no OpenMP runtime is loaded.
  static StatusOr<std::unique_ptr<Parallel>> Create(int threads,
                                                    CpuWorkers workers = CpuWorkers::kOneTbb);
  ~Parallel();
  Parallel(const Parallel&) = delete;
  Parallel& operator=(const Parallel&) = delete;

  int threads() const { return threads_; }
  CpuWorkers workers() const { return workers_; }
  // kProcessOpenMp: how many calls the team has held up (Note [Held up by the team]).
  uint64_t held_up_calls() const { return held_up_calls_.load(std::memory_order_relaxed); }

  // Calls fn(begin, end) over disjoint runs of whole chunks covering [0, count); returns when
  // all are done. Runs inline when the count is small or there is one thread.
  // Internal if a worker threw.
  Status For(size_t count, const std::function<void(size_t, size_t)>& fn);

  // For over several ranges at once, [0, counts[i]) for each i: their chunks are one sequence
  // the threads share, so many small ranges (a model's biases and norms) run in parallel, not
  // one after another inline. fn(i, begin, end) gets a run of whole chunks of range i.
  Status ForEach(std::span<const size_t> counts,
                 const std::function<void(size_t, size_t, size_t)>& fn);

  // Calls fn(begin, end) once per chunk and returns the partial results summed in chunk order.
  StatusOr<double> Sum(size_t count, const std::function<double(size_t, size_t)>& fn);

 private:
  struct Arena;
  using OpenMpParallel = void (*)(void (*)(void*), void*, unsigned, unsigned);
  Parallel(int threads, std::unique_ptr<Arena> arena, OpenMpParallel openmp);
  // Calls run(begin, end) over disjoint runs of [0, chunks) on the workers; returns when all
  // are done.
  Status RunChunks(size_t chunks, const std::function<void(size_t, size_t)>& run);
  // kProcessOpenMp: runs them on the team unless it held up a call lately; false when it did
  // not run them.
  bool RunOnTeam(size_t chunks, const std::function<void(size_t, size_t)>& run, Status& status);
  int threads_;
  CpuWorkers workers_;
  std::unique_ptr<Arena> arena_;     // always; kProcessOpenMp's pool after a held-up call
  OpenMpParallel openmp_ = nullptr;  // kProcessOpenMp: the runtime's GOMP_parallel
  // steady_clock time (ns) before which calls skip the team; and the held-up calls so far.
  std::atomic<int64_t> team_resumes_at_ns_{0};
  std::atomic<uint64_t> held_up_calls_{0};
};

}  // namespace zinf::cpu_optim

#endif  // ZINF_CPU_OPTIM_PARALLEL_H_
