// Outputs on a filesystem that fills up (docs/reliability.md, "Outputs"): a real tmpfs of a few
// hundred KiB, mounted for the test (CI runs as root). Every output either ends whole or is not
// left looking complete, the run says which, and the exit code is 8.
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <ostream>
#include <sstream>
#include <string>

#include "core/util/output_file.h"
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
      text += "Disk " + std::to_string(i * 7919 % 991) + " is nearly full " +
              std::to_string(i % 7) + ".\n";
    return testutil::PrepareShards("full_disk", text);
  }();
  return dir;
}

// A tmpfs of `kib` KiB at <tmp>/<name>, filled to `free_kib` free; unmounted by the destructor.
class SmallFilesystem {
 public:
  SmallFilesystem(const std::string& name, int kib, int free_kib) : dir_(TempDir() + "/" + name) {
    fs::create_directories(dir_);
    const std::string options = "size=" + std::to_string(kib) + "k";
    if (mount("tmpfs", dir_.c_str(), "tmpfs", 0, options.c_str()) != 0) {
      error_ = std::strerror(errno);
      return;
    }
    mounted_ = true;
    std::ofstream(dir_ + "/filler", std::ios::binary)
        << std::string(static_cast<size_t>(kib - free_kib) * 1024, 'x');
  }
  ~SmallFilesystem() {
    if (mounted_) umount2(dir_.c_str(), MNT_DETACH);
  }
  const std::string& dir() const { return dir_; }
  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }

 private:
  std::string dir_;
  bool mounted_ = false;
  std::string error_;
};

#define REQUIRE_MOUNT(filesystem)                                       \
  if (!(filesystem).mounted())                                          \
  GTEST_SKIP() << "cannot mount a tmpfs here (" << (filesystem).error() \
               << "); this test needs root with CAP_SYS_ADMIN"

std::string Train(const std::string& extra) {
  return Bigmac() + " train --config " + testutil::Runfile("configs/tiny.yaml") +
         " --set data.dir=" + DataDir() +
         " --set model.hidden_size=32 --set train.seq_length=32 --set train.micro_batch_size=2" +
         " --set train.log_interval=1 " + extra;
}

// metrics.jsonl and the events file fill the disk part-way through the run: the run trains to
// the end, warns at the first failure, ends with exit 8, and leaves each file cut back to whole
// records under a name that says it is incomplete; trace.json is not left half-written.
TEST(FullDisk, RunOutputsAreWholeOrMarkedIncompleteAndTheRunExits8) {
  SmallFilesystem disk("full_run", 256, 24);
  REQUIRE_MOUNT(disk);
  const std::string out = disk.dir() + "/out";
  const RunResult r = RunCommand(Train("--set train.max_steps=30 --set train.output_dir=" + out +
                                       " --dump " + disk.dir() + "/dump"),
                                 300);
  EXPECT_EQ(r.exit_code, 8) << r.output;
  EXPECT_NE(r.output.find("step 30/30"), std::string::npos) << "training goes on: " << r.output;
  EXPECT_NE(r.output.find("[output] warning: " + out + "/metrics.jsonl: write failed after "),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("No space left on device"), std::string::npos);
  EXPECT_NE(r.output.find("output file(s) not written whole"), std::string::npos);
  EXPECT_EQ(r.output.find("[train] wrote "), std::string::npos) << "no claim of success";
  EXPECT_FALSE(fs::exists(out + "/metrics.jsonl")) << "an incomplete file keeps no final name";
  const std::string metrics = ReadFile(out + "/metrics.jsonl.incomplete");
  ASSERT_FALSE(metrics.empty());
  EXPECT_EQ(metrics.back(), '\n') << "cut back to whole lines";
  // Every line is whole JSON: the steps from 1 up to where the disk filled, in order.
  std::istringstream lines(metrics);
  std::string line;
  int step = 0;
  while (std::getline(lines, line)) {
    ++step;
    EXPECT_EQ(line.front(), '{');
    EXPECT_EQ(line.back(), '}');
    EXPECT_NE(line.find("\"step\":" + std::to_string(step) + ","), std::string::npos) << line;
  }
  EXPECT_GT(step, 0);
  EXPECT_LT(step, 30);
  // Nothing half-written under a final name: no trace.json, no dump file, no temporary.
  for (const auto& entry : fs::recursive_directory_iterator(disk.dir())) {
    const std::string name = entry.path().filename().string();
    EXPECT_EQ(name.find(".tmp."), std::string::npos) << entry.path();
    EXPECT_NE(name, ".bigmac.lock") << "the lock is removed however the run ends";
    if (entry.is_regular_file() && name != "filler") {
      EXPECT_TRUE(name.find(".incomplete") != std::string::npos) << entry.path();
    }
  }
}

// The stream's buffer passes every byte, in order, across its 1 MiB pieces: single characters,
// short strings and writes larger than the buffer.
TEST(OutputFileBuffer, StreamsEveryByteInOrder) {
  const std::string path = TempDir() + "/streamed.txt";
  fs::remove(path);
  std::string problem;
  std::unique_ptr<util::OutputFile> file = util::OutputFile::Open(path, &problem);
  ASSERT_TRUE(file) << problem;
  std::string expected;
  {
    util::OutputFileBuffer buffer(file.get());
    std::ostream out(&buffer);
    uint32_t state = 12345;
    for (int piece = 0; piece < 4000; ++piece) {
      state = state * 1664525u + 1013904223u;
      const size_t size = piece % 97 == 0 ? (size_t{3} << 19) + state % 1000 : state % 3000;
      std::string text(size, 'a' + static_cast<char>(state % 26));
      if (piece % 5 == 0) {
        out << 'x';
        expected += 'x';
      }
      out << text;
      expected += text;
    }
    out.flush();
  }
  ASSERT_GT(expected.size(), size_t{30} << 20);
  ASSERT_EQ(file->Commit(), "");
  EXPECT_TRUE(ReadFile(path) == expected) << "the file differs from what was streamed";
  fs::remove(path);
}

// Commands that write one file: nothing is left at the path (or the earlier file is kept), and
// the exit code is 8 with the path and the OS's reason.
TEST(FullDisk, WholeFileOutputsLeaveNothingOrTheEarlierFile) {
  SmallFilesystem disk("full_files", 256, 16);
  REQUIRE_MOUNT(disk);
  const std::string ckpt = TempDir() + "/full_files_ckpt";
  fs::remove_all(ckpt);
  ASSERT_EQ(RunCommand(Train("--set train.max_steps=1 --set train.output_dir= "
                             "--set checkpoint.dir=" +
                             ckpt),
                       120)
                .exit_code,
            0);
  // ckpt export: a new file is not created; an earlier one survives --overwrite.
  const std::string model = disk.dir() + "/model.safetensors";
  RunResult r = RunCommand(Bigmac() + " ckpt export " + ckpt + " --safetensors " + model, 60);
  EXPECT_EQ(r.exit_code, 8) << r.output;
  EXPECT_NE(r.output.find(model + ": write failed after "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("No space left on device"), std::string::npos);
  EXPECT_FALSE(fs::exists(model));
  std::ofstream(model) << "earlier";
  r = RunCommand(Bigmac() + " ckpt export " + ckpt + " --safetensors " + model + " --overwrite",
                 60);
  EXPECT_EQ(r.exit_code, 8) << r.output;
  EXPECT_EQ(ReadFile(model), "earlier");
  // data prep into a directory on the full disk: exit 8, the directory is not created.
  const std::string corpus = testutil::WriteTempFile("full_corpus.txt", std::string(300000, 'a'));
  r = RunCommand(Bigmac() + " data prep --input " + corpus + " --output " + disk.dir() + "/shards",
                 60);
  EXPECT_EQ(r.exit_code, 8) << r.output;
  EXPECT_NE(r.output.find("No space left on device"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(disk.dir() + "/shards"));
  // schedule --trace and data batches --output: the same rule.
  r = RunCommand(
      Bigmac() + " schedule --kind 1f1b --pp 8 --microbatches 64 --trace " + disk.dir() + "/t.json",
      60);
  EXPECT_EQ(r.exit_code, 8) << r.output;
  EXPECT_FALSE(fs::exists(disk.dir() + "/t.json"));
  for (const auto& entry : fs::directory_iterator(disk.dir()))
    EXPECT_EQ(entry.path().filename().string().find(".tmp."), std::string::npos) << entry.path();
}

// data prep --overwrite replaces the shards but keeps the user's directory (its inode, its mode,
// its other files); a new directory gets the umask's mode, not mkdtemp's 0700.
TEST(OutputRules, DataPrepKeepsTheDirectoryAndHonoursTheUmask) {
  const std::string corpus = testutil::WriteTempFile(
      "keep_corpus.txt", std::string(60000, 'b') + "\n" + std::string(60000, 'c'));
  const std::string dir = TempDir() + "/keep_shards";
  fs::remove_all(dir);
  fs::create_directories(dir);
  chmod(dir.c_str(), 0751);
  std::ofstream(dir + "/README") << "mine";
  struct stat before, after;
  ASSERT_EQ(stat(dir.c_str(), &before), 0);
  RunResult r = RunCommand(Bigmac() + " data prep --input " + corpus + " --output " + dir, 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = RunCommand(Bigmac() + " data prep --input " + corpus + " --output " + dir + " --overwrite",
                 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(stat(dir.c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino) << "the same directory, not a new one";
  EXPECT_EQ(after.st_mode & 07777, 0751u);
  EXPECT_EQ(ReadFile(dir + "/README"), "mine");
  EXPECT_TRUE(fs::exists(dir + "/train_000.bin"));
  for (const auto& entry : fs::directory_iterator(dir))
    EXPECT_EQ(entry.path().filename().string().find(".prep_"), std::string::npos)
        << "no staging directory left: " << entry.path();
  // A new directory: 0777 less the umask.
  const std::string fresh = TempDir() + "/fresh_shards";
  fs::remove_all(fresh);
  r = RunCommand("umask 027 && " + Bigmac() + " data prep --input " + corpus + " --output " + fresh,
                 60);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_EQ(stat(fresh.c_str(), &after), 0);
  EXPECT_EQ(after.st_mode & 07777, 0750u);
}

}  // namespace
}  // namespace bigmac
