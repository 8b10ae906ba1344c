#ifndef BIGMAC_CORE_PLAN_PLAN_H_
#define BIGMAC_CORE_PLAN_PLAN_H_

#include <string>
#include <vector>

#include "core/config/resolve.h"
#include "core/partition/partition.h"
#include "core/plan/compare.h"

namespace bigmac::plan {

// Forward and backward milliseconds of one micro-batch through each kind of layer.
struct LayerTimes {
  double embedding_forward = 0, embedding_backward = 0;
  double block_forward = 0, block_backward = 0;
  double head_forward = 0, head_backward = 0;
  std::string source;  // "estimated at N GFLOP/s" or "measured on this machine"
};

// From the cost model's FLOPs at `gflops` per rank.
LayerTimes EstimateLayerTimes(const config::ResolvedConfig& config, double gflops);
// Times each kind of layer on this machine (CPU backend, the config's micro-batch): a warm-up,
// then the mean of `repeats` runs of forward and backward.
LayerTimes MeasureLayerTimes(const config::ResolvedConfig& config, int repeats = 3);

// One stage of a planned layout.
struct StagePlan {
  partition::StageRange range;
  int64_t parameters = 0;
  std::string notes;          // "embedding (owns tied wte)", "head (tied copy of wte)"
  double activation_mib = 0;  // per micro-batch
  int in_flight = 0;          // micro-batches held at once under the schedule (its rank)
  // Two fp32 AdamW moments per parameter on each rank: replicated, and sharded by ZeRO-1 over dp
  // (parallel.zero_stage=1: 1/dp of them, docs/zero.md).
  double optimizer_mib = 0;
  double optimizer_zero_mib = 0;
  // Host memory of an asynchronous checkpoint's snapshot on the rank that writes the most: the
  // value and two moments (12 B) of every parameter of the stage, whole (tp rank 0 gathers the tp
  // slices); replicas split the layers (docs/checkpoint.md). An upper bound.
  double checkpoint_snapshot_mib = 0;
  // parameters x 8 B (value, gradient) + the optimizer state as configured + the activations
  // (and, where the backward is split, what waits for the weight gradients) the stage holds at
  // its rank's simulated peak
  double total_mib = 0;
  double forward_ms = 0;
  double backward_ms = 0;
  double tp_allreduce_mib = 0;  // per optimizer step, per rank of the stage (0 at tp = 1)
};

struct PolicyPlan {
  std::string policy;
  bool valid = true;
  std::string problem;
  std::vector<StagePlan> stages;
  double step_ms = 0;  // simulated with the stages' own times, all flushes of one step
  double bubble = 0;   // idle share of the pipeline in the simulation
};

// Every partition policy (and the config's explicit lists, if any) for the config's layout.
std::vector<PolicyPlan> PlanPolicies(const config::ResolvedConfig& config, const LayerTimes& times);

// The stage tables side by side (one block per policy) and the recommendation.
std::vector<std::string> FormatPlans(const config::ResolvedConfig& config,
                                     const std::vector<PolicyPlan>& plans, const LayerTimes& times);

// One pipeline rank's predicted peak memory (its stages' total MiB in `plan`'s table) against the
// peak a short run measured on it (the allocator's, the largest over the rank's dp and tp
// replicas): what `plan --check` prints.
struct MemoryCheck {
  int pp_rank = 0;
  double predicted_mib = 0;
  double measured_mib = 0;
  double error() const { return measured_mib > 0 ? predicted_mib / measured_mib - 1 : 0; }
};
std::vector<MemoryCheck> CheckMemory(const PolicyPlan& plan, const std::vector<RankRecord>& ranks);
// The table and a verdict line: every rank within `tolerance` (0.10: 10%) of its measured peak.
std::vector<std::string> FormatMemoryChecks(const std::vector<MemoryCheck>& checks,
                                            const std::string& policy, double tolerance);

}  // namespace bigmac::plan

#endif  // BIGMAC_CORE_PLAN_PLAN_H_
