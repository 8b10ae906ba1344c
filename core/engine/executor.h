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

// Runs one rank's action list (core/schedule) against its Stage and the PipelineComm: it owns the
// activations and gradients in transit between actions, hands the tied weight's gradient to its
// owner and all-reduces gradients over the data-parallel group.
class Executor {
 public:
  Executor(Stage* stage, comm::PipelineComm* comm, std::vector<schedule::Action> actions,
           int hidden_size);

  // One pipeline flush. `batch(mb)` gives micro-batch mb of this flush (it must stay valid until
  // the flush ends). The per-step actions run only when `last_flush`; OptimizerStep calls
  // `optimizer_step`. Returns the sum of this rank's scaled losses (non-zero on the last stage).
  double RunFlush(const std::function<const layer::MicroBatch&(int)>& batch, bool last_flush,
                  const std::function<void()>& optimizer_step);

  // Forward only, for evaluation: micro-batch `mb` through this rank's stages in order.
  // Returns the scaled loss on the rank holding the last stage, 0 elsewhere.
  double Evaluate(const layer::MicroBatch& mb);

  // After the owner's optimizer step: its tied weight to the consumer's copy.
  void SendTiedWeight();

  // Where every action's span goes (null: nowhere).
  void set_timeline(metrics::Timeline* timeline) { timeline_ = timeline; }

 private:
  void RunAction(const schedule::Action& action,
                 const std::function<const layer::MicroBatch&(int)>& batch, bool last_flush,
                 const std::function<void()>& optimizer_step, double* loss);
  void ReduceTied();
  void ReduceDp();
  std::string Describe(const schedule::Action& action) const;
  std::vector<int64_t> ActivationShape(const layer::MicroBatch& mb) const;

  Stage* stage_;
  comm::PipelineComm* comm_;
  std::vector<schedule::Action> actions_;
  int hidden_size_;
  std::map<std::pair<int, int>, memory::Tensor> inbox_;   // received, keyed by (mb, stage)
  std::map<std::pair<int, int>, memory::Tensor> outbox_;  // produced, waiting for their send
  metrics::Timeline* timeline_ = nullptr;
};

}  // namespace bigmac::engine

#endif  // BIGMAC_CORE_ENGINE_EXECUTOR_H_
