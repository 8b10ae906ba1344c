#ifndef BIGMAC_CORE_SCHEDULE_SIMULATOR_H_
#define BIGMAC_CORE_SCHEDULE_SIMULATOR_H_

#include <ostream>
#include <string>
#include <vector>

#include "core/schedule/schedule.h"

namespace bigmac::schedule {

// Durations of one stage's computation for one micro-batch. Interleaved chunks hold 1/v of a
// rank's layers, so the simulator divides compute costs by virtual_stages.
struct Costs {
  double forward = 1;
  double backward = 2;        // input + weight gradients
  double backward_input = 1;  // the split backward (zb_h1, send_grad_before_weights)
  double backward_weight = 1;
  double transfer = 0;  // send -> matching receive
  // Optional per-stage durations (indexed by global stage), overriding the uniform ones above:
  // a forward and a full backward of one micro-batch through that stage. A split backward gives
  // each half.
  std::vector<double> stage_forward;
  std::vector<double> stage_backward;
  // Optional bytes each (micro-batch, stage) holds, by global stage: from its forward to its
  // backward (activation), and from a split backward's BackwardInput to its BackwardWeight
  // (deferred). Given, the simulation reports each rank's peak of their sum.
  std::vector<double> stage_activation_bytes;
  std::vector<double> stage_deferred_bytes;
  // Optional, by global stage: the most a stage holds at once during a micro-batch's fused
  // backward, and during its BackwardInput, above what it held before (its layers' temporaries
  // and gradients; LayerCost::backward_peak_bytes). Counted toward the peak while it runs.
  std::vector<double> stage_backward_peak_bytes;
  std::vector<double> stage_backward_input_peak_bytes;
};

struct SimEvent {
  int rank = 0;
  Action action;
  double start = 0;
  double end = 0;
};

struct SimResult {
  bool deadlock = false;
  std::string problem;             // deadlock or unmatched messages: who waits on what
  double makespan = 0;             // end of the last computation
  std::vector<double> busy;        // computation time per rank
  double bubble_fraction = 0;      // idle share of p * makespan
  std::vector<int> max_in_flight;  // per rank: most micro-batch stages holding activations at once
  // With Costs' bytes: per rank, the most bytes its micro-batch stages held at once; and per
  // global stage, what that stage held at its rank's peak (a rank's stages sum to its peak).
  std::vector<double> peak_bytes;
  std::vector<double> stage_bytes_at_peak;
  std::vector<SimEvent> events;  // computations and transfers, in execution order per rank
};

// Runs every rank's list (one flush, BuildAllActions; or BuildForwardOnlyActions) against the
// others: sends never block, a receive waits for its matching send; per-step actions take no time.
// Reports a deadlock (no rank can move, some unfinished) and messages sent but never received, with
// the ranks and actions involved.
SimResult Simulate(const std::vector<std::vector<Action>>& lists, int virtual_stages,
                   const Costs& costs);

// The data-parallel all-reduce of a step whose last flush is `flush`, serial or overlapped with
// that flush's backward (the executor's DpReducer, docs/pipeline.md). Per rank: `allreduce` is
// the whole all-reduce of its gradients when nothing else runs, of which `tail` (a tied weight's
// bucket, final only after ReduceTied) can only start after the flush; the rest goes in
// `buckets` equal buckets. A rank's gradients become final in proportion to the time of its
// last weight-gradient computation of each stage it hosts (Backward or BackwardWeight of the
// flush's last micro-batch there), so bucket k is final when (k + 1) / buckets of that time has
// passed. Buckets run one after the other, each once it is final and the one before it is done.
// Not modelled: communication slowing computation down (shared cores and memory bandwidth) and
// progress only at the executor's polls.
struct DpReduceCosts {
  std::vector<double> allreduce;  // per rank
  std::vector<double> tail;       // per rank; empty: 0
  int buckets = 1;
};

struct DpReducePrediction {
  std::vector<double> compute_end;  // per rank: its last computation of the flush ends
  std::vector<double> serial_end;   // the all-reduce after the flush: compute_end + allreduce
  std::vector<double> overlap_end;  // the buckets started as they become final
  double serial_makespan = 0;       // the latest rank, each way
  double overlap_makespan = 0;
};

DpReducePrediction PredictDpReduce(const SimResult& flush, const DpReduceCosts& costs);

// The largest grid FormatGrid draws; a larger one is a line saying so (it would be megabytes of
// text nobody reads; the trace holds the same timeline).
inline constexpr int kMaxGridRanks = 64;
inline constexpr int kMaxGridColumns = 1024;

// The per-rank grid, one character cell per unit of time ("F3", "B3", "W3", ".").
std::string FormatGrid(const SimResult& result, int pp);

// A Chrome/Perfetto trace (JSON) of the simulated timeline: one track per rank. Written as it
// goes, in memory proportional to one event.
void WriteChromeTrace(const SimResult& result, const std::string& title, std::ostream& out);
std::string ChromeTrace(const SimResult& result, const std::string& title);

}  // namespace bigmac::schedule

#endif  // BIGMAC_CORE_SCHEDULE_SIMULATOR_H_
