// Every pair of BigMac's features works together or is refused at start-up (docs/feature_pairs.md):
// tensor parallelism, ZeRO-1, pipeline stages with virtual stages, bf16, plugin layers,
// activation checkpointing, text samples during training, `generate` and `ckpt export`.
//
// A pair of training features runs both at once under mpirun (oversubscribed) and must give the
// losses, weights and text samples of one rank with the same arithmetic (bf16 and plugin layers
// change it; the layout, checkpointing and samples do not). A checkpoint trained with each
// feature must be read by `generate` and `ckpt export` with the results of the one-rank run's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/checkpoint/safetensors.h"
#include "tests/testing/dump.h"
#include "tests/testing/run.h"

namespace bigmac {
namespace {

using testutil::Bigmac;
using testutil::RunCommand;
using testutil::Runfile;
using testutil::TempDir;

// The training features, as the table's rows name them.
enum Feature { kTp, kZero, kVirtual, kBf16, kPlugin, kCheckpointing, kSamples, kFeatures };
const char* const kNames[kFeatures] = {"tp",     "zero1",         "virtual", "bf16",
                                       "plugin", "checkpointing", "samples"};

constexpr int kSteps = 4;

std::string DataDir() {
  static const std::string dir = [] {
    std::string text;
    for (int i = 0; i < 2000; ++i) {
      text += "Pair " + std::to_string(i * 31 % 97) + " of features trains like one rank, step " +
              std::to_string(i % 7) + ".\n";
    }
    return testutil::PrepareShards("pairs", text);
  }();
  return dir;
}

std::string Plugin() { return Runfile("plugins/examples/rms_swiglu/librms_swiglu.so"); }

struct Features {
  std::vector<bool> on = std::vector<bool>(kFeatures, false);
  bool operator<(const Features& other) const { return on < other.on; }
  std::string Name() const {
    std::string name;
    for (int f = 0; f < kFeatures; ++f)
      if (on[f]) name += (name.empty() ? "" : "_") + std::string(kNames[f]);
    return name.empty() ? "none" : name;
  }
  int dp() const { return on[kZero] ? 2 : 1; }
  int Ranks() const { return (on[kTp] ? 2 : 1) * (on[kVirtual] ? 2 : 1) * dp(); }
  // The one-rank run with the same arithmetic and global batch, samples on.
  Features Reference() const {
    Features reference;
    reference.on[kBf16] = on[kBf16];
    reference.on[kPlugin] = on[kPlugin];
    reference.on[kSamples] = true;
    return reference;
  }
  double Tolerance() const { return on[kBf16] ? 1e-4 : 1e-5; }
};

Features With(std::initializer_list<Feature> features) {
  Features f;
  for (Feature feature : features) f.on[feature] = true;
  return f;
}

// The flags of `f`, with `dp_of_batch` replicas' worth of micro-batches per replica.
std::string Flags(const Features& f, int dp_of_batch) {
  const int accum = 2 * dp_of_batch / f.dp();
  std::string flags = " --set parallel.num_microbatches=" + std::to_string(accum) +
                      " --set train.gradient_accumulation_steps=" + std::to_string(accum);
  if (f.on[kTp]) flags += " --set parallel.tp_size=2";
  if (f.on[kZero]) flags += " --set parallel.zero_stage=1";
  if (f.on[kVirtual]) {
    flags +=
        " --set parallel.pp_size=2 --set parallel.virtual_stages=2"
        " --set parallel.schedule=interleaved_1f1b";
  }
  if (f.on[kBf16]) flags += " --set precision.dtype=bf16";
  if (f.on[kPlugin]) {
    flags += " --plugin " + Plugin() + " --set 'model.layer_types=[\"rms_swiglu_block:1-2\"]'";
  }
  if (f.on[kCheckpointing]) flags += " --set train.activation_checkpointing=true";
  if (f.on[kSamples]) flags += " --set train.sample_interval=2 --set train.sample_tokens=8";
  return flags;
}

struct TrainRun : testutil::Dump {
  int exit_code = -1;
  std::string output;
  std::string checkpoint;            // its checkpoint directory (step kSteps)
  std::vector<std::string> samples;  // its "[sample] ..." lines
};

std::vector<std::string> SampleLines(const std::string& output) {
  std::vector<std::string> lines;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find("[sample] step");
    if (at != std::string::npos) lines.push_back(line.substr(at));
  }
  return lines;
}

// 4 blocks of hidden 32 with 4 heads, sequences of 16, micro-batches of 2, 4 steps, with the
// features of `f` over `dp_of_batch` replicas' worth of micro-batches; a checkpoint at the end.
TrainRun RunTraining(const Features& f, int dp_of_batch, const std::string& name) {
  const std::string dump = TempDir() + "/pairs_dump_" + name;
  TrainRun run;
  run.checkpoint = TempDir() + "/pairs_ckpt_" + name;
  std::filesystem::remove_all(dump);
  std::filesystem::remove_all(run.checkpoint);
  const testutil::RunResult r = RunCommand(
      testutil::Mpirun(f.Ranks()) + " " + Bigmac() + " train --config " +
          Runfile("configs/tiny.yaml") + " --dump " + dump + " --set data.dir=" + DataDir() +
          " --set model.num_layers=4 --set model.hidden_size=32 --set model.num_heads=4" +
          " --set train.seq_length=16 --set train.micro_batch_size=2" +
          " --set train.max_steps=" + std::to_string(kSteps) +
          " --set train.eval_batches=1 --set train.eval_interval=0 --set train.log_interval=1" +
          " --set optim.warmup_steps=2 --set optim.lr=3e-3 --set optim.eps=1e-6" +
          " --set train.output_dir= --set checkpoint.dir=" + run.checkpoint + Flags(f, dp_of_batch),
      300);
  static_cast<testutil::Dump&>(run) = testutil::ReadDump(dump);
  run.exit_code = r.exit_code;
  run.output = r.output;
  run.samples = SampleLines(r.output);
  return run;
}

// The run of `f`, once per feature set and test binary.
const TrainRun& Train(const Features& f) {
  static std::map<Features, TrainRun> cache;
  if (!cache.count(f)) cache[f] = RunTraining(f, f.dp(), f.Name() + "_run");
  return cache.at(f);
}

// The reference of `f` (one rank) over the same global batch.
const TrainRun& ReferenceOf(const Features& f) {
  static std::map<std::pair<Features, int>, TrainRun> cache;
  const auto key = std::make_pair(f.Reference(), f.dp());
  if (!cache.count(key)) {
    cache[key] =
        RunTraining(key.first, key.second, key.first.Name() + "_ref_dp" + std::to_string(f.dp()));
  }
  return cache.at(key);
}

// The run's losses and weights against its reference; its samples too, when it wrote some.
void ExpectTrainsLikeOneRank(const Features& f) {
  const TrainRun& reference = ReferenceOf(f);
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  const TrainRun& run = Train(f);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const testutil::DumpDifference d = testutil::CompareDumps(reference, run, kSteps);
  for (const std::string& problem : d.problems) ADD_FAILURE() << problem;
  EXPECT_LE(d.loss, f.Tolerance()) << f.Name();
  EXPECT_LE(d.weight, f.Tolerance()) << f.Name();
  if (f.on[kSamples]) {
    ASSERT_EQ(run.samples.size(), size_t{kSteps / 2}) << run.output;
    EXPECT_EQ(run.samples, reference.samples);
  }
  std::printf("[pairs] %s on %d ranks: max relative difference: loss %.3g, weights %.3g\n",
              f.Name().c_str(), f.Ranks(), d.loss, d.weight);
}

struct Pair {
  Feature a;
  Feature b;
  std::string Name() const { return std::string(kNames[a]) + "_" + kNames[b]; }
};

std::vector<Pair> TrainingPairs() {
  std::vector<Pair> pairs;
  for (int a = 0; a < kFeatures; ++a) {
    for (int b = a + 1; b < kFeatures; ++b) {
      if (a == kTp && b == kZero) continue;  // refused: TpWithZeroIsRefusedOnEveryRank
      pairs.push_back({Feature(a), Feature(b)});
    }
  }
  return pairs;
}

class TrainingPairTest : public ::testing::TestWithParam<Pair> {};

TEST_P(TrainingPairTest, TrainsLikeOneRank) {
  ExpectTrainsLikeOneRank(With({GetParam().a, GetParam().b}));
}

INSTANTIATE_TEST_SUITE_P(Pairs, TrainingPairTest, ::testing::ValuesIn(TrainingPairs()),
                         [](const auto& info) { return info.param.Name(); });

TEST(FeaturePairs, TpWithZeroIsRefusedOnEveryRank) {
  const testutil::RunResult r =
      RunCommand(testutil::Mpirun(4) + " " + Bigmac() + " train --dry-run --config " +
                     Runfile("configs/tiny.yaml") + " --set data.dir=" + DataDir() +
                     " --set parallel.tp_size=2 --set parallel.zero_stage=1",
                 120);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(testutil::CountOccurrences(r.output,
                                       "parallel.zero_stage=1 (--set) with "
                                       "parallel.tp_size=2 (--set)"),
            1)
      << r.output;  // rank 0 prints the problems; every rank stops
  EXPECT_NE(r.output.find("ZeRO-1 shards whole parameters over dp"), std::string::npos) << r.output;
}

// `generate` on a checkpoint, greedy (the same on any machine); `output` without the summary
// line, which names the checkpoint.
testutil::RunResult Generate(const std::string& checkpoint) {
  testutil::RunResult r = RunCommand(Bigmac() + " generate --checkpoint " + checkpoint +
                                         " --prompt 'Pair 3' --tokens 12 --temperature 0 2>&1",
                                     60);
  const size_t summary = r.output.find("[generate] ");
  if (r.exit_code == 0 && summary != std::string::npos) r.output.resize(summary);
  return r;
}

// A sample line's text with util::Printable's \xNN escapes undone.
std::string Unescape(const std::string& text) {
  std::string bytes;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text.compare(i, 2, "\\x") == 0 && i + 4 <= text.size()) {
      bytes.push_back(static_cast<char>(std::stoi(text.substr(i + 2, 2), nullptr, 16)));
      i += 3;
    } else {
      bytes.push_back(text[i]);
    }
  }
  return bytes;
}

std::vector<checkpoint::NamedTensor> Export(const std::string& checkpoint,
                                            const std::string& file) {
  // The exports share a directory: each replaces the last one's file and config.json.
  std::filesystem::remove(file);
  std::filesystem::remove(std::filesystem::path(file).parent_path() / "config.json");
  const testutil::RunResult r =
      RunCommand(Bigmac() + " ckpt export " + checkpoint + " --safetensors " + file, 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (r.exit_code != 0) return {};
  return checkpoint::ReadSafetensors(file);
}

// Largest |a - b| / max(1, |a|) over every tensor; a name or shape that differs fails.
double ExportDifference(const std::vector<checkpoint::NamedTensor>& reference,
                        const std::vector<checkpoint::NamedTensor>& run) {
  EXPECT_EQ(reference.size(), run.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(reference.size(), run.size()); ++i) {
    EXPECT_EQ(reference[i].name, run[i].name);
    EXPECT_EQ(reference[i].shape, run[i].shape) << reference[i].name;
    if (reference[i].data.size() != run[i].data.size()) continue;
    for (size_t j = 0; j < run[i].data.size(); ++j) {
      const double a = reference[i].data[j];
      worst = std::max(worst, std::fabs(a - run[i].data[j]) / std::max(1.0, std::fabs(a)));
    }
  }
  return worst;
}

class SingleFeatureTest : public ::testing::TestWithParam<Feature> {};

// A checkpoint trained with the feature: `generate` writes the reference checkpoint's text, and
// `ckpt export` its tensors (within the feature's tolerance), with no --plugin (the checkpoint
// records its plugins).
TEST_P(SingleFeatureTest, GenerateAndExportReadItsCheckpoint) {
  const Features f = With({GetParam()});
  const TrainRun& reference = ReferenceOf(f);
  const TrainRun& run = Train(f);
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const testutil::RunResult expected = Generate(reference.checkpoint);
  const testutil::RunResult text = Generate(run.checkpoint);
  ASSERT_EQ(expected.exit_code, 0) << expected.output;
  ASSERT_EQ(text.exit_code, 0) << text.output;
  EXPECT_EQ(text.output, expected.output);
  const double d = ExportDifference(Export(reference.checkpoint, TempDir() + "/pairs_ref.st"),
                                    Export(run.checkpoint, TempDir() + "/pairs_run.st"));
  EXPECT_LE(d, f.Tolerance()) << f.Name();
}

INSTANTIATE_TEST_SUITE_P(Features, SingleFeatureTest,
                         ::testing::Values(kTp, kZero, kVirtual, kBf16, kPlugin, kCheckpointing,
                                           kSamples),
                         [](const auto& info) { return std::string(kNames[info.param]); });

// samples x generate: the sample a run writes at step N is what `generate` writes from that
// step's checkpoint with the sample's prompt, temperature 1 and seed train.seed + N.
TEST(FeaturePairs, ASampleIsWhatGenerateWritesFromThatStep) {
  const TrainRun& run = Train(With({kSamples, kTp}));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  ASSERT_FALSE(run.samples.empty()) << run.output;
  const std::string& last = run.samples.back();  // "[sample] step 4 | PROMPT -> TEXT | ..."
  const std::string head = "[sample] step " + std::to_string(kSteps) + " | ";
  ASSERT_EQ(last.rfind(head, 0), 0u) << last;
  const size_t arrow = last.find(" -> ");
  const size_t bar = last.rfind(" | ");
  const std::string prompt = Unescape(last.substr(head.size(), arrow - head.size()));
  const std::string text = Unescape(last.substr(arrow + 4, bar - arrow - 4));
  // Through a file, so that any byte of the prompt reaches generate as it is.
  const std::string file = testutil::WriteTempFile("pairs_prompt.txt", prompt);
  const testutil::RunResult generated =
      RunCommand("p=\"$(cat " + file + "; printf x)\"; " + Bigmac() + " generate --checkpoint " +
                     run.checkpoint + " --prompt \"${p%x}\" --tokens 8 --temperature 1 --seed " +
                     std::to_string(1337 + kSteps) + " 2>/dev/null",
                 60);
  ASSERT_EQ(generated.exit_code, 0) << generated.output;
  EXPECT_EQ(generated.output, prompt + text + "\n");
}

// export x import x generate, with plugin blocks (plugins x export): the exported file imports
// back into a checkpoint that writes the same text.
TEST(FeaturePairs, ExportedPluginBlocksImportBackAndGenerateTheSameText) {
  const TrainRun& run = Train(With({kPlugin}));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const std::string file = TempDir() + "/pairs_plugin.safetensors";
  ASSERT_FALSE(Export(run.checkpoint, file).empty());
  const std::string config = testutil::WriteTempFile(
      "pairs_plugin.yaml",
      "model: {num_layers: 4, hidden_size: 32, num_heads: 4, vocab_size: 256,"
      " layer_types: [\"rms_swiglu_block:1-2\"]}\n"
      "train: {seq_length: 16, micro_batch_size: 2}\n"
      "data: {dir: " +
          DataDir() + "}\n");
  const std::string imported = TempDir() + "/pairs_imported";
  std::filesystem::remove_all(imported);
  const testutil::RunResult import =
      RunCommand(Bigmac() + " ckpt import --safetensors " + file + " --config " + config +
                     " --plugin " + Plugin() + " --output " + imported,
                 60);
  ASSERT_EQ(import.exit_code, 0) << import.output;
  const testutil::RunResult original = Generate(run.checkpoint);
  const testutil::RunResult round_trip = Generate(imported);
  ASSERT_EQ(original.exit_code, 0) << original.output;
  ASSERT_EQ(round_trip.exit_code, 0) << round_trip.output;
  EXPECT_EQ(round_trip.output, original.output);
}

}  // namespace
}  // namespace bigmac
