// Text generation: sampling (greedy, top-k, the distribution, determinism), the byte tokenizer,
// and `bigmac generate` end to end: a checkpoint trained under pp=2 and loaded on one rank writes
// text that the model finds far more likely than what an untrained one writes; bad inputs.
#include "core/engine/generate.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "core/cli/single_rank_model.h"
#include "core/data/tokenizer.h"
#include "tests/testing/expect.h"
#include "tests/testing/run.h"

namespace bigmac {
namespace {

using engine::Pick;
using engine::SampleOptions;
using engine::SampleToken;
using testutil::Bigmac;
using testutil::ExpectContains;
using testutil::RunCommand;
using testutil::Runfile;

std::vector<float> RandomLogits(int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0, 2);
  std::vector<float> logits(vocab);
  for (float& x : logits) x = normal(rng);
  return logits;
}

TEST(Sampling, GreedyAndTopOneTakeTheLargestLogit) {
  const std::vector<float> logits = RandomLogits(50, 3);
  const int best = int(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::mt19937_64 rng(1);
  SampleOptions greedy;
  greedy.temperature = 0;
  EXPECT_EQ(SampleToken(logits.data(), 50, greedy, &rng).token, best);
  SampleOptions top1;
  top1.top_k = 1;
  for (int i = 0; i < 20; ++i) EXPECT_EQ(SampleToken(logits.data(), 50, top1, &rng).token, best);
}

TEST(Sampling, DrawsFollowTheSoftmaxAndReportTheModelsLogProb) {
  const int vocab = 6;
  const std::vector<float> logits = RandomLogits(vocab, 5);
  double normalizer = 0;
  for (float x : logits) normalizer += std::exp(double(x));
  std::mt19937_64 rng(11);
  SampleOptions options;  // temperature 1, all tokens
  std::vector<int> counts(vocab);
  const int draws = 40000;
  for (int i = 0; i < draws; ++i) {
    const Pick pick = SampleToken(logits.data(), vocab, options, &rng);
    ++counts[pick.token];
    EXPECT_NEAR(pick.log_prob, logits[pick.token] - std::log(normalizer), 1e-9);
  }
  for (int t = 0; t < vocab; ++t) {
    const double p = std::exp(double(logits[t])) / normalizer;
    // Five standard deviations of a binomial count.
    EXPECT_NEAR(counts[t], p * draws, 5 * std::sqrt(draws * p * (1 - p)) + 1) << "token " << t;
  }
  // top-k 2: only the two largest, in their renormalised proportion.
  options.top_k = 2;
  std::vector<int> order = {0, 1, 2, 3, 4, 5};
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  std::vector<int> topk(vocab);
  for (int i = 0; i < draws; ++i) ++topk[SampleToken(logits.data(), vocab, options, &rng).token];
  EXPECT_EQ(topk[order[0]] + topk[order[1]], draws);
  const double p0 = 1 / (1 + std::exp(double(logits[order[1]]) - logits[order[0]]));
  EXPECT_NEAR(topk[order[0]], p0 * draws, 5 * std::sqrt(draws * p0 * (1 - p0)) + 1);
}

TEST(Sampling, TheSameSeedGivesTheSameTokens) {
  const auto logits_of = [](const std::vector<int32_t>& window) {
    return RandomLogits(40, 1000 + window.back() + 7 * uint32_t(window.size()));
  };
  SampleOptions options;
  options.tokens = 30;
  options.seed = 42;
  const engine::Generation a = engine::Generate({1, 2, 3}, 8, 40, options, logits_of);
  const engine::Generation b = engine::Generate({1, 2, 3}, 8, 40, options, logits_of);
  options.seed = 43;
  const engine::Generation c = engine::Generate({1, 2, 3}, 8, 40, options, logits_of);
  EXPECT_EQ(a.tokens, b.tokens);
  EXPECT_EQ(a.mean_loss, b.mean_loss);
  EXPECT_NE(a.tokens, c.tokens);
  EXPECT_EQ(a.tokens.size(), 30u);
}

TEST(ByteTokenizer, RoundTripsAnyBytes) {
  const std::unique_ptr<data::Tokenizer> tokenizer = data::MakeByteTokenizer();
  std::string text = "héllo\n\t";
  std::mt19937 rng(2);
  for (int i = 0; i < 300; ++i) text.push_back(static_cast<char>(rng()));
  const std::vector<int32_t> tokens = tokenizer->Encode(text);
  ASSERT_EQ(tokens.size(), text.size());
  for (int32_t t : tokens) ASSERT_TRUE(t >= 0 && t < 256);
  EXPECT_EQ(tokenizer->Decode(tokens), text);
  EXPECT_EQ(tokenizer->Decode({104, 300, 105}), "h<|300|>i");
}

// Checkpoints of the demo's model (configs/tiny.yaml: 4 blocks, width 128) trained on 2 pipeline
// stages: "trained" after 60 steps, "untrained" after one step at learning rate 1e-12.
struct Checkpoints {
  std::string trained;
  std::string untrained;
};

const Checkpoints& TrainedCheckpoints() {
  static const Checkpoints checkpoints = [] {
    std::string text;
    for (int i = 0; i < 4000; ++i) {
      text += "The quick brown fox jumps over the lazy dog number " +
              std::to_string(i * 7919 % 1000) + ". The dog sleeps.\n";
    }
    const std::string data = testutil::PrepareShards("generate", text);
    Checkpoints dirs{testutil::TempDir() + "/gen_trained", testutil::TempDir() + "/gen_untrained"};
    for (const std::string& dir : {dirs.trained, dirs.untrained}) std::filesystem::remove_all(dir);
    const std::string train = testutil::Mpirun(2) + " " + Bigmac() + " train --config " +
                              Runfile("configs/tiny.yaml") + " --set data.dir=" + data +
                              " --set parallel.pp_size=2 --set train.seq_length=64" +
                              " --set train.micro_batch_size=8 --set train.eval_batches=2" +
                              " --set train.output_dir= --set train.log_interval=20";
    const testutil::RunResult trained =
        RunCommand(train + " --set train.max_steps=60 --set optim.warmup_steps=5" +
                       " --set checkpoint.dir=" + dirs.trained,
                   240);
    EXPECT_EQ(trained.exit_code, 0) << trained.output;
    const testutil::RunResult untrained = RunCommand(
        train + " --set train.max_steps=1 --set optim.lr=1e-12 --set optim.min_lr=1e-12" +
            " --set checkpoint.dir=" + dirs.untrained,
        120);
    EXPECT_EQ(untrained.exit_code, 0) << untrained.output;
    return dirs;
  }();
  return checkpoints;
}

std::string Generate(const std::string& checkpoint, const std::string& flags) {
  return Bigmac() + " generate --checkpoint " + checkpoint + " --prompt 'The quick' " + flags;
}

TEST(GenerateCommand, IsDeterministicForASeed) {
  const std::string dir = TrainedCheckpoints().trained;
  const testutil::RunResult a = RunCommand(Generate(dir, "--tokens 40 --seed 7") + " 2>/dev/null");
  const testutil::RunResult b = RunCommand(Generate(dir, "--tokens 40 --seed 7") + " 2>/dev/null");
  const testutil::RunResult c = RunCommand(Generate(dir, "--tokens 40 --seed 8") + " 2>/dev/null");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(a.output, b.output);
  EXPECT_NE(a.output, c.output);
  EXPECT_EQ(a.output.rfind("The quick", 0), 0u) << a.output;
  EXPECT_EQ(a.output.size(), std::string("The quick").size() + 40 + 1) << a.output;
  // The summary on stderr names the checkpoint's step and the tokenizer.
  const testutil::RunResult summary = RunCommand(Generate(dir, "--tokens 4") + " 2>&1 >/dev/null");
  ExpectContains(summary.output, "(step 60, byte-level): 4 tokens");
}

// The mean per-token loss, under the trained model, of 200 tokens each checkpoint writes.
TEST(GenerateCommand, ATrainedCheckpointWritesTextItsModelFindsLikely) {
  const Checkpoints& dirs = TrainedCheckpoints();
  int64_t step = 0;
  std::string step_dir;
  cli::SingleRankModel trained = cli::LoadSingleRankModel(dirs.trained, {}, &step, &step_dir);
  EXPECT_EQ(step, 60);
  cli::SingleRankModel untrained = cli::LoadSingleRankModel(dirs.untrained, {}, &step, &step_dir);
  const int vocab = 256, context = 64;
  const std::vector<int32_t> prompt = data::MakeByteTokenizer()->Encode("The ");
  SampleOptions options;
  options.tokens = 200;
  options.seed = 5;
  auto sample = [&](cli::SingleRankModel& model) {
    engine::Generation g = engine::Generate(prompt, context, vocab, options, [&](const auto& w) {
      return engine::StageLastLogits(*model.stage, w, vocab);
    });
    std::vector<int32_t> text = prompt;
    text.insert(text.end(), g.tokens.begin(), g.tokens.end());
    return std::make_pair(text, g.mean_loss);
  };
  const auto [trained_text, trained_self] = sample(trained);
  const auto [untrained_text, untrained_self] = sample(untrained);
  const double trained_loss = engine::MeanTokenLoss(*trained.stage, trained_text, context);
  const double untrained_loss = engine::MeanTokenLoss(*trained.stage, untrained_text, context);
  std::printf(
      "per-token loss under the trained model: trained sample %.3f, untrained sample %.3f;"
      " each under its own model: %.3f, %.3f (ln 256 = %.3f)\n",
      trained_loss, untrained_loss, trained_self, untrained_self, std::log(256.0));
  EXPECT_LT(trained_loss, untrained_loss - 1.0);
  EXPECT_LT(trained_self, untrained_self - 1.0);
  EXPECT_NEAR(untrained_self, std::log(256.0), 0.3);  // an untrained model is nearly uniform
}

TEST(GenerateCommand, BadInputsExitWithTheirCodes) {
  const std::string missing = testutil::TempDir() + "/no_such_checkpoint";
  const testutil::RunResult absent = RunCommand(Generate(missing, ""));
  EXPECT_EQ(absent.exit_code, 7) << absent.output;
  ExpectContains(absent.output, missing);

  const std::string dir = TrainedCheckpoints().trained;
  for (const auto& [flags, message] : std::vector<std::pair<std::string, std::string>>{
           {"--tokens 0", "--tokens"},
           {"--temperature nan", "must be a finite temperature"},
           {"--temperature -1", "must be a finite temperature"},
           {"--top-k -2", "--top-k"},
           {"--seed x", "--seed"},
           {"--frobnicate", "frobnicate"}}) {
    const testutil::RunResult r = RunCommand(Generate(dir, flags));
    EXPECT_EQ(r.exit_code, 2) << flags << "\n" << r.output;
    ExpectContains(r.output, message);
  }
  const testutil::RunResult no_prompt = RunCommand(Bigmac() + " generate --checkpoint " + dir);
  EXPECT_EQ(no_prompt.exit_code, 2) << no_prompt.output;
  ExpectContains(no_prompt.output, "--prompt is required");
  const testutil::RunResult empty =
      RunCommand(Bigmac() + " generate --checkpoint " + dir + " --prompt ''");
  EXPECT_EQ(empty.exit_code, 2) << empty.output;
  ExpectContains(empty.output, "--prompt is empty");
}

}  // namespace
}  // namespace bigmac
