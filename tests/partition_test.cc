#include "core/partition/partition.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <stdexcept>

namespace bigmac::partition {
namespace {

PartitionSpec Spec(int layers, int pp, Policy policy, int virtual_stages = 1) {
  PartitionSpec spec;
  spec.num_layers = layers;
  spec.pp = pp;
  spec.policy = policy;
  spec.virtual_stages = virtual_stages;
  return spec;
}

TEST(Partition, SeedTwentySevenOnFourSpreadFirst) {
  const Partition p = MakePartition(Spec(27, 4, Policy::kSpreadFirst));
  EXPECT_EQ(p.LayersPerStage(), (std::vector<int>{7, 7, 7, 6}));
  EXPECT_EQ(p.SplitPoints(), (std::vector<int>{7, 14, 21}));
}

TEST(Partition, SeedTwentySevenOnFourSpreadLast) {
  const Partition p = MakePartition(Spec(27, 4, Policy::kSpreadLast));
  // Seed 1: n*i//pp for i in 1..pp-1.
  EXPECT_EQ(p.SplitPoints(), (std::vector<int>{6, 13, 20}));
  EXPECT_EQ(p.LayersPerStage(), (std::vector<int>{6, 7, 7, 7}));
}

TEST(Partition, FirstAndLastTakeTheWholeRemainder) {
  EXPECT_EQ(MakePartition(Spec(27, 4, Policy::kFirst)).LayersPerStage(),
            (std::vector<int>{9, 6, 6, 6}));
  EXPECT_EQ(MakePartition(Spec(27, 4, Policy::kLast)).LayersPerStage(),
            (std::vector<int>{6, 6, 6, 9}));
}

TEST(Partition, ExplicitCountsAndSplitPoints) {
  PartitionSpec counts = Spec(27, 4, Policy::kExplicit);
  counts.layers_per_stage = {5, 8, 8, 6};
  EXPECT_EQ(MakePartition(counts).SplitPoints(), (std::vector<int>{5, 13, 21}));
  PartitionSpec splits = Spec(27, 4, Policy::kExplicit);
  splits.split_points = {5, 13, 21};
  EXPECT_EQ(MakePartition(splits).LayersPerStage(), (std::vector<int>{5, 8, 8, 6}));
}

TEST(Partition, EmbeddingFirstHeadLastExplicitly) {
  const Partition p = MakePartition(Spec(8, 4, Policy::kSpreadFirst));
  for (const StageRange& range : p.stages) {
    EXPECT_EQ(range.has_embedding, range.stage == 0);
    EXPECT_EQ(range.has_head, range.stage == 3);
  }
  const Partition single = MakePartition(Spec(8, 1, Policy::kSpreadFirst));
  EXPECT_TRUE(single.stages[0].has_embedding);
  EXPECT_TRUE(single.stages[0].has_head);
}

TEST(Partition, VirtualStagesGoRoundRobinOverRanks) {
  const Partition p = MakePartition(Spec(10, 2, Policy::kSpreadFirst, 2));
  ASSERT_EQ(p.stages.size(), 4u);
  EXPECT_EQ(p.LayersPerStage(), (std::vector<int>{3, 3, 2, 2}));
  EXPECT_EQ(p.stages[2].pp_rank, 0);
  EXPECT_EQ(p.stages[2].chunk, 1);
  const std::vector<StageRange> rank1 = p.StagesOfRank(1);
  ASSERT_EQ(rank1.size(), 2u);
  EXPECT_EQ(rank1[0].first_layer, 3);
  EXPECT_EQ(rank1[1].first_layer, 8);
  EXPECT_TRUE(rank1[1].has_head);  // the last chunk of the last stage lives on rank pp-1
}

// Every policy, over many shapes: every layer_id exactly once, in order, no empty stage.
TEST(Partition, CoversEveryLayerOnceForAllShapes) {
  for (Policy policy : {Policy::kSpreadFirst, Policy::kSpreadLast, Policy::kFirst, Policy::kLast}) {
    for (int pp = 1; pp <= 8; ++pp) {
      for (int v = 1; v <= 3; ++v) {
        for (int layers = pp * v; layers <= 40; ++layers) {
          const Partition p = MakePartition(Spec(layers, pp, policy, v));
          ASSERT_EQ(static_cast<int>(p.stages.size()), pp * v);
          int next = 0;
          int smallest = layers;
          int largest = 0;
          for (const StageRange& range : p.stages) {
            ASSERT_EQ(range.first_layer, next)
                << PolicyName(policy) << " L=" << layers << " pp=" << pp;
            ASSERT_GE(range.num_layers, 1);
            ASSERT_EQ(range.pp_rank, range.stage % pp);
            next = range.end_layer();
            smallest = std::min(smallest, range.num_layers);
            largest = std::max(largest, range.num_layers);
          }
          ASSERT_EQ(next, layers);
          if (policy == Policy::kSpreadFirst || policy == Policy::kSpreadLast) {
            ASSERT_LE(largest - smallest, 1);
          }
        }
      }
    }
  }
}

TEST(Partition, SpreadFirstAndSpreadLastAreMirrorImages) {
  for (int layers = 4; layers <= 30; ++layers) {
    std::vector<int> first = MakePartition(Spec(layers, 4, Policy::kSpreadFirst)).LayersPerStage();
    std::vector<int> last = MakePartition(Spec(layers, 4, Policy::kSpreadLast)).LayersPerStage();
    std::sort(first.begin(), first.end());
    std::sort(last.begin(), last.end());
    EXPECT_EQ(first, last) << layers;
  }
}

TEST(Partition, InvalidSpecsThrowWithTheRule) {
  EXPECT_THROW(MakePartition(Spec(3, 4, Policy::kSpreadFirst)), std::invalid_argument);
  PartitionSpec bad = Spec(27, 4, Policy::kExplicit);
  bad.layers_per_stage = {7, 7, 7, 5};
  try {
    MakePartition(bad);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("sums to 26"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(CheckSpec(Spec(4, 0, Policy::kSpreadFirst)).empty());
}

TEST(Partition, FormattingHonoursOrigin) {
  const Partition p = MakePartition(Spec(27, 4, Policy::kSpreadFirst));
  EXPECT_EQ(FormatLayerList(p.SplitPoints(), 0), "[7, 14, 21]");
  EXPECT_EQ(FormatLayerList(p.SplitPoints(), 1), "[8, 15, 22]");
  EXPECT_EQ(FormatRange(p.stages[0], 0), "layers 0-6 (7) + embedding");
  EXPECT_EQ(FormatRange(p.stages[3], 1), "layers 22-27 (6) + head");
}

// The smallest possible costliest stage, by trying every composition of the layers.
double BruteForceBest(const PartitionSpec& spec) {
  const int stages = spec.pp * spec.virtual_stages;
  double best = 1e300;
  std::vector<int> counts(stages, 1);
  std::function<void(int, int)> place = [&](int stage, int left) {
    if (stage == stages - 1) {
      counts[stage] = left;
      PartitionSpec explicit_spec = spec;
      explicit_spec.policy = Policy::kExplicit;
      explicit_spec.layers_per_stage = counts;
      const std::vector<double> costs = StageCosts(spec, MakePartition(explicit_spec));
      best = std::min(best, *std::max_element(costs.begin(), costs.end()));
      return;
    }
    for (int take = 1; take <= left - (stages - stage - 1); ++take) {
      counts[stage] = take;
      place(stage + 1, left - take);
    }
  };
  place(0, spec.num_layers);
  return best;
}

TEST(Partition, BalancedMatchesBruteForce) {
  uint64_t state = 7;
  auto next = [&state] {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return double((state >> 33) % 1000) / 100.0 + 0.1;
  };
  for (int pp = 1; pp <= 4; ++pp) {
    for (int layers = pp; layers <= 10; ++layers) {
      for (int trial = 0; trial < 3; ++trial) {
        PartitionSpec spec = Spec(layers, pp, Policy::kBalanced);
        for (int i = 0; i < layers; ++i) spec.layer_costs.push_back(next());
        spec.first_stage_extra = next();
        spec.last_stage_extra = 3 * next();
        const Partition p = MakePartition(spec);
        const std::vector<double> costs = StageCosts(spec, p);
        EXPECT_DOUBLE_EQ(*std::max_element(costs.begin(), costs.end()), BruteForceBest(spec))
            << "pp=" << pp << " layers=" << layers;
      }
    }
  }
}

TEST(Partition, BalancedUnloadsAHeavyHead) {
  PartitionSpec spec = Spec(12, 4, Policy::kBalanced);
  spec.layer_costs.assign(12, 1.0);
  spec.last_stage_extra = 2.5;  // a large vocabulary
  const Partition p = MakePartition(spec);
  EXPECT_EQ(p.LayersPerStage().back(), 1) << "the head's stage keeps one block";
  const std::vector<double> costs = StageCosts(spec, p);
  EXPECT_DOUBLE_EQ(*std::max_element(costs.begin(), costs.end()), 4.0);  // spread_first: 3 + 2.5
}

TEST(Partition, PolicyNamesRoundTrip) {
  for (Policy policy : {Policy::kSpreadFirst, Policy::kSpreadLast, Policy::kFirst, Policy::kLast,
                        Policy::kExplicit}) {
    Policy parsed;
    ASSERT_TRUE(ParsePolicy(PolicyName(policy), &parsed));
    EXPECT_EQ(parsed, policy);
  }
  Policy parsed;
  EXPECT_FALSE(ParsePolicy("balanced_by_magic", &parsed));
}

}  // namespace
}  // namespace bigmac::partition
