// Checkpoints under mpirun: bitwise resume, resharding to other layouts, damage refused without
// touching the disk, a crash mid-write leaving the previous checkpoint usable, safetensors.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "core/checkpoint/checkpoint.pb.h"
#include "nlohmann/json.hpp"
#include "tests/testing/run.h"

namespace bigmac {
namespace {

namespace fs = std::filesystem;
using testutil::RunCommand;
using testutil::Runfile;

using testutil::Bigmac;
using testutil::TempDir;

std::string DataDir() {
  static const std::string dir = [] {
    std::string text;
    for (int i = 0; i < 5000; ++i) {
      text += "Checkpoint " + std::to_string(i * 17 % 89) + " keeps layer " +
              std::to_string(i % 11) + " safe on disk.\n";
    }
    return testutil::PrepareShards("ckpt", text);
  }();
  return dir;
}

constexpr int kHidden = 32;

struct Result {
  int exit_code;
  std::string output;
  std::vector<double> losses;                  // the steps this run trained
  std::map<std::string, std::string> weights;  // dumped layer files
};

// 11 layers (uneven on 2, 3 and 4 stages), 6 steps, a checkpoint every 3.
// `env` prefixes the command (the checkpoint fault hooks).
Result Train(int pp, int dp, const std::string& name, const std::string& extra,
             const std::string& env = "") {
  const std::string dump = TempDir() + "/dump_" + name;
  fs::remove_all(dump);
  const std::string command =
      env + testutil::Mpirun(pp * dp) + " " + Bigmac() + " train --config " +
      Runfile("configs/tiny.yaml") + " --dump " + dump + " --set data.dir=" + DataDir() +
      " --set model.num_layers=11 --set model.hidden_size=" + std::to_string(kHidden) +
      " --set model.num_heads=2 --set train.seq_length=16 --set train.micro_batch_size=2" +
      " --set parallel.schedule=1f1b --set parallel.num_microbatches=4 --set train.max_steps=6" +
      " --set train.eval_batches=2 --set train.eval_interval=0 --set optim.warmup_steps=2 --set "
      "optim.lr=3e-3" +
      " --set checkpoint.interval=3 --set parallel.pp_size=" + std::to_string(pp) + " " + extra;
  const testutil::RunResult r = RunCommand(command, 240);
  Result result{r.exit_code, r.output, {}, {}};
  std::ifstream losses(dump + "/losses.txt");
  for (double loss; losses >> loss;) result.losses.push_back(loss);
  if (fs::exists(dump)) {
    for (const auto& entry : fs::directory_iterator(dump)) {
      if (entry.path().extension() != ".f32") continue;
      std::ifstream in(entry.path(), std::ios::binary);
      result.weights[entry.path().filename().string()] =
          std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    }
  }
  return result;
}

std::string Accum(int n) { return " --set train.gradient_accumulation_steps=" + std::to_string(n); }

// An uninterrupted run that saves at steps 3 and 6.
const Result& Full(int pp, int dp) {
  static std::map<std::pair<int, int>, Result> cache;
  auto key = std::make_pair(pp, dp);
  if (!cache.count(key)) {
    const std::string dir =
        TempDir() + "/ckpt_full_pp" + std::to_string(pp) + "_dp" + std::to_string(dp);
    fs::remove_all(dir);
    cache[key] = Train(pp, dp, "full_" + std::to_string(pp) + "_" + std::to_string(dp),
                       "--set checkpoint.dir=" + dir + Accum(4));
  }
  return cache.at(key);
}

std::string FullDir(int pp, int dp) {
  return TempDir() + "/ckpt_full_pp" + std::to_string(pp) + "_dp" + std::to_string(dp);
}

double MaxRelative(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = a.size() == b.size() ? 0 : INFINITY;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    worst = std::max(worst, std::fabs(a[i] - b[i]) / std::max(1.0, std::fabs(a[i])));
  }
  return worst;
}

std::vector<double> Tail(const std::vector<double>& losses) {
  return losses.size() >= 3 ? std::vector<double>(losses.end() - 3, losses.end()) : losses;
}

TEST(Resume, BitwiseWithTheSameLayout) {
  const Result& full = Full(2, 1);
  ASSERT_EQ(full.exit_code, 0) << full.output;
  ASSERT_EQ(full.losses.size(), 6u);
  const Result resumed =
      Train(2, 1, "resume_same",
            "--resume " + FullDir(2, 1) + "/step_000003" + " --set checkpoint.dir=" + TempDir() +
                "/ckpt_resumed" + Accum(4));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("[ckpt] resumed from"), std::string::npos);
  EXPECT_EQ(resumed.losses, Tail(full.losses));
  EXPECT_EQ(resumed.weights, full.weights);
}

struct Reshard {
  int from_pp, from_dp, to_pp, to_dp;
};

class ReshardTest : public ::testing::TestWithParam<Reshard> {};

// Saved under one layout, resumed under another: the losses continue as the uninterrupted run's.
TEST_P(ReshardTest, ContinuesLikeTheUninterruptedRun) {
  const Reshard r = GetParam();
  const Result& full = Full(r.from_pp, r.from_dp);
  ASSERT_EQ(full.exit_code, 0) << full.output;
  const std::string name = "reshard_" + std::to_string(r.from_pp) + std::to_string(r.from_dp) +
                           "_" + std::to_string(r.to_pp) + std::to_string(r.to_dp);
  // The same global batch: replicas x accumulation stays 4 x from_dp.
  const Result resumed = Train(r.to_pp, r.to_dp, name,
                               "--resume " + FullDir(r.from_pp, r.from_dp) +
                                   "/step_000003 --set checkpoint.dir=" + TempDir() + "/" + name +
                                   Accum(4 * r.from_dp / r.to_dp));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const double difference = MaxRelative(Tail(full.losses), resumed.losses);
  EXPECT_LE(difference, 1e-6);
  std::printf("[reshard] pp=%d dp=%d -> pp=%d dp=%d: max relative loss difference %.3g%s\n",
              r.from_pp, r.from_dp, r.to_pp, r.to_dp, difference,
              difference == 0 ? " (bitwise)" : "");
}

INSTANTIATE_TEST_SUITE_P(Layouts, ReshardTest,
                         ::testing::Values(Reshard{4, 1, 2, 1}, Reshard{4, 1, 1, 1},
                                           Reshard{2, 1, 4, 1}, Reshard{4, 1, 3, 1},
                                           Reshard{2, 2, 2, 1}),
                         [](const auto& info) {
                           const Reshard& r = info.param;
                           return "pp" + std::to_string(r.from_pp) + "dp" +
                                  std::to_string(r.from_dp) + "_to_pp" + std::to_string(r.to_pp) +
                                  "dp" + std::to_string(r.to_dp);
                         });

// ---------------------------------------------------------------- damage

std::map<std::string, std::string> Snapshot(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    files[entry.path().string()] =
        std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  return files;
}

// A copy of the full pp=2 run's step-3 checkpoint, damaged by `damage`, must be refused with
// `fragment` (exit 7) by a resume, and nothing on disk may change.
void ExpectRefused(const std::string& name, const std::function<void(const std::string&)>& damage,
                   const std::string& fragment, const std::string& extra = "") {
  ASSERT_EQ(Full(2, 1).exit_code, 0);
  const std::string dir = TempDir() + "/damaged_" + name;
  fs::remove_all(dir);
  fs::copy(FullDir(2, 1) + "/step_000003", dir, fs::copy_options::recursive);
  damage(dir);
  const auto before = Snapshot(dir);
  const Result r = Train(2, 1, "damaged_" + name, "--resume " + dir + Accum(4) + " " + extra);
  EXPECT_EQ(r.exit_code, 7) << r.output;
  EXPECT_NE(r.output.find(fragment), std::string::npos) << "expected: " << fragment << "\n"
                                                        << r.output;
  EXPECT_EQ(Snapshot(dir), before) << "a refused checkpoint is left as it was";
  const testutil::RunResult inspect = RunCommand(Bigmac() + " ckpt inspect " + dir, 30);
  if (extra.empty()) {
    EXPECT_NE(inspect.exit_code, 0) << "inspect reports the damage too:\n" << inspect.output;
  }
}

void FlipByte(const std::string& path, int64_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(at);
  char c;
  f.get(c);
  f.seekp(at);
  f.put(static_cast<char>(c ^ 0x40));
}

TEST(Damage, ChecksumMismatch) {
  ExpectRefused(
      "checksum", [](const std::string& dir) { FlipByte(dir + "/block_0004.bin", 100); },
      "block_0004.bin: checksum mismatch");
}

TEST(Damage, TruncatedFile) {
  ExpectRefused(
      "truncated", [](const std::string& dir) { fs::resize_file(dir + "/block_0007.bin", 1000); },
      "block_0007.bin: 1000 bytes, the manifest says");
}

TEST(Damage, MissingFile) {
  ExpectRefused(
      "missing", [](const std::string& dir) { fs::remove(dir + "/head.bin"); },
      "head.bin: missing");
}

TEST(Damage, DifferentModelShape) {
  ExpectRefused(
      "shape", [](const std::string&) {},
      "the checkpoint is for a different model shape: model.hidden_size=32 in the checkpoint, 64 "
      "in this "
      "config",
      "--set model.hidden_size=64");
}

TEST(Damage, MissingLayerId) {
  ExpectRefused(
      "layer",
      [](const std::string& dir) {
        checkpoint::Manifest manifest;
        {
          std::ifstream in(dir + "/manifest.pb", std::ios::binary);
          ASSERT_TRUE(manifest.ParseFromIstream(&in));
        }
        auto* files = manifest.mutable_files();
        for (int i = 0; i < files->size(); ++i) {
          if (files->Get(i).layer_id() == 5) {
            files->DeleteSubrange(i, 1);
            break;
          }
        }
        std::ofstream out(dir + "/manifest.pb", std::ios::binary | std::ios::trunc);
        manifest.SerializeToOstream(&out);
      },
      "missing layer_id 5 (block 5)");
}

// A writer killed half-way through a file of the step-6 save: `latest` still names step 3, which
// verifies and resumes to the same losses as an uninterrupted run.
TEST(Crash, FirstSaveKilledLeavesTheOlderOne) {
  const std::string dir = TempDir() + "/ckpt_crash2";
  fs::remove_all(dir);
  // Steps 1-3 save step 3; the save of step 6 is killed half-way.
  const Result r = Train(2, 1, "crash2", "--set checkpoint.dir=" + dir + Accum(4));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  fs::remove_all(dir + "/step_000006");
  {
    std::ofstream latest(dir + "/latest", std::ios::trunc);
    latest << "step_000003\n";
  }
  const Result crash =
      Train(2, 1, "crash2_killed", "--resume auto --set checkpoint.dir=" + dir + Accum(4),
            "BIGMAC_TEST_CRASH_IN_CHECKPOINT=6 ");
  EXPECT_NE(crash.exit_code, 0) << crash.output;
  EXPECT_TRUE(fs::exists(dir + "/.tmp_step_000006")) << crash.output;
  EXPECT_FALSE(fs::exists(dir + "/step_000006"));
  std::ifstream latest(dir + "/latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, "step_000003");
  const testutil::RunResult inspect = RunCommand(Bigmac() + " ckpt inspect " + dir, 30);
  EXPECT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_NE(inspect.output.find("step 3"), std::string::npos) << inspect.output;
  // It resumes (auto) to the uninterrupted run's losses.
  const Result resumed =
      Train(2, 1, "after_crash", "--resume auto --set checkpoint.dir=" + dir + Accum(4));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_EQ(resumed.losses, Tail(Full(2, 1).losses));
}

// A write that fails half-way (a full disk): every rank stops with exit 7, the temporary directory
// is removed, and `latest` still names the previous, intact checkpoint.
TEST(Crash, FailedWriteKeepsThePreviousCheckpoint) {
  const std::string dir = TempDir() + "/ckpt_full_disk";
  fs::remove_all(dir);
  const Result r = Train(2, 1, "full_disk", "--set checkpoint.dir=" + dir + Accum(4),
                         "BIGMAC_TEST_FAIL_CHECKPOINT=6 ");
  EXPECT_EQ(r.exit_code, 7) << r.output;
  EXPECT_NE(r.output.find("No space left on device (injected); the previous checkpoint is intact"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir + "/.tmp_step_000006"));
  EXPECT_FALSE(fs::exists(dir + "/step_000006"));
  std::ifstream latest(dir + "/latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, "step_000003");
  EXPECT_EQ(RunCommand(Bigmac() + " ckpt inspect " + dir, 30).exit_code, 0);
}

// Resuming from an older step into a directory that holds later steps of an abandoned run: the new
// saves count as the newest, `latest` always names an existing checkpoint, and the later
// directories are left for the user.
TEST(Retention, ResumingFromAnOlderStepNeverDeletesWhatLatestNames) {
  const std::string dir = TempDir() + "/ckpt_older";
  fs::remove_all(dir);
  ASSERT_EQ(Train(2, 1, "older_full", "--set checkpoint.dir=" + dir + Accum(4)).exit_code,
            0);  // steps 3, 6
  const Result r = Train(
      2, 1, "older_resume",
      "--resume " + dir + "/step_000003 --set checkpoint.dir=" + dir +
          " --set checkpoint.interval=1 --set checkpoint.keep_last=1 --set train.max_steps=4" +
          Accum(4));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream latest(dir + "/latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, "step_000004");
  EXPECT_TRUE(fs::exists(dir + "/step_000004"));
  EXPECT_FALSE(fs::exists(dir + "/step_000003")) << "keep_last=1 among steps up to 4";
  EXPECT_TRUE(fs::exists(dir + "/step_000006")) << "the abandoned run's later step is left alone";
  EXPECT_EQ(RunCommand(Bigmac() + " ckpt inspect " + dir, 30).exit_code, 0);
}

TEST(Retention, KeepsTheLastNAndTiedWeightOnce) {
  const std::string dir = TempDir() + "/ckpt_keep";
  fs::remove_all(dir);
  const Result r = Train(4, 1, "keep",
                         "--set checkpoint.dir=" + dir +
                             " --set checkpoint.interval=2 "
                             "--set checkpoint.keep_last=2" +
                             Accum(4));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fs::exists(dir + "/step_000002"));
  EXPECT_TRUE(fs::exists(dir + "/step_000004"));
  EXPECT_TRUE(fs::exists(dir + "/step_000006"));
  checkpoint::Manifest manifest;
  std::ifstream in(dir + "/step_000006/manifest.pb", std::ios::binary);
  ASSERT_TRUE(manifest.ParseFromIstream(&in));
  int wte = 0;
  for (const auto& tensor : manifest.tensors())
    wte += tensor.name().find("/wte#") != std::string::npos;
  EXPECT_EQ(wte, 3) << "value and two moments, once, under the embedding";
  for (const auto& tensor : manifest.tensors()) {
    if (tensor.name().find("/wte#") != std::string::npos) {
      EXPECT_EQ(tensor.file(), "embedding.bin");
    }
  }
}

// ---------------------------------------------------------------- asynchronous saves

// The files of a step directory by name, manifest.txt aside (it holds the config).
std::map<std::string, std::string> StepFiles(const std::string& step_dir) {
  std::map<std::string, std::string> files;
  for (const auto& entry : fs::directory_iterator(step_dir)) {
    const std::string name = entry.path().filename().string();
    if (name == "manifest.txt") continue;
    std::ifstream in(entry.path(), std::ios::binary);
    files[name] =
        std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  return files;
}

// The manifest's files and tensors (their CRCs included), without the config snapshot.
std::string ManifestContents(const std::string& step_dir) {
  checkpoint::Manifest manifest;
  std::ifstream in(step_dir + "/manifest.pb", std::ios::binary);
  EXPECT_TRUE(manifest.ParseFromIstream(&in)) << step_dir;
  manifest.clear_config();
  return manifest.SerializeAsString();
}

// An asynchronous save (the default) writes byte for byte the files a synchronous one writes, with
// the same manifest, replicated or under ZeRO-1 (each replica's slices of the moments).
TEST(Async, WritesTheFilesASynchronousSaveWrites) {
  for (const std::string zero : {"0", "1"}) {
    SCOPED_TRACE("zero_stage=" + zero);
    std::map<std::string, std::string> dirs;
    for (const std::string async : {"true", "false"}) {
      const std::string dir = TempDir() + "/ckpt_async_" + async + "_zero" + zero;
      fs::remove_all(dir);
      const Result r = Train(2, 2, "async_" + async + "_zero" + zero,
                             "--set checkpoint.dir=" + dir + " --set checkpoint.async=" + async +
                                 " --set parallel.zero_stage=" + zero + Accum(4));
      ASSERT_EQ(r.exit_code, 0) << r.output;
      EXPECT_NE(r.output.find(async == "true" ? "written in the background" : "MB/s)"),
                std::string::npos)
          << r.output;
      dirs[async] = dir;
    }
    for (const char* step : {"/step_000003", "/step_000006"}) {
      const std::map<std::string, std::string> sync_files = StepFiles(dirs["false"] + step);
      const std::map<std::string, std::string> async_files = StepFiles(dirs["true"] + step);
      ASSERT_EQ(sync_files.size(), async_files.size()) << step;
      for (const auto& [name, bytes] : sync_files) {
        if (name == "manifest.pb") continue;
        ASSERT_TRUE(async_files.count(name)) << step << "/" << name;
        EXPECT_TRUE(async_files.at(name) == bytes) << step << "/" << name << " differs";
      }
      EXPECT_EQ(ManifestContents(dirs["true"] + step), ManifestContents(dirs["false"] + step))
          << step;
      EXPECT_EQ(RunCommand(Bigmac() + " ckpt inspect " + dirs["true"] + step, 30).exit_code, 0);
    }
  }
}

// A slow disk (every file waits 300 ms before its fsync) and a save every step: each save waits
// for the one in flight, says so, and metrics.jsonl carries the wait (checkpoint_wait_ms). The
// run ends with every save committed and resumes like the uninterrupted run.
TEST(Async, TheNextSaveWaitsForTheOneInFlightAndTheWaitIsMeasured) {
  const std::string dir = TempDir() + "/ckpt_async_wait";
  const std::string out = TempDir() + "/run_async_wait";
  fs::remove_all(dir);
  fs::remove_all(out);
  const Result r =
      Train(2, 1, "async_wait",
            "--set checkpoint.dir=" + dir +
                " --set checkpoint.interval=1 --set train.output_dir=" + out + Accum(4),
            "BIGMAC_TEST_SLOW_CHECKPOINT=300 ");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("the step loop waited"), std::string::npos) << r.output;
  EXPECT_EQ(r.losses, Full(2, 1).losses);
  std::ifstream metrics(out + "/metrics.jsonl");
  std::map<int, double> wait_ms;
  for (std::string line; std::getline(metrics, line);) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (record.contains("checkpoint_wait_ms"))
      wait_ms[record["step"].get<int>()] = record["checkpoint_wait_ms"].get<double>();
  }
  ASSERT_EQ(wait_ms.size(), 6u);
  EXPECT_EQ(wait_ms[1], 0) << "nothing in flight before the first save";
  // Steps 2 to 6 each waited for the previous save: at least one file's 300 ms.
  for (int step = 2; step <= 6; ++step) EXPECT_GT(wait_ms[step], 250) << "step " << step;
  std::ifstream latest(dir + "/latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, "step_000006");
  EXPECT_FALSE(fs::exists(dir + "/step_000003")) << "keep_last=3";
  const Result resumed =
      Train(2, 1, "async_wait_resumed",
            "--resume " + dir + "/step_000004 --set checkpoint.dir=" + dir + "_resumed" + Accum(4));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const std::vector<double>& full = Full(2, 1).losses;
  EXPECT_EQ(resumed.losses, std::vector<double>(full.end() - 2, full.end()));
}

// SIGTERM (Slurm's warning before a time limit) while an asynchronous save is being written (the
// disk is slow: 500 ms per file): the run finishes that save, saves the step it stopped after, and
// exits 10 (unfinished); both checkpoints verify and `latest` names the last.
TEST(Async, SigtermDuringASaveFinishesItAndSavesTheLastStep) {
  const std::string dir = TempDir() + "/ckpt_async_sigterm";
  fs::remove_all(dir);
  std::thread terminator([&] {
    for (int i = 0; i < 3000 && !fs::exists(dir + "/.tmp_step_000003"); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    // Only this test's ranks (mpirun forwards nothing we rely on).
    RunCommand(
        "for p in $(pgrep -x bigmac); do grep -qa ckpt_async_sigterm /proc/$p/cmdline && "
        "kill -TERM $p; done",
        10);
  });
  const Result r = Train(2, 1, "async_sigterm",
                         "--set checkpoint.dir=" + dir + " --set train.max_steps=200" + Accum(4),
                         "BIGMAC_TEST_SLOW_CHECKPOINT=500 ");
  terminator.join();
  ASSERT_EQ(r.exit_code, 10) << r.output;
  const size_t signal_line = r.output.find("[signal] SIGTERM: stopping after step ");
  ASSERT_NE(signal_line, std::string::npos) << r.output;
  const int stopped = std::stoi(
      r.output.substr(signal_line + std::strlen("[signal] SIGTERM: stopping after step ")));
  EXPECT_GT(stopped, 3);
  EXPECT_LT(stopped, 200);
  // Step 3's save was in flight: the stop waited for it, then saved the last step.
  const size_t step3 = r.output.find("[ckpt] saved step 3 ");
  ASSERT_NE(step3, std::string::npos) << r.output;
  EXPECT_NE(r.output.substr(step3, r.output.find('\n', step3) - step3).find("the step loop waited"),
            std::string::npos)
      << r.output;
  char last[32];
  std::snprintf(last, sizeof(last), "step_%06d", stopped);
  std::ifstream latest(dir + "/latest");
  std::string name;
  latest >> name;
  EXPECT_EQ(name, last);
  EXPECT_FALSE(fs::exists(dir + "/.tmp_step_000003"));
  EXPECT_EQ(RunCommand(Bigmac() + " ckpt inspect " + dir + "/step_000003", 30).exit_code, 0);
  EXPECT_EQ(RunCommand(Bigmac() + " ckpt inspect " + dir, 30).exit_code, 0);
}

// ---------------------------------------------------------------- safetensors

TEST(Safetensors, ExportFollowsTheSpecAndRoundTrips) {
  ASSERT_EQ(Full(2, 1).exit_code, 0);
  const std::string out = TempDir() + "/model.safetensors";
  const testutil::RunResult exported =
      RunCommand(Bigmac() + " ckpt export " + FullDir(2, 1) + " --safetensors " + out, 60);
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  std::ifstream in(out, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i) length |= uint64_t{static_cast<unsigned char>(bytes[i])} << (8 * i);
  ASSERT_LE(length + 8, bytes.size());
  EXPECT_EQ((8 + length) % 8, 0u) << "the header is padded to 8 bytes";
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, length));
  const int64_t c = kHidden;
  const std::map<std::string, std::vector<int64_t>> expected = {
      {"transformer.wte.weight", {256, c}},
      {"transformer.wpe.weight", {16, c}},
      {"transformer.h.0.ln_1.weight", {c}},
      {"transformer.h.0.attn.c_attn.weight", {c, 3 * c}},
      {"transformer.h.0.attn.c_attn.bias", {3 * c}},
      {"transformer.h.10.attn.c_proj.weight", {c, c}},
      {"transformer.h.10.mlp.c_fc.weight", {c, 4 * c}},
      {"transformer.h.10.mlp.c_proj.weight", {4 * c, c}},
      {"transformer.ln_f.bias", {c}},
  };
  for (const auto& [name, shape] : expected) {
    ASSERT_TRUE(header.contains(name)) << name;
    EXPECT_EQ(header[name]["dtype"], "F32");
    EXPECT_EQ(header[name]["shape"].get<std::vector<int64_t>>(), shape) << name;
  }
  EXPECT_EQ(header.size(), 2u + 11 * 12 + 2 + 1) << "wte, wpe, 12 per block, ln_f, __metadata__";
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    ranges.emplace_back(entry["data_offsets"][0].get<uint64_t>(),
                        entry["data_offsets"][1].get<uint64_t>());
  }
  std::sort(ranges.begin(), ranges.end());
  uint64_t next = 0;
  for (const auto& [begin, end] : ranges) {
    EXPECT_EQ(begin, next) << "no holes, no overlaps";
    next = end;
  }
  EXPECT_EQ(next, bytes.size() - 8 - length) << "the buffer is fully indexed";
  // c_attn is the transpose of our qkv weight: element [i][j] of theirs is [j][i] of ours.
  const std::string& block0 = Full(2, 1).weights.at("layer_0.f32");
  const float* ours =
      reinterpret_cast<const float*>(block0.data()) + 2 * c;  // after ln1.weight, ln1.bias
  const auto& entry = header["transformer.h.0.attn.c_attn.weight"];
  const float* theirs = reinterpret_cast<const float*>(bytes.data() + 8 + length +
                                                       entry["data_offsets"][0].get<uint64_t>());
  for (int i = 0; i < c; i += 7) {
    for (int j = 0; j < 3 * c; j += 5) ASSERT_EQ(theirs[i * 3 * c + j], ours[j * c + i]);
  }
  // Import, export again: the same tensors.
  const std::string imported = TempDir() + "/ckpt_imported";
  fs::remove_all(imported);
  const testutil::RunResult import = RunCommand(
      Bigmac() + " ckpt import --safetensors " + out + " --config " + Runfile("configs/tiny.yaml") +
          " --set model.num_layers=11 --set model.hidden_size=32 --set model.num_heads=2 --set "
          "train.seq_length=16 "
          "--output " +
          imported,
      60);
  ASSERT_EQ(import.exit_code, 0) << import.output;
  // Its own directory: config.json goes beside each export.
  std::filesystem::create_directories(TempDir() + "/again");
  const std::string again = TempDir() + "/again/again.safetensors";
  ASSERT_EQ(
      RunCommand(Bigmac() + " ckpt export " + imported + " --safetensors " + again, 60).exit_code,
      0);
  std::ifstream in2(again, std::ios::binary);
  const std::string bytes2((std::istreambuf_iterator<char>(in2)), std::istreambuf_iterator<char>());
  uint64_t length2 = 0;
  for (int i = 0; i < 8; ++i) length2 |= uint64_t{static_cast<unsigned char>(bytes2[i])} << (8 * i);
  EXPECT_EQ(bytes.substr(8 + length), bytes2.substr(8 + length2))
      << "the data round-trips bit for bit";
  // A damaged file is refused, naming the problem.
  std::string broken = bytes;
  broken[8 + 30] = '#';
  testutil::WriteTempFile("broken.safetensors", broken);
  const testutil::RunResult refused =
      RunCommand(Bigmac() + " ckpt import --safetensors " + TempDir() +
                     "/broken.safetensors --config " + Runfile("configs/tiny.yaml") +
                     " --set model.num_layers=11 --set model.hidden_size=32 --set "
                     "model.num_heads=2 --set train.seq_length=16 "
                     "--output " +
                     TempDir() + "/never",
                 60);
  EXPECT_EQ(refused.exit_code, 7) << refused.output;
  EXPECT_NE(refused.output.find("broken.safetensors"), std::string::npos) << refused.output;
  EXPECT_FALSE(fs::exists(TempDir() + "/never"));
}

}  // namespace
}  // namespace bigmac
