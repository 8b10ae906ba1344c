// One run per directory (docs/reliability.md): real processes that share checkpoint.dir or
// train.output_dir, started one after the other and together, a holder that is killed, and the
// lock's own rules (util::DirectoryLock) in this process.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "core/util/dir_lock.h"
#include "tests/testing/run.h"

namespace bigmac {
namespace {

namespace fs = std::filesystem;
using testutil::Bigmac;
using testutil::ReadFile;
using testutil::RunCommand;
using testutil::RunResult;
using testutil::TempDir;

std::string DataDir() {
  static const std::string dir = [] {
    std::string text;
    for (int i = 0; i < 3000; ++i)
      text += "Run " + std::to_string(i * 7907 % 997) + " writes its own directory " +
              std::to_string(i % 11) + ".\n";
    return testutil::PrepareShards("run_lock", text);
  }();
  return dir;
}

std::string Train(const std::string& extra) {
  return Bigmac() + " train --config " + testutil::Runfile("configs/tiny.yaml") +
         " --set data.dir=" + DataDir() +
         " --set model.hidden_size=32 --set train.seq_length=32 --set train.micro_batch_size=2" +
         " --set train.log_interval=1 --set checkpoint.interval=1 " + extra;
}

// Every file under `dir` with its bytes, to show that a refused run changed nothing.
std::string Snapshot(const std::string& dir) {
  // A run that is still writing may rename a directory under the iterator: list again.
  for (int attempt = 0;; ++attempt) {
    try {
      std::string listing;
      for (const auto& entry : fs::recursive_directory_iterator(dir)) {
        listing += entry.path().string() + "\n";
        if (entry.is_regular_file()) listing += ReadFile(entry.path().string()) + "\n";
      }
      return listing;
    } catch (const fs::filesystem_error&) {
      if (attempt == 50) throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
}

// A run in the background that holds its directories: it stalls (a testing hook) at step 3,
// after checkpoints 1 and 2. Returns its pid once its log shows step 2.
int StartHolder(const std::string& name, const std::string& extra,
                const std::string& settled_dir = "") {
  const std::string log = TempDir() + "/" + name + ".log";
  const std::string pid_file = TempDir() + "/" + name + ".pid";
  const RunResult started = RunCommand(
      "BIGMAC_TEST_STALL_RANK=0:3 " + Train(extra) + " > " + log + " 2>&1 & echo $! > " + pid_file,
      10);
  EXPECT_EQ(started.exit_code, 0) << started.output;
  const int pid = std::stoi(ReadFile(pid_file));
  for (int i = 0; i < 600 && ReadFile(log).find("step 2/") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_NE(ReadFile(log).find("step 2/"), std::string::npos) << ReadFile(log);
  // Then until its writes have settled (checkpoint 2 saved; it stalls before step 3).
  for (int i = 0; i < 100 && !settled_dir.empty(); ++i) {
    const std::string before = Snapshot(settled_dir);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    if (Snapshot(settled_dir) == before) break;
  }
  return pid;
}

void Kill(int pid) {
  kill(pid, SIGKILL);
  for (int i = 0; i < 100 && kill(pid, 0) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

TEST(RunLock, ASecondRunOnTheSameCheckpointDirStopsAndNamesTheHolder) {
  const std::string ckpt = TempDir() + "/shared_ckpt";
  fs::remove_all(ckpt);
  // Synchronous saves: step 2's is committed before the holder stalls at step 3.
  const int holder = StartHolder("holder_a",
                                 "--set train.max_steps=6 --set checkpoint.async=false "
                                 "--set checkpoint.dir=" +
                                     ckpt + " --set train.output_dir=" + ckpt + "_out",
                                 ckpt);
  const std::string before = Snapshot(ckpt);
  EXPECT_NE(ReadFile(ckpt + "/latest").find("step_000002"), std::string::npos);

  const RunResult second = RunCommand(Train("--set train.max_steps=4 --set checkpoint.dir=" + ckpt +
                                            " --set train.output_dir=" + TempDir() + "/other_out"),
                                      60);
  EXPECT_EQ(second.exit_code, 8) << second.output;
  EXPECT_NE(second.output.find("checkpoint.dir (--set): " + ckpt +
                               " is in use by bigmac train on "
                               "host "),
            std::string::npos)
      << second.output;
  EXPECT_NE(second.output.find("(pid " + std::to_string(holder) + ", started "), std::string::npos)
      << second.output;
  EXPECT_NE(second.output.find("wait for that run to end, stop it, or choose another directory"),
            std::string::npos);
  // The dry-run gives the same answer, and neither touched the holder's checkpoints.
  const RunResult dry = RunCommand(Train("--dry-run --set checkpoint.dir=" + ckpt), 60);
  EXPECT_EQ(dry.exit_code, 8) << dry.output;
  EXPECT_NE(dry.output.find(" is in use by bigmac train on host "), std::string::npos);
  EXPECT_EQ(Snapshot(ckpt), before);

  // A holder that dies leaves its name in the lock file, but not the lock: the next run takes it
  // over, says so, and resumes from the dead run's last checkpoint.
  Kill(holder);
  const RunResult third =
      RunCommand(Train("--set train.max_steps=4 --resume auto --set checkpoint.dir=" + ckpt), 120);
  EXPECT_EQ(third.exit_code, 0) << third.output;
  EXPECT_NE(third.output.find("[lock] checkpoint.dir (--set): took over the stale lock of bigmac "
                              "train on host "),
            std::string::npos)
      << third.output;
  EXPECT_NE(third.output.find("(pid " + std::to_string(holder) + ", started "), std::string::npos);
  EXPECT_NE(third.output.find("resumed from " + ckpt + "/step_000002"), std::string::npos)
      << third.output;
  // A clean end removes the file: nothing stale for the run after it.
  EXPECT_FALSE(fs::exists(ckpt + "/" + util::kLockFileName));
}

TEST(RunLock, TrainOutputDirIsLockedToo) {
  const std::string out = TempDir() + "/shared_out";
  fs::remove_all(out);
  const int holder =
      StartHolder("holder_out", "--set train.max_steps=6 --set train.output_dir=" + out +
                                    " --set checkpoint.dir=" + TempDir() + "/ck_out_a");
  const RunResult second =
      RunCommand(Train("--set train.max_steps=2 --set train.output_dir=" + out +
                       " --set checkpoint.dir=" + TempDir() + "/ck_out_b"),
                 60);
  EXPECT_EQ(second.exit_code, 8) << second.output;
  EXPECT_NE(second.output.find("train.output_dir (--set): " + out + " is in use by bigmac train"),
            std::string::npos)
      << second.output;
  // Nothing of the refused run: its checkpoint directory was not even created.
  EXPECT_FALSE(fs::exists(TempDir() + "/ck_out_b"));
  // Another directory is free while the holder runs.
  const RunResult free =
      RunCommand(Train("--set train.max_steps=2 --set train.output_dir=" + TempDir() +
                       "/own_out --set checkpoint.dir=" + TempDir() + "/ck_out_c"),
                 120);
  EXPECT_EQ(free.exit_code, 0) << free.output;
  Kill(holder);
}

// Started together, exactly one run gets the directory; the other stops with exit 8 (before the
// lock this was two "successful" runs, or a raw filesystem race with exit 7).
TEST(RunLock, TwoRunsStartedTogetherGetOneWinner) {
  const std::string ckpt = TempDir() + "/race_ckpt";
  fs::remove_all(ckpt);
  const std::string run =
      // Synchronous saves: step 2's is committed before the winner stalls at step 3.
      "BIGMAC_TEST_STALL_RANK=0:3 " +
      Train("--set train.max_steps=6 --set checkpoint.async=false --set checkpoint.dir=" + ckpt +
            " --set train.output_dir=" + ckpt);
  const std::string a = TempDir() + "/race_a", b = TempDir() + "/race_b";
  const RunResult started = RunCommand(run + " > " + a + ".log 2>&1 & echo $! > " + a + ".pid; " +
                                           run + " > " + b + ".log 2>&1 & echo $! > " + b + ".pid",
                                       10);
  ASSERT_EQ(started.exit_code, 0) << started.output;
  const int pid_a = std::stoi(ReadFile(a + ".pid")), pid_b = std::stoi(ReadFile(b + ".pid"));
  // The loser ends by itself; the winner stalls at step 3 until it is killed.
  int alive = 2;
  for (int i = 0; i < 600 && alive == 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    alive = (kill(pid_a, 0) == 0) + (kill(pid_b, 0) == 0);
  }
  ASSERT_EQ(alive, 1);
  const bool a_lost = kill(pid_a, 0) != 0;
  const std::string loser_log = ReadFile(a_lost ? a + ".log" : b + ".log");
  // The winner may not have written its name yet: "in use by another process (...)".
  EXPECT_NE(loser_log.find(" is in use by "), std::string::npos) << loser_log;
  EXPECT_NE(loser_log.find("bigmac: rank 0 exits with code 8"), std::string::npos) << loser_log;
  for (int i = 0; i < 600 && ReadFile(ckpt + "/latest").find("step_000002") == std::string::npos;
       ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_NE(ReadFile(ckpt + "/latest").find("step_000002"), std::string::npos)
      << ReadFile(a_lost ? b + ".log" : a + ".log");
  Kill(a_lost ? pid_b : pid_a);
}

// The lock itself: a second claim fails even from this process (open-file-description locks),
// a probe sees the holder without creating anything, and a released lock is free again.
TEST(RunLock, DirectoryLockRules) {
  const std::string dir = TempDir() + "/lock_rules/nested";
  fs::remove_all(TempDir() + "/lock_rules");
  EXPECT_EQ(util::DirectoryLock::Probe(dir, "x"), "");
  EXPECT_FALSE(fs::exists(dir)) << "a probe creates nothing";
  std::string problem, note;
  const mode_t old_mask = umask(027);
  auto lock = util::DirectoryLock::Acquire(dir, "checkpoint.dir (t)", "train", &problem, &note);
  umask(old_mask);
  ASSERT_NE(lock, nullptr) << problem;
  EXPECT_EQ(note, "");
  EXPECT_EQ(fs::status(dir).permissions() & fs::perms::all,
            fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec)
      << "the umask decides the mode of a directory the lock creates";
  const std::string held = util::DirectoryLock::Probe(dir, "checkpoint.dir (t)");
  EXPECT_NE(held.find("checkpoint.dir (t): " + dir + " is in use by bigmac train on host "),
            std::string::npos)
      << held;
  EXPECT_NE(held.find("(pid " + std::to_string(getpid()) + ", started "), std::string::npos);
  EXPECT_EQ(util::DirectoryLock::Acquire(dir, "y", "train", &problem, &note), nullptr);
  EXPECT_NE(problem.find("y: " + dir + " is in use by"), std::string::npos) << problem;
  lock.reset();
  EXPECT_FALSE(fs::exists(TempDir() + "/lock_rules")) << "what Acquire created, and is empty, goes";
  EXPECT_EQ(util::DirectoryLock::Probe(dir, "x"), "");
  auto again = util::DirectoryLock::Acquire(dir, "z", "train", &problem, &note);
  EXPECT_NE(again, nullptr) << problem;
  EXPECT_EQ(note, "") << "a released lock is not stale";
  // A lock file that is not a regular file (planted link) is refused, never followed.
  again.reset();
  const std::string planted = TempDir() + "/lock_rules/planted";
  fs::create_directories(planted);
  fs::create_symlink("/etc/hostname", planted + "/" + util::kLockFileName);
  EXPECT_EQ(util::DirectoryLock::Acquire(planted, "w", "train", &problem, &note), nullptr);
  EXPECT_NE(problem.find("w: cannot create the lock file " + planted), std::string::npos)
      << problem;
}

}  // namespace
}  // namespace bigmac
