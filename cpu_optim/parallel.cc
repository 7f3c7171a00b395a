// oneTBB partitioning for cpu_optim. See Note [Partitioning] in parallel.h.
#include "cpu_optim/parallel.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>
#include <tbb/task_arena.h>

#include <exception>
#include <string>
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

StatusOr<std::unique_ptr<Parallel>> Parallel::Create(int threads) {
  if (threads < 1) {
    return InvalidArgument("cpu optimizer threads must be >= 1, got " + std::to_string(threads));
  }
  try {
    auto arena = std::make_unique<Arena>(threads);
    arena->arena.initialize();
    return std::unique_ptr<Parallel>(new Parallel(threads, std::move(arena)));
  } catch (const std::exception& e) {
    return Internal(std::string("creating a oneTBB arena of ") + std::to_string(threads) +
                    " threads: " + e.what());
  }
}

Parallel::Parallel(int threads, std::unique_ptr<Arena> arena)
    : threads_(threads), arena_(std::move(arena)) {}

Parallel::~Parallel() = default;

Status Parallel::For(size_t count, const std::function<void(size_t, size_t)>& fn) {
  if (count == 0) return OkStatus();
  if (threads_ == 1 || count <= kInlineElems) {
    fn(0, count);
    return OkStatus();
  }
  const size_t chunks = NumChunks(count);
  try {
    arena_->arena.execute([&] {
      tbb::parallel_for(
          tbb::blocked_range<size_t>(0, chunks, 1),
          [&](const tbb::blocked_range<size_t>& r) {
            const size_t begin = r.begin() * kChunkElems;
            const size_t end = r.end() * kChunkElems < count ? r.end() * kChunkElems : count;
            fn(begin, end);
          },
          tbb::auto_partitioner());
    });
  } catch (const std::exception& e) {
    return Internal(std::string("cpu optimizer worker failed: ") + e.what());
  }
  return OkStatus();
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
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace zinf::cpu_optim
