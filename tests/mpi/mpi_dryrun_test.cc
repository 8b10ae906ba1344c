// Integration: real `mpirun` jobs of `bigmac train --dry-run`, and the `plan` and `--help`
// commands.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <string>

#include "core/comm/topology.h"
#include "tests/testing/run.h"

namespace bigmac {
namespace {

using testutil::CountOccurrences;
using testutil::Mpirun;
using testutil::RunCommand;
using testutil::Runfile;

using testutil::Bigmac;
std::string TinyPp4() { return Runfile("configs/tiny_pp4.yaml"); }

std::string DryRun(int ranks, const std::string& sets) {
  return Mpirun(ranks) + " " + Bigmac() + " train --config " + TinyPp4() + " --dry-run " + sets;
}

struct Layout {
  int ranks;
  int pp;
  int tp;
};

class DryRunLayoutTest : public ::testing::TestWithParam<Layout> {};

// Every rank reports the coordinates the documented rank order gives, and rank 0 prints the
// seeds' [cfg] lines.
TEST_P(DryRunLayoutTest, EveryRankPrintsItsCoordinates) {
  const Layout l = GetParam();
  const int dp = l.ranks / (l.pp * l.tp);
  const std::string sets = "--set parallel.pp_size=" + std::to_string(l.pp) +
                           " --set parallel.tp_size=" + std::to_string(l.tp) +
                           " --set parallel.num_microbatches=" + std::to_string(std::max(l.pp, 4));
  const testutil::RunResult r = RunCommand(DryRun(l.ranks, sets), 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(
      r.output.find("[cfg] world_size=" + std::to_string(l.ranks) + " pp=" + std::to_string(l.pp) +
                    " tp=" + std::to_string(l.tp) + " dp=" + std::to_string(dp) + "\n"),
      std::string::npos)
      << r.output;
  EXPECT_NE(
      r.output.find("[dry-run] configuration valid on all " + std::to_string(l.ranks) + " ranks"),
      std::string::npos);
  const comm::Topology topology(l.ranks, l.pp, dp, l.tp);
  const std::regex line(
      R"(\[rank\] rank (\d+): pp=(\d+) dp=(\d+) tp=(\d+)(?: tp_group=\[[0-9,]+\])? \| host=\S+ local_rank=(\d+)/\d+(?: \(= mpirun's\))? device=cpu:(\d+) capacity=[0-9.]+ MiB gemm=(?:bigmac-avx2|bigmac-avx512|openblas|onednn) transport=mpi \| stage (\d+): )");
  int seen = 0;
  for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), line);
       it != std::sregex_iterator(); ++it) {
    const int rank = std::stoi((*it)[1]);
    const comm::Coords expected = topology.CoordsOf(rank);
    EXPECT_EQ(std::stoi((*it)[2]), expected.pp) << it->str();
    EXPECT_EQ(std::stoi((*it)[3]), expected.dp) << it->str();
    EXPECT_EQ(std::stoi((*it)[4]), expected.tp) << it->str();
    EXPECT_EQ(std::stoi((*it)[5]), rank) << "one node: local rank == rank";
    EXPECT_EQ(std::stoi((*it)[7]), expected.pp) << "one stage per pp rank";
    EXPECT_EQ(rank, seen) << "rank lines come in rank order";
    ++seen;
  }
  EXPECT_EQ(seen, l.ranks) << r.output;
}

INSTANTIATE_TEST_SUITE_P(Mpirun, DryRunLayoutTest,
                         ::testing::Values(Layout{1, 1, 1}, Layout{2, 2, 1}, Layout{4, 4, 1},
                                           Layout{8, 4, 1}, Layout{8, 2, 2}),
                         [](const auto& info) {
                           return "np" + std::to_string(info.param.ranks) + "_pp" +
                                  std::to_string(info.param.pp) + "_tp" +
                                  std::to_string(info.param.tp);
                         });

TEST(DryRun, EightRanksPrintsStageRanges) {
  const testutil::RunResult r = RunCommand(DryRun(8, "--set device.memory_limit=1.5GiB"), 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(CountOccurrences(r.output, "capacity=1536.00 MiB"), 8) << r.output;
  EXPECT_NE(r.output.find("[cfg] world_size=8 pp=4 tp=1 dp=2"), std::string::npos);
  EXPECT_NE(r.output.find("[cfg] split_points=[7, 14, 21] policy=spread_first"), std::string::npos);
  EXPECT_NE(r.output.find("[cfg] stage 0 -> pp rank 0: layers 0-6 (7) + embedding"),
            std::string::npos);
  EXPECT_NE(r.output.find("[cfg] stage 3 -> pp rank 3: layers 21-26 (6) + head"),
            std::string::npos);
  EXPECT_EQ(CountOccurrences(r.output, "[cfg] world_size="), 1) << "only rank 0 prints the config";
}

// A bad config stops every rank with code 2, and nobody hangs (the deadline kills a hang).
TEST(DryRun, BadConfigExitsTwoOnAllRanks) {
  const testutil::RunResult r = RunCommand(DryRun(4, "--set parallel.pp_szie=4"), 10);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(r.output.find("bigmac: rank " + std::to_string(rank) + " exits with code 2"),
              std::string::npos)
        << r.output;
  }
  EXPECT_EQ(CountOccurrences(r.output, "did you mean 'parallel.pp_size'?"), 1)
      << "reported once, not per rank";
}

// Output locations are checked on every rank before any work, and every rank exits with 8.
TEST(DryRun, UnusableCheckpointDirExitsEightOnAllRanks) {
  const std::string file = testutil::WriteTempFile("not_a_dir", "a file\n");
  const testutil::RunResult r = RunCommand(DryRun(4, "--set checkpoint.dir=" + file), 30);
  EXPECT_EQ(r.exit_code, 8) << r.output;
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_NE(r.output.find("bigmac: rank " + std::to_string(rank) +
                            " exits with code 8: output locations rejected"),
              std::string::npos)
        << r.output;
  }
  EXPECT_EQ(CountOccurrences(r.output, file + ": is a file, not a directory"), 1)
      << "reported once, not per rank";
}

TEST(DryRun, PpThatDoesNotDivideTheWorldNamesTheValues) {
  // Issue 2: within 5 s (the deadline kills a slower run and fails the test).
  const testutil::RunResult r = RunCommand(DryRun(8, "--set parallel.pp_size=3"), 5);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("world_size=8 (launch) must be divisible by pp*tp: pp=3 "
                          "(parallel.pp_size, --set) * tp=1"),
            std::string::npos)
      << r.output;
}

// The transport is the launcher's (BIGMAC_TRANSPORT): shown with its source, checked at start-up.
TEST(DryRun, TransportComesFromTheLaunchLineAndIsChecked) {
  const testutil::RunResult mpi =
      RunCommand("BIGMAC_TRANSPORT=mpi " + DryRun(2, "--set parallel.pp_size=2"), 60);
  EXPECT_EQ(mpi.exit_code, 0) << mpi.output;
  EXPECT_NE(mpi.output.find("device.transport = mpi <- launch: BIGMAC_TRANSPORT [launch]"),
            std::string::npos)
      << mpi.output;
  EXPECT_EQ(CountOccurrences(mpi.output, " transport=mpi | stage "), 2) << mpi.output;
  const testutil::RunResult nccl =
      RunCommand("BIGMAC_TRANSPORT=nccl " + DryRun(2, "--set parallel.pp_size=2"), 60);
  EXPECT_EQ(nccl.exit_code, 2) << nccl.output;
  EXPECT_NE(nccl.output.find("device.transport=nccl (launch: BIGMAC_TRANSPORT) needs "
                             "device.backend=cpu ("),
            std::string::npos)
      << nccl.output;
  const testutil::RunResult in_file =
      RunCommand(DryRun(2, "--set parallel.pp_size=2 --set device.transport=mpi"), 60);
  EXPECT_EQ(in_file.exit_code, 2) << in_file.output;
  EXPECT_NE(in_file.output.find("'device.transport' belongs to the launch layer"),
            std::string::npos)
      << in_file.output;
}

// MPMD: half the ranks read another config. They must refuse to run together.
TEST(DryRun, RanksWithDifferentConfigsRefuse) {
  const std::string other =
      testutil::WriteTempFile("other.yaml", "parallel:\n  pp_size: 2\n  schedule: gpipe\n");
  const std::string command = Mpirun(2) + " " + Bigmac() + " train --dry-run --config " + other +
                              " : -np 2 " + Bigmac() + " train --dry-run --config " + other +
                              " --set train.seq_length=77";
  const testutil::RunResult r = RunCommand(command, 30);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("the ranks hold different effective configurations (ranks "),
            std::string::npos)
      << r.output;
  EXPECT_EQ(CountOccurrences(r.output, "exits with code 2: config hash differs"), 4) << r.output;
}

// MPMD: ranks 2-3 cannot read their config; ranks 0-1 must stop too, not hang.
TEST(DryRun, OneBadRankStopsAllRanks) {
  const std::string good =
      testutil::WriteTempFile("good.yaml", "parallel:\n  pp_size: 2\n  schedule: gpipe\n");
  const std::string command = Mpirun(2) + " " + Bigmac() + " train --dry-run --config " + good +
                              " : -np 2 " + Bigmac() +
                              " train --dry-run --config /nonexistent.yaml";
  const testutil::RunResult r = RunCommand(command, 30);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("/nonexistent.yaml: cannot open the config file"), std::string::npos)
      << r.output;
  EXPECT_EQ(CountOccurrences(r.output, "exits with code 2: configuration rejected by rank(s) 2-3"),
            4)
      << r.output;
}

TEST(Plan, PrintsTheSameConfigWithoutMpi) {
  const testutil::RunResult r =
      RunCommand(Bigmac() + " plan --config " + TinyPp4() + " --world-size 8", 30);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[cfg] world_size=8 pp=4 tp=1 dp=2"), std::string::npos);
  EXPECT_NE(r.output.find("world_size <- launch: --world-size"), std::string::npos);
  EXPECT_NE(r.output.find("[rank] rank 7: pp=3 dp=1 tp=0 | stage 3: layers 21-26 (6) + head"),
            std::string::npos)
      << r.output;
}

// plan --check trains the configured layout for a few steps and prints each pipeline rank's
// predicted peak memory against the measured one; tiny_pp4 under 1f1b and zb_h1 is within 10%
// (measured -0.2% .. -0.8% and -0.1% .. -0.2%), and so is a llama pipeline under 1f1b, whose
// backward's transient peak is large beside its activations (measured -1.3%, -4.0%; -13.5%,
// -15.8% before LayerCost::backward_peak_bytes).
TEST(Plan, CheckComparesPredictedAndMeasuredPeaks) {
  std::string text;
  for (int i = 0; i < 4000; ++i)
    text += "Stage " + std::to_string(i % 4) + " keeps " + std::to_string(i * 13 % 101) +
            " micro-batches of activations.\n";
  const std::string data = testutil::PrepareShards("plan_check", text);
  const std::string command = Bigmac() + " plan --config " + TinyPp4() +
                              " --world-size 4 --set data.dir=" + data + " --check --check-dir " +
                              testutil::TempDir() + "/plan_check --launcher '" +
                              testutil::Mpirun(4) + "'";
  const testutil::RunResult r = RunCommand(command, 240);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[check]   pp rank  predicted MiB  measured MiB  error    verdict"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(CountOccurrences(r.output, " ok\n"), 4) << r.output;
  EXPECT_NE(r.output.find("[check] verdict: every rank within 10% of its measured peak"),
            std::string::npos)
      << r.output;
  // A directory plan --check did not make is never replaced.
  const std::string mine = testutil::TempDir() + "/not_a_check_dir";
  std::filesystem::create_directories(mine);
  testutil::WriteTempFile("not_a_check_dir/keep.txt", "mine");
  const testutil::RunResult refused = RunCommand(
      Bigmac() + " plan --config " + TinyPp4() + " --world-size 4 --check --check-dir " + mine, 60);
  EXPECT_EQ(refused.exit_code, 8) << refused.output;
  EXPECT_NE(refused.output.find("holds files that plan --check did not write"), std::string::npos)
      << refused.output;
  EXPECT_TRUE(std::filesystem::exists(mine + "/keep.txt"));
  // zb_h1 keeps what the weight gradients need from BackwardInput to BackwardWeight
  // (LayerCost::deferred_bytes).
  const testutil::RunResult zb = RunCommand(command + " --set parallel.schedule=zb_h1", 240);
  EXPECT_EQ(zb.exit_code, 0) << zb.output;
  EXPECT_EQ(CountOccurrences(zb.output, " ok\n"), 4) << zb.output;
  const testutil::RunResult llama =
      RunCommand(Bigmac() + " plan --config " + Runfile("configs/llama_tiny.yaml") +
                     " --world-size 2 --set parallel.pp_size=2 --set parallel.schedule=1f1b"
                     " --set train.gradient_accumulation_steps=4 --set data.dir=" +
                     data + " --check --check-dir " + testutil::TempDir() +
                     "/plan_check_llama --launcher '" + testutil::Mpirun(2) + "'",
                 240);
  EXPECT_EQ(llama.exit_code, 0) << llama.output;
  EXPECT_EQ(CountOccurrences(llama.output, " ok\n"), 2) << llama.output;
  // A rank outside the tolerance is marked OFF and the check exits 1 (no plan is exact to 0.01%).
  const testutil::RunResult strict = RunCommand(command + " --check-tolerance 0.0001", 240);
  EXPECT_EQ(strict.exit_code, 1) << strict.output;
  EXPECT_EQ(CountOccurrences(strict.output, " OFF\n"), 4) << strict.output;
  EXPECT_NE(strict.output.find("[check] verdict: 4 rank(s) outside 0.01%, 0 without a measurement"),
            std::string::npos)
      << strict.output;
}

TEST(Plan, EveryShippedConfigIsValidAndTextProtoMatchesYaml) {
  std::string hashes[2];
  const char* files[] = {"configs/tiny_pp4.yaml", "configs/tiny_pp4.textproto"};
  for (int i = 0; i < 2; ++i) {
    const testutil::RunResult r =
        RunCommand(Bigmac() + " plan --world-size 8 --config " + Runfile(files[i]), 30);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const size_t at = r.output.find("config_hash=");
    ASSERT_NE(at, std::string::npos);
    hashes[i] = r.output.substr(at, 28);
  }
  EXPECT_EQ(hashes[0], hashes[1]);
  for (const char* file : {"configs/tiny.yaml", "configs/gpt2_124m_pp4.yaml"}) {
    const testutil::RunResult r =
        RunCommand(Bigmac() + " plan --world-size 8 --config " + Runfile(file), 30);
    EXPECT_EQ(r.exit_code, 0) << file << "\n" << r.output;
  }
}

// The stage table: every policy, its parameters per stage (checked against the real model's
// counts), memory, times, the predicted step and bubble, and a recommendation.
TEST(Plan, StageTableForEveryPolicy) {
  const testutil::RunResult r =
      RunCommand(Bigmac() + " plan --config " + TinyPp4() + " --world-size 4", 30);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* policy :
       {"spread_first (configured)", "spread_last", "first", "last", "balanced"}) {
    EXPECT_NE(r.output.find(std::string("[plan] policy ") + policy + ": predicted step"),
              std::string::npos)
        << policy << "\n"
        << r.output;
  }
  // spread_first on tiny_pp4: [7,7,7,6] layers; the pipeline engine's own counts are 370368,
  // 349888, 349888 and 300032 parameters per rank (see the [memory] lines of a real run).
  EXPECT_NE(r.output.find("[plan]   0     0    0-6         7      370.4K"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("[plan]   3     3    21-26       6      300.0K    -49.9K    0.86"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("[plan] recommend: model.partition="), std::string::npos) << r.output;
  // Optimizer bytes per rank, replicated and with ZeRO-1 (370368 parameters x 8 B on stage 0).
  EXPECT_NE(
      r.output.find("[plan]   optimizer state per rank (dp=1, parallel.zero_stage=0): stage 0 "
                    "2.83 MiB replicated, 2.83 MiB with ZeRO-1"),
      std::string::npos)
      << r.output;
  const testutil::RunResult zero = RunCommand(
      Bigmac() + " plan --config " + TinyPp4() + " --world-size 8 --set parallel.zero_stage=1", 30);
  ASSERT_EQ(zero.exit_code, 0) << zero.output;
  EXPECT_NE(zero.output.find("[plan]   optimizer state per rank (dp=2, parallel.zero_stage=1): "
                             "stage 0 2.83 MiB replicated, 1.41 MiB with ZeRO-1"),
            std::string::npos)
      << zero.output;
  EXPECT_NE(zero.output.find("2 Adam moments (x 8 B / dp=2: ZeRO-1)"), std::string::npos)
      << zero.output;
  const testutil::RunResult profiled =
      RunCommand(Bigmac() + " plan --config " + TinyPp4() + " --world-size 4 --profile", 60);
  ASSERT_EQ(profiled.exit_code, 0) << profiled.output;
  EXPECT_NE(profiled.output.find("times measured on this machine"), std::string::npos);
}

TEST(Plan, BadConfigExitsTwo) {
  const testutil::RunResult r = RunCommand(
      Bigmac() + " plan --config " + TinyPp4() + " --world-size 8 --set parallel.pp_size=3", 30);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("8 % 3 = 2"), std::string::npos) << r.output;
}

TEST(Help, EveryCommandHasHelp) {
  for (const std::string command : {"--help", "train --help", "plan --help"}) {
    const testutil::RunResult r = RunCommand(Bigmac() + " " + command, 30);
    EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.output;
    EXPECT_NE(r.output.find("Usage"), std::string::npos) << r.output;
  }
  const testutil::RunResult train = RunCommand(Bigmac() + " train --help", 30);
  EXPECT_NE(train.output.find("--dry-run"), std::string::npos);
  EXPECT_NE(train.output.find("parallel.pp_size = 1  [schedule]"), std::string::npos)
      << train.output;
  EXPECT_NE(train.output.find("model.split_points = []  [model]"), std::string::npos)
      << train.output;
}

TEST(Help, UsageErrorsExitTwo) {
  EXPECT_EQ(RunCommand(Bigmac(), 30).exit_code, 2);
  EXPECT_EQ(RunCommand(Bigmac() + " train", 30).exit_code, 2);
  EXPECT_EQ(RunCommand(Bigmac() + " plan --config x.yaml --world-size many", 30).exit_code, 2);
  EXPECT_EQ(RunCommand(Bigmac() + " launch-rockets", 30).exit_code, 2);
}

// The local rank comes from MPI_Comm_split_type; a launcher that says otherwise is a clear error
// (here a singleton run, local rank 0, with the launchers' variables forged).
TEST(DeviceMapping, LauncherThatDisagreesWithMpiIsRefused) {
  const testutil::RunResult mpirun =
      RunCommand("OMPI_COMM_WORLD_LOCAL_RANK=3 " + Bigmac() + " train --dry-run --config " +
                     TinyPp4() + " --set parallel.pp_size=1",
                 30);
  EXPECT_EQ(mpirun.exit_code, 2) << mpirun.output;
  EXPECT_NE(mpirun.output.find("gives local rank 0, but the launcher (mpirun) set "
                               "OMPI_COMM_WORLD_LOCAL_RANK=3"),
            std::string::npos)
      << mpirun.output;
  const testutil::RunResult srun =
      RunCommand("SLURM_LOCALID=2 SLURM_PROCID=0 SLURM_NTASKS=1 " + Bigmac() +
                     " train --dry-run --config " + TinyPp4() + " --set parallel.pp_size=1",
                 30);
  EXPECT_EQ(srun.exit_code, 2) << srun.output;
  EXPECT_NE(srun.output.find("but the launcher (srun) set SLURM_LOCALID=2"), std::string::npos)
      << srun.output;
  // A batch script's own SLURM_LOCALID (SLURM_NTASKS differs from the world) is not a launcher's.
  const testutil::RunResult batch =
      RunCommand("SLURM_LOCALID=0 SLURM_PROCID=0 SLURM_NTASKS=1 " + Mpirun(2) + " " + Bigmac() +
                     " train --dry-run --config " + TinyPp4() + " --set parallel.pp_size=1",
                 60);
  EXPECT_EQ(batch.exit_code, 0) << batch.output;
  EXPECT_NE(batch.output.find("local_rank=1/2 (= mpirun's) device=cpu:1"), std::string::npos)
      << batch.output;
}

}  // namespace
}  // namespace bigmac
