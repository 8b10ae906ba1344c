#ifndef BIGMAC_CORE_PARTITION_PARTITION_H_
#define BIGMAC_CORE_PARTITION_PARTITION_H_

#include <string>
#include <vector>

namespace bigmac::partition {

// How blocks are spread over stages when the stage count does not divide the block count.
enum class Policy {
  kSpreadFirst,  // the first `rem` stages take one extra block (seed 2: 27 on 4 -> [7,7,7,6])
  kSpreadLast,   // split points n*i/S (seed 1: 27 on 4 -> [6,13,20], i.e. [6,7,7,7])
  kFirst,        // the first stage takes the whole remainder
  kLast,         // the last stage takes the whole remainder
  kExplicit,     // layers_per_stage or split_points, as written
  kBalanced,     // contiguous ranges that minimise the costliest stage (from per-layer costs)
};

// Parses "spread_first", ...; returns false for anything else.
bool ParsePolicy(const std::string& name, Policy* policy);
std::string PolicyName(Policy policy);

struct PartitionSpec {
  int num_layers = 0;      // transformer blocks, layer_id 0..num_layers-1
  int pp = 1;              // pipeline ranks
  int virtual_stages = 1;  // model chunks per rank
  Policy policy = Policy::kSpreadFirst;
  std::vector<int> layers_per_stage;  // kExplicit: blocks per stage
  std::vector<int> split_points;      // kExplicit: first layer_id (0-based) of stages 1..S-1
  int origin = 0;                     // 0 or 1: how layer numbers are printed (never stored)
  // kBalanced: the cost of each block (empty: all equal), plus what the first stage (embedding)
  // and the last stage (head) carry besides their blocks.
  std::vector<double> layer_costs;
  double first_stage_extra = 0;
  double last_stage_extra = 0;
};

// One stage: a contiguous range of blocks hosted by one pipeline rank.
struct StageRange {
  int stage = 0;        // 0..S-1 in model order (S = pp * virtual_stages)
  int pp_rank = 0;      // stage % pp: interleaved chunks go round-robin over ranks
  int chunk = 0;        // stage / pp: which of this rank's virtual stages
  int first_layer = 0;  // layer_id (0-based)
  int num_layers = 0;
  bool has_embedding = false;  // stage 0 owns the embedding (and the tied weight)
  bool has_head = false;       // the last stage holds the final norm and the head
  int end_layer() const { return first_layer + num_layers; }  // exclusive
};

struct Partition {
  std::vector<StageRange> stages;  // in model order
  int origin = 0;

  std::vector<int> LayersPerStage() const;
  std::vector<int> SplitPoints() const;  // 0-based layer_ids
  std::vector<StageRange> StagesOfRank(int pp_rank) const;
};

// Problems with `spec`, each naming the model.* field, its value and the rule. Empty: valid.
// Messages print layer numbers in `spec.origin`.
std::vector<std::string> CheckSpec(const PartitionSpec& spec);

// The cost of every stage of `partition` under the costs in `spec` (kBalanced's objective).
std::vector<double> StageCosts(const PartitionSpec& spec, const Partition& partition);

// The single partition function: every tool and the trainer call it. Throws std::invalid_argument
// with the CheckSpec problems if `spec` is invalid. Covers every layer_id exactly once.
Partition MakePartition(const PartitionSpec& spec);

// "[7, 14, 21]" with `origin` added to each layer number.
std::string FormatLayerList(const std::vector<int>& layer_ids, int origin);
// "layers 7-13 (7)", in `origin`.
std::string FormatRange(const StageRange& range, int origin);
std::string FormatCounts(const std::vector<int>& counts);

}  // namespace bigmac::partition

#endif  // BIGMAC_CORE_PARTITION_PARTITION_H_
