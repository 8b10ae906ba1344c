#include "core/metrics/stragglers.h"

#include <algorithm>
#include <cstdio>
#include <map>

namespace bigmac::metrics {
namespace {

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t half = values.size() / 2;
  return values.size() % 2 ? values[half] : (values[half - 1] + values[half]) / 2;
}

}  // namespace

ComputeSpread AnalyzeCompute(const std::vector<RankCompute>& ranks, double threshold) {
  ComputeSpread spread;
  if (ranks.empty()) return spread;
  std::vector<double> all;
  for (const RankCompute& r : ranks) all.push_back(r.compute_ms);
  spread.median_ms = Median(all);
  const RankCompute* slowest = &ranks.front();
  for (const RankCompute& r : ranks) {
    if (r.compute_ms > slowest->compute_ms ||
        (r.compute_ms == slowest->compute_ms && r.rank < slowest->rank))
      slowest = &r;
  }
  spread.slowest_rank = slowest->rank;
  spread.slowest_host = slowest->host;
  spread.slowest_ms = slowest->compute_ms;
  spread.ratio = spread.median_ms > 0 ? slowest->compute_ms / spread.median_ms : 0;
  if (ranks.size() < 2) return spread;

  std::map<int, std::vector<const RankCompute*>> by_stage;
  for (const RankCompute& r : ranks) by_stage[r.pp_rank].push_back(&r);
  const bool have_peers = by_stage.begin()->second.size() > 1;
  for (const RankCompute& r : ranks) {
    std::vector<double> others;
    double own = r.compute_ms;
    std::string peers;
    if (have_peers) {
      for (const RankCompute* peer : by_stage[r.pp_rank])
        if (peer != &r) others.push_back(peer->compute_ms);
      peers = "its " + std::to_string(others.size()) + " peer" + (others.size() > 1 ? "s" : "") +
              " of pp rank " + std::to_string(r.pp_rank);
    } else {
      if (r.work <= 0) continue;
      own = r.compute_ms / r.work;
      for (const RankCompute& other : ranks)
        if (&other != &r && other.work > 0) others.push_back(other.compute_ms / other.work);
      peers = "the other " + std::to_string(others.size()) + " pipeline rank" +
              (others.size() > 1 ? "s" : "") + ", per unit of predicted work";
    }
    const double median = Median(others);
    if (others.empty() || median <= 0) continue;
    const double ratio = own / median;
    const double gap_ms = r.compute_ms - r.compute_ms / ratio;  // over what its peers' pace gives
    if (ratio > threshold && gap_ms >= kMinStragglerGapMs)
      spread.stragglers.push_back({r.rank, r.host, ratio, peers});
  }
  std::sort(spread.stragglers.begin(), spread.stragglers.end(),
            [](const Straggler& a, const Straggler& b) { return a.rank < b.rank; });
  return spread;
}

std::string FormatStraggler(const Straggler& straggler) {
  char ratio[32];
  std::snprintf(ratio, sizeof(ratio), "%.2fx", straggler.ratio);
  return "[straggler] rank " + std::to_string(straggler.rank) + " (" + straggler.host +
         "): " + ratio + " the median compute time of " + straggler.peers;
}

}  // namespace bigmac::metrics
