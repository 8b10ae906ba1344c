// The data-parallel all-reduce overlapped with the backward (parallel.overlap_dp_reduce) under
// mpirun: bitwise the same losses and weights as the serial all-reduce, buckets started during
// the last flush's backward, and their spans on the trace's communication track.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
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
    for (int i = 0; i < 3000; ++i) {
      text += "Replica " + std::to_string(i % 2) + " sums bucket " + std::to_string(i * 17 % 23) +
              " while the backward runs on.\n";
    }
    return testutil::PrepareShards("overlap", text);
  }();
  return dir;
}

constexpr int kSteps = 5;

struct OverlapRun {
  int exit_code = -1;
  std::string output;
  std::vector<std::string> losses;             // as printed (%.17g): compared as text, bitwise
  std::map<std::string, std::string> weights;  // dump file -> its bytes
  std::vector<nlohmann::json> metrics;
  nlohmann::json trace;
};

// kSteps of a 4-block model of width 64 in 128 KiB buckets (about 8 per rank), 2 micro-batches
// per replica and flush (two flushes per step at pp = 1, so only the last one overlaps).
OverlapRun Train(int pp, int dp, bool overlap, const std::string& name) {
  const std::string out = TempDir() + "/overlap_" + name;
  std::filesystem::remove_all(out);
  const int accum = pp == 1 ? 4 : 2;
  const std::string command =
      testutil::Mpirun(pp * dp) + " " + Bigmac() + " train --config " +
      Runfile("configs/tiny.yaml") + " --dump " + out + "/dump --set data.dir=" + DataDir() +
      " --set train.output_dir=" + out + " --set model.num_layers=4 --set model.hidden_size=64" +
      " --set model.num_heads=2 --set train.seq_length=32 --set train.micro_batch_size=2" +
      " --set train.max_steps=" + std::to_string(kSteps) +
      " --set train.eval_batches=1 --set train.eval_interval=0 --set train.log_interval=1" +
      " --set train.trace_steps=" + std::to_string(kSteps) +
      " --set parallel.pp_size=" + std::to_string(pp) + " --set parallel.schedule=1f1b" +
      " --set parallel.num_microbatches=2 --set train.gradient_accumulation_steps=" +
      std::to_string(accum) + " --set parallel.dp_bucket_size=128KiB" +
      " --set parallel.overlap_dp_reduce=" + (overlap ? "true" : "false");
  const testutil::RunResult r = RunCommand(command, 180);
  OverlapRun run;
  run.exit_code = r.exit_code;
  run.output = r.output;
  std::ifstream losses(out + "/dump/losses.txt");
  for (std::string line; std::getline(losses, line);) run.losses.push_back(line);
  if (std::filesystem::exists(out + "/dump")) {
    for (const auto& entry : std::filesystem::directory_iterator(out + "/dump")) {
      std::ifstream in(entry.path(), std::ios::binary);
      run.weights[entry.path().filename().string()] =
          std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    }
  }
  std::ifstream metrics(out + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);)
    run.metrics.push_back(nlohmann::json::parse(line));
  if (std::ifstream trace(out + "/trace.json"); trace) run.trace = nlohmann::json::parse(trace);
  return run;
}

struct Span {
  std::string name;
  double start;
  double end;
};

// Per rank (pid): the spans of one category.
std::map<int, std::vector<Span>> Spans(const nlohmann::json& trace, const std::string& category) {
  std::map<int, std::vector<Span>> spans;
  for (const auto& event : trace["traceEvents"]) {
    if (event["ph"] != "X" || event["cat"] != category) continue;
    const double ts = event["ts"].get<double>();
    spans[event["pid"].get<int>()].push_back(
        {event["name"].get<std::string>(), ts, ts + event["dur"].get<double>()});
  }
  return spans;
}

// Per rank: how many all-reduce buckets started inside a backward span (before it finished).
std::map<int, int> BucketsStartedInsideABackward(const nlohmann::json& trace) {
  const auto buckets = Spans(trace, "dp_reduce");
  // A stage that sends its input gradient computes the weight gradients after it: there the
  // buckets fill during the backward_weight spans.
  std::map<int, std::vector<Span>> backwards = Spans(trace, "backward");
  for (const auto& [rank, spans] : Spans(trace, "backward_weight"))
    backwards[rank].insert(backwards[rank].end(), spans.begin(), spans.end());
  std::map<int, int> inside;
  for (const auto& [rank, spans] : buckets) {
    inside[rank] = 0;
    for (const Span& bucket : spans) {
      for (const Span& backward : backwards[rank])
        if (backward.start < bucket.start && bucket.start < backward.end) {
          ++inside[rank];
          break;
        }
    }
  }
  return inside;
}

// The communication track exists: every bucket span is on thread 1 of its rank, named so.
void ExpectCommunicationTrack(const nlohmann::json& trace, int ranks) {
  std::map<int, std::string> track_names;
  for (const auto& event : trace["traceEvents"]) {
    if (event["ph"] == "M" && event["name"] == "thread_name" && event["tid"] == 1)
      track_names[event["pid"].get<int>()] = event["args"]["name"].get<std::string>();
    if (event["ph"] == "X" && event["cat"] == "dp_reduce") {
      EXPECT_EQ(event["tid"], 1);
    }
  }
  EXPECT_EQ(static_cast<int>(track_names.size()), ranks);
  for (const auto& [rank, name] : track_names) EXPECT_EQ(name, "communication") << rank;
}

// With a pipeline, each rank's messages in flight: asynchronous begin/end pairs, each ending after
// it begins, the pipeline's named by their action (the tied weight's by the weight).
void ExpectMessageSpans(const nlohmann::json& trace, int ranks) {
  std::map<int, std::map<std::string, double>> begins;  // rank -> id -> ts
  std::map<int, int> ended, pipeline;
  int moved = 0;  // messages seen complete by the progress inside a computation
  for (const auto& event : trace["traceEvents"]) {
    if (event.value("cat", "") != "message") continue;
    if (event["ph"] == "i") {
      EXPECT_EQ(event["name"].get<std::string>().rfind("moved: ", 0), 0u) << event.dump();
      EXPECT_EQ(event["tid"], 0) << event.dump();
      ++moved;
      continue;
    }
    const int rank = event["pid"].get<int>();
    const std::string id = event["id"].get<std::string>();
    if (event["ph"] == "b") {
      begins[rank][id] = event["ts"].get<double>();
      if (event["name"].get<std::string>().find("(micro-batch ") != std::string::npos)
        ++pipeline[rank];
    } else {
      ASSERT_EQ(event["ph"], "e");
      ASSERT_TRUE(begins[rank].count(id)) << id;
      EXPECT_GE(event["ts"].get<double>(), begins[rank][id]) << id;
      ++ended[rank];
    }
  }
  EXPECT_GT(moved, 0) << "no message moved while a rank computed";
  EXPECT_EQ(static_cast<int>(begins.size()), ranks);
  for (const auto& [rank, ids] : begins) {
    EXPECT_GT(pipeline[rank], 0) << "rank " << rank;
    EXPECT_EQ(static_cast<int>(ids.size()), ended[rank]) << "rank " << rank;
  }
}

void ExpectSameTraining(const OverlapRun& serial, const OverlapRun& overlapped) {
  ASSERT_EQ(serial.exit_code, 0) << serial.output;
  ASSERT_EQ(overlapped.exit_code, 0) << overlapped.output;
  ASSERT_EQ(serial.losses.size(), static_cast<size_t>(kSteps));
  EXPECT_EQ(serial.losses, overlapped.losses) << "losses differ";
  ASSERT_FALSE(serial.weights.empty());
  EXPECT_EQ(serial.weights.size(), overlapped.weights.size());
  for (const auto& [file, bytes] : serial.weights) {
    auto it = overlapped.weights.find(file);
    ASSERT_NE(it, overlapped.weights.end()) << file;
    EXPECT_TRUE(it->second == bytes) << file << " differs";
  }
}

// Every rank of every step: buckets, and how many of them started during the last flush.
void ExpectBucketCounts(const OverlapRun& run, int ranks, bool overlapped) {
  ASSERT_EQ(run.metrics.size(), static_cast<size_t>(kSteps));
  for (const nlohmann::json& step : run.metrics) {
    ASSERT_EQ(step["ranks"].size(), static_cast<size_t>(ranks));
    for (const nlohmann::json& rank : step["ranks"]) {
      EXPECT_GE(rank["dp_buckets"].get<int>(), 3) << rank.dump();
      if (overlapped) {
        EXPECT_GT(rank["dp_buckets_overlapped"].get<int>(), 0) << rank.dump();
      } else {
        EXPECT_EQ(rank["dp_buckets_overlapped"].get<int>(), 0) << rank.dump();
      }
    }
  }
}

// Serial against overlapped on pp x dp ranks: the same training, bitwise; every rank's buckets
// counted in metrics.jsonl; in the trace, bucket spans on the communication track, and with
// overlap some start inside a backward span of their rank (the computation still running),
// without it none does.
void ExpectOverlapChangesOnlyTheTiming(int pp, int dp) {
  const std::string name = "pp" + std::to_string(pp) + "dp" + std::to_string(dp);
  const OverlapRun serial = Train(pp, dp, false, name + "_serial");
  const OverlapRun overlapped = Train(pp, dp, true, name + "_overlap");
  ExpectSameTraining(serial, overlapped);
  ExpectBucketCounts(serial, pp * dp, false);
  ExpectBucketCounts(overlapped, pp * dp, true);
  ExpectCommunicationTrack(overlapped.trace, pp * dp);
  if (pp > 1) ExpectMessageSpans(overlapped.trace, pp * dp);
  const std::map<int, int> inside = BucketsStartedInsideABackward(overlapped.trace);
  EXPECT_EQ(static_cast<int>(inside.size()), pp * dp);
  for (const auto& [rank, count] : inside) EXPECT_GT(count, 0) << "rank " << rank;
  for (const auto& [rank, count] : BucketsStartedInsideABackward(serial.trace))
    EXPECT_EQ(count, 0) << "rank " << rank;
}

TEST(Overlap, DataParallelTwoGivesBitwiseTheSameTrainingWithBucketsDuringTheBackward) {
  ExpectOverlapChangesOnlyTheTiming(1, 2);
}

TEST(Overlap, PipelineTwoByDataParallelTwoGivesBitwiseTheSameTraining) {
  ExpectOverlapChangesOnlyTheTiming(2, 2);
}

}  // namespace
}  // namespace bigmac
