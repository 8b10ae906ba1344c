#include "core/comm/topology.h"

#include <gtest/gtest.h>

#include <map>
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
  ASSERT_TRUE(ChooseDevice(device::Backend::kCpu, 3, 8, 0, false, &placement, &error));
  EXPECT_EQ(placement.ToString(), "cpu:3");
}

TEST(Device, CudaNeedsOneDevicePerLocalRank) {
  DevicePlacement placement;
  std::string error;
  ASSERT_TRUE(ChooseDevice(device::Backend::kCuda, 1, 2, 8, false, &placement, &error));
  EXPECT_EQ(placement.ToString(), "cuda:1");
  ASSERT_TRUE(ChooseDevice(device::Backend::kCuda, 7, 8, 8, false, &placement, &error));
  EXPECT_EQ(placement.ToString(), "cuda:7");
  EXPECT_FALSE(ChooseDevice(device::Backend::kCuda, 0, 4, 0, false, &placement, &error));
  EXPECT_NE(error.find("no CUDA device is visible"), std::string::npos) << error;
  EXPECT_FALSE(ChooseDevice(device::Backend::kCuda, 5, 8, 4, false, &placement, &error));
  EXPECT_NE(error.find("8 local ranks but 4 visible CUDA devices"), std::string::npos) << error;
  EXPECT_NE(error.find("BIGMAC_SHARE_DEVICES=1"), std::string::npos) << error;
}

TEST(Device, SharingIsExplicitAndRoundRobin) {
  DevicePlacement placement;
  std::string error;
  ASSERT_TRUE(ChooseDevice(device::Backend::kCuda, 5, 8, 4, true, &placement, &error));
  EXPECT_EQ(placement.ToString(), "cuda:1 (shared)");
  ASSERT_TRUE(ChooseDevice(device::Backend::kCuda, 2, 4, 4, true, &placement, &error));
  EXPECT_EQ(placement.ToString(), "cuda:2") << "enough devices: not shared";
}

EnvLookup Env(std::map<std::string, std::string> values) {
  return [values = std::move(values)](const char* name) -> const char* {
    auto it = values.find(name);
    return it == values.end() ? nullptr : it->second.c_str();
  };
}

TEST(LocalRank, AgreesWithMpirunAndSrun) {
  std::string launcher;
  EXPECT_EQ(CheckLocalRank(3, 8, 1, Env({{"OMPI_COMM_WORLD_LOCAL_RANK", "1"}}), &launcher), "");
  EXPECT_EQ(launcher, "mpirun");
  EXPECT_EQ(
      CheckLocalRank(3, 8, 3,
                     Env({{"SLURM_LOCALID", "3"}, {"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "8"}}),
                     &launcher),
      "");
  EXPECT_EQ(launcher, "srun");
  EXPECT_EQ(CheckLocalRank(0, 1, 0, Env({}), &launcher), "");
  EXPECT_EQ(launcher, "");
}

TEST(LocalRank, DisagreementNamesBothValues) {
  std::string launcher;
  const std::string problem =
      CheckLocalRank(5, 8, 1, Env({{"OMPI_COMM_WORLD_LOCAL_RANK", "2"}}), &launcher);
  EXPECT_NE(problem.find("rank 5: MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) gives local rank 1, "
                         "but the launcher (mpirun) set OMPI_COMM_WORLD_LOCAL_RANK=2"),
            std::string::npos)
      << problem;
  EXPECT_NE(
      CheckLocalRank(5, 8, 1,
                     Env({{"SLURM_LOCALID", "0"}, {"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}}),
                     &launcher)
          .find("set SLURM_LOCALID=0"),
      std::string::npos);
}

TEST(LocalRank, BatchScriptSlurmLocalIdInheritedByMpirunRanksIsIgnored) {
  // mpirun inside sbatch: the batch step's SLURM_LOCALID=0 / SLURM_PROCID=0 reach every rank.
  std::string launcher;
  EXPECT_EQ(
      CheckLocalRank(2, 4, 2,
                     Env({{"SLURM_LOCALID", "0"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}),
                     &launcher),
      "");
  // ... and mpirun's own variable wins when both are present.
  EXPECT_EQ(
      CheckLocalRank(2, 4, 2, Env({{"OMPI_COMM_WORLD_LOCAL_RANK", "2"}, {"SLURM_LOCALID", "0"}}),
                     &launcher),
      "");
  EXPECT_EQ(launcher, "mpirun");
}

}  // namespace
}  // namespace bigmac::comm
