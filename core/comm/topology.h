#ifndef BIGMAC_CORE_COMM_TOPOLOGY_H_
#define BIGMAC_CORE_COMM_TOPOLOGY_H_

#include <string>
#include <vector>

#include "core/partition/partition.h"

namespace bigmac::comm {

// A rank's place in the 3-D grid.
struct Coords {
  int pp = 0;
  int dp = 0;
  int tp = 0;
  bool operator==(const Coords&) const = default;
};

// Rank order (documented in docs/topology.md): tp varies fastest, then dp, then pp, so
// rank = (pp * dp_size + dp) * tp_size + tp. Tensor-parallel peers are neighbours (same node),
// and each pipeline stage is a contiguous block of dp_size*tp_size ranks.
class Topology {
 public:
  // Requires world_size == pp_size * dp_size * tp_size; throws std::invalid_argument otherwise.
  Topology(int world_size, int pp_size, int dp_size, int tp_size);

  int world_size() const { return world_size_; }
  int pp_size() const { return pp_size_; }
  int dp_size() const { return dp_size_; }
  int tp_size() const { return tp_size_; }

  Coords CoordsOf(int rank) const;
  int RankOf(const Coords& coords) const;

  // The ranks of each group `rank` belongs to, in ascending order.
  std::vector<int> DpGroup(int rank) const;  // same pp and tp: gradients are all-reduced here
  std::vector<int> PpGroup(int rank) const;  // same dp and tp: one pipeline
  std::vector<int> TpGroup(int rank) const;  // same pp and dp
  // First and last pipeline stage of `rank`'s pipeline (one rank when pp_size == 1): the tied
  // embedding/head weight is exchanged here. Ranks in the middle stages get an empty list.
  std::vector<int> TiedGroup(int rank) const;

 private:
  int world_size_;
  int pp_size_;
  int dp_size_;
  int tp_size_;
};

// "rank 5: pp=2 dp=1 tp=0 | <placement> | stage 2: layers 14-20 (7)" for `rank`; with
// tp_size > 1 the tp coordinate is followed by the rank's tp group, "tp=1 tp_group=[2,3]".
std::string FormatRankLine(const Topology& topology, const partition::Partition& partition,
                           int rank, const std::string& placement);

}  // namespace bigmac::comm

#endif  // BIGMAC_CORE_COMM_TOPOLOGY_H_
