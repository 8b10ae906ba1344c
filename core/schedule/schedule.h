#ifndef BIGMAC_CORE_SCHEDULE_SCHEDULE_H_
#define BIGMAC_CORE_SCHEDULE_SCHEDULE_H_

#include <stdexcept>
#include <string>
#include <vector>

#include "core/schedule/constraints.h"

namespace bigmac::schedule {

// One instruction of a rank's list. Schedules are data: printed, simulated, tested and run by the
// same executor.
enum class Op {
  kForward,         // run a stage's layers forward for one micro-batch
  kBackward,        // BackwardInput then BackwardWeight
  kBackwardInput,   // input gradients only (zb_h1; a stage that sends them,
                    // send_grad_before_weights)
  kBackwardWeight,  // the weight gradients, after BackwardInput
  kSendAct,         // activation to the next stage
  kRecvAct,         // activation from the previous stage
  kSendGrad,        // input gradient to the previous stage
  kRecvGrad,        // output gradient from the next stage
  kReduceTied,      // tied-weight gradient: consumer -> owner
  kReduceDp,        // all-reduce gradients over the data-parallel group
  kOptimizerStep,   // clip, step, send the tied weight back to its consumer
};

// Everything known about an Op, in one table (schedule.cc): the printers, the parser, the
// simulator and the executor read it instead of switching on the Op.
struct OpInfo {
  Op op;
  const char* name;        // "Forward": logs, errors, trace categories
  const char* short_name;  // "F": ShortName, ParseAction
  const char* category;    // the timeline's span category: forward, backward, backward_input,
                           // backward_weight, wait, send, tied, allreduce, optimizer
  const char* grid_label;  // FormatGrid's cell ("F", "B", "b", "W"); "" for what does not compute
  bool computes;           // runs layers: busy time in the simulator, a cell in the grid
  bool per_step;           // once per optimizer step, after the last flush (BuildStepTail)
  char peer;               // '>' sends to the peer, '<' receives from it, 0: no peer
};

// One row per Op, in the enum's order.
const std::vector<OpInfo>& OpTable();
const OpInfo& Info(Op op);
std::string OpName(Op op);

struct Action {
  Op op;
  int microbatch = -1;  // -1 for the per-step actions
  int stage = -1;       // global stage index (pp * virtual_stages stages)
  int peer = -1;        // pp rank on the other end of a send/receive
  bool operator==(const Action&) const = default;
};

// "F3@s1", "RecvAct3@s1<r0", "SendGrad3@s1>r0", "OptimizerStep": short form for grids, errors
// and tests.
std::string ShortName(const Action& action);

// The exact inverse of ShortName: ParseAction(ShortName(a)) == a, and ShortName(ParseAction(t))
// == t. Throws std::invalid_argument naming the text and what is wrong with it.
Action ParseAction(const std::string& text);
// Actions separated by white space: "F0@s0 SendAct0@s0>r1 OptimizerStep". Throws
// std::invalid_argument naming the position of the first bad one.
std::vector<Action> ParseActions(const std::string& text);

struct ScheduleSpec {
  Kind kind = Kind::k1F1B;
  int pp = 1;
  int microbatches = 1;    // per pipeline flush
  int virtual_stages = 1;  // chunks per rank (interleaved only)
  // A Backward whose input gradient goes to an earlier stage runs as BackwardInput, SendGrad,
  // BackwardWeight, so that the earlier stage does not wait for this one's weight gradients: the
  // drain shortens by pp - 1 weight gradients (1F1B at pp = 2 with 8 micro-batches: 27 -> 26
  // units of F). The same gradients in the same order. False keeps Backward whole, as activation
  // checkpointing needs: split, the stage would hold every recomputed layer until the weights.
  bool send_grad_before_weights = true;
};

// The actions of pp rank `rank` for one pipeline flush (no per-step action). Stage s lives on rank
// s % pp. Sends and receives are placed right after the computation that produces them and right
// before the one that needs them. Callers have checked CheckScheduleConstraints.
std::vector<Action> BuildRankActions(const ScheduleSpec& spec, int rank);

// The per-step tail of pp rank `rank`, run once after the step's last flush: ReduceTied, ReduceDp,
// OptimizerStep.
std::vector<Action> BuildStepTail(const ScheduleSpec& spec, int rank);

// Evaluation: micro-batch `microbatch` forward through the stages of pp rank `rank` in model order
// (every virtual stage), with the RecvAct and SendAct around each Forward.
std::vector<Action> BuildForwardOnlyActions(const ScheduleSpec& spec, int rank, int microbatch = 0);

// Every rank's list for one flush (BuildRankActions).
std::vector<std::vector<Action>> BuildAllActions(const ScheduleSpec& spec);

// A deliberately wrong list, for the fault-injection hook BIGMAC_TEST_MISMATCH_SCHEDULE
// (docs/exit_codes.md): `actions` (one rank's flush) with its first RecvGrad moved to the front,
// so that it waits for the gradient of a micro-batch whose activation it has not sent yet: a
// cycle with the next stage under every schedule. The last stage receives no gradient; its first
// SendGrad moves to the end instead, so that the previous stage waits for that gradient while
// this one waits for an activation the previous stage sends only after it (a cycle when the
// previous stage needs the gradient before it has sent every activation: 1F1B with 3 or more
// micro-batches). Unchanged without either (one stage). Simulate finds the deadlock.
std::vector<Action> MismatchForTesting(std::vector<Action> actions);

}  // namespace bigmac::schedule

#endif  // BIGMAC_CORE_SCHEDULE_SCHEDULE_H_
