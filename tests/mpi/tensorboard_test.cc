// TensorBoard event files: the TFRecord framing and CRC-32C against an independent bitwise
// implementation, and a pipeline run's events read back by TensorBoard's own reader
// (tests/tensorboard_read.py) and compared with metrics.jsonl, scalar by scalar.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "core/metrics/event_writer.h"
#include "core/metrics/events.pb.h"
#include "nlohmann/json.hpp"
#include "tests/testing/expect.h"
#include "tests/testing/run.h"

namespace bigmac {
namespace {

using testutil::Bigmac;
using testutil::RunCommand;
using testutil::Runfile;

// CRC-32C bit by bit (reflected polynomial 0x82f63b78), the definition itself.
uint32_t ReferenceCrc32c(const std::string& data) {
  uint32_t crc = 0xffffffffu;
  for (const unsigned char byte : data) {
    crc ^= byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82f63b78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

uint64_t ReadLittleEndian(const std::string& bytes, size_t at, int width) {
  uint64_t value = 0;
  for (int i = 0; i < width; ++i) value |= uint64_t(uint8_t(bytes[at + i])) << (8 * i);
  return value;
}

TEST(EventWriter, Crc32cMatchesTheDefinition) {
  EXPECT_EQ(metrics::Crc32c("123456789", 9), 0xe3069283u);  // the standard check value
  std::mt19937 rng(19);
  for (int size : {0, 1, 7, 64, 1000, 4099}) {
    std::string data(size, '\0');
    for (char& c : data) c = static_cast<char>(rng());
    EXPECT_EQ(metrics::Crc32c(data.data(), data.size()), ReferenceCrc32c(data)) << size;
    const uint32_t crc = ReferenceCrc32c(data);
    EXPECT_EQ(metrics::MaskedCrc32c(data.data(), data.size()),
              ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
  }
}

TEST(EventWriter, WritesFramedEventsThatParseBack) {
  const std::string dir = testutil::TempDir() + "/events_unit";
  std::filesystem::remove_all(dir);
  std::string error;
  std::unique_ptr<metrics::EventWriter> writer = metrics::EventWriter::Open(dir, &error);
  ASSERT_TRUE(writer) << error;
  writer->AddScalar("train/loss", 3, 2.75);
  writer->AddText("config", 0, "pp=2");
  std::ifstream in(writer->path(), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<tensorboard::Event> events;
  for (size_t at = 0; at < bytes.size();) {
    ASSERT_LE(at + 12, bytes.size());
    const uint64_t length = ReadLittleEndian(bytes, at, 8);
    const std::string header = bytes.substr(at, 8);
    const uint32_t crc = ReferenceCrc32c(header);
    EXPECT_EQ(ReadLittleEndian(bytes, at + 8, 4), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
    ASSERT_LE(at + 16 + length, bytes.size());
    const std::string payload = bytes.substr(at + 12, length);
    const uint32_t payload_crc = ReferenceCrc32c(payload);
    EXPECT_EQ(ReadLittleEndian(bytes, at + 12 + length, 4),
              ((payload_crc >> 15) | (payload_crc << 17)) + 0xa282ead8u);
    ASSERT_TRUE(events.emplace_back().ParseFromString(payload));
    at += 16 + length;
  }
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].file_version(), "brain.Event:2");
  EXPECT_EQ(events[1].step(), 3);
  EXPECT_EQ(events[1].summary().value(0).tag(), "train/loss");
  EXPECT_EQ(events[1].summary().value(0).simple_value(), 2.75f);
  EXPECT_EQ(events[2].summary().value(0).metadata().plugin_data().plugin_name(), "text");
  EXPECT_EQ(events[2].summary().value(0).tensor().string_val(0), "pp=2");
}

constexpr int kSteps = 6;

struct TrainRun {
  testutil::RunResult result;
  std::vector<nlohmann::json> metrics;  // metrics.jsonl
  nlohmann::json events;                // what TensorBoard read
};

// kSteps of the tiny model on `ranks` pipeline stages, evaluated every 3 steps and sampled every 3.
TrainRun Train(int ranks, const std::string& name) {
  static const std::string data = [] {
    std::string text;
    for (int i = 0; i < 3000; ++i) {
      text += "Entry " + std::to_string(i * 7919 % 997) + ": a pipeline logs its loss from the " +
              "last stage, " + std::to_string(i % 17) + " times.\n";
    }
    return testutil::PrepareShards("tensorboard", text);
  }();
  const std::string out = testutil::TempDir() + "/tb_" + name;
  std::filesystem::remove_all(out);
  TrainRun run;
  run.result = RunCommand(
      testutil::Mpirun(ranks) + " " + Bigmac() + " train --config " + Runfile("configs/tiny.yaml") +
          " --set data.dir=" + data + " --set parallel.pp_size=" + std::to_string(ranks) +
          " --set model.hidden_size=32 --set train.seq_length=32 --set train.micro_batch_size=4" +
          " --set train.max_steps=" + std::to_string(kSteps) +
          " --set optim.warmup_steps=1 --set train.log_interval=1 --set train.eval_interval=3" +
          " --set train.eval_batches=2 --set train.sample_interval=3 --set train.sample_tokens=8" +
          " --set train.output_dir=" + out,
      180);
  std::ifstream metrics(out + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);)
    run.metrics.push_back(nlohmann::json::parse(line));
  const testutil::RunResult read =
      RunCommand("python3 " + Runfile("tests/tensorboard_read.py") + " " + out, 120);
  EXPECT_EQ(read.exit_code, 0) << "TensorBoard's reader (PyPI tensorboard, launch/setup.sh):\n"
                               << read.output;
  if (read.exit_code == 0) run.events = nlohmann::json::parse(read.output);
  return run;
}

// TensorBoard stores scalars as float32: the same number, rounded once.
float AsStored(double value) { return static_cast<float>(value); }

// (step -> value) of one TensorBoard scalar tag.
std::map<int, float> Scalars(const nlohmann::json& events, const std::string& tag) {
  std::map<int, float> values;
  if (!events["scalars"].contains(tag)) return values;
  for (const auto& point : events["scalars"][tag]) {
    values[point[0].get<int>()] = AsStored(point[1].get<double>());
  }
  return values;
}

TEST(TensorBoard, EveryScalarMatchesMetricsJsonlUnderPipelineParallelism) {
  const TrainRun pp2 = Train(2, "pp2");
  ASSERT_EQ(pp2.result.exit_code, 0) << pp2.result.output;
  ASSERT_EQ(pp2.metrics.size(), size_t(kSteps));
  ASSERT_FALSE(pp2.events.is_null());
  ASSERT_EQ(pp2.events["files"].size(), 1u) << pp2.events.dump();
  EXPECT_EQ(pp2.events["files"][0].get<std::string>().rfind("events.out.tfevents.", 0), 0u);

  const std::map<std::string, std::string> tags = {{"train/loss", "loss"},
                                                   {"train/lr", "lr"},
                                                   {"train/grad_norm", "grad_norm"},
                                                   {"train/tokens_per_s", "tokens_per_s"},
                                                   {"train/step_ms", "step_ms"}};
  for (const auto& [tag, key] : tags) {
    const std::map<int, float> tb = Scalars(pp2.events, tag);
    ASSERT_EQ(tb.size(), size_t(kSteps)) << tag << ": " << pp2.events.dump();
    for (const nlohmann::json& line : pp2.metrics) {
      const int step = line["step"].get<int>();
      ASSERT_TRUE(tb.count(step)) << tag << " step " << step;
      EXPECT_EQ(tb.at(step), AsStored(line[key].get<double>())) << tag << " step " << step;
    }
  }
  // Peak memory: the fullest rank's and each rank's.
  const std::map<int, float> peak = Scalars(pp2.events, "memory/peak_mib");
  for (const nlohmann::json& line : pp2.metrics) {
    const int step = line["step"].get<int>();
    EXPECT_EQ(peak.at(step), AsStored(line["peak_bytes"].get<double>() / (1 << 20)));
    ASSERT_EQ(line["ranks"].size(), 2u);
    for (const nlohmann::json& rank : line["ranks"]) {
      const std::string tag = "memory/peak_mib/rank_" + std::to_string(rank["rank"].get<int>());
      const std::map<int, float> per_rank = Scalars(pp2.events, tag);
      ASSERT_TRUE(per_rank.count(step)) << tag << " step " << step;
      EXPECT_EQ(per_rank.at(step), AsStored(rank["peak_bytes"].get<double>() / (1 << 20)));
    }
  }
  // The validation loss: at steps 3 and 6 in metrics.jsonl, at step 0 in the log.
  const std::map<int, float> val = Scalars(pp2.events, "val/loss");
  ASSERT_EQ(val.size(), 3u) << pp2.events.dump();
  for (const nlohmann::json& line : pp2.metrics) {
    const int step = line["step"].get<int>();
    EXPECT_EQ(line.contains("val_loss"), step % 3 == 0) << line.dump();
    if (line.contains("val_loss")) {
      EXPECT_EQ(val.at(step), AsStored(line["val_loss"].get<double>()));
    }
  }
  std::smatch initial;
  ASSERT_TRUE(std::regex_search(pp2.result.output, initial,
                                std::regex(R"(\[val\] step 0 \| val_loss ([0-9.]+))")));
  EXPECT_NEAR(val.at(0), std::stod(initial[1]), 5e-5);
  // The effective config as text, and the samples.
  ASSERT_TRUE(pp2.events["text"].contains("config")) << pp2.events.dump();
  EXPECT_EQ(pp2.events["plugins"]["config"], "text");
  testutil::ExpectContains(pp2.events["text"]["config"][0][1].get<std::string>(),
                           "[cfg] world_size=2 pp=2 tp=1 dp=1");
  ASSERT_TRUE(pp2.events["text"].contains("sample"));
  EXPECT_EQ(pp2.events["text"]["sample"].size(), 2u);
  EXPECT_EQ(testutil::CountOccurrences(pp2.result.output, "[sample] step "), 2)
      << pp2.result.output;

  // The loss under pp is the last stage's, not a placeholder: the one-rank run's, bitwise.
  const TrainRun pp1 = Train(1, "pp1");
  ASSERT_EQ(pp1.result.exit_code, 0) << pp1.result.output;
  ASSERT_EQ(pp1.metrics.size(), size_t(kSteps));
  const std::map<int, float> loss = Scalars(pp2.events, "train/loss");
  for (const nlohmann::json& line : pp1.metrics) {
    EXPECT_EQ(loss.at(line["step"].get<int>()), AsStored(line["loss"].get<double>()));
    EXPECT_GT(line["loss"].get<double>(), 1.0);
  }
  // Same samples too: the pipeline's sampling is the one-rank sampling.
  EXPECT_EQ(pp1.events["text"]["sample"], pp2.events["text"]["sample"]);
}

}  // namespace
}  // namespace bigmac
