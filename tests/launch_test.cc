// launch/bigmac-mpirun: the mpirun line it builds, the config keys it refuses, and a real run.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "tests/testing/expect.h"
#include "tests/testing/run.h"

namespace bigmac {
namespace {

using testutil::ExpectContains;
using testutil::RunCommand;
using testutil::Runfile;

std::string Wrapper() {
  return "BIGMAC_BIN=" + Runfile("bigmac") + " " + Runfile("launch/bigmac-mpirun");
}

TEST(MpirunWrapper, TwoNodesOfEightGpusGetSixteenRanksEightPerNode) {
  const std::string hosts = testutil::WriteTempFile("hosts", "node01 slots=8\nnode02 slots=8\n");
  const testutil::RunResult run =
      RunCommand(Wrapper() + " --nodes 2 --gpus-per-node 8 --hostfile " + hosts +
                     " --config configs/gpt2_124m_pp4.yaml --set train.max_steps=5 --print-only",
                 30);
  std::printf("%s", run.output.c_str());
  EXPECT_EQ(run.exit_code, 0) << run.output;
  ExpectContains(run.output, "mpirun -np 16 ");
  ExpectContains(run.output, "--hostfile " + hosts);
  ExpectContains(run.output, "--map-by ppr:8:node --bind-to numa");
  ExpectContains(run.output, "-x CUDA_DEVICE_ORDER=PCI_BUS_ID");
  ExpectContains(run.output, "train --config configs/gpt2_124m_pp4.yaml --set train.max_steps=5");
}

TEST(MpirunWrapper, CoresPerRankBindAndSetThreads) {
  const testutil::RunResult run = RunCommand(
      Wrapper() + " --gpus-per-node 4 --cpus-per-rank 6 --share-gpus --config c.yaml --print-only",
      30);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  ExpectContains(run.output, "--map-by ppr:4:node:PE=6 --bind-to core");
  ExpectContains(run.output, "-x OMP_NUM_THREADS=6");
  ExpectContains(run.output, "-x BIGMAC_SHARE_DEVICES=1");
}

// The transport is a launch-layer setting: the wrapper exports it for every rank.
TEST(MpirunWrapper, TransportIsExported) {
  const testutil::RunResult run =
      RunCommand(Wrapper() + " --gpus-per-node 2 --transport=mpi --config c.yaml --print-only", 30);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  ExpectContains(run.output, "-x BIGMAC_TRANSPORT=mpi");
  const testutil::RunResult bad = RunCommand(
      Wrapper() + " --gpus-per-node 2 --transport gloo --config c.yaml --print-only", 30);
  EXPECT_EQ(bad.exit_code, 2);
  ExpectContains(bad.output, "--transport must be auto, nccl or mpi, got 'gloo'");
}

TEST(MpirunWrapper, ConfigKeysAreRefusedNamingTheirLayer) {
  const testutil::RunResult schedule =
      RunCommand(Wrapper() + " --cpu --np 4 --config c.yaml --pp-size 2 --print-only", 30);
  EXPECT_EQ(schedule.exit_code, 2);
  ExpectContains(schedule.output,
                 "--pp-size is the schedule-layer config key 'parallel.pp_size', not a launch "
                 "option: write it in the config file or pass --set parallel.pp_size=VALUE");
  const testutil::RunResult model =
      RunCommand(Wrapper() + " --cpu --np 4 --config c.yaml --num_layers=2 --print-only", 30);
  EXPECT_EQ(model.exit_code, 2);
  ExpectContains(model.output, "--num_layers is the model-layer config key 'model.num_layers'");
  const testutil::RunResult alias =
      RunCommand(Wrapper() + " --cpu --np 4 --config c.yaml --micro-batch 8 --print-only", 30);
  EXPECT_EQ(alias.exit_code, 2);
  ExpectContains(alias.output, "'train.micro_batch_size'");
}

TEST(MpirunWrapper, LaunchMistakesAreClear) {
  const testutil::RunResult no_hosts =
      RunCommand(Wrapper() + " --nodes 2 --gpus-per-node 8 --config c.yaml --print-only", 30);
  EXPECT_EQ(no_hosts.exit_code, 2);
  ExpectContains(no_hosts.output, "--nodes 2 needs --hostfile FILE");
  const testutil::RunResult no_ranks = RunCommand(Wrapper() + " --config c.yaml --print-only", 30);
  EXPECT_EQ(no_ranks.exit_code, 2);
  ExpectContains(no_ranks.output, "--gpus-per-node G (GPUs), or --cpu --np N");
  const testutil::RunResult uneven =
      RunCommand(Wrapper() + " --cpu --np 3 --nodes 2 --config c.yaml --print-only", 30);
  EXPECT_EQ(uneven.exit_code, 2);
  ExpectContains(uneven.output, "--np 3 must be divisible by --nodes 2");
  // A hostfile is a user-named input: a fifo or a device is refused, never read.
  const testutil::RunResult device = RunCommand(
      Wrapper() + " --nodes 2 --gpus-per-node 8 --hostfile /dev/zero --config c.yaml --print-only",
      30);
  EXPECT_EQ(device.exit_code, 2);
  ExpectContains(device.output, "--hostfile /dev/zero: not a regular file");
}

TEST(MpirunWrapper, PrintsTheLineThenRunsIt) {
  const testutil::RunResult run =
      RunCommand(Wrapper() + " --cpu --np 4 --config " + Runfile("configs/tiny_pp4.yaml") +
                     " --dry-run --mpirun-arg=--mca --mpirun-arg=btl --mpirun-arg=self,vader",
                 120);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  ExpectContains(run.output, "mpirun -np 4 ");
  ExpectContains(run.output, "[cfg] world_size=4 pp=4 tp=1 dp=1");
  ExpectContains(run.output, "local_rank=3/4 (= mpirun's) device=cpu:3");
  ExpectContains(run.output, "[dry-run] configuration valid on all 4 ranks");
  EXPECT_LT(run.output.find("mpirun -np 4 "), run.output.find("[cfg]")) << "printed first";
}

// Issue 33, class 11: counts are parsed as bounded text (bash arithmetic wrapped 10^20 to -2
// ranks and printed `mpirun -np -2`), and an option never takes the next option as its value.
TEST(MpirunWrapper, CountsAreBoundedBeforeArithmetic) {
  const struct {
    std::string args, message;
  } cases[] = {
      {"--cpu --np 99999999999999999999",
       "--np must be an integer from 1 to 65536, got '99999999999999999999'"},
      {"--cpu --np 65537", "--np must be an integer from 1 to 65536, got '65537'"},
      {"--cpu --np 0", "--np must be an integer from 1 to 65536, got '0'"},
      {"--nodes 4611686018427387904 --gpus-per-node 8",
       "--nodes must be an integer from 1 to 65536"},
      {"--nodes 65536 --gpus-per-node 2 --hostfile /etc/hostname",
       "--nodes 65536 x --gpus-per-node 2 = 131072 ranks, over the limit of 65536"},
      {"--gpus-per-node 8 --cpus-per-rank 1025",
       "--cpus-per-rank must be an integer from 1 to 1024"},
  };
  for (const auto& c : cases) {
    const testutil::RunResult run =
        RunCommand(Wrapper() + " " + c.args + " --config c.yaml --print-only", 30);
    EXPECT_EQ(run.exit_code, 2) << c.args << "\n" << run.output;
    ExpectContains(run.output, c.message);
    EXPECT_EQ(run.output.find("mpirun -np"), std::string::npos) << c.args;
  }
  const testutil::RunResult most =
      RunCommand(Wrapper() +
                     " --nodes 2 --gpus-per-node 32768 --hostfile /etc/hostname --config c.yaml "
                     "--print-only",
                 30);
  EXPECT_EQ(most.exit_code, 0) << most.output;
  ExpectContains(most.output, "mpirun -np 65536 ");
}

TEST(MpirunWrapper, AnOptionIsNeverTheValueOfTheOptionBeforeIt) {
  // `--set --print-only` used to take --print-only as the value and really launch.
  const testutil::RunResult set = RunCommand(
      "MPIRUN=false " + Wrapper() + " --cpu --np 2 --config c.yaml --set --print-only", 30);
  EXPECT_EQ(set.exit_code, 2) << set.output;
  ExpectContains(set.output,
                 "--set needs a value, but the next word '--print-only' is an option "
                 "(write --set=VALUE for a value that starts with '-')");
  EXPECT_EQ(set.output.find("mpirun -np"), std::string::npos);
  const testutil::RunResult config =
      RunCommand(Wrapper() + " --cpu --np 2 --config --dry-run --print-only", 30);
  EXPECT_EQ(config.exit_code, 2);
  ExpectContains(config.output, "--config needs a value, but the next word '--dry-run'");
  const testutil::RunResult np = RunCommand(Wrapper() + " --cpu --np -4 --config c.yaml", 30);
  EXPECT_EQ(np.exit_code, 2);
  ExpectContains(np.output, "--np needs a value, but the next word '-4' is an option");
  // Attached, a value may start with '-', and is passed on attached.
  const testutil::RunResult attached = RunCommand(
      Wrapper() + " --cpu --np 2 --config c.yaml --set=-x --mpirun-arg=--tag-output --print-only",
      30);
  EXPECT_EQ(attached.exit_code, 0) << attached.output;
  ExpectContains(attached.output, "--tag-output ");
  ExpectContains(attached.output, "train --config c.yaml --set=-x");
}

// ---------------------------------------------------------------- a lost node (common.sh)

// launch/slurm/common.sh's bigmac_slurm_requeue_without against stand-ins for sinfo and scontrol:
// `sinfo` prints SINFO ("NodeName NodeHostName state" lines), `scontrol` logs its arguments to
// calls.txt, answers `show job` with EXCLUDED as the ExcNodeList, expands node[3-4], and fails
// `update` when UPDATE_FAILS is set. Returns the output, the status and the scontrol calls.
std::string RequeueWithout(const std::string& sinfo, const std::string& lost,
                           const std::string& excluded = "(null)", int restarts = 0,
                           bool update_fails = false) {
  const std::string dir = testutil::TempDir() + "/requeue_without";
  RunCommand("rm -rf " + dir + " && mkdir -p " + dir, 10);
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir + "/" + name) << text;
  };
  write("sinfo", "#!/bin/sh\nprintf '%s\\n' \"$SINFO\"\n");
  write("scontrol",
        "#!/bin/sh\n"
        "echo \"$*\" >> \"$(dirname \"$0\")/calls.txt\"\n"
        "case \"$1 $2\" in\n"
        "  'show job') echo \"JobId=7 JobName=bigmac ExcNodeList=$EXCLUDED NumNodes=2\" ;;\n"
        "  'show hostnames') if [ \"$3\" = 'node[3-4]' ]; then printf 'node3\\nnode4\\n'; "
        "else echo \"$3\" | tr , '\\n'; fi ;;\n"
        "  update*) [ -z \"$UPDATE_FAILS\" ] ;;\n"
        "esac\n");
  write("sinfo.txt", sinfo);
  write("run.sh",
        "set -euo pipefail\n"
        "source \"$COMMON\"\n"
        "set +e\n"
        "(bigmac_slurm_requeue_without 6 \"$RESTARTS\" \"$LOST\" 2; echo returned)\n"
        "echo \"function status $?\"\n");
  const std::string env = "cd " + dir +
                          " && chmod +x sinfo scontrol && SINFO=\"$(cat sinfo.txt)\" " +
                          "EXCLUDED='" + excluded + "' UPDATE_FAILS=" + (update_fails ? "1" : "") +
                          " RESTARTS=" + std::to_string(restarts) + " LOST='" + lost +
                          "' COMMON=" + Runfile("launch/slurm/common.sh") + " PATH=" + dir +
                          ":$PATH SLURM_JOB_ID=7 SLURM_JOB_PARTITION=p ";
  return RunCommand(env + "bash run.sh 2>&1; echo calls:; cat calls.txt 2>/dev/null", 30).output;
}

TEST(LostNode, ASpareNodeRequeuesTheJobWithoutTheLostOne) {
  const std::string out =
      RequeueWithout("hostA hostA alloc\nhostB hostB alloc\nhostC hostC idle", "hostB");
  ExpectContains(out, "bigmac-slurm: lost node(s): hostB (status 6)");
  ExpectContains(out, "requeueing job 7 without hostB (requeue 1 of at most 5");
  ExpectContains(out, "function status 0");
  EXPECT_EQ(out.find("returned"), std::string::npos) << "it exits once requeued:\n" << out;
  ExpectContains(out, "requeuehold 7\nupdate JobId=7 ExcNodeList=hostB\nrelease 7");
}

TEST(LostNode, WithoutASpareItSaysHowToResubmitAndDoesNotRequeue) {
  const std::string out =
      RequeueWithout("hostA hostA alloc\nhostB hostB alloc\nhostC hostC drain", "hostB");
  ExpectContains(out,
                 "no spare node: 1 node(s) up in partition p besides hostB, the job needs 2; "
                 "not requeueing; resubmit with --exclude=hostB and --resume auto");
  ExpectContains(out, "returned");
  EXPECT_EQ(out.find("requeuehold"), std::string::npos) << out;
}

TEST(LostNode, HostNamesMapToNodeNamesAndEarlierExclusionsStay) {
  // gethostname's long name, a NodeName unlike it, and an exclusion Slurm prints compressed.
  const std::string out = RequeueWithout(
      "n1 hosta alloc\nn2 hostb alloc\nnode3 node3 idle\nnode4 node4 idle\nn5 hostc idle",
      "hostb.cluster.example", "node[3-4]");
  ExpectContains(out, "lost node(s): n2 (status 6)");
  ExpectContains(out,
                 "without n2,node3,node4 (requeue 1 of at most 5, BIGMAC_MAX_REQUEUES; 2 "
                 "node(s) up)");
  ExpectContains(out, "update JobId=7 ExcNodeList=n2,node3,node4");
}

TEST(LostNode, AnExclusionThatCannotBeSetLeavesTheJobHeld) {
  const std::string out = RequeueWithout("hostA hostA alloc\nhostB hostB alloc\nhostC hostC idle",
                                         "hostB", "(null)", 0, /*update_fails=*/true);
  ExpectContains(out, "the job is held, but its exclusion could not be set: scancel 7");
  ExpectContains(out, "function status 6");
  EXPECT_EQ(out.find("\nrelease 7"), std::string::npos) << "released, it would run on hostB:\n"
                                                        << out;
}

TEST(LostNode, TheRequeuesAreBounded) {
  const std::string out = RequeueWithout("hostA hostA alloc\nhostB hostB alloc\nhostC hostC idle",
                                         "hostB", "(null)", 5);
  ExpectContains(out, "5 requeue(s) made, the most BIGMAC_MAX_REQUEUES=5 allows: not requeueing");
  EXPECT_EQ(out.find("requeuehold"), std::string::npos) << out;
}

}  // namespace
}  // namespace bigmac
