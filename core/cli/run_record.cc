#include "core/cli/run_record.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <regex>
#include <sstream>

#include "core/util/files.h"
#include "nlohmann/json.hpp"

namespace bigmac::cli {
namespace {

// A short run's metrics are a few KiB.
constexpr uint64_t kMaxMetricsBytes = uint64_t{1} << 30;

}  // namespace

plan::RunRecord ReadRunRecord(const std::string& name, const std::string& dir,
                              const std::string& output, int warmup) {
  plan::RunRecord record;
  record.name = name;
  std::map<int, plan::RankRecord> ranks;
  std::map<int, std::vector<double>> forward, backward, wait, busy;
  // The child run's own output, still read through the checked opener, and bounded.
  const std::string metrics_path = dir + "/metrics.jsonl";
  std::string text;
  if (std::string problem =
          util::ReadUserFile(metrics_path, kMaxMetricsBytes, "metrics file", &text);
      !problem.empty()) {
    std::fprintf(stderr, "bigmac: %s\n", problem.c_str());
  }
  std::istringstream metrics(text);
  int step = 0;
  for (std::string line; std::getline(metrics, line); ++step) {
    const nlohmann::json m = nlohmann::json::parse(line);
    const double loss = m["loss"].get<double>();
    record.loss.push_back(loss);
    if (step >= warmup && !std::isfinite(loss)) ++record.nan_steps;
    if (step >= warmup && m["clipped"].get<bool>()) ++record.clipped_steps;
    record.micro_batch_size = m["micro_batch_size"].get<int>();
    record.num_microbatches = m["num_microbatches"].get<int>();
    if (step < warmup) continue;
    record.step_ms.push_back(m["step_ms"].get<double>());
    for (const auto& r : m["ranks"]) {
      const int rank = r["rank"].get<int>();
      forward[rank].push_back(r["forward_ms"].get<double>());
      backward[rank].push_back(r["backward_ms"].get<double>());
      wait[rank].push_back(r["wait_ms"].get<double>());
      busy[rank].push_back(r["busy_ms"].get<double>());
    }
  }
  for (plan::RankRecord r : ReadMemoryLines(output)) {
    r.forward_ms = plan::Mean(forward[r.rank]);
    r.backward_ms = plan::Mean(backward[r.rank]);
    r.wait_ms = plan::Mean(wait[r.rank]);
    r.busy_ms = plan::Mean(busy[r.rank]);
    record.ranks.push_back(r);
  }
  return record;
}

std::vector<plan::RankRecord> ReadMemoryLines(const std::string& output) {
  const std::regex memory(
      R"(\[memory\] rank (\d+) \(pp (\d+), dp (\d+), stage [^)]*\): peak ([0-9.]+) MiB of ([0-9.]+) MiB capacity, activations peak ([0-9.]+) MiB, .* (\d+) parameters)");
  std::vector<plan::RankRecord> ranks;
  for (auto it = std::sregex_iterator(output.begin(), output.end(), memory);
       it != std::sregex_iterator(); ++it) {
    plan::RankRecord& r = ranks.emplace_back();
    r.rank = std::stoi((*it)[1]);
    r.pp = std::stoi((*it)[2]);
    r.dp = std::stoi((*it)[3]);
    r.peak_mib = std::stod((*it)[4]);
    r.capacity_mib = std::stod((*it)[5]);
    r.activation_mib = std::stod((*it)[6]);
    r.parameter_mib = std::stod((*it)[7]) * 16 / (1024.0 * 1024.0);
  }
  return ranks;
}

}  // namespace bigmac::cli
