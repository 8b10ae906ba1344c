#ifndef BIGMAC_CORE_ENGINE_EXECUTOR_H_
#define BIGMAC_CORE_ENGINE_EXECUTOR_H_

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "core/comm/pipeline_comm.h"
#include "core/device/device_spans.h"
#include "core/engine/dp_reduce.h"
#include "core/engine/rank_model.h"
#include "core/metrics/timeline.h"
#include "core/schedule/schedule.h"

namespace bigmac::engine {

// Runs one rank's action lists (core/schedule) against its RankModel and the PipelineComm: it owns
// the activations and gradients in transit between actions, batches adjacent communication with
// one neighbour into one exchange, hands the tied weight's gradient to its owner and all-reduces
// gradients over the data-parallel group in buckets (DpReducer), overlapped with the backward of
// the step's last flush. The stage and the transport outlive the executor.
class Executor {
 public:
  // The lists of pp rank comm->pp_rank() under `spec`: one flush (BuildRankActions), the
  // per-step tail (BuildStepTail), evaluation (BuildForwardOnlyActions).
  Executor(RankModel* stage, comm::PipelineComm* comm, const schedule::ScheduleSpec& spec,
           int hidden_size);
  // With hand-written flush and tail lists (tests); evaluation still follows `spec`.
  Executor(RankModel* stage, comm::PipelineComm* comm, const schedule::ScheduleSpec& spec,
           int hidden_size, std::vector<schedule::Action> flush,
           std::vector<schedule::Action> tail);
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  ~Executor();

  // One pipeline flush. `batch(mb)` gives micro-batch mb of this flush (it must stay valid until
  // the flush ends). Returns the sum of this rank's scaled losses (non-zero on the last stage),
  // accumulated on the device and read once. `last`: the step's last flush, in which the dp
  // all-reduce of final gradient buckets may start (DpReducer).
  double RunFlush(const std::function<const layer::MicroBatch&(int)>& batch, bool last = true);
  // The per-step tail; OptimizerStep calls `optimizer_step`.
  void RunTail(const std::function<void()>& optimizer_step);

  // Forward only, for evaluation (BuildForwardOnlyActions through the same dispatch): micro-batch
  // `mb` through this rank's stages in order, nothing kept. Returns the scaled loss on the rank
  // holding the last stage, 0 elsewhere.
  double Evaluate(const layer::MicroBatch& mb);
  // Forward only, as Evaluate, of a micro-batch without targets (text generation): the head's
  // output (the logits) on the rank holding the last stage, an empty tensor elsewhere.
  memory::Tensor ForwardOutput(const layer::MicroBatch& mb);

  // After the owner's optimizer step (or a skipped one): the tied weights to their copies.
  void SendTiedWeight();

  // Where every action's span goes (null: nowhere).
  void set_timeline(metrics::Timeline* timeline);
  // Where compute actions are timed on the device's compute stream as well (an asynchronous
  // device; null or disabled: nowhere). `spans` outlives the executor's use of it.
  void set_device_spans(device::DeviceSpans* spans) { device_spans_ = spans; }
  // How ReduceDp runs: overlapped with the last flush or not, its bucket size (default: on,
  // 25 MiB).
  void set_dp_reduce(const DpReduceOptions& options);
  const DpReducer& dp_reducer() const { return *dp_reducer_; }
  // Called before each action (or exchange) runs, after the progress record names it; the
  // fault-injection hooks of the tests use it.
  void set_action_hook(std::function<void(const schedule::Action&)> hook) {
    action_hook_ = std::move(hook);
  }

 private:
  using Batch = std::function<const layer::MicroBatch&(int)>;
  // Runs `actions`, one action or one batch of communication at a time; Forward keeps what the
  // backward needs when `keep`; spans go to the timeline when `record`.
  void Run(const std::vector<schedule::Action>& actions, const Batch& batch,
           const std::function<void()>& optimizer_step, bool keep = true, bool record = true);
  void RunCompute(const schedule::Action& action, const Batch& batch,
                  const std::function<void()>& optimizer_step, bool keep);
  // Actions [begin, end): adjacent sends and receives with one peer, as one exchange.
  void RunExchange(const std::vector<schedule::Action>& actions, size_t begin, size_t end,
                   const Batch& batch);
  // What receive action `a` expects.
  comm::Incoming IncomingOf(const schedule::Action& a, const Batch& batch) const;
  // Before computation `computing` runs: announces the receives of the next exchange that
  // follows it (PeerLinks::Expect), those at `*expected_until` and after, and moves it on.
  void ExpectNextReceives(const std::vector<schedule::Action>& actions, size_t computing,
                          size_t* expected_until, const Batch& batch);
  // A received tensor into the inbox; a second one for the same (micro-batch, stage) is an error.
  void Deliver(const schedule::Action& action, memory::Tensor tensor);
  [[noreturn]] void DuplicateReceive(const schedule::Action& action) const;
  std::string Describe(const schedule::Action& action) const;
  std::vector<int64_t> ActivationShape(const layer::MicroBatch& mb) const;

  RankModel* model_;
  comm::PipelineComm* comm_;
  schedule::ScheduleSpec spec_;
  std::vector<schedule::Action> flush_;
  int flush_microbatches_ = 0;  // the micro-batches flush_ computes on this rank
  std::vector<schedule::Action> tail_;
  int hidden_size_;
  std::map<std::pair<int, int>, memory::Tensor> inbox_;   // received, keyed by (mb, stage)
  std::map<std::pair<int, int>, memory::Tensor> outbox_;  // produced, waiting for their send
  memory::Tensor loss_;                                   // f64[1]: this flush's loss sum
  memory::Tensor loss_term_;                              // f64[1]: one micro-batch's, widened
  bool capture_output_ = false;  // ForwardOutput: the last stage's output goes to output_
  memory::Tensor output_;
  metrics::Timeline* timeline_ = nullptr;
  device::DeviceSpans* device_spans_ = nullptr;
  std::unique_ptr<DpReducer> dp_reducer_;
  std::function<void(const schedule::Action&)> action_hook_;
};

}  // namespace bigmac::engine

#endif  // BIGMAC_CORE_ENGINE_EXECUTOR_H_
