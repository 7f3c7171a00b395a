// Parallel: every element visited once, chunk-aligned pieces, sums independent of threads and
// of whose threads run them (oneTBB's or the process's OpenMP team: this test links an OpenMP
// runtime, as torch brings one into a Python process).
#include "cpu_optim/parallel.h"

#include <gtest/gtest.h>
#ifndef ZINF_TEST_OPENMP  // tests/cpu_optim/CMakeLists.txt defines it where OpenMP is found
#define ZINF_TEST_OPENMP 0
#endif
#if ZINF_TEST_OPENMP
#include <omp.h>
#endif

#include <atomic>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <thread>
#include <vector>

namespace zinf::cpu_optim {
namespace {

constexpr CpuWorkers kWorkers[] = {CpuWorkers::kOneTbb, CpuWorkers::kProcessOpenMp};

std::unique_ptr<Parallel> Make(int threads, CpuWorkers workers) {
  auto par = Parallel::Create(threads, workers);
  EXPECT_TRUE(par.ok()) << par.status().ToString();
  // Without an OpenMP runtime in the process, kProcessOpenMp runs on oneTBB.
  EXPECT_EQ((*par)->workers(), ZINF_TEST_OPENMP ? workers : CpuWorkers::kOneTbb);
  return std::move(*par);
}

TEST(ParallelTest, ForVisitsEveryElementOnceInChunkAlignedPieces) {
  for (CpuWorkers workers : kWorkers) {
    for (int threads : {1, 2, 3}) {
      auto par = Make(threads, workers);
      for (size_t n :
           {size_t{0}, size_t{1}, kChunkElems - 1, 2 * kChunkElems + 1, size_t{1000003}}) {
        std::vector<std::atomic<int>> seen(n);
        ASSERT_TRUE(par->For(n,
                             [&](size_t begin, size_t end) {
                               EXPECT_EQ(begin % kChunkElems, 0u);
                               EXPECT_LE(end, n);
                               for (size_t i = begin; i < end; ++i) seen[i].fetch_add(1);
                             })
                        .ok());
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(seen[i].load(), 1) << n << " " << i;
      }
    }
  }
}

TEST(ParallelTest, ForEachVisitsEveryElementOfEveryRangeOnce) {
  // Empty ranges, ranges under a chunk, and ones spanning several, in one call.
  const std::vector<size_t> counts = {0, 1,           kChunkElems - 1, 0, 3 * kChunkElems + 5, 7,
                                      0, kChunkElems, 2 * kChunkElems};
  for (CpuWorkers workers : kWorkers) {
    for (int threads : {1, 2, 3}) {
      auto par = Make(threads, workers);
      std::vector<std::vector<std::atomic<int>>> seen;
      for (size_t n : counts) seen.emplace_back(n);
      ASSERT_TRUE(par->ForEach(counts,
                               [&](size_t range, size_t begin, size_t end) {
                                 ASSERT_LT(range, counts.size());
                                 EXPECT_EQ(begin % kChunkElems, 0u);
                                 EXPECT_LT(begin, end);
                                 EXPECT_LE(end, counts[range]);
                                 for (size_t i = begin; i < end; ++i) seen[range][i].fetch_add(1);
                               })
                      .ok());
      for (size_t r = 0; r < counts.size(); ++r) {
        for (size_t i = 0; i < counts[r]; ++i) {
          ASSERT_EQ(seen[r][i].load(), 1) << threads << " threads, range " << r << " element " << i;
        }
      }
    }
  }
}

TEST(ParallelTest, ForEachSharesManySmallRangesAmongThreads) {
  // 64 ranges of one chunk each: too small to split one by one, but together worth the
  // workers, who must take part (or the call ran them one after another on this thread).
  auto par = Parallel::Create(2);
  ASSERT_TRUE(par.ok());
  const std::vector<size_t> counts(64, kChunkElems);
  const auto caller = std::this_thread::get_id();
  bool other_thread = false;
  for (int attempt = 0; attempt < 100 && !other_thread; ++attempt) {
    std::atomic<int> others = 0;
    ASSERT_TRUE((*par)
                    ->ForEach(counts,
                              [&](size_t, size_t, size_t) {
                                if (std::this_thread::get_id() != caller) others.fetch_add(1);
                                // Long enough that the worker wakes before the caller is done.
                                std::this_thread::sleep_for(std::chrono::microseconds(200));
                              })
                    .ok());
    other_thread = others.load() > 0;
  }
  EXPECT_TRUE(other_thread) << "every range ran on the calling thread";
}

TEST(ParallelTest, SumIsTheSameForAnyThreadCount) {
  const size_t n = 5000011;
  std::vector<double> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = std::sin(static_cast<double>(i)) * 1e3;
  auto chunk_sum = [&](size_t begin, size_t end) {
    double s = 0.0;
    for (size_t i = begin; i < end; ++i) s += x[i];
    return s;
  };
  std::vector<double> sums;
  for (CpuWorkers workers : kWorkers) {
    for (int threads : {1, 2, 3, 4}) {
      auto s = Make(threads, workers)->Sum(n, chunk_sum);
      ASSERT_TRUE(s.ok());
      sums.push_back(*s);
    }
  }
  for (double s : sums) EXPECT_EQ(s, sums[0]);
}

// Note [Partitioning]: a thread that stops running (here: asleep in its first chunk, as a
// thread the OS does not schedule) does not keep its share of the chunks; the caller takes them.
TEST(ParallelTest, AStalledThreadsChunksAreTakenByTheOthers) {
  for (CpuWorkers workers : kWorkers) {
    auto par = Make(2, workers);
    const size_t chunks = 64;
    const std::thread::id caller = std::this_thread::get_id();
    std::atomic<bool> worker_started{false};
    std::atomic<int> by_worker{0};
    ASSERT_TRUE(par->For(chunks * kChunkElems,
                         [&](size_t begin, size_t end) {
                           if (std::this_thread::get_id() != caller) {
                             by_worker += static_cast<int>((end - begin) / kChunkElems);
                             if (!worker_started.exchange(true)) {
                               std::this_thread::sleep_for(std::chrono::seconds(2));
                             }
                             return;
                           }
                           // The caller goes on only once the worker holds chunks of its own.
                           const auto give_up =
                               std::chrono::steady_clock::now() + std::chrono::seconds(30);
                           while (!worker_started && std::chrono::steady_clock::now() < give_up) {
                             std::this_thread::yield();
                           }
                         })
                    .ok());
    if (!worker_started) GTEST_SKIP() << "the worker thread never ran within 30 s";
    // A static split leaves the worker its half, 32 chunks, however long it sleeps.
    EXPECT_LT(by_worker.load(), static_cast<int>(chunks / 2));
  }
}

// Note [Whose threads]: the chunks run on the calling thread's OpenMP team, the one a parallel
// region of the process's own code (torch's ops) runs on.
TEST(ParallelTest, OpenMpWorkersAreTheCallersTeam) {
#if !ZINF_TEST_OPENMP
  GTEST_SKIP() << "built without an OpenMP runtime to find";
#else
  auto par = Make(2, CpuWorkers::kProcessOpenMp);
  std::atomic<int> team_size = 0;
  bool two = false;
  for (int attempt = 0; attempt < 100 && !two; ++attempt) {
    std::atomic<unsigned> members = 0;
    ASSERT_TRUE(par->For(64 * kChunkElems,
                         [&](size_t, size_t) {
                           team_size = omp_get_num_threads();
                           members |= 1u << omp_get_thread_num();
                           std::this_thread::sleep_for(std::chrono::microseconds(200));
                         })
                    .ok());
    two = members.load() == 3u;
  }
  EXPECT_EQ(team_size.load(), 2);
  EXPECT_TRUE(two) << "every chunk ran on one member of the team";
#endif
}

// Note [Held up by the team]: a call whose caller waited at the team's barrier (here for a team
// thread asleep in its chunk, as one the OS does not run) sends the calls of the next second to
// oneTBB; then the team runs them again.
TEST(ParallelTest, ACallTheTeamHeldUpSendsTheNextOnesToOneTbbForAWhile) {
#if !ZINF_TEST_OPENMP
  GTEST_SKIP() << "built without an OpenMP runtime to find";
#else
  auto par = Make(2, CpuWorkers::kProcessOpenMp);
  const std::thread::id caller = std::this_thread::get_id();
  // Whether the caller ran its chunks inside an OpenMP parallel region (the team). Each chunk
  // takes 20 us, so that no wait for a run of the other thread's (16 chunks at most) reaches
  // kHeldUpFloor; a call in which the other thread took every chunk (the caller still waking)
  // tells nothing, and is tried again.
  auto caller_on_team = [&] {
    std::atomic<int> in_parallel = -1;
    for (int attempt = 0; attempt < 100 && in_parallel.load() == -1; ++attempt) {
      EXPECT_TRUE(par->For(64 * kChunkElems,
                           [&](size_t begin, size_t end) {
                             if (std::this_thread::get_id() == caller) {
                               in_parallel = omp_in_parallel();
                             }
                             const auto until =
                                 std::chrono::steady_clock::now() +
                                 (end - begin) / kChunkElems * std::chrono::microseconds(20);
                             while (std::chrono::steady_clock::now() < until) {
                             }
                           })
                      .ok());
    }
    return in_parallel.load() == 1;
  };
  ASSERT_TRUE(caller_on_team());
  if (par->held_up_calls() != 0) GTEST_SKIP() << "a call was held up with no thread asleep";

  std::atomic<bool> member_asleep = false;
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(par->For(64 * kChunkElems,
                       [&](size_t, size_t) {
                         if (std::this_thread::get_id() != caller) {
                           if (!member_asleep.exchange(true)) {
                             std::this_thread::sleep_for(std::chrono::milliseconds(50));
                           }
                           return;
                         }
                         const auto give_up = start + std::chrono::seconds(30);
                         while (!member_asleep && std::chrono::steady_clock::now() < give_up) {
                           std::this_thread::yield();
                         }
                       })
                  .ok());
  if (!member_asleep) GTEST_SKIP() << "the team's other thread never ran within 30 s";
  EXPECT_EQ(par->held_up_calls(), 1u);
  EXPECT_FALSE(caller_on_team()) << "the call after a held-up one ran on the team";

  std::this_thread::sleep_until(std::chrono::steady_clock::now() + kOneTbbAfterHeldUp +
                                std::chrono::milliseconds(100));
  EXPECT_TRUE(caller_on_team()) << "the team was not tried again after the pause";
#endif
}

TEST(ParallelTest, AnExceptionInAWorkerIsAnError) {
  for (CpuWorkers workers : kWorkers) {
    auto par = Make(2, workers);
    Status s = par->For(64 * kChunkElems, [&](size_t begin, size_t) {
      if (begin >= 32 * kChunkElems) throw std::runtime_error("chunk failed");
    });
    EXPECT_EQ(s.code(), StatusCode::kInternal);
    EXPECT_NE(s.message().find("chunk failed"), std::string::npos) << s.ToString();
  }
}

TEST(ParallelTest, RejectsZeroThreads) {
  EXPECT_EQ(Parallel::Create(0).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace zinf::cpu_optim
