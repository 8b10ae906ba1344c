// Slurm: a real single-node cluster (munged, slurmctld, slurmd from Debian, configured in a
// temporary directory by tests/slurm/run_slurm_job.sh) runs launch/slurm/train.sbatch with 4 CPU
// ranks under `srun --mpi=pmix`; the daemons are gone afterwards, also when the job fails.
#include <gtest/gtest.h>

#include <string>

#include "tests/testing/run.h"

namespace bigmac {
namespace {

using testutil::RunCommand;
using testutil::Runfile;

std::string DataDir() {
  static const std::string dir = [] {
    std::string text;
    for (int i = 0; i < 3000; ++i) {
      text += "sbatch hands " + std::to_string(i % 9) + " tasks to srun, which starts rank " +
              std::to_string(i % 4) + " through PMIx.\n";
    }
    return testutil::PrepareShards("slurm", text);
  }();
  return dir;
}

std::string SubmitJob(const std::string& extra) {
  return Runfile("tests/slurm/run_slurm_job.sh") + " " + Runfile("bigmac") + " " +
         Runfile("configs/tiny_pp4.yaml") + " " + DataDir() + " " + extra;
}

// Slurm and munge processes still alive (zombies are the VM's init reaping late, not ours).
std::string LiveDaemons() {
  return RunCommand(
             "ps -eo stat=,comm= | awk '$1 !~ /^Z/ && ($2 == \"slurmctld\" || $2 == \"slurmd\" "
             "|| $2 == \"munged\" || $2 == \"slurmstepd\")'",
             10)
      .output;
}

TEST(Slurm, SbatchTrainsWithFourRanksUnderSrunPmix) {
  ASSERT_EQ(LiveDaemons(), "") << "Slurm daemons running before the test";
  const testutil::RunResult run =
      RunCommand(SubmitJob("--set train.max_steps=3 --set train.log_interval=1"), 300);
  std::printf("%s\n", run.output.c_str());
  EXPECT_EQ(run.exit_code, 0) << run.output;
  for (const std::string fragment :
       {"ranks=4 ranks_per_node=4", "srun --mpi=pmix", "[cfg] world_size=4 pp=4 tp=1 dp=1",
        "world_size <- launch: srun tasks (MPI_COMM_WORLD)", "local_rank=3/4", "step 3/3 | loss",
        "slurm job exit: 0"}) {
    EXPECT_NE(run.output.find(fragment), std::string::npos) << fragment << "\n" << run.output;
  }
  EXPECT_EQ(LiveDaemons(), "");
}

TEST(Slurm, AFailedJobReportsItsExitCodeAndStopsTheDaemons) {
  const testutil::RunResult run = RunCommand(SubmitJob("--set parallel.pp_szie=4"), 300);
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("did you mean 'parallel.pp_size'"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("slurm job exit: 2"), std::string::npos) << run.output;
  EXPECT_EQ(LiveDaemons(), "");
}

// Before a time limit Slurm sends SIGTERM (--signal=B:TERM@120): the batch script passes it to
// srun and the ranks, which stop together after a step, write a final checkpoint and exit 0.
TEST(Slurm, SigtermToTheBatchScriptStopsTheRanksWithAFinalCheckpoint) {
  const testutil::RunResult run =
      RunCommand("BIGMAC_SLURM_TERM_AFTER='step 20/' " +
                     SubmitJob("--set train.max_steps=100000 --set train.log_interval=10 "
                               "--set train.eval_interval=0 --set checkpoint.dir=ckpt"),
                 300);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  for (const std::string fragment : {"bigmac-slurm: SIGTERM, stopping the training step",
                                     "[signal] SIGTERM: stopping after step",
                                     "with the checkpoint of step", "slurm job exit: 0"}) {
    EXPECT_NE(run.output.find(fragment), std::string::npos) << fragment << "\n" << run.output;
  }
  EXPECT_EQ(LiveDaemons(), "");
}

}  // namespace
}  // namespace bigmac
