// ZeRO-1 (parallel.zero_stage=1) under mpirun: the AdamW state sharded over dp gives bitwise the
// same losses and weights as the replicated optimizer at dp in {2, 4} x pp in {1, 2} (and stays
// within 1e-6 of the one-rank run); each rank holds 1/dp of the optimizer state; a checkpoint
// saved sharded is byte-identical to the replicated one and resumes under another dp, with or
// without ZeRO; a NaN in a sharded gradient is named with its rank.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "tests/testing/run.h"

namespace bigmac {
namespace {

namespace fs = std::filesystem;
using testutil::Bigmac;
using testutil::RunCommand;
using testutil::Runfile;
using testutil::TempDir;

std::string DataDir() {
  static const std::string dir = [] {
    std::string text;
    for (int i = 0; i < 3000; ++i) {
      text += "Shard " + std::to_string(i % 4) + " holds moments of bucket " +
              std::to_string(i * 13 % 29) + " and gathers the rest.\n";
    }
    return testutil::PrepareShards("zero", text);
  }();
  return dir;
}

constexpr int kSteps = 10;
constexpr int kGlobalMicrobatches =
    8;  // accum * dp: the same global batch in every layout (pp=2 needs 2 per replica)

struct ZeroRun {
  int exit_code = -1;
  std::string output;
  std::vector<std::string> losses;             // as printed (%.17g): compared as text, bitwise
  std::map<std::string, std::string> weights;  // dump file -> its bytes
};

struct Layout {
  int pp = 1;
  int dp = 1;
  bool zero = false;
};

std::string Name(const Layout& l) {
  return "pp" + std::to_string(l.pp) + "_dp" + std::to_string(l.dp) + (l.zero ? "_zero" : "");
}

std::map<std::string, std::string> ReadFiles(const std::string& dir) {
  std::map<std::string, std::string> files;
  if (!fs::exists(dir)) return files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    files[entry.path().filename().string()] =
        std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  return files;
}

// A 4-block model of width 64 (tied embedding and head) in 64 KiB buckets (several per stage,
// the tied weight's of its own), gradient clipping on, kSteps steps of 8 micro-batches globally.
ZeroRun Train(const Layout& l, const std::string& name, const std::string& extra = "",
              const std::string& env = "") {
  const std::string out = TempDir() + "/zero_" + name;
  fs::remove_all(out);
  const std::string command =
      env + testutil::Mpirun(l.pp * l.dp) + " " + Bigmac() + " train --config " +
      Runfile("configs/tiny.yaml") + " --dump " + out + "/dump --set data.dir=" + DataDir() +
      " --set model.num_layers=4 --set model.hidden_size=64 --set model.num_heads=2" +
      " --set train.seq_length=32 --set train.micro_batch_size=2" +
      " --set train.max_steps=" + std::to_string(kSteps) +
      " --set train.eval_batches=1 --set train.eval_interval=0 --set train.log_interval=1" +
      " --set optim.grad_clip=0.5 --set parallel.pp_size=" + std::to_string(l.pp) +
      " --set parallel.schedule=1f1b --set parallel.dp_bucket_size=64KiB" +
      " --set train.gradient_accumulation_steps=" + std::to_string(kGlobalMicrobatches / l.dp) +
      " --set parallel.zero_stage=" + (l.zero ? "1" : "0") + " " + extra;
  const testutil::RunResult r = RunCommand(command, 240);
  ZeroRun run;
  run.exit_code = r.exit_code;
  run.output = r.output;
  std::ifstream losses(out + "/dump/losses.txt");
  for (std::string line; std::getline(losses, line);) run.losses.push_back(line);
  run.weights = ReadFiles(out + "/dump");
  run.weights.erase("losses.txt");
  return run;
}

const ZeroRun& Reference() {
  static const ZeroRun run = Train({1, 1, false}, "reference");
  return run;
}

double RelativeDifference(const std::string& a, const std::string& b) {
  const double x = std::stod(a), y = std::stod(b);
  return std::abs(x - y) / std::max(std::abs(y), 1e-30);
}

// Per (pp, dp) coordinate of the [memory] summary: the elements with AdamW state.
std::map<std::pair<int, int>, long long> OptimizerElements(const std::string& output) {
  std::map<std::pair<int, int>, long long> elements;
  const std::regex line(
      "\\[memory\\] rank \\d+ \\(pp (\\d+), dp (\\d+)[^\n]* optimizer state for (\\d+) \\(");
  for (auto it = std::sregex_iterator(output.begin(), output.end(), line);
       it != std::sregex_iterator(); ++it) {
    elements[{std::stoi((*it)[1]), std::stoi((*it)[2])}] = std::stoll((*it)[3]);
  }
  return elements;
}

class ZeroEquivalence : public ::testing::TestWithParam<std::pair<int, int>> {};

// Bitwise: the reduce-scatter sums in the same (dp-rank) order as the all-reduce, and AdamW is
// elementwise, so the shard boundaries change nothing. Within 1e-6 of the one-rank run.
TEST_P(ZeroEquivalence, LossesAndWeightsEqualTheReplicatedOptimizer) {
  const auto [pp, dp] = GetParam();
  const ZeroRun plain = Train({pp, dp, false}, Name({pp, dp, false}));
  const ZeroRun zero = Train({pp, dp, true}, Name({pp, dp, true}));
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  ASSERT_EQ(zero.exit_code, 0) << zero.output;
  ASSERT_EQ(zero.losses.size(), size_t(kSteps));
  EXPECT_EQ(zero.losses, plain.losses);
  ASSERT_FALSE(plain.weights.empty());
  EXPECT_EQ(zero.weights.size(), plain.weights.size());
  for (const auto& [file, bytes] : plain.weights)
    EXPECT_TRUE(zero.weights.count(file) && zero.weights.at(file) == bytes) << file;
  ASSERT_EQ(Reference().exit_code, 0) << Reference().output;
  for (int i = 0; i < kSteps; ++i)
    EXPECT_LE(RelativeDifference(zero.losses[i], Reference().losses[i]), 1e-6) << "step " << i + 1;
  EXPECT_NE(zero.output.find("ZeRO-1 shard of"), std::string::npos) << zero.output;

  // The optimizer state each rank holds: the replicated one / dp, up to the padding of each
  // bucket to a multiple of dp (at most dp - 1 elements per bucket, under 20 buckets per stage);
  // over a stage's replicas, each element's state exactly once.
  const auto sharded = OptimizerElements(zero.output);
  const auto replicated = OptimizerElements(plain.output);
  ASSERT_EQ(sharded.size(), size_t(pp * dp)) << zero.output;
  ASSERT_EQ(replicated.size(), size_t(pp * dp)) << plain.output;
  for (int stage = 0; stage < pp; ++stage) {
    const long long whole = replicated.at({stage, 0});
    long long sum = 0;
    for (int replica = 0; replica < dp; ++replica) {
      EXPECT_EQ(replicated.at({stage, replica}), whole);
      const long long own = sharded.at({stage, replica});
      EXPECT_NEAR(double(own), double(whole) / dp, 20.0 * dp) << "stage " << stage;
      EXPECT_LT(own, whole) << "stage " << stage;
      sum += own;
    }
    EXPECT_EQ(sum, whole) << "stage " << stage;
  }
}

INSTANTIATE_TEST_SUITE_P(DpByPp, ZeroEquivalence,
                         ::testing::Values(std::pair{1, 2}, std::pair{1, 4}, std::pair{2, 2},
                                           std::pair{2, 4}),
                         [](const auto& info) {
                           return "pp" + std::to_string(info.param.first) + "_dp" +
                                  std::to_string(info.param.second);
                         });

// Saved sharded at dp = 4 after step 5: the layer files are byte for byte the replicated
// optimizer's (full tensors, masters and moments); resumed without ZeRO at dp = 1 and with it at
// dp = 2, steps 6-10 continue the uninterrupted losses.
TEST(ZeroCheckpoint, SavedShardedResumesUnderAnotherDpWithOrWithoutZero) {
  const std::string ckpt_zero = TempDir() + "/zero_ckpt_sharded";
  const std::string ckpt_plain = TempDir() + "/zero_ckpt_plain";
  fs::remove_all(ckpt_zero);
  fs::remove_all(ckpt_plain);
  const std::string save = " --set checkpoint.interval=5 --set checkpoint.keep_last=5";
  const ZeroRun zero = Train({1, 4, true}, "ckpt_zero", "--set checkpoint.dir=" + ckpt_zero + save);
  const ZeroRun plain =
      Train({1, 4, false}, "ckpt_plain", "--set checkpoint.dir=" + ckpt_plain + save);
  ASSERT_EQ(zero.exit_code, 0) << zero.output;
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const auto zero_files = ReadFiles(ckpt_zero + "/step_000005");
  const auto plain_files = ReadFiles(ckpt_plain + "/step_000005");
  ASSERT_GT(zero_files.size(), 2u);
  for (const auto& [file, bytes] : plain_files) {
    if (file.rfind("manifest", 0) == 0) continue;  // the config snapshot differs
    EXPECT_TRUE(zero_files.count(file) && zero_files.at(file) == bytes) << file;
  }
  const testutil::RunResult check =
      RunCommand(Bigmac() + " ckpt inspect " + ckpt_zero + "/step_000005", 60);
  EXPECT_EQ(check.exit_code, 0) << check.output;

  const std::string from = " --resume " + ckpt_zero + "/step_000005";
  const ZeroRun dp1 = Train({1, 1, false}, "resume_dp1", from);
  const ZeroRun dp2 = Train({1, 2, true}, "resume_dp2_zero", from);
  for (const ZeroRun* resumed : {&dp1, &dp2}) {
    ASSERT_EQ(resumed->exit_code, 0) << resumed->output;
    EXPECT_NE(resumed->output.find("[ckpt] resumed from"), std::string::npos);
    ASSERT_EQ(resumed->losses.size(), size_t(kSteps - 5)) << resumed->output;
    for (int i = 0; i < kSteps - 5; ++i) {
      EXPECT_LE(RelativeDifference(resumed->losses[i], zero.losses[5 + i]), 1e-6)
          << "step " << 6 + i;
    }
  }
}

// The injected NaN lands in element 0 of block 2's first parameter on every replica, after the
// reduce-scatter: only the replica whose shard holds that element sees it, and names it.
TEST(ZeroNan, TheOwnerOfTheShardNamesTheParameter) {
  const ZeroRun r = Train({1, 2, true}, "nan", "", "BIGMAC_TEST_NAN_GRAD=3:2 ");
  EXPECT_EQ(r.exit_code, 4) << r.output;
  const std::regex named(
      "step 3: non-finite gradient norm; non-finite gradients in rank \\d \\(stage 0, dp \\d\\): "
      "block 2/ln1.weight \\(train.nan_policy=stop");
  EXPECT_TRUE(std::regex_search(r.output, named)) << r.output;
  EXPECT_EQ(testutil::CountOccurrences(r.output, "block 2/ln1.weight ("), 1) << r.output;
}

}  // namespace
}  // namespace bigmac
