// Stragglers (docs/launch.md): every log interval the progress line gives the spread of the ranks'
// compute time, metrics.jsonl keeps it, and a rank more than train.straggler_ratio slower than its
// peers is named with its host. One rank is slowed with BIGMAC_TEST_SLOW_RANK (a sleep before each
// of its forward computations); a run with none slowed names no one.
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "nlohmann/json.hpp"
#include "tests/testing/run.h"

namespace bigmac {
namespace {

using testutil::CountOccurrences;
using testutil::RunCommand;
using testutil::Runfile;

std::string Data() {
  static const std::string dir = [] {
    std::string text;
    for (int i = 0; i < 3000; ++i)
      text += "rank " + std::to_string(i % 4) + " computes micro-batch " + std::to_string(i % 7) +
              " as fast as its peers.\n";
    return testutil::PrepareShards("straggler", text);
  }();
  return dir;
}

// A 2-rank run of the tiny GPT; `env` goes to every rank. The ratio is 1.5, not the default 1.2:
// this machine's ranks share two cores with the rest of the test, and a rank slowed by 150 ms per
// forward is 2x or more.
testutil::RunResult Train(const std::string& name, const std::string& env,
                          const std::string& layout) {
  const std::string out = testutil::TempDir() + "/" + name;
  return RunCommand(env + " " + testutil::Mpirun(2) + " " + testutil::Bigmac() +
                        " train --config " + Runfile("configs/tiny.yaml") +
                        " --set data.dir=" + Data() + " " + layout +
                        " --set model.hidden_size=64 --set model.num_heads=2"
                        " --set train.seq_length=64 --set train.micro_batch_size=4"
                        " --set train.max_steps=6 --set train.log_interval=3"
                        " --set train.eval_interval=0 --set train.straggler_ratio=1.5"
                        " --set train.output_dir=" +
                        out,
                    240);
}

// The last metrics.jsonl line's compute_spread.
nlohmann::json LastSpread(const std::string& name) {
  std::istringstream lines(testutil::ReadFile(testutil::TempDir() + "/" + name + "/metrics.jsonl"));
  std::string line, last;
  while (std::getline(lines, line))
    if (!line.empty()) last = line;
  const nlohmann::json parsed = nlohmann::json::parse(last);
  return parsed.contains("compute_spread") ? parsed["compute_spread"] : nlohmann::json();
}

constexpr char kDataParallel[] = "--set train.gradient_accumulation_steps=2";
constexpr char kPipeline[] =
    "--set parallel.pp_size=2 --set parallel.schedule=1f1b --set "
    "train.gradient_accumulation_steps=4";

TEST(Stragglers, NoRankIsNamedWhenNoneIsSlowed) {
  const testutil::RunResult run = Train("even", "", kDataParallel);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(CountOccurrences(run.output, "[straggler]"), 0) << run.output;
  EXPECT_EQ(CountOccurrences(run.output, " ms median, slowest rank "), 3) << run.output;
  const nlohmann::json spread = LastSpread("even");
  ASSERT_FALSE(spread.is_null());
  EXPECT_EQ(spread["steps"], 3);
  EXPECT_GT(spread["median_ms"].get<double>(), 0);
  EXPECT_TRUE(spread["stragglers"].empty());
}

TEST(Stragglers, ASlowDataParallelRankIsNamedAgainstItsPeer) {
  const testutil::RunResult run = Train("slow_dp", "BIGMAC_TEST_SLOW_RANK=1:150", kDataParallel);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("[straggler] rank 1 ("), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("the median compute time of its 1 peer of pp rank 0"),
            std::string::npos)
      << run.output;
  EXPECT_EQ(CountOccurrences(run.output, "[straggler] rank 0 "), 0) << run.output;
  const nlohmann::json spread = LastSpread("slow_dp");
  ASSERT_FALSE(spread.is_null());
  EXPECT_EQ(spread["slowest_rank"], 1);
  ASSERT_EQ(spread["stragglers"].size(), 1u);
  EXPECT_EQ(spread["stragglers"][0]["rank"], 1);
  EXPECT_GT(spread["stragglers"][0]["ratio"].get<double>(), 1.5);
}

// Without dp peers each pipeline rank's time per unit of predicted work is compared.
TEST(Stragglers, ASlowPipelineRankIsNamedPerUnitOfPredictedWork) {
  const testutil::RunResult run = Train("slow_pp", "BIGMAC_TEST_SLOW_RANK=0:150", kPipeline);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("[straggler] rank 0 ("), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("the other 1 pipeline rank, per unit of predicted work"),
            std::string::npos)
      << run.output;
  EXPECT_EQ(CountOccurrences(run.output, "[straggler] rank 1 "), 0) << run.output;
}

}  // namespace
}  // namespace bigmac
