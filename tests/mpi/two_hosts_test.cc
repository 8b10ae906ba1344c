// Two hosts for real (docs/launch.md, "Two hosts"): launch/two_hosts.sh makes two hosts out of
// network namespaces joined by a veth pair (each with its own address, hostname, /etc/hosts and
// /dev/shm), trains pp=2 dp=2 with 2 ranks on each, launched by mpirun on hostA with a hostfile
// and a launch agent in place of ssh, Open MPI over TCP only; then the same job on this one host.
// The per-step losses must be identical, and nothing the script made may outlive it, also when it
// is interrupted or killed. Every case is skipped, with the script's reason, where the hosts cannot
// be made (not root, or namespaces forbidden, as in some sandboxes and containers).
#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "tests/testing/expect.h"
#include "tests/testing/run.h"

namespace bigmac {
namespace {

using testutil::ExpectContains;
using testutil::RunCommand;
using testutil::Runfile;
using testutil::RunResult;

// Bazel's test PATH lacks /usr/sbin, where ip is.
const char kPath[] = "export PATH=$PATH:/usr/sbin:/sbin; ";

std::string Script() { return Runfile("launch/two_hosts.sh") + " --bigmac " + testutil::Bigmac(); }

// The reason the script gave for skipping (it then exits 77), or "" if it did not skip.
std::string SkipReason(const std::string& output) {
  std::smatch reason;
  if (std::regex_search(output, reason, std::regex("two_hosts: skipped: (.*)"))) return reason[1];
  return "";
}

// The namespaces a run made (from its "hosts up" line).
std::vector<std::string> Namespaces(const std::string& output) {
  std::vector<std::string> names;
  const std::regex netns(R"(\(netns (bm2h[0-9]+[abc])[;)])");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), netns);
       it != std::sregex_iterator(); ++it) {
    names.push_back((*it)[1]);
  }
  return names;
}

// Namespaces of the script's naming left on this machine, and live processes in them.
std::string Leftovers(const std::vector<std::string>& names) {
  std::string check = std::string(kPath) + "ip netns list | awk '{print $1}' > list.txt; ";
  for (const std::string& name : names) {
    check += "grep -x " + name + " list.txt && ip netns pids " + name + "; ";
  }
  return RunCommand("cd " + testutil::TempDir() + " && { " + check + "} 2>&1; true", 20).output;
}

// Kills what runs in the namespaces and deletes them (so that a failed case leaves no ranks
// training in the background).
void RemoveNamespaces(const std::vector<std::string>& names) {
  std::string command = kPath;
  for (const std::string& name : names) {
    command += "for p in $(ip netns pids " + name +
               " 2>/dev/null); do kill -9 $p; done; ip netns del " + name + " 2>/dev/null; ";
  }
  RunCommand(command + "true", 20);
}

// The bytes hostB's eth0 received during the two-host run, from the script's line (-1 if absent).
long long HostBReceivedBytes(const std::string& output) {
  std::smatch traffic;
  if (!std::regex_search(output, traffic,
                         std::regex(R"(hostB eth0: received (\d+) bytes, sent (\d+) bytes)")))
    return -1;
  return std::stoll(traffic[1]);
}

// Starts the script with many steps in the background, waits until its two-host run trains, sends
// `signal` to it and waits for it; prints its output and then "exit=N".
RunResult Interrupted(const std::string& signal, const std::string& name) {
  const std::string out = testutil::TempDir() + "/" + name + ".out";
  return RunCommand(Script() + " --steps 100000 > " + out +
                        " 2>&1 & pid=$!; "
                        "for i in $(seq 300); do "
                        "  grep -qs '^step 3/' /tmp/bm2h-$pid.*/two_hosts.log && break; "
                        "  grep -q 'two_hosts: skipped' " +
                        out +
                        " && break; sleep 0.1; done; "
                        "kill -" +
                        signal + " $pid; wait $pid; rc=$?; cat " + out + "; echo exit=$rc",
                    90);
}

TEST(TwoHosts, PipelineAcrossTwoNetworkNamespacesMatchesOneHostBitForBit) {
  const RunResult r = RunCommand(Script(), 80);
  if (const std::string reason = SkipReason(r.output); !reason.empty()) {
    EXPECT_EQ(r.exit_code, 77) << r.output;
    GTEST_SKIP() << reason;
  }
  std::printf("%s\n", r.output.c_str());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Two ranks on each host, each host its own node for Open MPI, launched through the agent with
  // TCP only.
  for (const std::string fragment :
       {"host=hostA local_rank=0/2", "host=hostA local_rank=1/2", "host=hostB local_rank=0/2",
        "host=hostB local_rank=1/2", "--hostfile", "--map-by ppr:2:node", "--mca plm_rsh_agent",
        "--mca btl tcp\\,self", "the two-host losses equal the one-host"}) {
    ExpectContains(r.output, fragment);
  }
  // hostB's address carried the traffic (the script fails below 10 kB each way).
  EXPECT_GT(HostBReceivedBytes(r.output), 10000) << r.output;
  // The comparison table, checked here too: every step's loss string from metrics.jsonl equal.
  const std::regex row(R"(step (\d+)  (\S+) +(\S+) +(identical|DIFFERENT))");
  int steps = 0;
  for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), row);
       it != std::sregex_iterator(); ++it) {
    ++steps;
    EXPECT_EQ((*it)[1], std::to_string(steps));
    EXPECT_EQ((*it)[2], (*it)[3]) << "step " << steps;
    EXPECT_EQ((*it)[4], "identical");
  }
  EXPECT_EQ(steps, 5) << r.output;
  // The step time over TCP against one host: printed (issue 34's figure), never asserted.
  std::smatch step_time;
  EXPECT_TRUE(std::regex_search(
      r.output, step_time,
      std::regex(R"(median step time ([0-9.]+) ms over TCP between the hosts, ([0-9.]+) ms on )"
                 R"(one host: [-+][0-9.]+%)")))
      << r.output;
  const std::vector<std::string> names = Namespaces(r.output);
  ASSERT_EQ(names.size(), 2u) << r.output;
  EXPECT_EQ(Leftovers(names), "");
}

// The two hosts as a two-node Slurm cluster (munged, slurmctld and a slurmd per host, RPCs over
// the veth pair): sbatch -N 2 --ntasks-per-node=2 train_multinode.sbatch, ranks started by
// srun --mpi=pmix on both hosts, Open MPI over TCP; the losses equal the one-host run's bit for
// bit, and no daemon outlives the script.
TEST(TwoHosts, SlurmJobOnTwoNodesMatchesOneHostBitForBit) {
  const RunResult r = RunCommand(Script() + " --slurm", 150);
  if (const std::string reason = SkipReason(r.output); !reason.empty()) {
    EXPECT_EQ(r.exit_code, 77) << r.output;
    GTEST_SKIP() << reason;
  }
  std::printf("%s\n", r.output.c_str());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const std::string fragment :
       {"slurm up: slurmctld on hostA, slurmd on hostA and hostB",
        "nodes=2 [hostA,hostB] ranks=4 ranks_per_node=2", "srun --mpi=pmix",
        "host=hostA local_rank=0/2", "host=hostA local_rank=1/2", "host=hostB local_rank=0/2",
        "host=hostB local_rank=1/2",
        "the two-host losses equal the one-host losses, bit for bit (5 steps)"}) {
    ExpectContains(r.output, fragment);
  }
  EXPECT_GT(HostBReceivedBytes(r.output), 10000) << r.output;
  const std::vector<std::string> names = Namespaces(r.output);
  ASSERT_EQ(names.size(), 2u) << r.output;
  EXPECT_EQ(Leftovers(names), "");
  EXPECT_EQ(testutil::LiveSlurmDaemons(), "");
}

// A lost node with a spare: hostB's processes (slurmd, slurmstepd, ranks 2 and 3) are killed and
// its link taken down at step 5 of a 12-step job on hostA and hostB that checkpoints every 2
// steps; hostC is idle. The ranks end within the deadline (5 s) plus 30 s, the hang report names
// hostB, the batch script requeues the job without hostB, and the requeued job runs on hostA and
// hostC, resumes from the last complete checkpoint (its first step the same as before the loss)
// and finishes.
TEST(TwoHosts, ALostSlurmNodeIsExcludedAndTheJobRequeuesOntoTheSpare) {
  const RunResult r = RunCommand(Script() + " --lose-node", 240);
  if (const std::string reason = SkipReason(r.output); !reason.empty()) {
    EXPECT_EQ(r.exit_code, 77) << r.output;
    GTEST_SKIP() << reason;
  }
  std::printf("%s\n", r.output.c_str());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::smatch ended;
  ASSERT_TRUE(std::regex_search(
      r.output, ended, std::regex(R"(the job's ranks ended (\d+) s after hostB was lost)")))
      << r.output;
  EXPECT_LE(std::stoi(ended[1]), 5 + 30) << "train.comm_timeout_seconds=5, plus 30 s";
  for (const std::string fragment :
       {"bigmac: hang: no rank on hostB (ranks 2, 3) answers: a lost node? Resume with "
        "--resume auto, excluding host hostB",
        "bigmac-slurm: lost node(s): hostB (status 6)", "bigmac-slurm: requeueing job ",
        " without hostB (requeue 1 of at most 5", "slurm job 1: COMPLETED, exit 0",
        "before the loss and after the requeue", "(the same)",
        "two_hosts: hostB lost: the job ended in "}) {
    ExpectContains(r.output, fragment);
  }
  const std::vector<std::string> names = Namespaces(r.output);
  ASSERT_EQ(names.size(), 3u) << r.output;
  EXPECT_EQ(Leftovers(names), "");
  EXPECT_EQ(testutil::LiveSlurmDaemons(), "");
}

// SIGTERM while the ranks train on both hosts: the job is stopped, the namespaces removed.
TEST(TwoHosts, SigtermMidRunRemovesTheHostsAndTheirProcesses) {
  const RunResult r = Interrupted("TERM", "sigterm");
  if (const std::string reason = SkipReason(r.output); !reason.empty()) GTEST_SKIP() << reason;
  ExpectContains(r.output, "exit=143");
  ExpectContains(r.output, "two_hosts: stopping the running job");
  const std::vector<std::string> names = Namespaces(r.output);
  ASSERT_EQ(names.size(), 2u) << r.output;
  EXPECT_EQ(Leftovers(names), "");
}

// SIGKILL leaves the hosts and the ranks behind (no trap runs); the next run removes them.
TEST(TwoHosts, TheNextRunRemovesWhatAKilledRunLeft) {
  const RunResult killed = Interrupted("KILL", "sigkill");
  if (const std::string reason = SkipReason(killed.output); !reason.empty()) {
    GTEST_SKIP() << reason;
  }
  ExpectContains(killed.output, "exit=137");
  const std::vector<std::string> names = Namespaces(killed.output);
  ASSERT_EQ(names.size(), 2u) << killed.output;
  // No trap ran: both namespaces are still there.
  const std::string left = Leftovers(names);
  ExpectContains(left, names[0]);
  ExpectContains(left, names[1]);
  const RunResult next = RunCommand(Script() + " --steps 1", 80);
  if (next.exit_code != 0) RemoveNamespaces(names);
  EXPECT_EQ(next.exit_code, 0) << next.output;
  for (const std::string& name : names) {
    ExpectContains(next.output, "removing leftover namespace " + name);
  }
  EXPECT_EQ(Leftovers(names), "");
}

}  // namespace
}  // namespace bigmac
