#include "core/plan/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/util/format.h"

namespace bigmac::plan {
using util::Format;

double Mean(const std::vector<double>& values) {
  if (values.empty()) return 0;
  double sum = 0;
  for (double v : values) sum += v;
  return sum / values.size();
}

double Slope(const std::vector<double>& values) {
  const int n = static_cast<int>(values.size());
  if (n < 2) return 0;
  const double mean_x = (n - 1) / 2.0;
  const double mean_y = Mean(values);
  double num = 0, den = 0;
  for (int i = 0; i < n; ++i) {
    num += (i - mean_x) * (values[i] - mean_y);
    den += (i - mean_x) * (i - mean_x);
  }
  return num / den;
}

Verdict Judge(const RunRecord& baseline, const RunRecord& candidate,
              const std::string& candidate_policy) {
  Verdict verdict;
  // 1. Memory.
  Check memory{"memory", true,
               Format("every rank's peak below %.0f%% of its capacity", kMemoryThreshold * 100),
               ""};
  double worst = 0;
  int worst_rank = -1;
  for (const RankRecord& r : candidate.ranks) {
    const double share = r.capacity_mib > 0 ? r.peak_mib / r.capacity_mib : 0;
    if (share > worst) {
      worst = share;
      worst_rank = r.rank;
    }
  }
  memory.pass = worst < kMemoryThreshold;
  memory.detail = worst_rank < 0 ? "no memory records"
                                 : Format("highest: rank %d at %.1f%%", worst_rank, worst * 100);
  if (worst_rank < 0) memory.pass = false;
  // 2. Step time stability.
  Check stable{"step time", true,
               Format("least-squares drift (slope x steps) under %.0f%% of the mean step time",
                      kTrendThreshold * 100),
               ""};
  const double mean = Mean(candidate.step_ms);
  const double drift = Slope(candidate.step_ms) * candidate.step_ms.size();
  stable.pass = candidate.step_ms.size() >= 2 && mean > 0 && drift < kTrendThreshold * mean;
  stable.detail = candidate.step_ms.size() < 2
                      ? "fewer than 2 steps after warm-up"
                      : Format("drift %+.1f ms over %zu steps, mean %.1f ms (%+.1f%%)", drift,
                               candidate.step_ms.size(), mean, 100 * drift / std::max(mean, 1e-9));
  // 3. Loss follows the baseline.
  Check loss{"loss", true,
             Format("within %.0f%% of the baseline at each of the first %d steps, no NaN",
                    kLossTolerance * 100, kLossSteps),
             ""};
  double worst_diff = 0;
  int worst_step = 1;
  const size_t n = std::min({baseline.loss.size(), candidate.loss.size(), size_t(kLossSteps)});
  for (size_t i = 0; i < n; ++i) {
    const double diff = std::fabs(candidate.loss[i] - baseline.loss[i]) /
                        std::max(1e-12, std::fabs(baseline.loss[i]));
    if (!std::isfinite(diff) || diff > worst_diff) {
      worst_diff = std::isfinite(diff) ? diff : INFINITY;
      worst_step = static_cast<int>(i) + 1;
    }
  }
  loss.pass = n > 0 && worst_diff <= kLossTolerance && candidate.nan_steps == 0;
  loss.detail = Format("largest difference %.3g%% at step %d; %d NaN step(s)", worst_diff * 100,
                       worst_step, candidate.nan_steps);
  verdict.checks = {memory, stable, loss};
  verdict.feasible = memory.pass && stable.pass && loss.pass;

  // Bottleneck: the pipeline rank (first replica) with the most compute per step.
  const RankRecord* slowest = nullptr;
  double total_compute = 0;
  int stages = 0;
  for (const RankRecord& r : candidate.ranks) {
    if (r.dp != 0) continue;  // one replica is enough
    ++stages;
    total_compute += r.busy_ms;
    if (!slowest || r.busy_ms > slowest->busy_ms) slowest = &r;
  }
  if (slowest && stages > 1) {
    const double mean_compute = total_compute / stages;
    const double ratio = slowest->busy_ms / std::max(mean_compute, 1e-9);
    // Seed 2: parameter shares that differ a lot across stages while the peaks stay close mean the
    // activations are the limit; so does a bottleneck whose activations outweigh its parameters.
    double param_lo = 1e300, param_hi = 0, peak_lo = 1e300, peak_hi = 0;
    for (const RankRecord& r : candidate.ranks) {
      if (r.dp != 0) continue;
      param_lo = std::min(param_lo, r.parameter_mib);
      param_hi = std::max(param_hi, r.parameter_mib);
      peak_lo = std::min(peak_lo, r.peak_mib);
      peak_hi = std::max(peak_hi, r.peak_mib);
    }
    const bool shares_differ_peaks_do_not =
        param_lo > 0 && peak_lo > 0 && param_hi / param_lo > 1.3 && peak_hi / peak_lo < 1.15;
    const bool activation_bound =
        shares_differ_peaks_do_not || slowest->activation_mib > slowest->parameter_mib;
    std::string fix;
    if (activation_bound) {
      fix =
          "lower train.micro_batch_size or turn on train.activation_checkpointing (seed 2: when "
          "parameter "
          "shares differ but peaks do not, activations are the limit)";
    } else if (slowest->pp == 0) {
      fix =
          "move the remainder to the other end (model.partition=spread_last or last) or use "
          "balanced";
    } else if (slowest->pp == stages - 1) {
      fix =
          "move the remainder to the first stage (model.partition=spread_first or first) or use "
          "balanced";
    } else {
      fix = "use model.partition=balanced";
    }
    if (candidate_policy == "balanced" && !activation_bound)
      fix = "more stages, or a smaller micro-batch";
    verdict.bottleneck = Format(
        "pp rank %d (world rank %d) is busy %.1f ms per step (CPU or device time), %.2fx the mean; "
        "it is bound by %s "
        "(activations %.1f MiB vs parameters %.1f MiB); suggestion: %s",
        slowest->pp, slowest->rank, slowest->busy_ms, ratio,
        activation_bound ? "activations" : "parameters", slowest->activation_mib,
        slowest->parameter_mib, fix.c_str());
  } else {
    verdict.bottleneck = "one stage: no pipeline imbalance to diagnose";
  }
  return verdict;
}

}  // namespace bigmac::plan
