// A model with plugin layers trains under mpirun exactly like one rank, under every schedule,
// and saves and resumes by layer_id like the built-in layers; bad plugins stop every rank.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/testing/run.h"

namespace bigmac {
namespace {

namespace fs = std::filesystem;
using testutil::RunCommand;
using testutil::Runfile;

using testutil::Bigmac;
std::string Plugin() { return Runfile("plugins/examples/rms_swiglu/librms_swiglu.so"); }
using testutil::TempDir;

std::string DataDir() {
  static const std::string dir = [] {
    std::string text;
    for (int i = 0; i < 3000; ++i) {
      text += "A plugin block " + std::to_string(i * 13 % 89) + " gates its MLP with SiLU, " +
              std::to_string(i % 5) + " norms, no biases.\n";
    }
    return testutil::PrepareShards("plugin", text);
  }();
  return dir;
}

// The model: blocks 1-2 of four come from the plugin; `plugins:` in the YAML loads it.
std::string ConfigFile() {
  static const std::string file = testutil::WriteTempFile(
      "plugin_model.yaml",
      "plugins: [" + Plugin() + "]\n" +
          "model:\n  num_layers: 4\n  hidden_size: 32\n  num_heads: 2\n  vocab_size: 256\n"
          "  layer_types: [\"rms_swiglu_block:1-2\"]\n"
          "train:\n  micro_batch_size: 2\n  seq_length: 16\n  max_steps: 6\n"
          "  gradient_accumulation_steps: 4\n  eval_interval: 0\n  eval_batches: 2\n"
          "  log_interval: 1\n"
          "optim:\n  lr: 3.0e-3\n  warmup_steps: 2\n"
          "data:\n  dir: " +
          DataDir() + "\n");
  return file;
}

struct Result {
  int exit_code;
  std::string output;
  std::vector<double> losses;
};

Result Train(int ranks, const std::string& name, const std::string& extra) {
  const std::string dump = TempDir() + "/dump_" + name;
  fs::remove_all(dump);
  const std::string command = testutil::Mpirun(ranks) + " " + Bigmac() + " train --config " +
                              ConfigFile() + " --dump " + dump +
                              " --set parallel.pp_size=" + std::to_string(ranks) + " " + extra;
  const testutil::RunResult run = RunCommand(command, 240);
  Result result{run.exit_code, run.output, {}};
  std::ifstream losses(dump + "/losses.txt");
  for (double loss; losses >> loss;) result.losses.push_back(loss);
  return result;
}

const Result& OneRank() {
  static const Result result = Train(1, "one_rank", "--set parallel.schedule=1f1b");
  return result;
}

class PluginScheduleTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PluginScheduleTest, TwoStagesGiveTheLossesOfOneRank) {
  const Result& reference = OneRank();
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  ASSERT_EQ(reference.losses.size(), 6u);
  const std::string schedule = GetParam();
  const Result run =
      Train(2, "pp2_" + schedule,
            "--set parallel.schedule=" + schedule +
                (schedule == "interleaved_1f1b" ? " --set parallel.virtual_stages=2" : ""));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("[cfg] layer_types: 0 gpt_block, 1-2 rms_swiglu_block, 3 gpt_block"),
            std::string::npos)
      << run.output;
  ASSERT_EQ(run.losses.size(), reference.losses.size());
  for (size_t i = 0; i < run.losses.size(); ++i) {
    EXPECT_NEAR(run.losses[i], reference.losses[i], 1e-6 * std::fabs(reference.losses[i]))
        << "step " << i + 1;
  }
  EXPECT_LT(run.losses.back(), run.losses.front()) << "the model learns";
}

INSTANTIATE_TEST_SUITE_P(Schedules, PluginScheduleTest,
                         ::testing::Values("gpipe", "1f1b", "interleaved_1f1b", "zb_h1"));

// Activation checkpointing applies to plugin blocks too: the stage keeps a plugin block's input
// only and reruns its Forward before the backward. Same arithmetic, so the losses are bitwise
// those without checkpointing, and the kept activations shrink.
TEST(PluginCheckpointing, TheStageRecomputesPluginBlocksBitwise) {
  // Every block from the plugin, so only the stage's recomputation can shrink the activations.
  const std::string all_plugin =
      "--set parallel.schedule=1f1b --set 'model.layer_types=[\"rms_swiglu_block:0-3\"]'";
  const Result plain = Train(1, "all_plugin", all_plugin);
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const Result checkpointed = Train(1, "all_plugin_checkpointed",
                                    all_plugin + " --set train.activation_checkpointing=true");
  ASSERT_EQ(checkpointed.exit_code, 0) << checkpointed.output;
  ASSERT_EQ(plain.losses.size(), 6u);
  EXPECT_EQ(checkpointed.losses, plain.losses);
  auto activation_peak = [](const std::string& output) {
    const std::string key = "activations peak ";
    const size_t at = output.find(key);
    return at == std::string::npos ? -1.0 : std::stod(output.substr(at + key.size()));
  };
  EXPECT_GT(activation_peak(plain.output), 0) << plain.output;
  EXPECT_LT(activation_peak(checkpointed.output), 0.6 * activation_peak(plain.output))
      << checkpointed.output;
}

// Saved on two stages at step 3, resumed on one: the plugin layers' files are keyed by layer_id
// like the built-in ones, so the run continues with the uninterrupted losses.
TEST(PluginCheckpoint, SavedOnTwoStagesResumesOnOne) {
  const std::string dir = TempDir() + "/plugin_ckpt";
  fs::remove_all(dir);
  const Result full = Train(2, "ckpt_full",
                            "--set parallel.schedule=1f1b --set checkpoint.interval=3 "
                            "--set checkpoint.dir=" +
                                dir);
  ASSERT_EQ(full.exit_code, 0) << full.output;
  ASSERT_TRUE(fs::exists(dir + "/step_000003/block_0001.bin"));
  const Result resumed =
      Train(1, "ckpt_resumed",
            "--resume " + dir + "/step_000003 --set checkpoint.dir=" + TempDir() + "/plugin_ckpt2");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  ASSERT_EQ(resumed.losses.size(), 3u) << resumed.output;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(resumed.losses[i], full.losses[3 + i], 1e-6 * std::fabs(full.losses[3 + i]));
  }
  // A checkpoint of the plugin model does not load into the plain GPT model: the names differ.
  const Result plain =
      Train(1, "ckpt_plain", "--resume " + dir + "/step_000003 --set 'model.layer_types=[]'");
  EXPECT_EQ(plain.exit_code, 7) << plain.output;
  EXPECT_NE(plain.output.find("step_000003: tensor block 1/ln1.weight#value is missing from the "
                              "manifest"),
            std::string::npos)
      << plain.output;
}

// A checkpoint records its plugins: `generate` and `ckpt export`, run from another directory
// with no --plugin, load the library it was trained with; once that is gone, they stop with
// exit 2 naming the type, its blocks and the paths tried, and --plugin brings it back (issue 33:
// they failed with "internal error: unknown type 'rms_swiglu_block'").
TEST(PluginCheckpoint, GenerateAndExportLoadTheRecordedPlugin) {
  const std::string dir = TempDir() + "/plugin_generate_ckpt";
  const std::string copy = TempDir() + "/plugin_copy.so";
  fs::remove_all(dir);
  fs::copy_file(Plugin(), copy, fs::copy_options::overwrite_existing);
  // The copy replaces the config's plugin: the checkpoint records only it.
  const Result trained = Train(
      2, "generate_ckpt",
      "--set parallel.schedule=1f1b --set 'plugins=[" + copy + "]' --set checkpoint.dir=" + dir);
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const std::string generate =
      "cd / && " + Bigmac() + " generate --checkpoint " + dir + " --prompt 'A plugin' --tokens 4";
  const testutil::RunResult found = RunCommand(generate + " 2>&1", 60);
  EXPECT_EQ(found.exit_code, 0) << found.output;
  EXPECT_NE(found.output.find("(step 6, byte-level): 4 tokens"), std::string::npos) << found.output;
  const std::string file = TempDir() + "/plugin_export.safetensors";
  fs::remove(file);
  const testutil::RunResult exported = RunCommand(
      "cd / && " + Bigmac() + " ckpt export " + dir + " --safetensors " + file + " 2>&1", 60);
  EXPECT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_TRUE(fs::exists(file));

  fs::remove(copy);
  const testutil::RunResult missing = RunCommand(generate + " 2>&1", 60);
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(
      missing.output.find("layer type rms_swiglu_block (blocks 1,2) of the checkpoint " + dir +
                          "/step_000006 is not registered by any loaded plugin (its "
                          "plugins were not found: " +
                          copy + ", " + copy + ")"),
      std::string::npos)
      << missing.output;
  const testutil::RunResult flagged = RunCommand(generate + " --plugin " + Plugin() + " 2>&1", 60);
  EXPECT_EQ(flagged.exit_code, 0) << flagged.output;
  EXPECT_EQ(flagged.output.substr(0, flagged.output.find("[generate]")),
            found.output.substr(0, found.output.find("[generate]")));
}

TEST(PluginErrors, UnknownLayerTypeStopsEveryRankWithExitTwo) {
  const testutil::RunResult run = RunCommand(
      testutil::Mpirun(2) + " " + Bigmac() + " train --config " + Runfile("configs/tiny.yaml") +
          " --set parallel.pp_size=2 --set 'model.layer_types=[\"swiglu_blok:0-1\"]'",
      60);
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("model.layer_types names layer type 'swiglu_blok' (--set), which is "
                            "not registered; known: gpt_block (built-in)"),
            std::string::npos)
      << run.output;
}

TEST(PluginErrors, ABadPluginStopsEveryRankWithExitTwo) {
  const std::string bad = Runfile("tests/plugins/libabi_mismatch.so");
  const testutil::RunResult run =
      RunCommand(testutil::Mpirun(2) + " " + Bigmac() + " train --config " +
                     Runfile("configs/tiny.yaml") + " --set parallel.pp_size=2 --plugin " + bad,
                 60);
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("plugin " + bad + ": built for plugin ABI version 3"),
            std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("(plugins, --plugin)"), std::string::npos) << run.output;
}

TEST(PluginErrors, MalformedLayerTypesAreConfigErrors) {
  const testutil::RunResult run =
      RunCommand(Bigmac() + " train --dry-run --config " + Runfile("configs/tiny.yaml") +
                     " --set 'model.layer_types=[\"gpt_block\", \"a:0-9\", \"b:1-2\", \"c:2\"]'",
                 60);
  EXPECT_EQ(run.exit_code, 2) << run.output;
  for (const std::string fragment :
       {"model.layer_types[0]='gpt_block' must be TYPE:FIRST-LAST or TYPE:LAYER",
        "model.layer_types[1]='a:0-9': the range must satisfy 0 <= FIRST <= LAST <= 3",
        "model.layer_types[3]='c:2' overlaps model.layer_types[2]='b:1-2' at layer 2"}) {
    EXPECT_NE(run.output.find(fragment), std::string::npos) << fragment << "\n" << run.output;
  }
}

// A layer type without an implementation for device.backend is a config error on every path that
// builds a model (plan, --dry-run, train), before any device is chosen: exit 2 on every rank.
TEST(PluginErrors, ALayerTypeWithoutTheBackendStopsEveryRankWithExitTwo) {
  const std::string missing =
      "rms_swiglu_block has no cuda implementation (has: cpu): "
      "model.layer_types (" +
      ConfigFile() + ":7) uses it with device.backend=cuda (--set)";
  const testutil::RunResult dry_run =
      RunCommand(testutil::Mpirun(2) + " " + Bigmac() + " train --dry-run --config " +
                     ConfigFile() + " --set parallel.pp_size=2 --set device.backend=cuda",
                 60);
  EXPECT_EQ(dry_run.exit_code, 2) << dry_run.output;
  EXPECT_NE(dry_run.output.find(missing), std::string::npos) << dry_run.output;
  EXPECT_NE(dry_run.output.find("it comes from " + Plugin()), std::string::npos) << dry_run.output;
  for (const char* rank : {"rank 0 exits with code 2", "rank 1 exits with code 2"}) {
    EXPECT_NE(dry_run.output.find(rank), std::string::npos) << rank << "\n" << dry_run.output;
  }
  const testutil::RunResult plan = RunCommand(
      Bigmac() + " plan --world-size 2 --config " + ConfigFile() + " --set device.backend=cuda",
      60);
  EXPECT_EQ(plan.exit_code, 2) << plan.output;
  EXPECT_NE(plan.output.find(missing), std::string::npos) << plan.output;
  // The built-in types have a CUDA implementation: the same layout of built-in blocks plans.
  const testutil::RunResult built_in =
      RunCommand(Bigmac() + " plan --world-size 2 --config " + ConfigFile() +
                     " --set device.backend=cuda --set 'model.layer_types=[]'",
                 60);
  EXPECT_EQ(built_in.exit_code, 0) << built_in.output;
}

TEST(Layers, ListsBuiltInAndPluginTypesWithTheirBackendsAndLibrary) {
  const testutil::RunResult run = RunCommand(Bigmac() + " layers --plugin " + Plugin(), 60);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("layer type           backends   from"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("gpt_block            cpu,cuda   built-in"), std::string::npos)
      << run.output;
  EXPECT_NE(run.output.find("rms_swiglu_block     cpu        " + Plugin()), std::string::npos)
      << run.output;
}

}  // namespace
}  // namespace bigmac
