// The pipeline engine under mpirun: every schedule and layout trains exactly like one rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/testing/dump.h"
#include "tests/testing/run.h"

namespace bigmac {
namespace {

using testutil::RunCommand;
using testutil::Runfile;

using testutil::Bigmac;

using testutil::TempDir;

std::string DataDir() {
  static const std::string dir = [] {
    std::string text;
    for (int i = 0; i < 5000; ++i) {
      text += "RankModel " + std::to_string(i * 31 % 97) +
              " sends its activations to the next one, " + std::to_string(i % 7) +
              " micro-batches in flight.\n";
    }
    return testutil::PrepareShards("pipeline", text);
  }();
  return dir;
}

constexpr int kLayers = 11;  // uneven on 2, 4 and 8 stages, so policies differ
constexpr int kHidden = 32;
constexpr int kSeq = 16;
constexpr int kVocab = 256;
constexpr int kSteps = 10;

struct Layout {
  std::string schedule;
  int pp;
  int dp;
  std::string policy;
  int virtual_stages() const { return schedule == "interleaved_1f1b" ? 2 : 1; }
  friend void PrintTo(const Layout& l, std::ostream* os) {
    *os << l.schedule << " pp=" << l.pp << " dp=" << l.dp << " " << l.policy;
  }
};

struct TrainRun : testutil::Dump {
  int exit_code = -1;
  std::string output;
};

// Trains kSteps on the tiny model with 4 micro-batches per flush and per replica; the reference
// (pp = dp = 1) accumulates dp times as many, so every run sees the same global batch.
TrainRun Train(const Layout& l, int microbatches_per_replica, const std::string& extra,
               const std::string& name) {
  const std::string dump = TempDir() + "/dump_" + name;
  std::filesystem::remove_all(dump);
  const int world = l.pp * l.dp;
  const std::string command =
      testutil::Mpirun(world) + " " + Bigmac() + " train --config " + Runfile("configs/tiny.yaml") +
      " --dump " + dump + " --set data.dir=" + DataDir() +
      " --set model.num_layers=" + std::to_string(kLayers) +
      " --set model.hidden_size=" + std::to_string(kHidden) + " --set model.num_heads=2" +
      " --set model.vocab_size=" + std::to_string(kVocab) +
      " --set train.seq_length=" + std::to_string(kSeq) +
      " --set train.micro_batch_size=2 --set train.max_steps=" + std::to_string(kSteps) +
      " --set train.eval_batches=2 --set train.eval_interval=0 --set train.log_interval=1" +
      " --set optim.warmup_steps=2 --set optim.lr=3e-3" +
      " --set parallel.pp_size=" + std::to_string(l.pp) + " --set parallel.schedule=" + l.schedule +
      " --set parallel.virtual_stages=" + std::to_string(l.virtual_stages()) +
      " --set parallel.num_microbatches=" + std::to_string(microbatches_per_replica) +
      " --set train.gradient_accumulation_steps=" + std::to_string(microbatches_per_replica) +
      " --set model.partition=" + l.policy + " " + extra;
  const testutil::RunResult r = RunCommand(command, 240);
  TrainRun run;
  static_cast<testutil::Dump&>(run) = testutil::ReadDump(dump);
  run.exit_code = r.exit_code;
  run.output = r.output;
  return run;
}

const TrainRun& Reference(int dp, const std::string& extra = "") {
  static std::map<std::string, TrainRun> cache;
  const std::string key = std::to_string(dp) + extra;
  if (!cache.count(key)) {
    cache[key] = Train({"1f1b", 1, 1, "spread_first"}, 4 * dp, extra,
                       "reference_dp" + std::to_string(dp) + std::to_string(cache.size()));
  }
  return cache.at(key);
}

// Largest |a-b| / max(1, |a|) over the losses and over every weight; a missing or resized layer
// file fails the test.
testutil::DumpDifference Compare(const TrainRun& reference, const TrainRun& run) {
  testutil::DumpDifference d = testutil::CompareDumps(reference, run, kSteps);
  for (const std::string& problem : d.problems) ADD_FAILURE() << problem;
  return d;
}

class EquivalenceTest : public ::testing::TestWithParam<Layout> {};

TEST_P(EquivalenceTest, LossesAndWeightsMatchOneRank) {
  const Layout l = GetParam();
  const TrainRun& reference = Reference(l.dp);
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  const std::string name =
      l.schedule + "_pp" + std::to_string(l.pp) + "_dp" + std::to_string(l.dp) + "_" + l.policy;
  const TrainRun run = Train(l, 4, "", name);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const testutil::DumpDifference d = Compare(reference, run);
  EXPECT_LE(d.loss, 1e-5) << name;
  EXPECT_LE(d.weight, 1e-5) << name;
  std::printf("[equivalence] %s: max relative difference: loss %.3g, weights %.3g\n", name.c_str(),
              d.loss, d.weight);
}

std::vector<Layout> AllLayouts() {
  std::vector<Layout> layouts;
  for (const char* schedule : {"gpipe", "1f1b", "interleaved_1f1b", "zb_h1"}) {
    for (auto [pp, dp] : std::vector<std::pair<int, int>>{{2, 1}, {4, 1}, {2, 2}, {4, 2}}) {
      for (const char* policy : {"spread_first", "last"})
        layouts.push_back({schedule, pp, dp, policy});
    }
  }
  return layouts;
}

INSTANTIATE_TEST_SUITE_P(Layouts, EquivalenceTest, ::testing::ValuesIn(AllLayouts()),
                         [](const auto& info) {
                           return info.param.schedule + "_pp" + std::to_string(info.param.pp) +
                                  "_dp" + std::to_string(info.param.dp) + "_" + info.param.policy;
                         });

// With one replica and no clipping (whose norm is summed across ranks in another order), every
// schedule does the same arithmetic in the same order as one rank: bitwise equal.
TEST(Equivalence, BitwiseWithOneReplicaAndNoClipping) {
  const TrainRun& reference = Reference(1, "--set optim.grad_clip=0");
  ASSERT_EQ(reference.exit_code, 0) << reference.output;
  for (const char* schedule : {"gpipe", "1f1b", "interleaved_1f1b", "zb_h1"}) {
    const TrainRun run = Train({schedule, 4, 1, "spread_first"}, 4, "--set optim.grad_clip=0",
                               std::string("bitwise_") + schedule);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_EQ(run.losses, reference.losses) << schedule;
    EXPECT_EQ(run.layers, reference.layers) << schedule;
  }
}

// Each rank builds only its stage: its parameter count is its stage's share.
TEST(Stages, ParameterCountsAreTheStageShares) {
  const TrainRun run = Train({"1f1b", 4, 1, "last"}, 4, "", "shares");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  // 11 layers, policy last on 4 stages: [2, 2, 2, 5].
  const int64_t c = kHidden;
  const int64_t block = 12 * c * c + 13 * c;
  const int64_t embedding =
      int64_t{kVocab} * c + int64_t{kSeq} * c;  // wte + wpe (wpe rows = seq_length)
  const int64_t head = 2 * c;                   // lnf only: wte is a copy
  const int64_t expected[4] = {embedding + 2 * block, 2 * block, 2 * block, 5 * block + head};
  for (int rank = 0; rank < 4; ++rank) {
    const std::regex line("\\[memory\\] rank " + std::to_string(rank) + " .* (\\d+) parameters");
    std::smatch match;
    ASSERT_TRUE(std::regex_search(run.output, match, line)) << run.output;
    EXPECT_EQ(std::stoll(match[1]), expected[rank]) << "rank " << rank;
  }
}

// The tied embedding: the owner (first stage) holds wte with its optimizer state; the consumer
// (last stage) holds a read-only copy without optimizer state, equal to the owner's weight after
// the last step; and the losses match one rank's at every step.
TEST(TiedWeights, OneOwnerAndAnIdenticalCopyWithoutOptimizerState) {
  const TrainRun run = Train({"1f1b", 2, 1, "spread_first"}, 4, "", "tied");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  ASSERT_TRUE(run.layers.count("layer_-1.f32"));
  const std::vector<float>& owner = run.layers.at("layer_-1.f32");
  std::ifstream copy_file(TempDir() + "/dump_tied/tied_copy.bin", std::ios::binary);
  ASSERT_TRUE(copy_file) << "the consumer dumps its copy";
  std::vector<float> copy(kVocab * kHidden);
  copy_file.read(reinterpret_cast<char*>(copy.data()), copy.size() * sizeof(float));
  ASSERT_EQ(copy.size(), size_t(kVocab * kHidden));
  EXPECT_TRUE(std::equal(copy.begin(), copy.end(), owner.begin()))
      << "wte is the first parameter of the embedding";
  EXPECT_EQ(run.layers.at("layer_" + std::to_string(kLayers) + ".f32").size(), size_t(2 * kHidden));
  // Optimizer state: the owner's covers its parameters (wte included); the consumer's excludes
  // the copy.
  for (int rank = 0; rank < 2; ++rank) {
    const std::regex line("\\[memory\\] rank " + std::to_string(rank) +
                          " .* (\\d+) parameters, optimizer state for (\\d+)");
    std::smatch match;
    ASSERT_TRUE(std::regex_search(run.output, match, line)) << run.output;
    EXPECT_EQ(match[1], match[2]) << "rank " << rank;
  }
  EXPECT_LE(Compare(Reference(1), run).loss, 1e-5);
}

// Activation memory in flight on the first stage: GPipe holds all m micro-batches, 1F1B at most p.
TEST(Memory, GpipeHoldsAllMicroBatchesOneFOneBHoldsP) {
  auto in_flight = [](const TrainRun& run, int rank) {
    const std::regex line("\\[memory\\] rank " + std::to_string(rank) +
                          " .* at most (\\d+) micro-batch");
    std::smatch match;
    EXPECT_TRUE(std::regex_search(run.output, match, line)) << run.output;
    return match.empty() ? -1 : std::stoi(match[1]);
  };
  const TrainRun gpipe =
      Train({"gpipe", 4, 1, "spread_first"}, 8, "--set train.max_steps=1", "mem_gpipe");
  const TrainRun one =
      Train({"1f1b", 4, 1, "spread_first"}, 8, "--set train.max_steps=1", "mem_1f1b");
  ASSERT_EQ(gpipe.exit_code, 0) << gpipe.output;
  ASSERT_EQ(one.exit_code, 0) << one.output;
  for (int rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(in_flight(gpipe, rank), 8);
    EXPECT_EQ(in_flight(one, rank), 4 - rank);
  }
  // And in bytes: on the last stage GPipe keeps 8 micro-batches of activations, 1F1B one.
  auto activation_mib = [](const TrainRun& run, int rank) {
    const std::regex line("\\[memory\\] rank " + std::to_string(rank) +
                          " .* activations peak ([0-9.]+) MiB");
    std::smatch match;
    EXPECT_TRUE(std::regex_search(run.output, match, line)) << run.output;
    return match.empty() ? -1.0 : std::stod(match[1]);
  };
  EXPECT_GT(activation_mib(gpipe, 3), 4 * activation_mib(one, 3));
  EXPECT_NEAR(activation_mib(gpipe, 0), activation_mib(one, 0) * 2, activation_mib(one, 0) * 0.3)
      << "first stage: 8 micro-batches against p = 4";
}

// Every run can write metrics.jsonl (one line per step) and a Perfetto trace with one process
// per rank and the forward, backward, wait, tied-weight and optimizer spans of each.
TEST(Timeline, MetricsAndTraceFromAllRanks) {
  const std::string out = TempDir() + "/run_output";
  std::filesystem::remove_all(out);
  const TrainRun run =
      Train({"1f1b", 2, 2, "spread_first"}, 4, "--set train.output_dir=" + out, "timeline");
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::ifstream metrics(out + "/metrics.jsonl");
  int lines = 0;
  for (std::string line; std::getline(metrics, line); ++lines) {
    const nlohmann::json m = nlohmann::json::parse(line);
    EXPECT_EQ(m["step"], lines + 1);
    for (const char* key :
         {"loss", "lr", "grad_norm", "clipped", "step_ms", "tokens_per_s", "peak_bytes"}) {
      EXPECT_TRUE(m.contains(key)) << key;
    }
    EXPECT_EQ(m["micro_batch_size"], 2);
    EXPECT_EQ(m["num_microbatches"], 4);
    EXPECT_EQ(m["ranks"].size(), 4u);
  }
  EXPECT_EQ(lines, kSteps);
  std::ifstream trace_file(out + "/trace.json");
  const nlohmann::json trace = nlohmann::json::parse(trace_file);
  std::map<int, std::set<std::string>> categories;
  std::set<int> named;
  for (const auto& event : trace["traceEvents"]) {
    if (event["ph"] == "M" && event["name"] == "process_name")
      named.insert(event["pid"].get<int>());
    if (event["ph"] == "X") {
      EXPECT_GE(event["ts"].get<double>(), 0.0);
      EXPECT_GE(event["dur"].get<double>(), 0.0);
      categories[event["pid"].get<int>()].insert(event["cat"].get<std::string>());
    }
  }
  EXPECT_EQ(named, (std::set<int>{0, 1, 2, 3})) << "one process per rank";
  for (int rank = 0; rank < 4; ++rank) {
    for (const char* category : {"forward", "wait", "allreduce", "optimizer", "tied"}) {
      EXPECT_TRUE(categories[rank].count(category)) << "rank " << rank << " " << category;
    }
    // Stage 1 (ranks 2 and 3) sends its input gradient before its weight gradients.
    const std::vector<std::string> backward =
        rank < 2 ? std::vector<std::string>{"backward"}
                 : std::vector<std::string>{"backward_input", "backward_weight"};
    for (const std::string& category : backward)
      EXPECT_TRUE(categories[rank].count(category)) << "rank " << rank << " " << category;
  }
  EXPECT_NE(
      run.output.find("[stage] rank 3 (pp 1, dp 1, stage 1, layers 6-10 (5) + head): forward"),
      std::string::npos)
      << run.output;
}

// bigmac compare end to end: two layouts, the table, the verdict, the report and the chart.
// 7 layers on 4 stages with model.partition=last: 1, 1, 1 and 4, so stage 3 computes about twice
// the mean even when other tests share the cores (with 11 layers, 2, 2, 2 and 5, another rank
// was named in 3 of 10 runs beside a second compare).
TEST(Compare, TwoLayoutsGiveATableAVerdictAndAReport) {
  const std::string out = TempDir() + "/compare_report";
  const std::string common =
      " --set data.dir=" + DataDir() +
      " --set model.num_layers=7 --set model.hidden_size=32 --set model.num_heads=2"
      " --set train.seq_length=16 --set train.micro_batch_size=2 --set parallel.num_microbatches=4"
      " --set train.gradient_accumulation_steps=4 --set parallel.schedule=1f1b";
  std::string base_sets, cand_sets;
  for (size_t at = 0; at < common.size();) {
    const size_t next = common.find(" --set ", at + 1);
    const std::string set =
        common.substr(at + 7, (next == std::string::npos ? common.size() : next) - at - 7);
    base_sets += " --set-baseline " + set;
    cand_sets += " --set-candidate " + set;
    at = next == std::string::npos ? common.size() : next;
  }
  const testutil::RunResult r = RunCommand(
      Bigmac() + " compare --baseline " + Runfile("configs/tiny.yaml") + " --candidate " +
          Runfile("configs/tiny.yaml") + base_sets + cand_sets +
          " --set-baseline parallel.pp_size=2 --set-candidate parallel.pp_size=4" +
          " --set-candidate model.partition=last --steps 8 --warmup 2 --out " + out +
          " --launcher \"" +
          testutil::Mpirun(0).replace(testutil::Mpirun(0).find("-np 0"), 5, "-np {np}") + "\"",
      240);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("mean step (ms, after warm-up)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("PASS loss:"), std::string::npos)
      << "the same global batch on both" << r.output;
  EXPECT_NE(r.output.find("bottleneck: pp rank 3 (world rank 3)"), std::string::npos)
      << "last piles the remainder on stage 3" << r.output;
  std::ifstream report(out + "/report.md");
  const std::string markdown((std::istreambuf_iterator<char>(report)),
                             std::istreambuf_iterator<char>());
  EXPECT_NE(markdown.find("| metric | baseline | candidate |"), std::string::npos);
  std::ifstream chart(out + "/report.svg");
  const std::string svg((std::istreambuf_iterator<char>(chart)), std::istreambuf_iterator<char>());
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_EQ(std::count(svg.begin(), svg.end(), '<') - std::count(svg.begin(), svg.end(), '>'), 0);
  EXPECT_EQ(svg.find("<polyline") != std::string::npos, true);
}

// A peer that stops responding makes the deadline fire with a diagnostic: no hang.
TEST(Deadline, StalledPeerStopsTheJobWithADiagnostic) {
  const testutil::RunResult r = RunCommand(
      "BIGMAC_TEST_STALL_RANK=0 " + testutil::Mpirun(2) + " " + Bigmac() + " train --config " +
          Runfile("configs/tiny.yaml") + " --set data.dir=" + DataDir() +
          " --set parallel.pp_size=2 --set model.hidden_size=32 --set train.seq_length=16"
          " --set train.comm_timeout_seconds=2 --set train.max_steps=2",
      60);
  EXPECT_EQ(r.exit_code, 6) << r.output;
  EXPECT_NE(
      r.output.find(
          "bigmac: rank 1: pp 1, dp 0: waited 2 s for RecvAct(micro-batch 0, stage 1) activation "
          "from pp rank 0 (world rank 0), past the deadline of 2 s"),
      std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace bigmac
