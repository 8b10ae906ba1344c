// Hangs explained (docs/reliability.md), under mpirun on the CPU: a rank stopped by SIGSTOP, a
// rank killed without the launcher noticing, and a mismatched schedule. In each case the rank
// whose wait passes train.comm_timeout_seconds prints one hang report naming the right rank, and
// the job exits with code 6 within the deadline plus 10 s of the hang's start.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "core/util/process.h"
#include "tests/testing/expect.h"
#include "tests/testing/run.h"

namespace bigmac {
namespace {

using testutil::ExpectContains;

constexpr int kDeadline = 5;  // train.comm_timeout_seconds

std::string DataDir() {
  static const std::string dir = [] {
    std::string text;
    for (int i = 0; i < 3000; ++i) {
      text += "Rank " + std::to_string(i % 4) + " waits on rank " + std::to_string((i + 1) % 4) +
              ", which is stopped in Forward mb" + std::to_string(i % 8) + ".\n";
    }
    return testutil::PrepareShards("hangs", text);
  }();
  return dir;
}

// Every line of a run's output, with the time it arrived.
struct Line {
  double seconds;
  std::string text;
};

struct JobRun {
  int exit_code = -1;
  double seconds = 0;
  std::vector<Line> lines;
  std::string output;

  // Arrival of the last line holding `fragment` (-1 if none).
  double TimeOf(const std::string& fragment) const {
    double at = -1;
    for (const Line& line : lines) {
      if (line.text.find(fragment) != std::string::npos) at = line.seconds;
    }
    return at;
  }
  // The lines holding `fragment`.
  std::vector<std::string> LinesWith(const std::string& fragment) const {
    std::vector<std::string> found;
    for (const Line& line : lines) {
      if (line.text.find(fragment) != std::string::npos) found.push_back(line.text);
    }
    return found;
  }
};

// Two to four stages of the tiny model, 1F1B, 4 micro-batches per step, 6 steps, the short
// deadline. `wrapper` (if not empty) starts each rank.
JobRun Train(int ranks, const std::string& env, const std::string& wrapper = "") {
  const std::string command =
      env + " " + testutil::Mpirun(ranks) + " " + (wrapper.empty() ? "" : wrapper + " ") +
      testutil::Bigmac() + " train --config " + testutil::Runfile("configs/tiny.yaml") +
      " --set data.dir=" + DataDir() + " --set parallel.pp_size=" + std::to_string(ranks) +
      " --set parallel.schedule=1f1b --set model.num_layers=6"
      " --set model.hidden_size=32 --set model.num_heads=2 --set train.seq_length=16"
      " --set train.micro_batch_size=2 --set train.gradient_accumulation_steps=4"
      " --set train.eval_interval=0 --set train.eval_batches=2 --set train.log_interval=1"
      " --set train.max_steps=6 --set train.comm_timeout_seconds=" +
      std::to_string(kDeadline);
  const auto start = std::chrono::steady_clock::now();
  auto now = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  JobRun run;
  FILE* pipe =
      popen(("timeout -k 5 90 /bin/sh -c " + util::ShellQuote(command) + " 2>&1").c_str(), "r");
  char buffer[8192];
  while (pipe && std::fgets(buffer, sizeof(buffer), pipe)) {
    std::string text = buffer;
    if (!text.empty() && text.back() == '\n') text.pop_back();
    run.lines.push_back({now(), text});
    run.output += text + "\n";
  }
  const int status = pipe ? pclose(pipe) : -1;
  run.exit_code = status >= 0 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  run.seconds = now();
  return run;
}

// The single summary line of the report.
std::string Summary(const JobRun& run) {
  const std::vector<std::string> summaries = run.LinesWith("bigmac: hang: ");
  EXPECT_EQ(summaries.size(), 1u) << "one report per job:\n" << run.output;
  return summaries.empty() ? "" : summaries.front();
}

// The report's verdict holds every fragment, and the job ended with exit 6 within the deadline
// plus 10 s of `hang_start` (a line printed just before the hang began).
void ExpectReport(const JobRun& run, const std::vector<std::string>& fragments,
                  const std::string& hang_start, const char* name) {
  const std::string summary = Summary(run);
  for (const std::string& fragment : fragments) ExpectContains(summary, fragment);
  EXPECT_EQ(run.exit_code, 6) << run.output;
  const double start = run.TimeOf(hang_start);
  ASSERT_GE(start, 0) << "no '" << hang_start << "' in:\n" << run.output;
  const double elapsed = run.seconds - start;
  EXPECT_LE(elapsed, kDeadline + 10) << run.output;
  std::printf("[hang] %s: exit %d %.1f s after the hang began (deadline %d s): %s\n", name,
              run.exit_code, elapsed, kDeadline, summary.c_str());
}

// The pid the report gives for `rank` ("rank 2 (vm, pid 1234): ...").
int PidOf(const JobRun& run, int rank) {
  const std::string key = "[hang]   rank " + std::to_string(rank) + " (";
  for (const std::string& line : run.LinesWith(key)) {
    const size_t at = line.find(", pid ");
    if (at != std::string::npos) return std::atoi(line.c_str() + at + 6);
  }
  return 0;
}

TEST(Hang, ARankStoppedBySigstopIsNamedWithItsLastAction) {
  // Four stages; rank 2 stops itself before its Forward of micro-batch 1 in step 3. Rank 0 waits
  // for rank 1, which waits for rank 2: the chain must end at rank 2, not at the rank waited on.
  // Which rank reports first decides where the chain starts: rank 0 or 1 ("rank 1 waits RecvGrad
  // mb0 from rank 2"), or rank 3 ("rank 3 waits RecvAct mb0 from rank 2", or mb1 when rank 2's
  // activation for micro-batch 0 reached it before rank 2 stopped).
  const JobRun run = Train(4, "BIGMAC_TEST_SIGSTOP=2:3");
  ExpectReport(run,
               {" from rank 2; rank 2 is stopped in Forward mb1 of step 3 (no progress for ",
                "it does not answer, and process ", " is T (stopped by a signal))"},
               "step 2/6", "SIGSTOP of rank 2 in step 3");
  ExpectContains(run.output, "past the deadline of 5 s");
  // The stopped process does not outlive the job.
  const int pid = PidOf(run, 2);
  ASSERT_GT(pid, 0) << run.output;
  for (int i = 0; i < 50 && std::filesystem::exists("/proc/" + std::to_string(pid)); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(std::filesystem::exists("/proc/" + std::to_string(pid))) << "pid " << pid;
}

TEST(Hang, AKilledRankTheLauncherDidNotNoticeIsNamedDead) {
  // mpirun ends the job itself when a rank it started dies (tests/mpi/fault_test.cc); here each
  // rank runs under a shell that outlives it, as when a node dies and the launcher is not told: the
  // peers' deadlines must explain it.
  const std::string wrapper = testutil::WriteTempFile(
      "hang_wrapper.sh", "#!/bin/sh\n\"$@\"\necho \"wrapper: bigmac exited $?\"\nsleep 60\n");
  std::filesystem::permissions(wrapper, std::filesystem::perms::owner_all);
  const JobRun run = Train(2, "BIGMAC_TEST_KILL=1:3", wrapper);
  // What rank 0 waits in depends on where rank 1's last messages were when it died (the Open MPI
  // path, the timing): a gradient still in flight ("waits RecvGrad mb2 from rank 1"), the tied
  // embedding's gradient, or, all delivered, the optimizer's all-reduce ("waits for rank 1 in
  // OptimizerStep: ..."). Each names rank 1 as the one waited for, and dead.
  ExpectReport(run,
               {"bigmac: hang: rank 0 waits ", "; rank 1 is dead (process ",
                "its status port refuses connections)"},
               "step 2/6", "SIGKILL of rank 1 in step 3, unnoticed by mpirun");
  EXPECT_TRUE(std::regex_search(
      run.output,
      std::regex(R"(rank 0 waits (\S.* from rank 1|for rank 1 in \S.*); rank 1 is dead)")))
      << run.output;
  ExpectContains(run.output, "wrapper: bigmac exited 137");
}

TEST(Hang, AMismatchedScheduleIsACycle) {
  // Rank 1 (the last stage) sends its first gradient only at the end of the flush: rank 0 waits
  // for it while rank 1 waits for an activation rank 0 sends only after it.
  ExpectReport(Train(2, "BIGMAC_TEST_MISMATCH_SCHEDULE=1"),
               {"rank 0 waits RecvGrad mb0 from rank 1", "rank 1 waits RecvAct mb2 from rank 0",
                "(a cycle: each waits for a message the other sends only later"},
               "[val] step 0", "mismatched schedule on rank 1");
}

}  // namespace
}  // namespace bigmac
