// The one place cpu_optim splits work across threads (oneTBB; no TBB type leaves this file
// pair). See Note [Partitioning].
//
// Thread-safety: For and Sum may be called from several threads at once; they share the
// arena's workers.
#ifndef ZINF_CPU_OPTIM_PARALLEL_H_
#define ZINF_CPU_OPTIM_PARALLEL_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <span>

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
inline constexpr size_t kChunkElems = size_t{1} << 14;

class Parallel {
 public:
  // threads >= 1 (the calling thread included). Internal when TBB cannot make the arena.
  static StatusOr<std::unique_ptr<Parallel>> Create(int threads);
  ~Parallel();
  Parallel(const Parallel&) = delete;
  Parallel& operator=(const Parallel&) = delete;

  int threads() const { return threads_; }

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
  Parallel(int threads, std::unique_ptr<Arena> arena);
  int threads_;
  std::unique_ptr<Arena> arena_;
};

}  // namespace zinf::cpu_optim

#endif  // ZINF_CPU_OPTIM_PARALLEL_H_
