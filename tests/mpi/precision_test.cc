// precision.dtype=bf16 on the CPU backend: fp32 masters, bf16 compute copies and activations.
// Each test runs the real binary (under mpirun where it needs several ranks).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/testing/run.h"

namespace bigmac {
namespace {

using testutil::Bigmac;
using testutil::RunCommand;
using testutil::Runfile;
using testutil::TempDir;

std::string DataDir() {
  static const std::string dir = [] {
    std::string text;
    for (int i = 0; i < 6000; ++i) {
      text += "Rounded to " + std::to_string(i * 37 % 101) + " bits, the weights still learn " +
              std::to_string(i % 11) + " things.\n";
    }
    return testutil::PrepareShards("precision", text);
  }();
  return dir;
}

struct TrainRun {
  int exit_code = 0;
  std::string output;
  std::vector<double> losses;
  std::vector<nlohmann::json> metrics;  // metrics.jsonl, one object per step
};

// A small model (tiny.yaml's shape, narrower) for `steps` steps on `ranks` ranks.
TrainRun Train(int ranks, const std::string& dtype, int steps, const std::string& extra,
               const std::string& name, const std::string& environment = "") {
  const std::string dump = TempDir() + "/precision_" + name;
  std::filesystem::remove_all(dump);
  const std::string command =
      environment + (ranks > 1 ? testutil::Mpirun(ranks) + " " : std::string()) + Bigmac() +
      " train --config " + Runfile("configs/tiny.yaml") + " --dump " + dump +
      " --set data.dir=" + DataDir() + " --set precision.dtype=" + dtype +
      " --set model.num_layers=4 --set model.hidden_size=32 --set model.num_heads=2" +
      " --set train.seq_length=16 --set train.micro_batch_size=2" +
      " --set train.max_steps=" + std::to_string(steps) +
      " --set train.eval_batches=2 --set train.eval_interval=0 --set train.log_interval=1" +
      " --set optim.warmup_steps=2 --set optim.lr=3e-3 --set train.output_dir=" + dump +
      "/out --set parallel.pp_size=" + std::to_string(ranks) + " " + extra;
  const testutil::RunResult r = RunCommand(command, 300);
  TrainRun run{r.exit_code, r.output, {}, {}};
  std::ifstream losses(dump + "/losses.txt");
  for (double loss; losses >> loss;) run.losses.push_back(loss);
  std::ifstream metrics(dump + "/out/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);)
    run.metrics.push_back(nlohmann::json::parse(line));
  return run;
}

// bf16 pp=4 does the same arithmetic in the same order as bf16 pp=1 (one replica, no clipping,
// whose norm would be summed across ranks in another order): bitwise equal over 10 steps.
TEST(Bf16, FourStagesEqualOneRankBitwise) {
  const std::string extra =
      "--set optim.grad_clip=0 --set parallel.num_microbatches=4 "
      "--set train.gradient_accumulation_steps=4 --set parallel.schedule=1f1b";
  const TrainRun one = Train(1, "bf16", 10, extra, "pp1");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  const TrainRun four = Train(4, "bf16", 10, extra, "pp4");
  ASSERT_EQ(four.exit_code, 0) << four.output;
  ASSERT_EQ(one.losses.size(), 10u);
  EXPECT_EQ(four.losses, one.losses);
  // And bf16 is really on: the fp32 run differs.
  const TrainRun fp32 = Train(1, "fp32", 10, extra, "pp1_fp32");
  ASSERT_EQ(fp32.exit_code, 0) << fp32.output;
  EXPECT_NE(fp32.losses, one.losses);
}

// The activations and gradients between stages are bf16: the transport counts half the bytes.
TEST(Bf16, BytesBetweenStagesHalve) {
  const TrainRun fp32 = Train(2, "fp32", 3, "", "bytes_fp32");
  ASSERT_EQ(fp32.exit_code, 0) << fp32.output;
  const TrainRun bf16 = Train(2, "bf16", 3, "", "bytes_bf16");
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  ASSERT_EQ(fp32.metrics.size(), 3u);
  ASSERT_EQ(bf16.metrics.size(), 3u);
  for (int step = 0; step < 3; ++step) {
    for (int rank = 0; rank < 2; ++rank) {
      const int64_t full = fp32.metrics[step]["ranks"][rank]["activation_bytes_sent"];
      const int64_t half = bf16.metrics[step]["ranks"][rank]["activation_bytes_sent"];
      // One micro-batch of 2x16 tokens x 32 wide, per direction and micro-batch.
      EXPECT_EQ(full, int64_t{2} * 16 * 32 * 4) << "step " << step << " rank " << rank;
      EXPECT_EQ(half * 2, full) << "step " << step << " rank " << rank;
    }
  }
  EXPECT_NE(bf16.output.find("of activations and gradients sent per step (bf16)"),
            std::string::npos)
      << bf16.output;
}

// Checkpoints hold only the fp32 masters and moments, so a run moves between fp32 and bf16.
// A bf16 run resumed under bf16 reproduces its uninterrupted losses bitwise (the compute copies
// are refreshed on load); a bf16 checkpoint resumes under fp32 and an fp32 one under bf16.
TEST(Bf16, ResumeAcrossPrecisions) {
  const std::string ckpt = TempDir() + "/precision_ckpt";
  std::filesystem::remove_all(ckpt);
  const std::string save = "--set checkpoint.dir=" + ckpt + " --set checkpoint.interval=3";
  const TrainRun bf16 = Train(2, "bf16", 6, save, "resume_bf16");
  ASSERT_EQ(bf16.exit_code, 0) << bf16.output;
  const std::string step3 = " --resume " + ckpt + "/step_000003";
  const TrainRun again = Train(2, "bf16", 6, step3, "resume_bf16_again");
  ASSERT_EQ(again.exit_code, 0) << again.output;
  ASSERT_EQ(again.losses.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(again.losses[i], bf16.losses[3 + i]) << "step " << 4 + i;

  const TrainRun as_fp32 = Train(2, "fp32", 6, step3, "resume_as_fp32");
  ASSERT_EQ(as_fp32.exit_code, 0) << as_fp32.output;
  ASSERT_EQ(as_fp32.losses.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    // Same masters, different rounding: close, not equal.
    EXPECT_NEAR(as_fp32.losses[i], bf16.losses[3 + i], 0.02 * bf16.losses[3 + i]);
    EXPECT_NE(as_fp32.losses[i], bf16.losses[3 + i]);
  }

  const std::string fp32_ckpt = TempDir() + "/precision_ckpt_fp32";
  std::filesystem::remove_all(fp32_ckpt);
  const TrainRun fp32 = Train(1, "fp32", 6, "--set checkpoint.dir=" + fp32_ckpt, "resume_fp32");
  ASSERT_EQ(fp32.exit_code, 0) << fp32.output;
  const TrainRun as_bf16 =
      Train(1, "bf16", 8, "--resume " + fp32_ckpt + "/step_000006", "resume_as_bf16");
  ASSERT_EQ(as_bf16.exit_code, 0) << as_bf16.output;
  ASSERT_EQ(as_bf16.losses.size(), 2u);
  for (double loss : as_bf16.losses) EXPECT_TRUE(std::isfinite(loss));
}

// MPI counts are ints, so the transport sends a payload as messages of at most 1 GiB. A test
// limit of 1000 bytes splits every activation (4096 bytes in fp32, 2048 in bf16) into several
// messages: the losses are bitwise those of unsplit messages.
TEST(Transport, PayloadsSplitIntoSeveralMessagesArriveWhole) {
  for (const char* dtype : {"fp32", "bf16"}) {
    const TrainRun whole = Train(2, dtype, 3, "", std::string("whole_") + dtype);
    ASSERT_EQ(whole.exit_code, 0) << whole.output;
    const TrainRun split = Train(2, dtype, 3, "", std::string("split_") + dtype,
                                 "BIGMAC_TEST_MAX_MESSAGE_BYTES=1000 ");
    ASSERT_EQ(split.exit_code, 0) << split.output;
    ASSERT_EQ(whole.losses.size(), 3u);
    EXPECT_EQ(split.losses, whole.losses) << dtype;
  }
}

// The tolerance: over 200 steps of configs/tiny.yaml's model (4 blocks, 128 wide, 4 heads) on
// real English text, the bf16 run ends within 2% of the fp32 loss. (Micro-batches of 8x64 tokens
// instead of 16x128 keep the test under two minutes on 2 cores; the model is unchanged.)
TEST(Bf16, TinyConfigTracksFp32Within2Percent) {
  // The demo's corpus: every fortunes file (launch/setup.sh installs the package).
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator("/usr/share/games/fortunes")) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && !entry.is_symlink() && name.find('.') == std::string::npos)
      files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  ASSERT_GT(files.size(), 10u) << "launch/setup.sh installs the fortunes package";
  std::string corpus;
  for (const std::string& file : files) corpus += " " + file;
  const std::string data = TempDir() + "/precision_fortunes";
  std::filesystem::remove_all(data);
  ASSERT_EQ(
      RunCommand(Bigmac() + " data prep --input" + corpus + " --output " + data, 60).exit_code, 0);
  auto run = [&](const std::string& dtype) {
    const std::string dump = TempDir() + "/precision_tiny_" + dtype;
    std::filesystem::remove_all(dump);
    const testutil::RunResult r = RunCommand(
        Bigmac() + " train --config " + Runfile("configs/tiny.yaml") + " --dump " + dump +
            " --set data.dir=" + data + " --set precision.dtype=" + dtype +
            " --set train.max_steps=200 --set train.micro_batch_size=8 --set train.seq_length=64"
            " --set train.eval_interval=0 --set train.eval_batches=4 --set train.log_interval=50",
        600);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::vector<double> losses;
    std::ifstream in(dump + "/losses.txt");
    for (double loss; in >> loss;) losses.push_back(loss);
    return losses;
  };
  const std::vector<double> fp32 = run("fp32");
  const std::vector<double> bf16 = run("bf16");
  ASSERT_EQ(fp32.size(), 200u);
  ASSERT_EQ(bf16.size(), 200u);
  // The last 10 steps' mean, so one noisy batch does not decide.
  double fp32_end = 0, bf16_end = 0;
  for (int i = 190; i < 200; ++i) {
    fp32_end += fp32[i] / 10;
    bf16_end += bf16[i] / 10;
  }
  std::printf("[bf16] tiny config, 200 steps: fp32 %.4f, bf16 %.4f (%.2f%%)\n", fp32_end, bf16_end,
              100 * (bf16_end - fp32_end) / fp32_end);
  EXPECT_LT(fp32_end, 3.0) << "the model learned";
  EXPECT_LE(std::fabs(bf16_end - fp32_end), 0.02 * fp32_end);
}

}  // namespace
}  // namespace bigmac
