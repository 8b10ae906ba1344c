#ifndef BIGMAC_CORE_ENGINE_EXECUTOR_H_
#define BIGMAC_CORE_ENGINE_EXECUTOR_H_

#include <functional>
#include <map>
#include <vector>

#include "core/comm/pipeline_comm.h"
#include "core/engine/stage.h"
#include "core/metrics/timeline.h"
#include "core/schedule/schedule.h"

namespace bigmac::engine {

// Runs one rank's action lists (core/schedule) against its Stage and the PipelineComm: it owns the
// activations and gradients in transit between actions, hands the tied weight's gradient to its
// owner and all-reduces gradients over the data-parallel group. `stage` and `comm` must outlive it.
class Executor {
 public:
  // The lists of pp rank comm->pp_rank() under `spec`: one flush, the per-step tail, evaluation.
  Executor(Stage* stage, comm::PipelineComm* comm, const schedule::ScheduleSpec& spec,
           int hidden_size);

  // One pipeline flush (BuildRankActions). `batch(mb)` gives micro-batch mb of this flush (it must
  // stay valid until the flush ends). After the step's last flush (`last_flush`), the per-step
  // tail (BuildStepTail) runs once; its OptimizerStep calls `optimizer_step`. Returns the sum of
  // this rank's scaled losses (non-zero on the last stage).
  double RunFlush(const std::function<const layer::MicroBatch&(int)>& batch, bool last_flush,
                  const std::function<void()>& optimizer_step);

  // Forward only, for evaluation (BuildForwardOnlyActions): micro-batch `mb` through this rank's
  // stages in order, nothing kept. Returns the scaled loss on the rank holding the last stage, 0
  // elsewhere.
  double Evaluate(const layer::MicroBatch& mb);

  // After the owner's optimizer step: its tied weight to the consumer's copy.
  void SendTiedWeight();

  // Where every action's span goes (null: nowhere).
  void set_timeline(metrics::Timeline* timeline) { timeline_ = timeline; }

 private:
  // Runs `actions` in order, recording their spans when `record`. Forward keeps what the backward
  // needs when `keep`.
  double RunList(const std::vector<schedule::Action>& actions,
                 const std::function<const layer::MicroBatch&(int)>& batch,
                 const std::function<void()>& optimizer_step, bool keep, bool record);
  void RunAction(const schedule::Action& action,
                 const std::function<const layer::MicroBatch&(int)>& batch,
                 const std::function<void()>& optimizer_step, bool keep, double* loss);
  void ReduceTied();
  void ReduceDp();
  std::string Describe(const schedule::Action& action) const;
  std::vector<int64_t> ActivationShape(const layer::MicroBatch& mb) const;

  Stage* stage_;
  comm::PipelineComm* comm_;
  schedule::ScheduleSpec spec_;
  std::vector<schedule::Action> flush_;      // one flush's actions
  std::vector<schedule::Action> step_tail_;  // once per step, after the last flush
  int hidden_size_;
  std::map<std::pair<int, int>, memory::Tensor> inbox_;   // received, keyed by (mb, stage)
  std::map<std::pair<int, int>, memory::Tensor> outbox_;  // produced, waiting for their send
  metrics::Timeline* timeline_ = nullptr;
};

}  // namespace bigmac::engine

#endif  // BIGMAC_CORE_ENGINE_EXECUTOR_H_
