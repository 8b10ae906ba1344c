#include "core/comm/topology.h"

#include <gtest/gtest.h>

#include <set>
#include <stdexcept>

#include "core/comm/device.h"

namespace bigmac::comm {
namespace {

TEST(Topology, RankOrderTpFastestThenDpThenPp) {
  const Topology t(16, /*pp=*/2, /*dp=*/4, /*tp=*/2);
  EXPECT_EQ(t.CoordsOf(0), (Coords{0, 0, 0}));
  EXPECT_EQ(t.CoordsOf(1), (Coords{0, 0, 1}));
  EXPECT_EQ(t.CoordsOf(2), (Coords{0, 1, 0}));
  EXPECT_EQ(t.CoordsOf(7), (Coords{0, 3, 1}));
  EXPECT_EQ(t.CoordsOf(8), (Coords{1, 0, 0}));
  EXPECT_EQ(t.CoordsOf(15), (Coords{1, 3, 1}));
}

TEST(Topology, RoundTripAndGroupsPartitionTheWorld) {
  for (int pp = 1; pp <= 4; ++pp) {
    for (int dp = 1; dp <= 3; ++dp) {
      for (int tp = 1; tp <= 2; ++tp) {
        const Topology t(pp * dp * tp, pp, dp, tp);
        for (int rank = 0; rank < t.world_size(); ++rank) {
          const Coords c = t.CoordsOf(rank);
          ASSERT_EQ(t.RankOf(c), rank);
          ASSERT_EQ(static_cast<int>(t.DpGroup(rank).size()), dp);
          ASSERT_EQ(static_cast<int>(t.PpGroup(rank).size()), pp);
          ASSERT_EQ(static_cast<int>(t.TpGroup(rank).size()), tp);
          for (int member : t.DpGroup(rank)) {
            ASSERT_EQ(t.CoordsOf(member).pp, c.pp);
            ASSERT_EQ(t.CoordsOf(member).tp, c.tp);
          }
          for (int member : t.PpGroup(rank)) ASSERT_EQ(t.CoordsOf(member).dp, c.dp);
        }
      }
    }
  }
}

TEST(Topology, TiedGroupIsFirstAndLastStage) {
  const Topology t(8, 4, 2, 1);
  EXPECT_EQ(t.TiedGroup(0), (std::vector<int>{0, 6}));
  EXPECT_EQ(t.TiedGroup(7), (std::vector<int>{1, 7}));
  EXPECT_TRUE(t.TiedGroup(3).empty());
  const Topology single(2, 1, 2, 1);
  EXPECT_EQ(single.TiedGroup(1), (std::vector<int>{1}));
}

TEST(Topology, RejectsInconsistentSizes) {
  EXPECT_THROW(Topology(8, 3, 2, 1), std::invalid_argument);
  EXPECT_THROW(Topology(8, 0, 8, 1), std::invalid_argument);
  const Topology t(4, 4, 1, 1);
  EXPECT_THROW(t.CoordsOf(4), std::out_of_range);
}

TEST(Topology, RankLineNamesCoordsAndStages) {
  partition::PartitionSpec spec;
  spec.num_layers = 27;
  spec.pp = 4;
  const partition::Partition p = partition::MakePartition(spec);
  const Topology t(8, 4, 2, 1);
  EXPECT_EQ(FormatRankLine(t, p, 5, "device=cpu:5"),
            "rank 5: pp=2 dp=1 tp=0 | device=cpu:5 | stage 2: layers 14-20 (7)");
}

TEST(Device, CpuUsesTheLocalRank) {
  DevicePlacement placement;
  std::string error;
  ASSERT_TRUE(ChooseDevice("cpu", 3, 8, 0, &placement, &error));
  EXPECT_EQ(placement.ToString(), "cpu:3");
}

TEST(Device, CudaNeedsOneDevicePerLocalRank) {
  DevicePlacement placement;
  std::string error;
  ASSERT_TRUE(ChooseDevice("cuda", 1, 2, 8, &placement, &error));
  EXPECT_EQ(placement.ToString(), "cuda:1");
  EXPECT_FALSE(ChooseDevice("cuda", 0, 4, 0, &placement, &error));
  EXPECT_NE(error.find("4 local ranks but 0 visible CUDA devices"), std::string::npos) << error;
}

}  // namespace
}  // namespace bigmac::comm
