#ifndef BIGMAC_CORE_SCHEDULE_SCHEDULE_H_
#define BIGMAC_CORE_SCHEDULE_SCHEDULE_H_

#include <string>
#include <vector>

#include "core/schedule/constraints.h"

namespace bigmac::schedule {

// One instruction of a rank's list. Schedules are data: printed, simulated, tested and run by the
// same executor.
enum class Op {
  kForward,         // run a stage's layers forward for one micro-batch
  kBackward,        // BackwardInput then BackwardWeight
  kBackwardInput,   // input gradients only (zero-bubble)
  kBackwardWeight,  // the deferred weight gradients (zero-bubble)
  kSendAct,         // activation to the next stage
  kRecvAct,         // activation from the previous stage
  kSendGrad,        // input gradient to the previous stage
  kRecvGrad,        // output gradient from the next stage
  kReduceTied,      // tied-weight gradient: consumer -> owner
  kReduceDp,        // all-reduce gradients over the data-parallel group
  kOptimizerStep,   // clip, step, send the tied weight back to its consumer
};

std::string OpName(Op op);

struct Action {
  Op op;
  int microbatch = -1;  // -1 for the per-step actions
  int stage = -1;       // global stage index (pp * virtual_stages stages)
  int peer = -1;        // pp rank on the other end of a send/receive
  bool operator==(const Action&) const = default;
};

// "F3@s1", "RecvAct3@s1<r0", ...: short form for grids and errors.
std::string ShortName(const Action& action);

struct ScheduleSpec {
  Kind kind = Kind::k1F1B;
  int pp = 1;
  int microbatches = 1;    // per pipeline flush
  int virtual_stages = 1;  // chunks per rank (interleaved only)
};

// The actions of pp rank `rank` for one pipeline flush, ending with ReduceTied, ReduceDp and
// OptimizerStep. Stage s lives on rank s % pp. Sends and receives are placed right after the
// computation that produces them and right before the one that needs them.
// Callers have checked CheckScheduleConstraints.
std::vector<Action> BuildRankActions(const ScheduleSpec& spec, int rank);

// Every rank's list.
std::vector<std::vector<Action>> BuildAllActions(const ScheduleSpec& spec);

}  // namespace bigmac::schedule

#endif  // BIGMAC_CORE_SCHEDULE_SCHEDULE_H_
