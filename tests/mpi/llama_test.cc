// The llama architecture (model.arch: llama) under mpirun, as the GPT tests prove GPT: every
// schedule and pipeline layout gives one rank's losses and weights bit for bit (one replica, no
// clipping); dp with ZeRO-1 and tensor parallelism (q by heads, k and v by key/value-head groups,
// gate|up column-parallel, o and down row-parallel) within 1e-5; a tied head across stages; bf16;
// a checkpoint saved under tp2 x pp2 resumed on one rank; generate from it; Hugging Face export
// and import.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/testing/dump.h"
#include "tests/testing/run.h"

namespace bigmac {
namespace {

using testutil::Bigmac;
using testutil::ReadFile;
using testutil::RunCommand;
using testutil::Runfile;
using testutil::TempDir;

std::string DataDir() {
  static const std::string dir = [] {
    std::string text;
    for (int i = 0; i < 3000; ++i) {
      text += "Query head " + std::to_string(i * 37 % 89) + " shares key head " +
              std::to_string(i % 5) + " and turns by its position.\n";
    }
    return testutil::PrepareShards("llama", text);
  }();
  return dir;
}

constexpr int kSteps = 10;

struct Layout {
  std::string schedule = "1f1b";
  int pp = 1;
  int dp = 1;
  int tp = 1;
  std::string Name() const {
    return schedule + "_pp" + std::to_string(pp) + "_dp" + std::to_string(dp) + "_tp" +
           std::to_string(tp);
  }
};

struct TrainRun : testutil::Dump {
  int exit_code = -1;
  std::string output;
};

// 4 llama blocks of hidden 32: 4 query heads over 2 key/value heads (one group per rank at
// tp = 2), SwiGLU 48 wide, sequences of 16; 4 micro-batches of 2 per replica and step (the
// dp = 1 reference accumulates dp times as many). AdamW's eps is 1e-6, as in tp_test.cc.
TrainRun Train(const Layout& l, const std::string& extra, const std::string& name) {
  const std::string dump = TempDir() + "/llama_dump_" + name;
  std::filesystem::remove_all(dump);
  const int world = l.pp * l.dp * l.tp;
  const int microbatches = 4;
  const std::string command =
      (world > 1 ? testutil::Mpirun(world) + " " : std::string()) + Bigmac() + " train --config " +
      Runfile("configs/llama_tiny.yaml") + " --dump " + dump + " --set data.dir=" + DataDir() +
      " --set model.num_layers=4 --set model.hidden_size=32 --set model.num_heads=4" +
      " --set model.num_kv_heads=2 --set model.intermediate_size=48" +
      " --set train.seq_length=16 --set train.micro_batch_size=2" +
      " --set train.max_steps=" + std::to_string(kSteps) +
      " --set train.eval_batches=2 --set train.eval_interval=0 --set train.log_interval=1" +
      " --set optim.warmup_steps=2 --set optim.lr=3e-3 --set optim.eps=1e-6" +
      " --set parallel.schedule=" + l.schedule + " --set parallel.pp_size=" + std::to_string(l.pp) +
      " --set parallel.tp_size=" + std::to_string(l.tp) +
      " --set parallel.virtual_stages=" + (l.schedule == "interleaved_1f1b" ? "2" : "1") +
      " --set parallel.num_microbatches=" + std::to_string(microbatches) +
      " --set train.gradient_accumulation_steps=" + std::to_string(microbatches) + " " + extra;
  const testutil::RunResult r = RunCommand(command, 240);
  TrainRun run;
  static_cast<testutil::Dump&>(run) = testutil::ReadDump(dump);
  run.exit_code = r.exit_code;
  run.output = r.output;
  return run;
}

// One rank over the same global batch as `dp` replicas.
TrainRun Reference(int dp, const std::string& extra, const std::string& name) {
  const std::string accum = std::to_string(4 * dp);
  return Train({"1f1b", 1, 1, 1},
               "--set parallel.num_microbatches=" + accum +
                   " --set train.gradient_accumulation_steps=" + accum + " " + extra,
               name);
}

testutil::DumpDifference Compare(const TrainRun& reference, const TrainRun& run) {
  testutil::DumpDifference d = testutil::CompareDumps(reference, run, kSteps);
  for (const std::string& problem : d.problems) ADD_FAILURE() << problem;
  return d;
}

// One replica, no clipping (its norm is summed across ranks in another order): every schedule
// does one rank's arithmetic in one rank's order.
TEST(LlamaEquivalence, SchedulesAndStagesAreBitwiseOneRank) {
  const std::string no_clip = "--set optim.grad_clip=0";
  const TrainRun reference = Reference(1, no_clip, "bitwise_reference");
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  ASSERT_EQ(reference.losses.size(), size_t{kSteps});
  EXPECT_LT(reference.losses.back(), reference.losses.front()) << "it learns";
  EXPECT_NE(reference.output.find("layer_types: 0-3 llama_block"), std::string::npos)
      << reference.output;
  for (const Layout& l :
       {Layout{"gpipe", 2}, Layout{"1f1b", 4}, Layout{"interleaved_1f1b", 2}, Layout{"zb_h1", 2}}) {
    const TrainRun run = Train(l, no_clip, "bitwise_" + l.Name());
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_EQ(run.losses, reference.losses) << l.Name();
    EXPECT_EQ(run.layers, reference.layers) << l.Name();
  }
}

// Two stages with `extra` (no clipping) give one rank's losses and weights bit for bit.
void ExpectTwoStagesBitwise(const std::string& extra, const std::string& name) {
  const std::string settings = extra + " --set optim.grad_clip=0";
  const TrainRun reference = Reference(1, settings, name + "_reference");
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  const TrainRun run = Train({"1f1b", 2}, settings, name + "_pp2");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(run.losses, reference.losses);
  EXPECT_EQ(run.layers, reference.layers);
}

// The head tied to the embedding across stages: the single-owner exchange, as GPT's.
TEST(LlamaEquivalence, TiedHeadOnTheLastStageIsBitwiseOneRank) {
  ExpectTwoStagesBitwise("--set model.tie_embeddings=true", "tied");
}

// dp with ZeRO-1, and tp over the pipeline and over dp: one rank's training within 1e-5 (the
// row-parallel sums and the dp all-reduce add in another order).
TEST(LlamaEquivalence, ZeroAndTensorParallelMatchOneRank) {
  const TrainRun reference1 = Reference(1, "", "reference_dp1");
  const TrainRun reference2 = Reference(2, "", "reference_dp2");
  ASSERT_EQ(reference1.exit_code, 0) << reference1.output;
  ASSERT_EQ(reference2.exit_code, 0) << reference2.output;
  struct Case {
    Layout layout;
    std::string extra;
  };
  for (const Case& c : {Case{{"1f1b", 2, 2, 1}, "--set parallel.zero_stage=1"},
                        Case{{"1f1b", 2, 1, 2}, ""}, Case{{"1f1b", 1, 2, 2}, ""}}) {
    const TrainRun run = Train(c.layout, c.extra, "close_" + c.layout.Name());
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const testutil::DumpDifference d = Compare(c.layout.dp == 2 ? reference2 : reference1, run);
    EXPECT_LE(d.loss, 1e-5) << c.layout.Name();
    EXPECT_LE(d.weight, 1e-5) << c.layout.Name();
    std::printf("[llama equivalence] %s %s: max relative difference: loss %.3g, weights %.3g\n",
                c.layout.Name().c_str(), c.extra.c_str(), d.loss, d.weight);
  }
}

// bf16 (fp32 masters, bf16 compute copies and activations) on two stages: one rank's bits.
TEST(LlamaBf16, TwoStagesEqualOneRankBitwise) {
  ExpectTwoStagesBitwise("--set precision.dtype=bf16", "bf16");
}

// A checkpoint saved by tp2 x pp2 (per layer_id, q|k|v sliced by head groups) resumes on one
// rank with the uninterrupted run's losses; generate reads it.
TEST(LlamaCheckpoint, SavedUnderTpAndPpResumesOnOneRankAndGenerates) {
  const std::string dir = TempDir() + "/llama_ckpt";
  std::filesystem::remove_all(dir);
  const TrainRun full = Train(
      {"1f1b", 2, 1, 2}, "--set checkpoint.interval=5 --set checkpoint.dir=" + dir, "ckpt_full");
  ASSERT_EQ(full.exit_code, 0) << full.output;
  ASSERT_EQ(full.losses.size(), size_t{kSteps});
  const TrainRun resumed = Train(
      {"1f1b", 1},
      "--resume " + dir + "/step_000005 --set checkpoint.dir=" + TempDir() + "/llama_ckpt_resumed",
      "ckpt_resumed");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  ASSERT_EQ(resumed.losses.size(), size_t{kSteps - 5}) << resumed.output;
  double worst = 0;
  for (int i = 0; i < kSteps - 5; ++i) {
    worst = std::max(worst, std::fabs(resumed.losses[i] - full.losses[i + 5]) /
                                std::max(1.0, full.losses[i + 5]));
  }
  EXPECT_LE(worst, 1e-5);
  std::printf("[llama checkpoint] tp2 pp2 -> one rank: max relative loss difference %.3g\n", worst);

  // The resume preview (--dry-run) says what that resume did: the layouts, the files, the
  // slicing, the optimizer state, and that the data continued exactly; another micro-batch size
  // makes the data differ, and it says why.
  const std::string model =
      " --set model.num_layers=4 --set model.hidden_size=32"
      " --set model.num_heads=4 --set model.num_kv_heads=2"
      " --set model.intermediate_size=48 --set train.seq_length=16"
      " --set parallel.num_microbatches=4"
      " --set train.gradient_accumulation_steps=4 --set data.dir=" +
      DataDir();
  const std::string preview = Bigmac() + " train --config " + Runfile("configs/llama_tiny.yaml") +
                              model + " --resume " + dir + "/step_000005 --dry-run";
  const testutil::RunResult same = RunCommand(preview + " --set train.micro_batch_size=2", 60);
  ASSERT_EQ(same.exit_code, 0) << same.output;
  for (const char* line :
       {"resharded: pp 2 -> 1, tp 2 -> 1, layers_per_stage [2, 2] -> [4]",
        "pp rank 0 reads embedding.bin, block_0000.bin .. block_0003.bin, head.bin (6 files)",
        "every rank takes the whole layers (saved under tp=2)",
        "optimizer: AdamW moments for all 27 parameter tensors", "data: continues exactly"}) {
    EXPECT_NE(same.output.find(line), std::string::npos) << line << "\n" << same.output;
  }
  const testutil::RunResult other = RunCommand(preview + " --set train.micro_batch_size=4", 60);
  ASSERT_EQ(other.exit_code, 0) << other.output;
  EXPECT_NE(other.output.find("data: does not continue exactly (train.micro_batch_size 2 -> 4)"),
            std::string::npos)
      << other.output;

  const testutil::RunResult generated =
      RunCommand(Bigmac() + " generate --checkpoint " + dir +
                     " --prompt 'Query head ' --tokens 24 --seed 3 --temperature 0.8",
                 120);
  ASSERT_EQ(generated.exit_code, 0) << generated.output;
  EXPECT_NE(generated.output.find("Query head "), std::string::npos) << generated.output;
  EXPECT_NE(generated.output.find("24 tokens"), std::string::npos) << generated.output;
}

// ckpt export writes LlamaForCausalLM's names (q|k|v and gate|up split by rows) and a config.json
// that transformers reads (bench/hf_llama_check.py loads both with transformers); ckpt import
// reads the file back, and its export holds the same tensors.
TEST(LlamaExport, HuggingFaceNamesAndConfigRoundTrip) {
  const std::string dir = TempDir() + "/llama_export";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir + "/hf");
  std::filesystem::create_directories(dir + "/again");
  const TrainRun trained = Train(
      {"1f1b", 1},
      "--set checkpoint.interval=3 --set train.max_steps=3 --set checkpoint.dir=" + dir + "/ckpt",
      "export");
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const testutil::RunResult exported = RunCommand(
      Bigmac() + " ckpt export " + dir + "/ckpt --safetensors " + dir + "/hf/model.safetensors",
      60);
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_NE(exported.output.find("LlamaForCausalLM names"), std::string::npos) << exported.output;
  const nlohmann::json config = nlohmann::json::parse(ReadFile(dir + "/hf/config.json"));
  EXPECT_EQ(config["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(config["num_key_value_heads"], 2);
  EXPECT_EQ(config["intermediate_size"], 48);
  EXPECT_EQ(config["tie_word_embeddings"], false);
  const std::string file = ReadFile(dir + "/hf/model.safetensors");
  ASSERT_GT(file.size(), 8u);
  uint64_t length = 0;
  for (int i = 0; i < 8; ++i) length |= uint64_t{static_cast<unsigned char>(file[i])} << (8 * i);
  const nlohmann::json header = nlohmann::json::parse(file.substr(8, length));
  // Hidden 32, head_dim 8: q is 32 rows, k and v 2 * 8; gate and up 48 each.
  for (const auto& [name, rows] :
       std::vector<std::pair<std::string, int>>{{"model.layers.3.self_attn.q_proj.weight", 32},
                                                {"model.layers.3.self_attn.k_proj.weight", 16},
                                                {"model.layers.3.self_attn.v_proj.weight", 16},
                                                {"model.layers.0.mlp.gate_proj.weight", 48},
                                                {"model.layers.0.mlp.up_proj.weight", 48},
                                                {"model.layers.0.mlp.down_proj.weight", 32},
                                                {"model.embed_tokens.weight", 256},
                                                {"lm_head.weight", 256}}) {
    ASSERT_TRUE(header.contains(name)) << name << " in " << header.dump();
    EXPECT_EQ(header[name]["shape"][0], rows) << name;
  }
  EXPECT_TRUE(header.contains("model.norm.weight"));
  EXPECT_TRUE(header.contains("model.layers.1.post_attention_layernorm.weight"));

  const std::string model =
      " --set model.num_layers=4 --set model.hidden_size=32"
      " --set model.num_heads=4 --set model.num_kv_heads=2"
      " --set model.intermediate_size=48 --set train.seq_length=16";
  const testutil::RunResult imported = RunCommand(
      Bigmac() + " ckpt import --safetensors " + dir + "/hf/model.safetensors --config " +
          Runfile("configs/llama_tiny.yaml") + model + " --output " + dir + "/imported",
      60);
  ASSERT_EQ(imported.exit_code, 0) << imported.output;
  EXPECT_EQ(imported.output.find("have no place in this model"), std::string::npos)
      << imported.output;
  // Imported as tied, the untied file's lm_head.weight has no place: said, not dropped silently.
  const testutil::RunResult as_tied =
      RunCommand(Bigmac() + " ckpt import --safetensors " + dir +
                     "/hf/model.safetensors --config " + Runfile("configs/llama_tiny.yaml") +
                     model + " --set model.tie_embeddings=true --output " + dir + "/imported_tied",
                 60);
  ASSERT_EQ(as_tied.exit_code, 0) << as_tied.output;
  EXPECT_NE(as_tied.output.find("note: 1 tensor(s) of " + dir +
                                "/hf/model.safetensors have no place in this model and were not "
                                "read: lm_head.weight"),
            std::string::npos)
      << as_tied.output;
  const testutil::RunResult again =
      RunCommand(Bigmac() + " ckpt export " + dir + "/imported --safetensors " + dir +
                     "/again/model.safetensors",
                 60);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  // The tensors (everything after the header) are the same bytes; the header's metadata names
  // another source.
  const std::string second = ReadFile(dir + "/again/model.safetensors");
  uint64_t second_length = 0;
  for (int i = 0; i < 8; ++i)
    second_length |= uint64_t{static_cast<unsigned char>(second[i])} << (8 * i);
  EXPECT_TRUE(file.substr(8 + length) == second.substr(8 + second_length));
}

// generate on a llama checkpoint trained on a SentencePiece vocabulary: the prompt encodes with
// the corpus's tokenizer and the text decodes with it.
TEST(LlamaGenerate, SentencePieceVocabulary) {
  const std::string dir = TempDir() + "/llama_sp";
  std::filesystem::remove_all(dir);
  std::string text;
  for (int i = 0; i < 20000; ++i)
    text += "Key head " + std::to_string(i * 37 % 1009) + " serves query heads of group " +
            std::to_string(i * 11 % 997) + ".\n";
  const std::string corpus = testutil::WriteTempFile("llama_sp.txt", text);
  const testutil::RunResult prep =
      RunCommand(Bigmac() + " data prep --input " + corpus + " --output " + dir +
                     "/data --tokenizer sentencepiece --vocab-size 320",
                 120);
  ASSERT_EQ(prep.exit_code, 0) << prep.output;
  const TrainRun trained =
      Train({"1f1b", 1},
            "--set data.dir=" + dir +
                "/data --set model.vocab_size=320 --set checkpoint.dir=" + dir + "/ckpt",
            "sentencepiece");
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const testutil::RunResult generated =
      RunCommand(Bigmac() + " generate --checkpoint " + dir +
                     "/ckpt --prompt 'Key head ' --tokens 12 --seed 5",
                 120);
  ASSERT_EQ(generated.exit_code, 0) << generated.output;
  EXPECT_NE(generated.output.find("Key head "), std::string::npos) << generated.output;
  EXPECT_NE(generated.output.find("sentencepiece"), std::string::npos) << generated.output;
  EXPECT_NE(generated.output.find("12 tokens"), std::string::npos) << generated.output;
}

}  // namespace
}  // namespace bigmac
