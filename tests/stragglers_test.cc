// metrics::AnalyzeCompute: who is compared with whom, and the spread's numbers.
#include "core/metrics/stragglers.h"

#include <gtest/gtest.h>

namespace bigmac::metrics {
namespace {

TEST(AnalyzeCompute, ARankIsComparedWithTheMedianOfItsPeersOfTheSameStage) {
  // pp=2 x dp=3: stage 1 does twice stage 0's work; rank 4 is 1.3x its peers (100, 104).
  const std::vector<RankCompute> ranks = {{0, 0, "a", 50, 1},    {1, 1, "a", 100, 2},
                                          {2, 0, "b", 51, 1},    {3, 1, "b", 104, 2},
                                          {4, 1, "c", 132.6, 2}, {5, 0, "c", 49, 1}};
  const ComputeSpread spread = AnalyzeCompute(ranks, 1.2);
  ASSERT_EQ(spread.stragglers.size(), 1u);
  EXPECT_EQ(spread.stragglers[0].rank, 4);
  EXPECT_EQ(spread.stragglers[0].host, "c");
  EXPECT_DOUBLE_EQ(spread.stragglers[0].ratio, 132.6 / 102);
  EXPECT_EQ(spread.stragglers[0].peers, "its 2 peers of pp rank 1");
  EXPECT_EQ(FormatStraggler(spread.stragglers[0]),
            "[straggler] rank 4 (c): 1.30x the median compute time of its 2 peers of pp rank 1");
  // The spread is over every rank: the median of the six, the slowest and its ratio.
  EXPECT_DOUBLE_EQ(spread.median_ms, (51 + 100) / 2.0);
  EXPECT_EQ(spread.slowest_rank, 4);
  EXPECT_EQ(spread.slowest_host, "c");
  EXPECT_DOUBLE_EQ(spread.ratio, 132.6 / 75.5);
  // The heavier stage alone is no straggler, and the threshold is strict.
  EXPECT_TRUE(AnalyzeCompute(ranks, 1.31).stragglers.empty());
}

TEST(AnalyzeCompute, WithoutPeersTheTimePerUnitOfWorkIsCompared) {
  // pp=4, dp=1: the last stage predicted at 3 units; rank 1 takes 1.5x per unit.
  const std::vector<RankCompute> ranks = {
      {0, 0, "a", 100, 1}, {1, 1, "a", 150, 1}, {2, 2, "b", 100, 1}, {3, 3, "b", 303, 3}};
  const ComputeSpread spread = AnalyzeCompute(ranks, 1.2);
  ASSERT_EQ(spread.stragglers.size(), 1u);
  EXPECT_EQ(spread.stragglers[0].rank, 1);
  EXPECT_DOUBLE_EQ(spread.stragglers[0].ratio, 150 / 100.0);  // the others: 100, 100, 101
  EXPECT_EQ(spread.stragglers[0].peers, "the other 3 pipeline ranks, per unit of predicted work");
  EXPECT_EQ(spread.slowest_rank, 3) << "the spread itself is raw time";
}

// 1.5x of a 4 ms computation is noise, not a straggler (kMinStragglerGapMs).
TEST(AnalyzeCompute, ASmallGapIsNoStraggler) {
  EXPECT_TRUE(AnalyzeCompute({{0, 0, "a", 4, 1}, {1, 0, "a", 6, 1}}, 1.2).stragglers.empty());
  EXPECT_EQ(AnalyzeCompute({{0, 0, "a", 40, 1}, {1, 0, "a", 60, 1}}, 1.2).stragglers.size(), 1u);
}

TEST(AnalyzeCompute, OneRankHasNoPeers) {
  const ComputeSpread spread = AnalyzeCompute({{0, 0, "a", 10, 1}}, 1.2);
  EXPECT_TRUE(spread.stragglers.empty());
  EXPECT_EQ(spread.slowest_rank, 0);
  EXPECT_DOUBLE_EQ(spread.ratio, 1);
}

}  // namespace
}  // namespace bigmac::metrics
