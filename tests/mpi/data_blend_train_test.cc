// A blend of three datasets (two Megatron, one llm.c; written here from the published layouts)
// trained under mpirun: saved under one pp/dp layout and resumed under others, the run continues
// the uninterrupted run's batches (losses bitwise where only pp changes) and every dataset's
// token count exactly.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint.pb.h"
#include "nlohmann/json.hpp"
#include "tests/testing/run.h"
#include "tests/testing/token_writers.h"

namespace bigmac {
namespace {

namespace fs = std::filesystem;
using testutil::TempDir;

// Documents of 10..200 byte tokens, seeded.
void WriteDocuments(const std::string& prefix, int documents, uint32_t seed) {
  std::vector<uint32_t> tokens;
  std::vector<int> lengths;
  std::mt19937 rng(seed);
  for (int d = 0; d < documents; ++d) {
    lengths.push_back(10 + static_cast<int>(rng() % 190));
    for (int i = 0; i < lengths.back(); ++i) tokens.push_back(rng() % 256);
  }
  testutil::WriteMegatron(prefix, tokens, lengths, false);
}

const std::string& DataDir() {
  static const std::string dir = [] {
    const std::string dir = TempDir() + "/blend_data";
    fs::remove_all(dir);
    fs::create_directories(dir);
    WriteDocuments(dir + "/web_text_document", 400, 1);
    WriteDocuments(dir + "/code_text_document", 300, 2);
    testutil::WriteBytes(dir + "/books.bin",
                         testutil::LlmcFile(testutil::RandomTokens(40000, 256, 3), false));
    return dir;
  }();
  return dir;
}

struct TrainRun {
  int exit_code = -1;
  std::string output;
  std::vector<double> losses;
  std::vector<nlohmann::json> metrics;  // metrics.jsonl, a line per step
};

// 4 blocks, 6 steps of a global batch of 8 samples, a checkpoint every 3.
TrainRun Train(int pp, int dp, int accum, const std::string& name, const std::string& extra) {
  const std::string out = TempDir() + "/blend_" + name;
  fs::remove_all(out);
  const std::string d = DataDir();
  const std::string command =
      testutil::Mpirun(pp * dp) + " " + testutil::Bigmac() + " train --config " +
      testutil::Runfile("configs/tiny.yaml") + " --dump " + out + "/dump" +
      " --set \"data.path=0.2 " + d + "/web_text_document 0.3 " + d + "/code_text_document 0.5 " +
      d + "/books.bin\" --set data.split=90,10" +
      " --set model.num_layers=4 --set model.hidden_size=32 --set model.num_heads=2" +
      " --set train.seq_length=16 --set train.micro_batch_size=2 --set parallel.schedule=1f1b" +
      " --set train.max_steps=6 --set train.eval_batches=2 --set train.eval_interval=3" +
      " --set train.log_interval=1 --set checkpoint.interval=3 --set train.output_dir=" + out +
      " --set parallel.pp_size=" + std::to_string(pp) +
      " --set train.gradient_accumulation_steps=" + std::to_string(accum) +
      " --set parallel.num_microbatches=" + std::to_string(accum) + " " + extra;
  const testutil::RunResult r = testutil::RunCommand(command, 240);
  TrainRun run{r.exit_code, r.output, {}, {}};
  std::ifstream losses(out + "/dump/losses.txt");
  for (double loss; losses >> loss;) run.losses.push_back(loss);
  std::ifstream metrics(out + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);)
    run.metrics.push_back(nlohmann::json::parse(line));
  return run;
}

std::string CheckpointDir(const std::string& name) { return TempDir() + "/blend_ckpt_" + name; }

const TrainRun& Uninterrupted() {
  static const TrainRun run = [] {
    fs::remove_all(CheckpointDir("full"));
    return Train(2, 1, 4, "full", "--set checkpoint.dir=" + CheckpointDir("full"));
  }();
  return run;
}

std::map<std::string, int64_t> TokensAt(const TrainRun& run, int step) {
  for (const nlohmann::json& line : run.metrics) {
    if (line["step"] == step)
      return line["tokens_by_dataset"].get<std::map<std::string, int64_t>>();
  }
  return {};
}

TEST(BlendTraining, LogsEachDatasetsSplitsAndDrawsItsShare) {
  const TrainRun& full = Uninterrupted();
  ASSERT_EQ(full.exit_code, 0) << full.output;
  ASSERT_EQ(full.losses.size(), 6u);
  EXPECT_NE(full.output.find("[cfg] data web_text_document (weight 0.2): "), std::string::npos)
      << full.output;
  EXPECT_NE(full.output.find("split 0.9,0.1,0 by documents: train 360 documents"),
            std::string::npos);
  EXPECT_NE(full.output.find("[cfg] data books (weight 0.5): "), std::string::npos);
  EXPECT_NE(full.output.find("by tokens (its format has no documents): train 36000 tokens"),
            std::string::npos);
  EXPECT_NE(full.output.find("per dataset, weighted: web_text_document "), std::string::npos);
  EXPECT_NE(full.output.find("[data] steps 1-6 draw 48 samples: web_text_document "),
            std::string::npos);
  ASSERT_EQ(full.metrics.size(), 6u);
  const std::map<std::string, int64_t> last = TokensAt(full, 6);
  int64_t total = 0;
  for (const auto& [name, tokens] : last) total += tokens;
  EXPECT_EQ(total, 6 * 8 * 16) << "every sample's tokens counted once";
  EXPECT_NEAR(double(last.at("books")) / total, 0.5, 0.05);
  EXPECT_TRUE(full.metrics[2].contains("val_loss_by_dataset")) << full.metrics[2].dump();
  // The checkpoint keeps the counts.
  checkpoint::Manifest manifest;
  std::ifstream in(CheckpointDir("full") + "/step_000003/manifest.pb", std::ios::binary);
  ASSERT_TRUE(manifest.ParseFromIstream(&in));
  ASSERT_EQ(manifest.data().datasets_size(), 3);
  EXPECT_EQ(manifest.data().next_sample(), 24);
  int64_t samples = 0;
  for (const checkpoint::DatasetDrawn& drawn : manifest.data().datasets()) {
    samples += drawn.samples();
    EXPECT_EQ(drawn.tokens(), drawn.samples() * 16);
  }
  EXPECT_EQ(samples, 24);
}

struct Layout {
  int pp, dp, accum;
};

class BlendResumeTest : public ::testing::TestWithParam<Layout> {};

TEST_P(BlendResumeTest, ContinuesTheUninterruptedRunsBatchesAndCounts) {
  const Layout layout = GetParam();
  const TrainRun& full = Uninterrupted();
  ASSERT_EQ(full.exit_code, 0) << full.output;
  const std::string name =
      "resume_pp" + std::to_string(layout.pp) + "dp" + std::to_string(layout.dp);
  fs::remove_all(CheckpointDir(name));
  const TrainRun resumed = Train(layout.pp, layout.dp, layout.accum, name,
                                 "--resume " + CheckpointDir("full") +
                                     "/step_000003 --set checkpoint.dir=" + CheckpointDir(name));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  ASSERT_EQ(resumed.losses.size(), 3u) << resumed.output;
  EXPECT_NE(
      resumed.output.find("[data] resumed at sample 24: trained on so far web_text_document "),
      std::string::npos)
      << resumed.output;
  const std::vector<double> tail(full.losses.end() - 3, full.losses.end());
  if (layout.dp == 1) {
    EXPECT_EQ(resumed.losses, tail) << "only pp changed: the same arithmetic, bitwise";
  } else {
    for (int i = 0; i < 3; ++i) EXPECT_NEAR(resumed.losses[i], tail[i], 1e-6 * tail[i]);
  }
  for (int step = 4; step <= 6; ++step) {
    EXPECT_EQ(TokensAt(resumed, step).size(), 3u) << "step " << step;
    EXPECT_EQ(TokensAt(resumed, step), TokensAt(full, step)) << "step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, BlendResumeTest,
                         ::testing::Values(Layout{1, 1, 4}, Layout{1, 2, 2}), [](const auto& info) {
                           return "pp" + std::to_string(info.param.pp) + "dp" +
                                  std::to_string(info.param.dp);
                         });

}  // namespace
}  // namespace bigmac
