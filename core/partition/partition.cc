#include "core/partition/partition.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <stdexcept>

namespace bigmac::partition {
namespace {

std::string Join(const std::vector<int>& values, int offset) {
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(values[i] + offset);
  }
  return text + "]";
}

double LayerCost(const PartitionSpec& spec, int layer) {
  return spec.layer_costs.empty() ? 1.0 : spec.layer_costs[layer];
}

// Dynamic programming over split points: best[s][i] is the smallest possible costliest stage when
// the first i blocks go to the first s stages (each at least one block). O(S * L^2).
std::vector<int> BalancedCounts(const PartitionSpec& spec) {
  const int stages = spec.pp * spec.virtual_stages;
  const int n = spec.num_layers;
  std::vector<double> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + LayerCost(spec, i);
  auto cost = [&](int s, int begin, int end) {
    return prefix[end] - prefix[begin] + (s == 0 ? spec.first_stage_extra : 0) +
           (s == stages - 1 ? spec.last_stage_extra : 0);
  };
  const double kInf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(n + 1, kInf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int s = 1; s <= stages; ++s) {
    for (int i = s; i <= n - (stages - s); ++i) {
      for (int j = s - 1; j < i; ++j) {
        const double value = std::max(best[s - 1][j], cost(s - 1, j, i));
        if (value < best[s][i]) {
          best[s][i] = value;
          cut[s][i] = j;
        }
      }
    }
  }
  std::vector<int> counts(stages);
  for (int s = stages, i = n; s > 0; --s) {
    counts[s - 1] = i - cut[s][i];
    i = cut[s][i];
  }
  return counts;
}

// Blocks per stage for the policies that compute it.
std::vector<int> ComputeCounts(const PartitionSpec& spec) {
  const int stages = spec.pp * spec.virtual_stages;
  const int base = spec.num_layers / stages;
  const int rem = spec.num_layers % stages;
  std::vector<int> counts(stages, base);
  switch (spec.policy) {
    case Policy::kSpreadFirst:
      for (int s = 0; s < rem; ++s) ++counts[s];
      break;
    case Policy::kSpreadLast:
      // Seed 1's split points n*i//S; the boundaries fix the counts.
      for (int s = 0; s < stages; ++s) {
        counts[s] = spec.num_layers * (s + 1) / stages - spec.num_layers * s / stages;
      }
      break;
    case Policy::kFirst:
      counts.front() += rem;
      break;
    case Policy::kLast:
      counts.back() += rem;
      break;
    case Policy::kBalanced:
      return BalancedCounts(spec);
    case Policy::kExplicit:
      if (!spec.layers_per_stage.empty()) return spec.layers_per_stage;
      for (int s = 0; s < stages; ++s) {
        const int begin = s == 0 ? 0 : spec.split_points[s - 1];
        const int end = s == stages - 1 ? spec.num_layers : spec.split_points[s];
        counts[s] = end - begin;
      }
      break;
  }
  return counts;
}

}  // namespace

bool ParsePolicy(const std::string& name, Policy* policy) {
  for (Policy candidate : {Policy::kSpreadFirst, Policy::kSpreadLast, Policy::kFirst, Policy::kLast,
                           Policy::kExplicit, Policy::kBalanced}) {
    if (PolicyName(candidate) == name) {
      *policy = candidate;
      return true;
    }
  }
  return false;
}

std::string PolicyName(Policy policy) {
  switch (policy) {
    case Policy::kSpreadFirst:
      return "spread_first";
    case Policy::kSpreadLast:
      return "spread_last";
    case Policy::kFirst:
      return "first";
    case Policy::kLast:
      return "last";
    case Policy::kExplicit:
      return "explicit";
    case Policy::kBalanced:
      return "balanced";
  }
  return "unknown";
}

std::vector<std::string> CheckSpec(const PartitionSpec& spec) {
  std::vector<std::string> problems;
  if (spec.pp < 1 || spec.virtual_stages < 1) {
    problems.push_back("cannot partition into pp_size=" + std::to_string(spec.pp) +
                       " x virtual_stages=" + std::to_string(spec.virtual_stages) +
                       " stages (both must be >= 1)");
    return problems;
  }
  const int stages = spec.pp * spec.virtual_stages;
  const std::string stages_formula = "pp_size*virtual_stages = " + std::to_string(spec.pp) + "*" +
                                     std::to_string(spec.virtual_stages) + " = " +
                                     std::to_string(stages);
  if (spec.origin != 0 && spec.origin != 1) {
    problems.push_back("model.layers_per_stage_origin=" + std::to_string(spec.origin) +
                       " must be 0 or 1 (the number of the first layer)");
  }
  if (spec.num_layers < stages) {
    problems.push_back(
        "model.num_layers=" + std::to_string(spec.num_layers) + " is less than the stage count " +
        stages_formula +
        ": every stage needs at least one layer (rule: num_layers >= pp_size*virtual_stages)");
  }
  const bool has_counts = !spec.layers_per_stage.empty();
  const bool has_splits = !spec.split_points.empty();
  if (spec.policy == Policy::kBalanced && !spec.layer_costs.empty() &&
      static_cast<int>(spec.layer_costs.size()) != spec.num_layers) {
    problems.push_back("model.partition=balanced has " + std::to_string(spec.layer_costs.size()) +
                       " layer costs for model.num_layers=" + std::to_string(spec.num_layers));
  }
  if (spec.policy != Policy::kExplicit) {
    if (has_counts || has_splits) {
      problems.push_back(
          "model.partition=" + PolicyName(spec.policy) + " conflicts with model." +
          (has_counts ? "layers_per_stage" : "split_points") +
          ": an explicit list needs model.partition=explicit (or leave partition unset)");
    }
    return problems;
  }
  if (has_counts == has_splits) {
    problems.push_back(
        std::string("model.partition=explicit needs exactly one of model.layers_per_stage "
                    "and model.split_points; ") +
        (has_counts ? "both are set" : "neither is set"));
    return problems;
  }
  if (has_counts) {
    const std::vector<int>& counts = spec.layers_per_stage;
    const int sum = std::accumulate(counts.begin(), counts.end(), 0);
    if (static_cast<int>(counts.size()) != stages) {
      problems.push_back("model.layers_per_stage=" + Join(counts, 0) + " has " +
                         std::to_string(counts.size()) +
                         " entries but needs one per stage: " + stages_formula);
    }
    if (sum != spec.num_layers) {
      problems.push_back(
          "model.layers_per_stage=" + Join(counts, 0) + " sums to " + std::to_string(sum) +
          " but model.num_layers=" + std::to_string(spec.num_layers) +
          " (rule: sum(layers_per_stage) == num_layers; no layer may be dropped or duplicated)");
    }
    for (size_t s = 0; s < counts.size(); ++s) {
      if (counts[s] <= 0) {
        problems.push_back("model.layers_per_stage=" + Join(counts, 0) + " gives stage " +
                           std::to_string(s) + " " + std::to_string(counts[s]) +
                           " layers (rule: every entry >= 1)");
        break;
      }
    }
    return problems;
  }
  const std::vector<int>& splits = spec.split_points;
  const std::string written = "model.split_points=" + Join(splits, spec.origin);
  if (static_cast<int>(splits.size()) != stages - 1) {
    problems.push_back(written + " has " + std::to_string(splits.size()) +
                       " entries but needs stages-1 = " + std::to_string(stages - 1) +
                       " (stages = " + stages_formula + ")");
  }
  for (size_t i = 0; i < splits.size(); ++i) {
    if (splits[i] < 1 || splits[i] > spec.num_layers - 1) {
      problems.push_back(written + ": " + std::to_string(splits[i] + spec.origin) +
                         " is outside the layer numbers a stage can start at, " +
                         std::to_string(1 + spec.origin) + ".." +
                         std::to_string(spec.num_layers - 1 + spec.origin) +
                         " (num_layers=" + std::to_string(spec.num_layers) +
                         ", origin=" + std::to_string(spec.origin) + ")");
      break;
    }
    if (i > 0 && splits[i] <= splits[i - 1]) {
      problems.push_back(written + " is not strictly increasing at position " + std::to_string(i) +
                         " (" + std::to_string(splits[i - 1] + spec.origin) + " then " +
                         std::to_string(splits[i] + spec.origin) +
                         "): that would leave a stage empty");
      break;
    }
  }
  return problems;
}

Partition MakePartition(const PartitionSpec& spec) {
  if (std::vector<std::string> problems = CheckSpec(spec); !problems.empty()) {
    throw std::invalid_argument(problems.front());
  }
  const std::vector<int> counts = ComputeCounts(spec);
  Partition partition;
  partition.origin = spec.origin;
  int next_layer = 0;
  for (int s = 0; s < static_cast<int>(counts.size()); ++s) {
    StageRange range;
    range.stage = s;
    range.pp_rank = s % spec.pp;
    range.chunk = s / spec.pp;
    range.first_layer = next_layer;
    range.num_layers = counts[s];
    range.has_embedding = s == 0;
    range.has_head = s == static_cast<int>(counts.size()) - 1;
    next_layer += counts[s];
    partition.stages.push_back(range);
  }
  if (next_layer != spec.num_layers) {
    throw std::logic_error("partition covers " + std::to_string(next_layer) + " of " +
                           std::to_string(spec.num_layers) + " layers");
  }
  return partition;
}

std::vector<double> StageCosts(const PartitionSpec& spec, const Partition& partition) {
  std::vector<double> costs;
  for (const StageRange& range : partition.stages) {
    double total = 0;
    for (int layer = range.first_layer; layer < range.end_layer(); ++layer)
      total += LayerCost(spec, layer);
    if (range.has_embedding) total += spec.first_stage_extra;
    if (range.has_head) total += spec.last_stage_extra;
    costs.push_back(total);
  }
  return costs;
}

std::vector<int> Partition::LayersPerStage() const {
  std::vector<int> counts;
  for (const StageRange& range : stages) counts.push_back(range.num_layers);
  return counts;
}

std::vector<int> Partition::SplitPoints() const {
  std::vector<int> splits;
  for (size_t s = 1; s < stages.size(); ++s) splits.push_back(stages[s].first_layer);
  return splits;
}

std::vector<StageRange> Partition::StagesOfRank(int pp_rank) const {
  std::vector<StageRange> mine;
  for (const StageRange& range : stages) {
    if (range.pp_rank == pp_rank) mine.push_back(range);
  }
  return mine;
}

std::string FormatLayerList(const std::vector<int>& layer_ids, int origin) {
  return Join(layer_ids, origin);
}

std::string FormatRange(const StageRange& range, int origin) {
  const int first = range.first_layer + origin;
  const int last = range.end_layer() - 1 + origin;
  std::string text = "layers " + std::to_string(first) + "-" + std::to_string(last) + " (" +
                     std::to_string(range.num_layers) + ")";
  if (range.has_embedding) text += " + embedding";
  if (range.has_head) text += " + head";
  return text;
}

std::string FormatCounts(const std::vector<int>& counts) { return Join(counts, 0); }

}  // namespace bigmac::partition
