#include "core/comm/topology.h"

#include <stdexcept>

namespace bigmac::comm {

Topology::Topology(int world_size, int pp_size, int dp_size, int tp_size)
    : world_size_(world_size), pp_size_(pp_size), dp_size_(dp_size), tp_size_(tp_size) {
  if (pp_size < 1 || dp_size < 1 || tp_size < 1 || world_size != pp_size * dp_size * tp_size) {
    throw std::invalid_argument("topology: world_size=" + std::to_string(world_size) +
                                " != pp*dp*tp = " + std::to_string(pp_size) + "*" +
                                std::to_string(dp_size) + "*" + std::to_string(tp_size));
  }
}

Coords Topology::CoordsOf(int rank) const {
  if (rank < 0 || rank >= world_size_) {
    throw std::out_of_range("rank " + std::to_string(rank) + " outside world of " +
                            std::to_string(world_size_));
  }
  Coords coords;
  coords.tp = rank % tp_size_;
  coords.dp = (rank / tp_size_) % dp_size_;
  coords.pp = rank / (tp_size_ * dp_size_);
  return coords;
}

int Topology::RankOf(const Coords& coords) const {
  return (coords.pp * dp_size_ + coords.dp) * tp_size_ + coords.tp;
}

std::vector<int> Topology::DpGroup(int rank) const {
  Coords coords = CoordsOf(rank);
  std::vector<int> group;
  for (coords.dp = 0; coords.dp < dp_size_; ++coords.dp) group.push_back(RankOf(coords));
  return group;
}

std::vector<int> Topology::PpGroup(int rank) const {
  Coords coords = CoordsOf(rank);
  std::vector<int> group;
  for (coords.pp = 0; coords.pp < pp_size_; ++coords.pp) group.push_back(RankOf(coords));
  return group;
}

std::vector<int> Topology::TpGroup(int rank) const {
  Coords coords = CoordsOf(rank);
  std::vector<int> group;
  for (coords.tp = 0; coords.tp < tp_size_; ++coords.tp) group.push_back(RankOf(coords));
  return group;
}

std::vector<int> Topology::TiedGroup(int rank) const {
  Coords coords = CoordsOf(rank);
  if (coords.pp != 0 && coords.pp != pp_size_ - 1) return {};
  coords.pp = 0;
  std::vector<int> group = {RankOf(coords)};
  if (pp_size_ > 1) {
    coords.pp = pp_size_ - 1;
    group.push_back(RankOf(coords));
  }
  return group;
}

std::string FormatRankLine(const Topology& topology, const partition::Partition& partition,
                           int rank, const std::string& placement) {
  const Coords coords = topology.CoordsOf(rank);
  std::string line = "rank " + std::to_string(rank) + ": pp=" + std::to_string(coords.pp) +
                     " dp=" + std::to_string(coords.dp) + " tp=" + std::to_string(coords.tp);
  if (topology.tp_size() > 1) {
    std::string group;
    for (int member : topology.TpGroup(rank))
      group += (group.empty() ? "" : ",") + std::to_string(member);
    line += " tp_group=[" + group + "]";
  }
  if (!placement.empty()) line += " | " + placement;
  for (const partition::StageRange& range : partition.StagesOfRank(coords.pp)) {
    line += " | stage " + std::to_string(range.stage) + ": " +
            partition::FormatRange(range, partition.origin);
  }
  return line;
}

}  // namespace bigmac::comm
