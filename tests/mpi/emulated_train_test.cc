// `bigmac train --set device.backend=cuda` on the emulated CUDA device (an emulated build of the
// binary, //core/cli:bigmac_emulated) against the CPU backend: fp32 within 1e-5 relative, bf16
// within device_check.sh's 3e-2, pp=2 and dp=2 (ZeRO-1 too) over the NCCL stand-in equal to one
// rank, checkpoints moving between the backends, and nccl_pingpong. The device runs the same
// kernels, layers and transport code as on a GPU (cuDNN's SDPA aside: the fallback attention).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/testing/dump.h"
#include "tests/testing/run.h"

namespace bigmac {
namespace {

namespace fs = std::filesystem;
using testutil::Runfile;
using testutil::TempDir;

constexpr double kFp32Tolerance = 1e-5;
constexpr double kBf16Tolerance = 3e-2;  // launch/device_check.sh's tol_bf16

std::string EmulatedBigmac() { return Runfile("core/cli/bigmac_emulated"); }

std::string DataDir() {
  static const std::string dir = [] {
    std::string text;
    for (int i = 0; i < 4000; ++i) {
      text += "Kernel " + std::to_string(i * 17 % 89) + " runs on an emulated device, block " +
              std::to_string(i % 13) + " of the grid.\n";
    }
    return testutil::PrepareShards("emulated_train", text);
  }();
  return dir;
}

struct TrainRun {
  int exit_code = -1;
  std::string output;
  testutil::Dump dump;
};

// configs/tiny.yaml's model (4 blocks, hidden 128, 4 heads, byte vocabulary) on a smaller batch
// (4 x 64 tokens: the emulated device runs every GPU thread as a fiber on the CPU).
std::string TinyModel() {
  return " --config " + Runfile("configs/tiny.yaml") + " --set data.dir=" + DataDir() +
         " --set train.micro_batch_size=4 --set train.seq_length=64 --set train.eval_batches=1"
         " --set train.eval_interval=0 --set train.log_interval=1";
}

// A smaller model for the multi-rank runs (2 processes share the 2 cores).
std::string SmallModel() {
  return " --config " + Runfile("configs/tiny.yaml") + " --set data.dir=" + DataDir() +
         " --set model.num_layers=4 --set model.hidden_size=32 --set model.num_heads=2"
         " --set train.micro_batch_size=2 --set train.seq_length=16 --set train.eval_batches=1"
         " --set train.eval_interval=0 --set train.log_interval=1 --set optim.warmup_steps=2"
         " --set optim.grad_clip=0";
}

TrainRun Train(const std::string& launcher, const std::string& binary, const std::string& name,
               const std::string& args) {
  const std::string dump = TempDir() + "/dump_" + name;
  fs::remove_all(dump);
  const std::string out = TempDir() + "/out_" + name;
  const testutil::RunResult r =
      testutil::RunCommand(launcher + binary + " train" + args + " --dump " + dump +
                               " --set train.output_dir=" + out + " --overwrite 2>&1",
                           600);
  return {r.exit_code, r.output, testutil::ReadDump(dump)};
}

double MaxRelative(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = a.size() == b.size() && !a.empty() ? 0 : INFINITY;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    worst = std::max(worst, std::fabs(a[i] - b[i]) / std::max(1.0, std::fabs(a[i])));
  }
  return worst;
}

TEST(EmulatedTrain, Fp32LossesMatchTheCpuBackend) {
  const std::string args = TinyModel() + " --set train.max_steps=10";
  const TrainRun cpu = Train("", testutil::Bigmac(), "fp32_cpu", args);
  ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
  const TrainRun gpu =
      Train("", EmulatedBigmac(), "fp32_cuda", args + " --set device.backend=cuda");
  ASSERT_EQ(gpu.exit_code, 0) << gpu.output;
  ASSERT_EQ(gpu.dump.losses.size(), 10u);
  EXPECT_LE(MaxRelative(cpu.dump.losses, gpu.dump.losses), kFp32Tolerance);
}

TEST(EmulatedTrain, Bf16LossesMatchTheCpuBackendsBf16) {
  const std::string args = TinyModel() + " --set train.max_steps=10 --set precision.dtype=bf16";
  const TrainRun cpu = Train("", testutil::Bigmac(), "bf16_cpu", args);
  ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
  const TrainRun gpu =
      Train("", EmulatedBigmac(), "bf16_cuda", args + " --set device.backend=cuda");
  ASSERT_EQ(gpu.exit_code, 0) << gpu.output;
  ASSERT_EQ(gpu.dump.losses.size(), 10u);
  EXPECT_LE(MaxRelative(cpu.dump.losses, gpu.dump.losses), kBf16Tolerance);
}

// Saved at step 3 by one backend, resumed by the other: steps 4-6 as the uninterrupted run's.
TEST(EmulatedTrain, CheckpointsMoveBetweenTheBackends) {
  const std::string args = SmallModel() + " --set train.max_steps=6 --set checkpoint.interval=3";
  const std::string cpu_dir = TempDir() + "/ckpt_cpu", gpu_dir = TempDir() + "/ckpt_cuda";
  fs::remove_all(cpu_dir);
  fs::remove_all(gpu_dir);
  const TrainRun cpu =
      Train("", testutil::Bigmac(), "ckpt_cpu", args + " --set checkpoint.dir=" + cpu_dir);
  ASSERT_EQ(cpu.exit_code, 0) << cpu.output;
  const TrainRun gpu = Train("", EmulatedBigmac(), "ckpt_cuda",
                             args + " --set device.backend=cuda --set checkpoint.dir=" + gpu_dir);
  ASSERT_EQ(gpu.exit_code, 0) << gpu.output;
  const std::vector<double> tail(cpu.dump.losses.begin() + 3, cpu.dump.losses.end());

  const TrainRun on_cpu =
      Train("", testutil::Bigmac(), "resume_on_cpu",
            args + " --resume " + gpu_dir + "/step_000003 --set checkpoint.dir=" + TempDir() +
                "/ckpt_resumed_cpu");
  ASSERT_EQ(on_cpu.exit_code, 0) << on_cpu.output;
  EXPECT_LE(MaxRelative(tail, on_cpu.dump.losses), kFp32Tolerance);

  const TrainRun on_gpu =
      Train("", EmulatedBigmac(), "resume_on_cuda",
            args + " --set device.backend=cuda --resume " + cpu_dir +
                "/step_000003 --set checkpoint.dir=" + TempDir() + "/ckpt_resumed_cuda");
  ASSERT_EQ(on_gpu.exit_code, 0) << on_gpu.output;
  EXPECT_LE(MaxRelative(tail, on_gpu.dump.losses), kFp32Tolerance);
}

// One global batch of 4 micro-batches: pp=1 on one rank, then pp=2 and dp=2 (with and without
// ZeRO-1) over the NCCL stand-in, two processes under mpirun.
class EmulatedNcclTrain : public testing::Test {
 protected:
  static const TrainRun& OneRank() {
    static const TrainRun run = Train("", EmulatedBigmac(), "nccl_reference",
                                      SmallModel() +
                                          " --set train.max_steps=4 --set device.backend=cuda"
                                          " --set train.gradient_accumulation_steps=4");
    return run;
  }
  // The transport belongs to the launch layer (BIGMAC_TRANSPORT), not the config.
  static TrainRun TwoRanks(const std::string& name, const std::string& layout) {
    return Train(testutil::Mpirun(2) + " -x BIGMAC_TRANSPORT=nccl ", EmulatedBigmac(), name,
                 SmallModel() + " --set train.max_steps=4 --set device.backend=cuda " + layout);
  }
};

TEST_F(EmulatedNcclTrain, PipelineOfTwoStagesMatchesOneRank) {
  ASSERT_EQ(OneRank().exit_code, 0) << OneRank().output;
  const TrainRun run = TwoRanks("nccl_pp2",
                                "--set parallel.pp_size=2 --set parallel.schedule=1f1b"
                                " --set parallel.num_microbatches=4"
                                " --set train.gradient_accumulation_steps=4");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_LE(MaxRelative(OneRank().dump.losses, run.dump.losses), kFp32Tolerance) << run.output;
}

TEST_F(EmulatedNcclTrain, DataParallelAllReduceMatchesOneRank) {
  ASSERT_EQ(OneRank().exit_code, 0) << OneRank().output;
  const TrainRun run = TwoRanks("nccl_dp2",
                                "--set parallel.pp_size=1"
                                " --set train.gradient_accumulation_steps=2");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_LE(MaxRelative(OneRank().dump.losses, run.dump.losses), kFp32Tolerance) << run.output;
}

TEST_F(EmulatedNcclTrain, ZeroOneMatchesOneRank) {
  ASSERT_EQ(OneRank().exit_code, 0) << OneRank().output;
  const TrainRun run = TwoRanks("nccl_zero1",
                                "--set parallel.pp_size=1 --set parallel.zero_stage=1"
                                " --set train.gradient_accumulation_steps=2");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_LE(MaxRelative(OneRank().dump.losses, run.dump.losses), kFp32Tolerance) << run.output;
}

TEST(EmulatedNcclPingPong, ExchangesAndAllReducesOverTheNcclStandIn) {
  const testutil::RunResult r = testutil::RunCommand(
      testutil::Mpirun(2) + " " + Runfile("tests/nccl_pingpong_emulated") +
          " --backend cuda --transport nccl --iterations 20 --elements 100000 2>&1",
      300);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("transport=nccl"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("checksums ok"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("sums, 0 wrong"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tp group: 4099 maxima, 2 slices, a sum, 0 wrong"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("SKIP"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace bigmac
