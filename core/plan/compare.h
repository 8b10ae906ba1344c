#ifndef BIGMAC_CORE_PLAN_COMPARE_H_
#define BIGMAC_CORE_PLAN_COMPARE_H_

#include <string>
#include <vector>

namespace bigmac::plan {

// What one short run recorded (metrics.jsonl and the [memory] lines), warm-up steps removed.
struct RankRecord {
  int rank = 0;
  int pp = 0;
  int dp = 0;
  double peak_mib = 0;
  double capacity_mib = 0;
  double activation_mib = 0;
  double parameter_mib = 0;  // parameters x 16 B (value, gradient, Adam moments)
  double forward_ms = 0;     // mean per step
  double backward_ms = 0;
  double wait_ms = 0;
  // The computations' cost per step: the rank's thread's CPU time in forward and backward on the
  // CPU, the device's time on a GPU. Unlike forward_ms + backward_ms (wall clock) it does not grow
  // while the rank waits for a core it shares.
  double busy_ms = 0;
};

struct RunRecord {
  std::string name;
  std::vector<double> step_ms;  // after warm-up
  std::vector<double> loss;     // every step, warm-up included (the loss comparison starts at 1)
  int nan_steps = 0;
  int clipped_steps = 0;
  int micro_batch_size = 0;
  int num_microbatches = 0;
  std::vector<RankRecord> ranks;
};

// The seed's three conditions, each with its threshold stated in `rule`.
struct Check {
  std::string name;
  bool pass = false;
  std::string rule;
  std::string detail;
};

struct Verdict {
  std::vector<Check> checks;
  bool feasible = false;   // all three pass
  std::string bottleneck;  // the stage that sets the pace and why, with a suggested fix
};

inline constexpr double kMemoryThreshold = 0.90;  // of capacity
inline constexpr double kTrendThreshold = 0.10;   // step-time drift over the run, of the mean
inline constexpr double kLossTolerance = 0.02;    // relative, per step
inline constexpr int kLossSteps = 10;             // the first steps compared

// Judges `candidate` against `baseline`: memory below 90% of capacity on every rank; step time
// without an upward trend (least-squares slope x steps below 10% of the mean); the loss within 2%
// of the baseline's over the first 10 steps. Names the bottleneck stage, whether it is bound by
// parameters or activations (seed 2), and a fix.
Verdict Judge(const RunRecord& baseline, const RunRecord& candidate,
              const std::string& candidate_policy);

double Mean(const std::vector<double>& values);
// Least-squares slope per step.
double Slope(const std::vector<double>& values);

}  // namespace bigmac::plan

#endif  // BIGMAC_CORE_PLAN_COMPARE_H_
