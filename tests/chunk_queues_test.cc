// How the blocked GEMM's team shares out chunks of rows (stages/cpu/chunk_queues.h): every chunk
// of every loop runs exactly once at any team size, loops follow each other without a barrier
// before them, a thread runs its own share from the front, and the chunks of a thread that has not
// come yet are taken from the back of its share by the others.
#include "stages/cpu/chunk_queues.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <thread>
#include <vector>

namespace bigmac::sdk::cpu::internal {
namespace {

TEST(ChunkQueues, EveryChunkOfEveryLoopRunsOnce) {
  for (int threads : {1, 2, 3, 5}) {
    for (int count : {0, 1, 2, 7, 64, 1000}) {
      constexpr int kLoops = 20;
      std::vector<std::atomic<int>> runs(kLoops * count);
      ChunkQueues queues;
#pragma omp parallel num_threads(threads)
      for (int loop = 1; loop <= kLoops; ++loop) {
        queues.ForEach(loop, count, [&](int chunk) {
          ASSERT_GE(chunk, 0);
          ASSERT_LT(chunk, count);
          runs[(loop - 1) * count + chunk].fetch_add(1);
        });
#pragma omp barrier
      }
      for (int i = 0; i < kLoops * count; ++i) {
        ASSERT_EQ(runs[i].load(), 1) << threads << " threads, " << count << " chunks: loop "
                                     << i / count + 1 << " chunk " << i % count;
      }
    }
  }
}

// Thread 1 starts each loop only after thread 0 has finished it, so thread 0 runs its own share
// (chunks 0-4 of 10) in order and then all of thread 1's from the back; thread 1 finds nothing.
TEST(ChunkQueues, OwnShareFromTheFrontThenTheOthersFromTheBack) {
  ChunkQueues queues;
  std::vector<int> order[2];
  std::atomic<int> done{0};
  int team = 0;
#pragma omp parallel num_threads(2)
  {
#pragma omp single
    team = omp_get_num_threads();
    if (team == 2) {
      const int self = omp_get_thread_num();
      for (int loop = 1; loop <= 3; ++loop) {
        if (self == 1) {
          while (done.load() < loop) std::this_thread::yield();  // kind to a one-CPU host
        }
        queues.ForEach(loop, 10, [&](int chunk) { order[self].push_back(chunk); });
        if (self == 0) done.store(loop);
#pragma omp barrier
      }
    }
  }
  if (team != 2) GTEST_SKIP() << "OpenMP gave a team of " << team << ", not 2";
  std::vector<int> expected;
  for (int loop = 1; loop <= 3; ++loop)
    expected.insert(expected.end(), {0, 1, 2, 3, 4, 9, 8, 7, 6, 5});
  EXPECT_EQ(order[0], expected);
  EXPECT_TRUE(order[1].empty());
}

// A thread still in loop 1 when its share has moved on to loop 2 takes nothing from it (loop 1's
// chunks were all taken before anyone set up loop 2), rather than running loop 1 again.
TEST(ChunkQueues, AnEarlierLoopTakesNothingFromALaterLoopsShare) {
  ChunkQueues queues;
  std::vector<int> second, first;
#pragma omp parallel num_threads(1)
  {
    queues.ForEach(2, 6, [&](int chunk) { second.push_back(chunk); });
    queues.ForEach(1, 6, [&](int chunk) { first.push_back(chunk); });
  }
  EXPECT_EQ(second, (std::vector<int>{0, 1, 2, 3, 4, 5}));
  EXPECT_TRUE(first.empty());
}

TEST(ChunkQueues, FitsBoundsTheTeamTheChunksAndTheLoops) {
  EXPECT_TRUE(ChunkQueues::Fits(2, 128, 64));
  EXPECT_FALSE(ChunkQueues::Fits(ChunkQueues::kMaxThreads + 1, 128, 64));
  EXPECT_FALSE(ChunkQueues::Fits(2, int64_t{1} << 24, 64));
  EXPECT_FALSE(ChunkQueues::Fits(2, 128, int64_t{1} << 16));
}

}  // namespace
}  // namespace bigmac::sdk::cpu::internal
