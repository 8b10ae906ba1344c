#ifndef BIGMAC_CORE_ENGINE_TRAINER_INTERNAL_H_
#define BIGMAC_CORE_ENGINE_TRAINER_INTERNAL_H_

// The Trainer behind engine::Train (core/engine/trainer.h): its state and its parts. Private to
// trainer.cc, which reads top-down as the training loop.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/checkpoint/saver.h"
#include "core/comm/pipeline_comm.h"
#include "core/config/resolve.h"
#include "core/data/blend.h"
#include "core/data/dataset.h"
#include "core/data/error.h"
#include "core/device/device_spans.h"
#include "core/engine/executor.h"
#include "core/engine/rank_model.h"
#include "core/engine/run_report.h"
#include "core/engine/tp_group.h"
#include "core/engine/trainer.h"
#include "core/engine/zero_shard.h"
#include "core/metrics/timeline.h"
#include "core/optim/adamw.h"
#include "core/util/compute_progress.h"

namespace bigmac::engine {

// One micro-batch's tokens (read on the host) and the MicroBatch view of them. On a device
// without host-visible memory the tokens are uploaded and the view points at the device copies.
// Without targets (a text sample) the view's targets are null.
struct BatchSlot {
  std::vector<int32_t> tokens;
  std::vector<int32_t> targets;
  memory::Tensor device_tokens, device_targets;
  layer::MicroBatch mb;

  // Sets `mb` for `batch` x `seq` tokens on `device`. Every token and target must lie in
  // [0, vocab): the embedding and the cross-entropy index tables with them, and a GPU kernel
  // reading past a table reports nothing useful (a DataError names the value and its place).
  void View(device::Device* device, int batch, int seq, double loss_scale, int index, int vocab) {
    CheckVocabulary(tokens, "token", vocab, index);
    CheckVocabulary(targets, "target", vocab, index);
    const int32_t* t = tokens.data();
    const int32_t* y = targets.empty() ? nullptr : targets.data();
    if (device->backend() != device::Backend::kCpu) {
      const std::vector<int64_t> shape = {batch, seq};
      if (device_tokens.empty() || device_tokens.shape() != shape) {
        device_tokens = memory::Tensor(device, shape, memory::DType::kI32);
        device_targets = memory::Tensor(device, shape, memory::DType::kI32);
      }
      device_tokens.CopyFromHost(tokens.data());
      t = device_tokens.data<int32_t>();
      if (y != nullptr) {
        device_targets.CopyFromHost(targets.data());
        y = device_targets.data<int32_t>();
      }
    }
    mb = {batch, seq, t, y, loss_scale, index, tokens.data()};
  }

  static void CheckVocabulary(const std::vector<int32_t>& values, const char* what, int vocab,
                              int index) {
    for (size_t i = 0; i < values.size(); ++i) {
      if (values[i] < 0 || values[i] >= vocab) {
        throw data::DataError(std::string(what) + " " + std::to_string(values[i]) +
                              " at position " + std::to_string(i) + " of micro-batch " +
                              std::to_string(index) + " is outside the vocabulary [0, " +
                              std::to_string(vocab) + ") (model.vocab_size)");
      }
    }
  }
};

// One training run on one rank: built from the config (device, stage, executor, data, optimizer),
// then driven step by step by Run(); its RunReport observes each step. Owns everything but the
// transport and a device the CLI passed in, which outlive it.
class Trainer {
 public:
  Trainer(const config::ResolvedConfig& resolved, comm::PipelineComm& comm,
          const TrainOptions& options);
  ~Trainer() {
    util::SetComputeProgress(nullptr, 0);
    comm_.set_device_spans(nullptr);
  }
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  TrainResult Run();

 private:
  void Log(const std::string& line) const {
    if (root_) options_.log(line);
  }
  void Resume();
  // The validation loss after `step` steps (rank 0: the mean per token; elsewhere a partial sum),
  // over the batches run before a stop signal; none if it came before the first.
  // With several datasets, each one's loss is logged and reported too; the overall loss is their
  // mean weighted by data.path's weights (the blend's expected loss).
  std::optional<double> Evaluate(int step);
  // The mean validation loss over `batches` batches of dataset `d` on rank 0 (elsewhere a partial
  // sum), and the batches run before a stop signal in `evaluated`.
  double EvaluateDataset(int d, int batches, int* evaluated);
  // Every train.sample_interval steps: a short text written by the model, printed by rank 0.
  void Sample(int step);
  void FillBatches(int step, int flush);
  // After a step: its samples counted against their datasets.
  void AdvanceDataPosition();
  // The checkpoint's (or, from a manifest without one, the position `step` steps in), and the
  // counts logged.
  void RestoreDataPosition(const checkpoint::Manifest& manifest, int step);
  // "web_text_document 2304 tokens, ...": the tokens each dataset gave, or will give.
  std::string DatasetTokens(const std::vector<int64_t>& samples) const;
  StepOutcome RunStep(int step);
  // The optimizer step of `step` (0-based): norm, non-finite diagnosis, clipping, AdamW, the tied
  // weight back to its copy.
  void OptimizerStep(int step, StepOutcome* outcome);
  // Every rank sees the same non-finite norm: report where, then skip (returns) or throw.
  void DiagnoseNonFinite(int step, const std::string& bad, StepOutcome* outcome);
  // Every step's end: commits a save whose files are durable on every rank, then starts the
  // save that is due (checkpoint.interval, the last step). Records the time in `outcome`.
  void Checkpoint(int step, StepOutcome* outcome);
  // Starts the save of `step` (finishing one in flight first); a synchronous one is committed.
  void Save(int step);
  // Commits the save in flight, if any, waiting for its files.
  void FinishSave();
  void LogSaved(const checkpoint::SaveStats& stats);
  // After step `step` (0-based): true if a stop signal ends the run here (every rank agrees).
  bool StopRequested(int step);
  // Host copies (double) of this rank's owned parameters, for TrainResult.
  std::vector<double> FinalParameters() const;

  const config::ResolvedConfig& resolved_;
  const config::Config& cfg_;
  const config::Train& train_;
  comm::PipelineComm& comm_;
  const TrainOptions& options_;
  const util::FaultPlan& faults_;  // options_.faults
  const bool root_;
  const int batch_, seq_, accum_, microbatches_, flushes_;
  const double tokens_per_step_;
  std::unique_ptr<device::Device> owned_device_;  // when the CLI passed none
  device::Device* device_;
  // The trace's device tracks (an asynchronous device only): spans timed on the streams.
  std::unique_ptr<device::DeviceSpans> device_spans_;
  RankModelOptions model_options_;
  std::unique_ptr<CommTpGroup> tp_group_;  // tp_size > 1
  std::unique_ptr<RankModel> model_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<ZeroShards> zero_;  // parallel.zero_stage=1 with dp > 1
  // The datasets (data.path or data.dir), opened where the embedding (tokens) or the head
  // (targets) is; null on the other ranks.
  std::unique_ptr<data::BlendedData> data_;
  // Every rank: the datasets (data.path's, or data.dir) and their names, which dataset each
  // sample comes from, and where the run stands (counted on every rank alike from the sampler,
  // so any rank's report and save have it).
  const std::vector<config::BlendEntry> datasets_;
  const std::vector<std::string> dataset_names_;
  const data::BlendSampler sampler_;
  data::DataPosition position_;
  // The data's tokenizer (tokenizer.json in data::DataHome), read on every rank: recorded in
  // checkpoints, and a resume on data of another tokenizer is refused. Empty when it has none.
  std::string tokenizer_id_;
  metrics::Timeline timeline_;
  optim::AdamW adamw_;
  optim::LrSchedule lr_schedule_;
  std::vector<layer::Param*> params_;
  std::vector<BatchSlot> slots_;
  TrainResult result_;
  int start_step_ = 0;
  int skipped_steps_ = 0;
  int last_saved_step_ = -1;
  int stopped_at_ = -1;
  int running_step_ = 0;  // 1-based, for the fault plan
  // checkpoint.dir set: destroyed before the device, whose host memory it holds.
  std::unique_ptr<checkpoint::Saver> saver_;
  double checkpoint_wait_seconds_ = 0;  // the current step's, while it checkpoints
  std::unique_ptr<RunReport> report_;   // the observer of the steps (built last)
};

}  // namespace bigmac::engine

#endif  // BIGMAC_CORE_ENGINE_TRAINER_INTERNAL_H_
