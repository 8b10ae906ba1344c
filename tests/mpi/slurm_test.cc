// Slurm: a real single-node cluster (munged, slurmctld, slurmd from Debian, configured in a
// temporary directory by tests/slurm/run_slurm_job.sh) runs launch/slurm/train.sbatch with 4 CPU
// ranks under `srun --mpi=pmix`; the daemons are gone afterwards, also when the job fails.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

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

TEST(Slurm, SbatchTrainsWithFourRanksUnderSrunPmix) {
  ASSERT_EQ(testutil::LiveSlurmDaemons(), "") << "Slurm daemons running before the test";
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
  EXPECT_EQ(testutil::LiveSlurmDaemons(), "");
}

TEST(Slurm, AFailedJobReportsItsExitCodeAndStopsTheDaemons) {
  const testutil::RunResult run = RunCommand(SubmitJob("--set parallel.pp_szie=4"), 300);
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("did you mean 'parallel.pp_size'"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("slurm job exit: 2"), std::string::npos) << run.output;
  EXPECT_EQ(testutil::LiveSlurmDaemons(), "");
}

// SIGTERM to the batch script (as Slurm sends it before a time limit, --signal=B:TERM@120): the
// script passes it to srun and the ranks, which stop together after a step, write a final
// checkpoint and exit 10 (unfinished). Here it comes an hour before the limit, as an operator's
// scancel --batch --signal=TERM would: no requeue, and the job ends with that code.
TEST(Slurm, SigtermToTheBatchScriptStopsTheRanksWithAFinalCheckpoint) {
  const testutil::RunResult run =
      RunCommand("BIGMAC_SLURM_TERM_AFTER='step 20/' " +
                     SubmitJob("--set train.max_steps=100000 --set train.log_interval=10 "
                               "--set train.eval_interval=0 --set checkpoint.dir=ckpt"),
                 300);
  EXPECT_EQ(run.exit_code, 10) << run.output;
  for (const std::string fragment :
       {"bigmac-slurm: SIGTERM, stopping the training step",
        "[signal] SIGTERM: stopping after step", "with the checkpoint of step",
        "bigmac-slurm: bigmac train exited with status 10",
        "before the time limit (more than BIGMAC_REQUEUE_WITHIN=900): a stop, not the time limit; "
        "not requeueing",
        "slurm job exit: 10"}) {
    EXPECT_NE(run.output.find(fragment), std::string::npos) << fragment << "\n" << run.output;
  }
  EXPECT_EQ(testutil::LiveSlurmDaemons(), "");
}

// A time limit shorter than the training, for real: --time=1 with --signal=B:TERM@55, so Slurm
// signals the batch script at its controller's next 30 s tick after 5 s. Each time the ranks
// checkpoint and exit 10, the script requeues the job (scontrol requeue; the throwaway cluster's
// cred_expire makes the requeued job wait 10 s instead of 120), and the requeued job resumes with
// --resume auto, until training is done: at least twice here (rank 0 sleeps 50 ms before each
// forward, so the job needs about 80 s of training, and a run at most 35 s). Every resume starts at
// the step the stop before it saved (nothing trained twice or skipped), and the per-step losses in
// metrics.jsonl, continued across the requeues, are the uninterrupted run's bit for bit.
TEST(Slurm, ATimeLimitRequeuesTheJobUntilItIsDone) {
  constexpr int kSteps = 150;
  const std::string dir = testutil::TempDir() + "/requeue";
  std::filesystem::remove_all(dir);
  const std::string common = "--set train.max_steps=" + std::to_string(kSteps) +
                             " --set train.eval_interval=0 --set train.log_interval=20";
  const testutil::RunResult reference =
      RunCommand(testutil::Mpirun(4) + " " + Runfile("bigmac") + " train --config " +
                     Runfile("configs/tiny_pp4.yaml") + " --set data.dir=" + DataDir() + " " +
                     common + " --set train.output_dir=" + dir + "/reference",
                 300);
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  const auto start = std::chrono::steady_clock::now();
  const testutil::RunResult run = RunCommand(
      "BIGMAC_SLURM_TIMEOUT=600 BIGMAC_MAX_REQUEUES=10 BIGMAC_TEST_SLOW_RANK=0:50 "
      "BIGMAC_SLURM_SBATCH_FLAGS='--time=1 --signal=B:TERM@55' " +
          SubmitJob(common + " --set checkpoint.dir=" + dir +
                    "/ckpt --set checkpoint.keep_last=50" + " --set train.output_dir=" + dir +
                    "/job"),
      700);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("[requeue] the job took %.0f s with %d requeue(s)\n", seconds,
              testutil::CountOccurrences(run.output, "bigmac-slurm: unfinished (status 10)"));
  // The requeue cycles' times, for the log: when each stop requeued and each run started.
  std::istringstream log(run.output);
  for (std::string line; std::getline(log, line);) {
    if (line.find("requeueing job") != std::string::npos ||
        line.find("bigmac-slurm: requeued run") != std::string::npos)
      std::printf("[requeue] %s\n", line.c_str());
  }
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_GE(testutil::CountOccurrences(run.output,
                                       "bigmac-slurm: unfinished (status 10): "
                                       "requeueing job"),
            2)
      << run.output;
  EXPECT_NE(run.output.find("bigmac-slurm: requeued run 2 started "), std::string::npos)
      << run.output;
  // The steps the stops saved, and the steps the resumes started from, in order.
  auto numbers_after = [&](const std::string& prefix, const std::string& then) {
    std::vector<int> steps;
    for (size_t at = run.output.find(prefix); at != std::string::npos;
         at = run.output.find(prefix, at + 1)) {
      const size_t number = run.output.find(then, at + prefix.size());
      if (number == std::string::npos) break;
      steps.push_back(std::atoi(run.output.c_str() + number + then.size()));
    }
    return steps;
  };
  const std::vector<int> stopped = numbers_after("[signal] SIGTERM: stopping after step", "step ");
  const std::vector<int> resumed = numbers_after("[ckpt] resumed from ", " at step ");
  ASSERT_GE(stopped.size(), 2u) << run.output;
  EXPECT_EQ(resumed, stopped) << run.output;
  // metrics.jsonl: every step once, each loss the reference's.
  auto losses = [](const std::string& file) {
    std::map<int, double> by_step;
    std::istringstream lines(testutil::ReadFile(file));
    for (std::string line; std::getline(lines, line);) {
      if (line.empty()) continue;
      const size_t step = line.find("\"step\":"), loss = line.find("\"loss\":");
      if (step == std::string::npos || loss == std::string::npos) continue;
      const int s = std::atoi(line.c_str() + step + 7);
      EXPECT_EQ(by_step.count(s), 0u) << "step " << s << " twice in " << file;
      by_step[s] = std::strtod(line.c_str() + loss + 7, nullptr);
    }
    return by_step;
  };
  const std::map<int, double> expected = losses(dir + "/reference/metrics.jsonl");
  const std::map<int, double> got = losses(dir + "/job/metrics.jsonl");
  ASSERT_EQ(expected.size(), size_t{kSteps});
  ASSERT_EQ(got.size(), size_t{kSteps});
  for (const auto& [step, loss] : expected) EXPECT_EQ(got.at(step), loss) << "step " << step;
  EXPECT_EQ(testutil::LiveSlurmDaemons(), "");
}

}  // namespace
}  // namespace bigmac
