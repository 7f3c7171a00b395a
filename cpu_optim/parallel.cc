// Partitioning for cpu_optim, on oneTBB or the process's OpenMP team. See Note [Partitioning]
// in parallel.h.
#include "cpu_optim/parallel.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace zinf::cpu_optim {

struct Parallel::Arena {
  explicit Arena(int threads) : arena(threads) {}
  tbb::task_arena arena;
};

namespace {
// Below this many elements a call runs on the calling thread: waking workers costs more than
// the work.
constexpr size_t kInlineElems = 2 * kChunkElems;

size_t NumChunks(size_t count) { return (count + kChunkElems - 1) / kChunkElems; }
}  // namespace

StatusOr<std::unique_ptr<Parallel>> Parallel::Create(int threads, CpuWorkers workers) {
  if (threads < 1) {
    return InvalidArgument("cpu optimizer threads must be >= 1, got " + std::to_string(threads));
  }
  // Note [Whose threads]: the runtime already loaded (torch's), never one of zinf's own.
  OpenMpParallel openmp = nullptr;
  if (workers == CpuWorkers::kProcessOpenMp) {
    openmp = reinterpret_cast<OpenMpParallel>(dlsym(RTLD_DEFAULT, "GOMP_parallel"));
  }
  try {
    auto arena = std::make_unique<Arena>(threads);
    arena->arena.initialize();
    return std::unique_ptr<Parallel>(new Parallel(threads, std::move(arena), openmp));
  } catch (const std::exception& e) {
    return Internal(std::string("creating a oneTBB arena of ") + std::to_string(threads) +
                    " threads: " + e.what());
  }
}

Parallel::Parallel(int threads, std::unique_ptr<Arena> arena, OpenMpParallel openmp)
    : threads_(threads),
      workers_(openmp != nullptr ? CpuWorkers::kProcessOpenMp : CpuWorkers::kOneTbb),
      arena_(std::move(arena)),
      openmp_(openmp) {}

Parallel::~Parallel() = default;

namespace {

using Clock = std::chrono::steady_clock;

// One OpenMP team's shared work (Note [Whose threads]).
struct Team {
  const std::function<void(size_t, size_t)>* run;
  size_t chunks;
  size_t threads;
  std::thread::id caller = std::this_thread::get_id();
  Clock::time_point caller_done;  // when the caller found no chunks left
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::string error;  // the first exception's message; the team's other threads stop early

  // Each team thread: take runs of chunks, half the remaining work split among the threads,
  // until none are left.
  static void Member(void* data) {
    auto* team = static_cast<Team*>(data);
    try {
      size_t begin = team->next.load(std::memory_order_relaxed);
      for (;;) {
        if (begin >= team->chunks) {
          if (std::this_thread::get_id() == team->caller) team->caller_done = Clock::now();
          return;
        }
        const size_t take = std::max<size_t>(1, (team->chunks - begin) / (2 * team->threads));
        if (!team->next.compare_exchange_weak(begin, begin + take, std::memory_order_relaxed)) {
          continue;  // begin now holds the counter's current value
        }
        (*team->run)(begin, begin + take);
        begin = team->next.load(std::memory_order_relaxed);
      }
    } catch (const std::exception& e) {
      team->Fail(e.what());
    } catch (...) {  // nothing may leave the OpenMP runtime's call
      team->Fail("unknown exception");
    }
    if (std::this_thread::get_id() == team->caller) team->caller_done = Clock::now();
  }

  void Fail(const char* what) {
    next.store(chunks);
    std::lock_guard<std::mutex> lock(mu);
    if (error.empty()) error = what;
  }
};

int64_t Nanos(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

}  // namespace

bool Parallel::RunOnTeam(size_t chunks, const std::function<void(size_t, size_t)>& run,
                         Status& status) {
  const Clock::time_point start = Clock::now();
  if (Nanos(start) < team_resumes_at_ns_.load(std::memory_order_relaxed)) return false;
  Team team{&run, chunks, static_cast<size_t>(threads_)};
  team.caller_done = start;
  openmp_(&Team::Member, &team, static_cast<unsigned>(threads_), 0);
  // Note [Held up by the team]: the caller's wait at the barrier against its own work.
  const Clock::time_point end = Clock::now();
  const Clock::duration waited = end - team.caller_done;
  if (waited > kHeldUpFloor && waited > team.caller_done - start) {
    held_up_calls_.fetch_add(1, std::memory_order_relaxed);
    team_resumes_at_ns_.store(Nanos(end + kOneTbbAfterHeldUp), std::memory_order_relaxed);
  }
  status = team.error.empty() ? OkStatus() : Internal("cpu optimizer worker failed: " + team.error);
  return true;
}

Status Parallel::RunChunks(size_t chunks, const std::function<void(size_t, size_t)>& run) {
  if (openmp_ != nullptr) {
    Status status;
    if (RunOnTeam(chunks, run, status)) return status;
  }
  try {
    arena_->arena.execute([&] {
      tbb::parallel_for(
          tbb::blocked_range<size_t>(0, chunks, 1),
          [&](const tbb::blocked_range<size_t>& r) { run(r.begin(), r.end()); },
          tbb::auto_partitioner());
    });
  } catch (const std::exception& e) {
    return Internal(std::string("cpu optimizer worker failed: ") + e.what());
  }
  return OkStatus();
}

Status Parallel::For(size_t count, const std::function<void(size_t, size_t)>& fn) {
  const size_t counts[] = {count};
  return ForEach(counts, [&](size_t, size_t begin, size_t end) { fn(begin, end); });
}

Status Parallel::ForEach(std::span<const size_t> counts,
                         const std::function<void(size_t, size_t, size_t)>& fn) {
  // first_chunk[i]: where range i starts in the shared sequence of chunks.
  std::vector<size_t> first_chunk(counts.size() + 1, 0);
  size_t total = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    first_chunk[i + 1] = first_chunk[i] + NumChunks(counts[i]);
    total += counts[i];
  }
  if (threads_ == 1 || total <= kInlineElems) {
    for (size_t i = 0; i < counts.size(); ++i) {
      if (counts[i] > 0) fn(i, 0, counts[i]);
    }
    return OkStatus();
  }
  // Chunks [begin, end) of the sequence, as runs within each range they cover.
  return RunChunks(first_chunk.back(), [&](size_t begin, size_t end) {
    size_t i = static_cast<size_t>(std::upper_bound(first_chunk.begin(), first_chunk.end(), begin) -
                                   first_chunk.begin() - 1);
    for (; i < counts.size() && first_chunk[i] < end; ++i) {
      const size_t from = std::max(begin, first_chunk[i]) - first_chunk[i];
      const size_t to = std::min(end, first_chunk[i + 1]) - first_chunk[i];
      if (from < to) fn(i, from * kChunkElems, std::min(to * kChunkElems, counts[i]));
    }
  });
}

StatusOr<double> Parallel::Sum(size_t count, const std::function<double(size_t, size_t)>& fn) {
  const size_t chunks = NumChunks(count);
  std::vector<double> partial(chunks, 0.0);
  auto run = [&](size_t begin_chunk, size_t end_chunk) {
    for (size_t c = begin_chunk; c < end_chunk; ++c) {
      const size_t begin = c * kChunkElems;
      const size_t end = begin + kChunkElems < count ? begin + kChunkElems : count;
      partial[c] = fn(begin, end);
    }
  };
  if (threads_ == 1 || count <= kInlineElems) {
    run(0, chunks);
  } else {
    ZINF_RETURN_IF_ERROR(RunChunks(chunks, run));
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace zinf::cpu_optim
