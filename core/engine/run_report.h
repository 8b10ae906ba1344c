#ifndef BIGMAC_CORE_ENGINE_RUN_REPORT_H_
#define BIGMAC_CORE_ENGINE_RUN_REPORT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/comm/pipeline_comm.h"
#include "core/config/resolve.h"
#include "core/device/device.h"
#include "core/engine/executor.h"
#include "core/engine/rank_model.h"
#include "core/engine/trainer.h"
#include "core/engine/zero_shard.h"
#include "core/metrics/event_writer.h"
#include "core/metrics/timeline.h"
#include "core/optim/adamw.h"
#include "core/util/output_file.h"
#include "nlohmann/json.hpp"

namespace bigmac::engine {

// What one optimizer step produced, as the trainer hands it to its report.
struct StepOutcome {
  double loss = 0;  // rank 0: mean per token over the global batch
  double norm = 0;
  double lr = 0;
  bool skipped = false;
  int skipped_steps = 0;  // in the run so far
  double ms = 0;
  int64_t activation_bytes = 0;         // sent by this rank during the step
  int64_t tp_bytes = 0;                 // put into tp all-reduces by this rank during the step
  double tp_ms = 0;                     // spent in them
  double peak = 0;                      // rank 0: the largest allocator peak of any rank
  std::vector<int64_t> dataset_tokens;  // trained on from each dataset so far (data.path order)
  // Checkpoints at the end of the step: the time the step loop spent on them (a snapshot, a
  // synchronous save, a commit), and the part of it that waited for a background write.
  double checkpoint_ms = 0;
  double checkpoint_wait_ms = 0;
};

// The pp stages this rank hosts, "0,4".
std::string StageList(const RankModel& stage);

// What the report reads of the run. Every object is the trainer's and outlives the report;
// `zero` may be null (no ZeRO-1).
struct RunView {
  const config::ResolvedConfig& resolved;
  comm::PipelineComm& comm;
  const TrainOptions& options;
  device::Device* device;
  RankModel& stage;
  const Executor& executor;
  const optim::AdamW& adamw;
  const ZeroShards* zero;
  const metrics::Timeline& timeline;
};

// The run's reporting, an observer of each step's outcome that changes nothing in the run: the
// progress line, metrics.jsonl and TensorBoard (rank 0), the [memory] and [stage] summaries, the
// trace, and --dump. Its calls that gather are collective over the world: call them on every rank.
class RunReport {
 public:
  explicit RunReport(const RunView& view);
  RunReport(const RunReport&) = delete;
  RunReport& operator=(const RunReport&) = delete;

  // A line on rank 0's log.
  void Log(const std::string& line) const;
  // A run output that failed after start-up: warned at once, and the run exits 8 at the end.
  void OutputFailed(const std::string& problem);
  const std::vector<std::string>& output_failures() const { return output_failures_; }

  // The model line (parameters over the pipeline, data, flushes) and the precision line.
  void Model(const std::string& data_description);
  // Rank 0: metrics.jsonl and the TensorBoard events under train.output_dir, the config as text.
  void Open(int start_step);
  // Collective over the world, every step: gathers every rank's record of the step on rank 0
  // (for metrics.jsonl and the straggler report; the one gather a step makes for reporting), then
  // the progress line every train.log_interval steps (`step` is 0-based) with the spread of the
  // ranks' compute time over the interval, and a [straggler] line for each rank more than
  // train.straggler_ratio slower than its peers (core/metrics/stragglers.h).
  void Progress(int step, const StepOutcome& outcome);
  // Rank 0, after Progress: metrics.jsonl and TensorBoard, from the records Progress gathered;
  // the step's line carries val_loss when it was evaluated. Not collective.
  void Metrics(int step, const StepOutcome& outcome, std::optional<double> val_loss);
  void ValLoss(int step, double loss);
  // Rank 0, with several datasets: one dataset's validation loss (TensorBoard val/loss/NAME, and
  // val_loss_by_dataset on the step's metrics line).
  void DatasetValLoss(int step, const std::string& name, double loss);
  // The datasets' names, in data.path's order (the keys of tokens_by_dataset).
  void set_dataset_names(std::vector<std::string> names) { dataset_names_ = std::move(names); }
  void Sample(int step, const std::string& text);
  // The [memory] and [stage] lines of every rank, after `steps_run` steps.
  void Summary(const TrainResult& result, int steps_run);
  // trace.json (rank 0) and, with --dump, the weights per layer_id and rank 0's losses.
  void TraceAndDump(const std::vector<double>& train_losses);

 private:
  // metrics.jsonl and the events file: their first failure, once each.
  void CheckRecordFiles();
  // The [memory] line's optimizer bytes, sharded or not.
  std::string OptimizerMemory() const;

  // This rank's record of the step: time per category, buckets, memory, tp traffic.
  nlohmann::json RankRecord(const StepOutcome& outcome) const;
  // Rank 0: the interval's compute spread, its progress-line words and its [straggler] lines.
  std::string ComputeSpreadWords();

  RunView view_;
  const config::Config& cfg_;
  const bool root_;
  const double tokens_per_step_;
  std::unique_ptr<util::RecordFile> metrics_file_;  // rank 0: metrics.jsonl
  std::unique_ptr<metrics::EventWriter> events_;    // rank 0, beside metrics.jsonl
  bool metrics_failure_reported_ = false, events_failure_reported_ = false;
  const std::string host_;           // this rank's host name
  const double work_ = 0;            // this rank's forward FLOPs per micro-batch (predicted)
  nlohmann::json step_ranks_;        // rank 0: every rank's record of the step, in rank order
  std::vector<double> interval_ms_;  // rank 0: each rank's compute time since the last line
  int interval_steps_ = 0;           // rank 0: the steps in interval_ms_
  nlohmann::json spread_;            // rank 0: the interval's spread, on the step that ended it
  std::vector<std::string> output_failures_;
  std::vector<std::string> dataset_names_;
  nlohmann::json dataset_val_losses_;  // rank 0: the pending evaluation's, by dataset name
};

}  // namespace bigmac::engine

#endif  // BIGMAC_CORE_ENGINE_RUN_REPORT_H_
