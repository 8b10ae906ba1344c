#include "core/schedule/constraints.h"

namespace bigmac::schedule {

bool ParseKind(const std::string& name, Kind* kind) {
  for (Kind candidate : {Kind::kGpipe, Kind::k1F1B, Kind::kInterleaved1F1B, Kind::kZeroBubbleH1}) {
    if (KindName(candidate) == name) {
      *kind = candidate;
      return true;
    }
  }
  return false;
}

std::string KindName(Kind kind) {
  switch (kind) {
    case Kind::kGpipe:
      return "gpipe";
    case Kind::k1F1B:
      return "1f1b";
    case Kind::kInterleaved1F1B:
      return "interleaved_1f1b";
    case Kind::kZeroBubbleH1:
      return "zb_h1";
  }
  return "unknown";
}

std::vector<std::string> CheckScheduleConstraints(Kind kind, int pp, int virtual_stages,
                                                  int num_microbatches) {
  std::vector<std::string> problems;
  const std::string name = "parallel.schedule=" + KindName(kind);
  const std::string m = "parallel.num_microbatches=" + std::to_string(num_microbatches);
  const std::string p = "parallel.pp_size=" + std::to_string(pp);
  const std::string v = "parallel.virtual_stages=" + std::to_string(virtual_stages);
  if (kind == Kind::kInterleaved1F1B && virtual_stages < 2) {
    problems.push_back(name + " needs " + v +
                       " >= 2 (model chunks per rank; with 1 it is plain 1f1b)");
  }
  if (kind != Kind::kInterleaved1F1B && virtual_stages != 1) {
    problems.push_back(v + " is only used by parallel.schedule=interleaved_1f1b, but " + name +
                       " (rule: virtual_stages == 1 unless interleaved)");
  }
  // One-forward-one-backward schedules warm up with pp micro-batches in flight; with fewer they
  // degenerate and the steady state never starts.
  if (kind != Kind::kGpipe && num_microbatches < pp) {
    problems.push_back(name + " needs " + m + " >= " + p + " (rule: num_microbatches >= pp_size)");
  }
  // Interleaving walks micro-batches in groups of pp (as in Megatron-LM).
  if (kind == Kind::kInterleaved1F1B && pp > 0 && num_microbatches % pp != 0) {
    problems.push_back(name + " needs " + m + " to be a multiple of " + p +
                       " (rule: num_microbatches % pp_size == 0, " +
                       std::to_string(num_microbatches) + " % " + std::to_string(pp) + " = " +
                       std::to_string(num_microbatches % pp) + ")");
  }
  return problems;
}

}  // namespace bigmac::schedule
