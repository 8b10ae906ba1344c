#ifndef BIGMAC_CORE_METRICS_STRAGGLERS_H_
#define BIGMAC_CORE_METRICS_STRAGGLERS_H_

// Which rank makes the job slow (docs/launch.md, "Stragglers"). Every rank's compute time for a
// logging interval (its forward and backward computations, not its waits), gathered on rank 0 by
// the per-step record the step already gathers, is set against its peers': the ranks doing the
// same work, i.e. the same pipeline rank in the other dp replicas and tp ranks. Without such peers
// (dp = tp = 1) each rank's time per unit of predicted work (its layers' FLOPs) is set against the
// other pipeline ranks'. Pure functions: no communication, no clock.

#include <string>
#include <vector>

namespace bigmac::metrics {

// One rank's interval.
struct RankCompute {
  int rank = 0;
  int pp_rank = 0;
  std::string host;
  double compute_ms = 0;  // computing, summed over the interval
  double work = 0;        // predicted work of one step, any unit shared by all ranks (> 0)
};

struct Straggler {
  int rank = 0;
  std::string host;
  double ratio = 0;   // its compute time over its peers' median (per unit of work across stages)
  std::string peers;  // "its 3 peers of pp rank 1", "the other 3 pipeline ranks per predicted FLOP"
};

struct ComputeSpread {
  double median_ms = 0;  // over every rank
  int slowest_rank = -1;
  std::string slowest_host;
  double slowest_ms = 0;
  double ratio = 0;                   // slowest over median
  std::vector<Straggler> stragglers;  // rank order
};

// A rank is named only when it is also this much slower than its peers' median in absolute terms
// (per step): a model whose computations take a few milliseconds varies by more than 1.2x from
// step to step on any machine, and that is no straggler.
inline constexpr double kMinStragglerGapMs = 10;

// The spread of `ranks` (every rank of the world, any order) and the ranks more than `threshold`
// times, and kMinStragglerGapMs, slower than their peers' median. Fewer than two ranks: no
// stragglers.
ComputeSpread AnalyzeCompute(const std::vector<RankCompute>& ranks, double threshold);

// "[straggler] rank 3 (hostB): 1.85x the median compute time of its 3 peers of pp rank 1".
std::string FormatStraggler(const Straggler& straggler);

}  // namespace bigmac::metrics

#endif  // BIGMAC_CORE_METRICS_STRAGGLERS_H_
