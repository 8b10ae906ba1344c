#include "core/engine/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/tp_slices.h"
#include "core/comm/progress.h"
#include "core/config/effective_log.h"
#include "core/config/resolve.h"
#include "core/data/dataset.h"
#include "core/data/error.h"
#include "core/data/shard.h"
#include "core/data/tokenizer.h"
#include "core/device/device_spans.h"
#include "core/engine/executor.h"
#include "core/engine/generate.h"
#include "core/engine/stage.h"
#include "core/engine/tp_group.h"
#include "core/engine/zero_shard.h"
#include "core/memory/allocator.h"
#include "core/metrics/event_writer.h"
#include "core/metrics/timeline.h"
#include "core/optim/adamw.h"
#include "core/schedule/schedule.h"
#include "core/util/format.h"
#include "core/util/output_file.h"
#include "core/util/stop_signal.h"
#include "nlohmann/json.hpp"

namespace bigmac::engine {
using util::Format;

namespace {

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

// Writes this rank's owned parameters as <dir>/layer_<id>.f32 (every parameter of the layer, in
// order, float32, full tensors), so that runs under different layouts can be compared by
// layer_id. Collective over the tp group, whose rank 0 writes. Returns the files that could not
// be written (each whole or not at all: util::WriteWholeFile).
std::vector<std::string> DumpWeights(Stage& stage, const std::string& dir,
                                     comm::PipelineComm& comm) {
  std::vector<memory::Tensor> full;  // gathered from the tp slices
  for (const Stage::NamedParam& named : stage.OwnedParams())
    full.push_back(
        checkpoint::GatherTpSlices(named.param->value, stage.TpShardOf(named.param), comm));
  // The consumer's read-only copy of the tied weight, to check that it equals the owner's.
  layer::Param* copy = stage.TiedOwner() ? nullptr : stage.TiedCopy();
  const memory::Tensor copy_full =
      copy ? checkpoint::GatherTpSlices(copy->value, stage.TpShardOf(copy), comm)
           : memory::Tensor();
  if (comm.tp_rank() != 0) return {};
  auto host_bytes = [](const memory::Tensor& tensor) {
    std::string host(static_cast<size_t>(tensor.bytes()), '\0');
    tensor.CopyToHost(host.data());
    return host;
  };
  std::map<std::string, std::string> files;  // name -> contents
  if (copy) files["tied_copy.bin"] = host_bytes(copy_full);
  size_t index = 0;
  for (const Stage::NamedParam& named : stage.OwnedParams())
    files["layer_" + std::to_string(named.layer_id) + ".f32"] += host_bytes(full[index++]);
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  std::vector<std::string> problems;
  for (const auto& [name, contents] : files) {
    if (std::string problem = util::WriteWholeFile(dir + "/" + name, contents); !problem.empty())
      problems.push_back(problem);
  }
  return problems;
}

// Fault-injection hooks for the reliability tests (docs/exit_codes.md), read once from the
// environment. Steps are 1-based, as printed.
struct FaultHooks {
  int stall_rank = -1;  // BIGMAC_TEST_STALL_RANK=<rank>[:<step>]: stops responding at that step
  int stall_step = 0;   // (0: before the first step)
  int kill_rank = -1;   // BIGMAC_TEST_KILL=<rank>:<step>: SIGKILL itself after that step's backward
  int kill_step = -1;
  int nan_step = -1;  // BIGMAC_TEST_NAN_GRAD=<step>:<layer_id>: a NaN in that layer's gradient
  int nan_layer = 0;
  // BIGMAC_TEST_SIGSTOP=<rank>:<step>: SIGSTOP itself before its Forward of micro-batch 1
  int sigstop_rank = -1;
  int sigstop_step = -1;
  int mismatch_rank = -1;  // BIGMAC_TEST_MISMATCH_SCHEDULE=<rank>: schedule::MismatchForTesting

  static FaultHooks FromEnvironment() {
    FaultHooks hooks;
    auto pair = [](const char* name, int* first, int* second) {
      const char* text = std::getenv(name);
      if (text == nullptr) return;
      *first = std::atoi(text);
      if (const char* colon = std::strchr(text, ':')) *second = std::atoi(colon + 1);
    };
    pair("BIGMAC_TEST_STALL_RANK", &hooks.stall_rank, &hooks.stall_step);
    pair("BIGMAC_TEST_KILL", &hooks.kill_rank, &hooks.kill_step);
    pair("BIGMAC_TEST_NAN_GRAD", &hooks.nan_step, &hooks.nan_layer);
    pair("BIGMAC_TEST_SIGSTOP", &hooks.sigstop_rank, &hooks.sigstop_step);
    int unused = 0;
    pair("BIGMAC_TEST_MISMATCH_SCHEDULE", &hooks.mismatch_rank, &unused);
    return hooks;
  }
};

// This process's resident set size, from /proc (0 where there is none).
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0;
  int64_t resident = 0;
  if (!(statm >> pages >> resident)) return 0;
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

// The pp stages this rank hosts, "0,4".
std::string StageList(const Stage& stage) {
  std::string stages;
  for (const partition::StageRange& range : stage.ranges())
    stages += (stages.empty() ? "" : ",") + std::to_string(range.stage);
  return stages;
}

// What one step produced, for the progress line and metrics.jsonl.
struct StepOutcome {
  double loss = 0;  // rank 0: mean per token over the global batch
  double norm = 0;
  double lr = 0;
  bool skipped = false;
  double ms = 0;
  int64_t activation_bytes = 0;  // sent by this rank during the step
  int64_t tp_bytes = 0;          // put into tp all-reduces by this rank during the step
  double tp_ms = 0;              // spent in them
  double peak = 0;               // rank 0: the largest allocator peak of any rank
};

// One training run on one rank: built from the config (device, stage, executor, data, optimizer),
// then driven step by step by Run(). Owns everything but the transport and a device the CLI
// passed in, which outlive it.
class Trainer {
 public:
  Trainer(const config::ResolvedConfig& resolved, comm::PipelineComm& comm,
          const TrainOptions& options);
  ~Trainer() { comm_.set_device_spans(nullptr); }
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  TrainResult Run();

 private:
  void Log(const std::string& line) const {
    if (root_) options_.log(line);
  }
  void LogModel();
  void Resume();
  void OpenMetrics();
  // The validation loss after `step` steps (rank 0: the mean per token; elsewhere a partial sum),
  // over the batches run before a stop signal; none if it came before the first.
  std::optional<double> Evaluate(int step);
  // Every train.sample_interval steps: a short text written by the model, printed by rank 0.
  void Sample(int step);
  void FillBatches(int step, int flush);
  StepOutcome RunStep(int step);
  // The optimizer step of `step` (0-based): norm, non-finite diagnosis, clipping, AdamW, the tied
  // weight back to its copy.
  void OptimizerStep(int step, StepOutcome* outcome);
  // Every rank sees the same non-finite norm: report where, then skip (returns) or throw.
  void DiagnoseNonFinite(int step, const std::string& bad, StepOutcome* outcome);
  // metrics.jsonl and TensorBoard; the step's line carries val_loss when it was evaluated.
  void WriteMetrics(int step, const StepOutcome& outcome, std::optional<double> val_loss);
  void ReportProgress(int step, const StepOutcome& outcome);
  void Save(int step);
  // After step `step` (0-based): true if a stop signal ends the run here (every rank agrees).
  bool StopRequested(int step);
  void Report(int steps_run);
  // The [memory] line's optimizer bytes, sharded or not.
  std::string OptimizerMemory() const;
  void WriteTraceAndDump();
  // A run output that failed after start-up: warned at once, and the run exits 8 at the end.
  void OutputFailed(const std::string& problem);
  // metrics.jsonl and the events file: their first failure, once each.
  void CheckRecordFiles();

  const config::ResolvedConfig& resolved_;
  const config::Config& cfg_;
  const config::Train& train_;
  comm::PipelineComm& comm_;
  const TrainOptions& options_;
  const bool root_;
  const int batch_, seq_, accum_, microbatches_, flushes_;
  const double tokens_per_step_;
  std::unique_ptr<device::Device> owned_device_;  // when the CLI passed none
  device::Device* device_;
  // The trace's device tracks (an asynchronous device only): spans timed on the streams.
  std::unique_ptr<device::DeviceSpans> device_spans_;
  StageOptions stage_options_;
  std::unique_ptr<CommTpGroup> tp_group_;  // tp_size > 1
  std::unique_ptr<Stage> stage_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<ZeroShards> zero_;  // parallel.zero_stage=1 with dp > 1
  std::optional<data::TokenDataset> train_data_, val_data_;
  // data.dir's tokenizer (tokenizer.json), read on every rank: recorded in checkpoints, and a
  // resume on data of another tokenizer is refused. Empty when the data has no manifest.
  std::string tokenizer_id_;
  metrics::Timeline timeline_;
  std::unique_ptr<util::RecordFile> metrics_file_;  // rank 0: metrics.jsonl
  std::unique_ptr<metrics::EventWriter> events_;    // rank 0, beside metrics.jsonl
  bool metrics_failure_reported_ = false, events_failure_reported_ = false;
  optim::AdamW adamw_;
  optim::LrSchedule lr_schedule_;
  std::vector<layer::Param*> params_;
  std::vector<BatchSlot> slots_;
  const FaultHooks hooks_ = FaultHooks::FromEnvironment();
  TrainResult result_;
  int start_step_ = 0;
  int skipped_steps_ = 0;
  int last_saved_step_ = -1;
  int stopped_at_ = -1;
  int running_step_ = 0;  // 1-based, for the hooks
};

Trainer::Trainer(const config::ResolvedConfig& resolved, comm::PipelineComm& comm,
                 const TrainOptions& options)
    : resolved_(resolved),
      cfg_(resolved.values()),
      train_(cfg_.train()),
      comm_(comm),
      options_(options),
      root_(comm.world_rank() == 0),
      batch_(train_.micro_batch_size()),
      seq_(train_.seq_length()),
      accum_(train_.gradient_accumulation_steps()),
      microbatches_(resolved.batch.num_microbatches),
      flushes_(resolved.batch.flushes_per_step),
      // Every token loss is scaled by 1/(tokens per optimizer step over all replicas), so the
      // summed gradient is the mean over the global batch, whatever the pp/dp split.
      tokens_per_step_(double(batch_) * seq_ * accum_ * resolved.dp),
      device_(options.device),
      adamw_({cfg_.optim().beta1(), cfg_.optim().beta2(), cfg_.optim().eps(),
              cfg_.optim().weight_decay()}),
      lr_schedule_{cfg_.optim().lr(), cfg_.optim().min_lr(), cfg_.optim().warmup_steps(),
                   train_.max_steps()},
      slots_(microbatches_) {
  if (device_ == nullptr) {
    owned_device_ = device::MakeCpuDevice(
        comm.world_rank(),
        memory::CpuCapacity(cfg_.device().memory_limit(), options.ranks_on_node));
    device_ = owned_device_.get();
  }
  stage_options_.dims = config::ModelDimsOf(cfg_);
  stage_options_.bf16 = cfg_.precision().dtype() == "bf16";  // fp16 is refused at start-up
  stage_options_.device = device_;
  stage_options_.activation_checkpointing = train_.activation_checkpointing();
  stage_options_.seed = static_cast<uint64_t>(train_.seed());
  stage_options_.model = GptModel(resolved);
  if (comm.tp_size() > 1) {
    tp_group_ = std::make_unique<CommTpGroup>(comm);
    stage_options_.tp = tp_group_.get();
  }
  stage_ = std::make_unique<Stage>(stage_options_, resolved.partition, comm.pp_rank());

  // The ranks' layers together must cover every layer_id once.
  if (std::string problem =
          CheckLayerCoverage(comm.AllGatherPp(stage_->LayerIds()), cfg_.model().num_layers());
      !problem.empty()) {
    throw std::logic_error("stage layout: " + problem);
  }

  // Only the ranks with the embedding (tokens) or the head (targets) read data.
  if (stage_->has_embedding() || stage_->has_head()) {
    train_data_.emplace(cfg_.data().dir(), "train", cfg_.data().train_files());
    val_data_.emplace(cfg_.data().dir(), "val", cfg_.data().val_files());
    train_data_->CheckFits(seq_, cfg_.model().vocab_size());
    val_data_->CheckFits(seq_, cfg_.model().vocab_size());
    if (root_) {
      for (const std::string& warning :
           data::SplitWarnings(*train_data_, *val_data_, seq_, batch_, train_.eval_batches())) {
        Log("[data] warning: " + warning);
      }
    }
  }
  if (const auto manifest = data::ReadTokenizerManifest(cfg_.data().dir()))
    tokenizer_id_ = manifest->Id();

  schedule::Kind kind = schedule::Kind::k1F1B;
  schedule::ParseKind(cfg_.parallel().schedule(), &kind);
  const schedule::ScheduleSpec spec{kind, comm.pp_size(), microbatches_,
                                    cfg_.parallel().virtual_stages()};
  if (hooks_.mismatch_rank == comm.world_rank()) {
    executor_ = std::make_unique<Executor>(
        stage_.get(), &comm, spec, cfg_.model().hidden_size(),
        schedule::MismatchForTesting(schedule::BuildRankActions(spec, comm.pp_rank())),
        schedule::BuildStepTail(spec, comm.pp_rank()));
  } else {
    executor_ = std::make_unique<Executor>(stage_.get(), &comm, spec, cfg_.model().hidden_size());
  }
  executor_->set_timeline(&timeline_);
  device_spans_ = std::make_unique<device::DeviceSpans>(device_);
  executor_->set_device_spans(device_spans_.get());
  comm.set_device_spans(device_spans_.get());
  DpReduceOptions dp_reduce;
  dp_reduce.overlap = cfg_.parallel().overlap_dp_reduce();
  std::string size_error;
  memory::ParseByteSize(cfg_.parallel().dp_bucket_size(), &dp_reduce.bucket_bytes,
                        &size_error);  // validated at start-up
  dp_reduce.shard = cfg_.parallel().zero_stage() == 1;
  executor_->set_dp_reduce(dp_reduce);
  if (dp_reduce.shard && comm.dp_size() > 1) {
    zero_ = std::make_unique<ZeroShards>(executor_->dp_reducer().buckets(), &comm, device_);
    zero_->InitState(&adamw_);  // before a checkpoint's moments arrive (SetState slices them)
  }
  if (hooks_.sigstop_rank == comm.world_rank()) {
    const int microbatch = std::min(1, microbatches_ - 1);
    executor_->set_action_hook([this, microbatch](const schedule::Action& action) {
      if (running_step_ == hooks_.sigstop_step && action.op == schedule::Op::kForward &&
          action.microbatch == microbatch) {
        std::fflush(stdout);
        std::raise(SIGSTOP);
      }
    });
  }
  for (const Stage::NamedParam& named : stage_->OwnedParams()) params_.push_back(named.param);
  result_.parameter_count = stage_->OwnedParameterCount();
}

void Trainer::LogModel() {
  int64_t counted_once = 0;  // over the tp group
  for (const Stage::NamedParam& named : stage_->OwnedParams())
    if (stage_->CountsOnce(named.param)) counted_once += named.param->value.numel();
  const double total_params = comm_.SumToRoot(comm_.dp_rank() == 0 ? double(counted_once) : 0.0);
  Log(
      Format("[train] model: %.0f parameters, %d blocks, hidden %d, %d heads, vocab %d | %s | %d "
             "flush(es) of %d "
             "micro-batches per step",
             total_params, cfg_.model().num_layers(), cfg_.model().hidden_size(),
             cfg_.model().num_heads(), cfg_.model().vocab_size(),
             train_data_ ? train_data_->description().c_str() : "(data on other ranks)", flushes_,
             microbatches_));
  if (stage_options_.bf16) {
    Log("[train] precision: bf16 compute copies and activations, fp32 masters, gradients, "
        "AdamW moments, loss and norm (" +
        device::BackendName(device_->backend()) + " backend)");
  }
}

void Trainer::Resume() {
  if (options_.resume.empty()) return;
  const std::string& checkpoint_root = cfg_.checkpoint().dir();
  const std::string step_dir = checkpoint::ResolveStepDir(options_.resume, checkpoint_root);
  if (step_dir.empty()) {
    Log("[ckpt] --resume auto: no checkpoint in " + checkpoint_root + " yet; starting fresh");
    return;
  }
  // Every rank reads both, so every rank refuses alike; before the model's shapes, which another
  // vocabulary also changes.
  data::CheckSameTokenizer(checkpoint::ReadCheckedManifest(step_dir).tokenizer(), cfg_.data().dir(),
                           step_dir);
  const auto load_start = std::chrono::steady_clock::now();
  start_step_ =
      static_cast<int>(checkpoint::Load(step_dir, resolved_, stage_->State(), adamw_, comm_));
  stage_->RefreshComputeCopies();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  const double bytes = comm_.SumToRoot(
      comm_.dp_rank() == 0 ? double(3 * result_.parameter_count * sizeof(float)) : 0.0);
  Log(Format("[ckpt] resumed from %s at step %d: read %.2f MB in %.3f s (%.1f MB/s)",
             step_dir.c_str(), start_step_, bytes / 1e6, seconds,
             bytes / 1e6 / std::max(seconds, 1e-9)));
}

void Trainer::OpenMetrics() {
  const std::string& output_dir = train_.output_dir();
  if (!root_ || output_dir.empty()) return;
  // The start-up checks found the directory writable and the lock created it: a failure here is
  // a filesystem failing later (docs/reliability.md, "Outputs"): a warning now, exit 8 at the end.
  std::error_code error;
  std::filesystem::create_directories(output_dir, error);
  const std::string metrics_path = output_dir + "/metrics.jsonl";
  std::filesystem::remove(metrics_path + ".incomplete", error);  // an earlier run's
  if (std::filesystem::exists(metrics_path, error)) {
    Log("[train] " + output_dir + ": replacing the earlier run's metrics.jsonl, trace.json and " +
        "TensorBoard events (one run per train.output_dir; set another to keep them)");
  }
  std::string problem;
  metrics_file_ = util::RecordFile::Create(metrics_path, &problem);
  if (!metrics_file_) {
    OutputFailed(problem + "; no metrics, events or trace this run");
    return;
  }
  metrics::RemoveEventFiles(output_dir);  // one run per directory, as metrics.jsonl
  events_ = metrics::EventWriter::Open(output_dir, &problem);
  if (!events_) {
    OutputFailed(problem + "; no TensorBoard events this run");
    return;
  }
  // The effective config, indented so that TensorBoard's Markdown shows it as written.
  std::string text;
  for (const std::string& line : config::EffectiveConfigLines(resolved_))
    text += "    " + line + "\n";
  events_->AddText("config", start_step_, text);
  CheckRecordFiles();
}

void Trainer::OutputFailed(const std::string& problem) {
  const std::string line =
      "[output] warning: " + problem + "; training goes on, and the run will exit with code 8";
  if (root_) {
    Log(line);
  } else {  // a --dump file of another stage: only rank 0 logs, so say it here
    std::fprintf(stderr, "bigmac: rank %d: %s\n", comm_.world_rank(), line.c_str());
  }
  result_.output_failures.push_back(problem);
}

void Trainer::CheckRecordFiles() {
  if (metrics_file_ && metrics_file_->failed() && !metrics_failure_reported_) {
    metrics_failure_reported_ = true;
    OutputFailed(metrics_file_->problem());
  }
  if (events_ && !events_->problem().empty() && !events_failure_reported_) {
    events_failure_reported_ = true;
    OutputFailed(events_->problem());
  }
}

std::optional<double> Trainer::Evaluate(int step) {
  double local = 0;
  BatchSlot slot;
  slot.tokens.resize(int64_t{batch_} * seq_);
  slot.targets.resize(slot.tokens.size());
  comm::progress::SetAction("", "evaluation");
  const int batches = train_.eval_batches();
  int evaluated = batches;
  // Rounds of one batch per dp replica. A long evaluation ends on a stop signal: all ranks agree
  // before each round (every rank runs the same rounds), so none waits for a peer that stopped.
  for (int first = 0; first < batches; first += comm_.dp_size()) {
    if (!comm_.AllOk(util::StopSignalReceived() == 0)) {
      evaluated = first;
      break;
    }
    const int i = first + comm_.dp_rank();
    if (i >= batches) continue;
    if (val_data_) val_data_->EvalBatch(i, batch_, seq_, slot.tokens.data(), slot.targets.data());
    slot.View(device_, batch_, seq_, 1.0 / (double(batch_) * seq_), i, cfg_.model().vocab_size());
    const double loss = executor_->Evaluate(slot.mb);
    if (comm_.tp_rank() == 0) local += loss;  // each tp rank of the last stage has it
  }
  comm_.FinishSends();
  const double sum = comm_.SumToRoot(local);
  if (evaluated == 0) {
    Log(Format("[val] step %d | stopped by a signal before the first of %d batches", step,
               batches));
    return std::nullopt;
  }
  const double loss = sum / evaluated;
  if (root_) result_.val_losses.emplace_back(step, loss);
  if (events_) events_->AddScalar("val/loss", step, loss);
  Log(Format(
      "[val] step %d | val_loss %.4f | %d batches of %dx%d%s", step, loss, evaluated, batch_, seq_,
      evaluated < batches ? Format(" (stopped by a signal; %d asked)", batches).c_str() : ""));
  return loss;
}

void Trainer::Sample(int step) {
  const int interval = train_.sample_interval();
  if (interval == 0 || step % interval != 0) return;
  comm::progress::SetAction("", "text sample");
  // The prompt: the start of the validation split (read where the embedding is; the other ranks
  // only need its length).
  const int prompt_length = std::max(1, std::min(16, seq_ / 2));
  std::vector<int32_t> prompt(prompt_length), unused(prompt_length);
  if (val_data_) val_data_->EvalBatch(0, 1, prompt_length, prompt.data(), unused.data());
  const int vocab = cfg_.model().vocab_size();
  SampleOptions options;
  options.tokens = train_.sample_tokens();
  options.seed = static_cast<uint64_t>(train_.seed()) + static_cast<uint64_t>(step);
  BatchSlot slot;
  const auto last_logits = [&](const std::vector<int32_t>& window) -> std::vector<float> {
    slot.tokens = window;
    slot.View(device_, 1, static_cast<int>(window.size()), 1.0, 0, vocab);
    const memory::Tensor logits = executor_->ForwardOutput(slot.mb);
    return logits.empty() ? std::vector<float>() : LastLogitsRow(logits, vocab);
  };
  // The rank holding the head picks; a sum over the pipeline gives every stage its pick.
  const auto share = [&](const Pick& local, bool have) {
    Pick pick;
    pick.token = static_cast<int32_t>(std::lround(comm_.AllReduceSumPp(have ? local.token : 0)));
    pick.log_prob = comm_.AllReduceSumPp(have ? local.log_prob : 0.0);
    return pick;
  };
  // A stop signal ends a long sample: all ranks agree before each token (a rank that stopped
  // alone would leave its pipeline peers waiting), then the step ends and the run saves.
  const auto stop = [&] { return !comm_.AllOk(util::StopSignalReceived() == 0); };
  const Generation sample = Generate(prompt, seq_, vocab, options, last_logits, share, stop);
  comm_.FinishSends();
  if (!root_) return;
  // The data's tokenizer by generate's rule; ids where no tokenizer here can spell them (data
  // without tokenizer.json and a vocabulary other than bytes'), never another tokenizer's text.
  std::unique_ptr<data::Tokenizer> tokenizer;
  try {
    tokenizer = data::RecordedTokenizer(tokenizer_id_, cfg_.data().dir(), vocab, "the data");
  } catch (const data::DataError&) {
  }
  const auto decode = [&](const std::vector<int32_t>& tokens) {
    return tokenizer ? tokenizer->Decode(tokens) : data::IdsText(tokens);
  };
  const std::string prompt_text = decode(prompt);
  const std::string text = decode(sample.tokens);
  Log(Format("[sample] step %d | %s -> %s | %.3f nats/token under the model%s", step,
             util::Printable(prompt_text).c_str(), util::Printable(text).c_str(), sample.mean_loss,
             sample.stopped ? Format(" (stopped by a signal after %zu of %d tokens)",
                                     sample.tokens.size(), options.tokens)
                                  .c_str()
                            : ""));
  if (events_) events_->AddText("sample", step, "    " + prompt_text + " -> " + text);
}

void Trainer::FillBatches(int step, int flush) {
  for (int mb = 0; mb < microbatches_; ++mb) {
    BatchSlot& slot = slots_[mb];
    slot.tokens.resize(int64_t{batch_} * seq_);
    slot.targets.resize(slot.tokens.size());
    // The sample key is the micro-batch's global index in the step, so any pp/dp layout of the
    // same global batch reads the same samples.
    const int global_microbatch = comm_.dp_rank() * accum_ + flush * microbatches_ + mb;
    if (train_data_) {
      train_data_->TrainBatch(stage_options_.seed, step, 0, global_microbatch, batch_, seq_,
                              slot.tokens.data(), slot.targets.data());
    }
    slot.View(device_, batch_, seq_, 1.0 / tokens_per_step_, mb, cfg_.model().vocab_size());
  }
}

StepOutcome Trainer::RunStep(int step) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t bytes_before = comm_.activation_bytes_sent();
  const int64_t tp_bytes_before = comm_.tp_bytes_reduced();
  const double tp_seconds_before = comm_.tp_seconds();
  StepOutcome outcome;
  timeline_.set_recording(step - start_step_ < train_.trace_steps());
  device_spans_->set_enabled(step - start_step_ < train_.trace_steps());
  timeline_.ResetWindow();
  stage_->ZeroGrads();
  double local_loss = 0;
  for (int flush = 0; flush < flushes_; ++flush) {
    comm::progress::SetStep(step + 1, flush, flushes_);
    FillBatches(step, flush);
    const double loss = executor_->RunFlush(
        [&](int mb) -> const layer::MicroBatch& { return slots_[mb].mb; }, flush + 1 == flushes_);
    if (comm_.tp_rank() == 0) local_loss += loss;  // each tp rank of the last stage has it
  }
  executor_->RunTail([&] { OptimizerStep(step, &outcome); });
  comm::progress::SetAction("", "losses and metrics");
  comm_.FinishSends();
  outcome.loss = comm_.SumToRoot(local_loss);
  // The step's work has finished: its device spans get their host times.
  for (const device::DeviceSpans::Resolved& span : device_spans_->Resolve())
    timeline_.Record(span.name, span.category, span.start, span.end, span.track);
  if (root_) {
    if (!std::isfinite(outcome.loss) && !outcome.skipped) {
      throw NumericalError(Format("step %d: the loss is %f", step + 1, outcome.loss));
    }
    result_.train_losses.push_back(outcome.loss);
  }
  outcome.ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  outcome.peak = comm_.MaxToRoot(double(device_->allocator().peak_bytes()));
  outcome.activation_bytes = comm_.activation_bytes_sent() - bytes_before;
  outcome.tp_bytes = comm_.tp_bytes_reduced() - tp_bytes_before;
  outcome.tp_ms = (comm_.tp_seconds() - tp_seconds_before) * 1e3;
  result_.activation_bytes_per_step = outcome.activation_bytes;
  return outcome;
}

void Trainer::OptimizerStep(int step, StepOutcome* outcome) {
  if (hooks_.nan_step == step + 1) {
    // Every replica holding the layer: as a NaN from the backward would be after the
    // data-parallel all-reduce.
    for (const Stage::NamedParam& named : stage_->OwnedParams()) {
      if (named.layer_id != hooks_.nan_layer) continue;
      const float nan = std::nanf("");
      device_->CopyHostToDevice(named.param->grad.raw(), &nan, sizeof(nan));
      break;
    }
  }
  if (hooks_.kill_rank == comm_.world_rank() && hooks_.kill_step == step + 1) {
    std::fflush(stdout);
    std::raise(SIGKILL);
  }
  // Each parameter is owned by one rank of the pipeline and is identical across dp replicas:
  // sum over the pipeline, and over the tp group with each replicated parameter counted once.
  // Under ZeRO-1 (never with tp > 1) each element's final gradient is on one rank of the dp
  // group: sum over it first.
  double local_sumsq = 0;
  std::string bad;
  if (zero_) {
    local_sumsq = zero_->DpSum(zero_->SumSquares(&bad));
  } else {
    // One device wait for all of them (SumSquaresEach), then the same arithmetic per parameter.
    const std::vector<Stage::NamedParam> owned = stage_->OwnedParams();
    std::vector<const Stage::NamedParam*> counted;
    std::vector<device::Device::Region> regions;
    for (const Stage::NamedParam& named : owned) {
      if (!stage_->CountsOnce(named.param)) continue;
      const memory::Tensor& grad = named.param->grad;
      counted.push_back(&named);
      regions.push_back({grad.raw(), grad.dtype(), grad.numel()});
    }
    const std::vector<double> parts =
        regions.empty() ? std::vector<double>() : device_->SumSquaresEach(regions);
    for (size_t i = 0; i < parts.size(); ++i) {
      const double norm = std::sqrt(parts[i]);
      if (!std::isfinite(norm) && bad.empty()) bad = counted[i]->name;
      local_sumsq += norm * norm;
    }
  }
  outcome->norm = std::sqrt(comm_.AllReduceSumPp(comm_.AllReduceSumTp(local_sumsq)));
  outcome->lr = optim::LearningRate(lr_schedule_, step);
  if (!std::isfinite(outcome->norm)) {
    DiagnoseNonFinite(step, bad, outcome);  // throws unless the step is skipped
    executor_->SendTiedWeight();
    return;
  }
  if (cfg_.optim().grad_clip() > 0 && outcome->norm > cfg_.optim().grad_clip()) {
    optim::ScaleGradients(params_, cfg_.optim().grad_clip() / outcome->norm);
  }
  adamw_.Step(params_, outcome->lr, step + 1);  // under ZeRO-1: this rank's slices
  if (zero_) zero_->AllGatherValues();
  executor_->SendTiedWeight();
}

void Trainer::DiagnoseNonFinite(int step, const std::string& bad, StepOutcome* outcome) {
  // Gather where each rank found non-finite gradients; rank 0 reports them all before any rank
  // stops.
  std::string origin;
  if (stage_->has_embedding() && stage_->has_head()) {
    origin = stage_->FirstNonFiniteLayer(slots_[0].mb);
    if (!origin.empty()) origin = "; non-finite values first appear in " + origin;
  }
  const std::vector<std::string> found =
      comm_.GatherToRoot(bad.empty() ? ""
                                     : Format("rank %d (stage %s, dp %d): %s%s", comm_.world_rank(),
                                              StageList(*stage_).c_str(), comm_.dp_rank(),
                                              bad.c_str(), origin.c_str()));
  std::string report;
  for (const std::string& where : found) {
    if (!where.empty()) report += (report.empty() ? "" : "; ") + where;
  }
  std::string message = Format("step %d: non-finite gradient norm; non-finite gradients in %s",
                               step + 1, report.empty() ? "(none found)" : report.c_str());
  const bool skip = train_.nan_policy() == "skip";
  if (skip && skipped_steps_ < train_.max_skipped_steps()) {
    // Every rank saw the same norm, so all skip together: no update, the tied copy gets the
    // unchanged weight, and the next step starts from zeroed gradients.
    outcome->skipped = true;
    ++skipped_steps_;
    Log(
        Format("[nan] %s; train.nan_policy=skip: the update is skipped (%d of at most %d skipped "
               "steps)",
               message.c_str(), skipped_steps_, train_.max_skipped_steps()));
    return;
  }
  if (skip) {
    message += Format(
        "; train.nan_policy=skip, but %d steps were skipped already (train.max_skipped_steps=%d)",
        skipped_steps_, train_.max_skipped_steps());
  } else {
    message += " (train.nan_policy=stop; skip would drop this step's update)";
  }
  if (root_) std::fprintf(stderr, "bigmac: rank 0: %s\n", message.c_str());
  comm_.AllOk(false);
  throw NumericalError(message, /*reported=*/true);
}

void Trainer::WriteMetrics(int step, const StepOutcome& outcome, std::optional<double> val_loss) {
  const double peak = outcome.peak;
  // Per-rank milliseconds in compute and waiting this step.
  const auto& w = timeline_.window_ms();
  auto get = [&w](const char* key) { return w.count(key) ? w.at(key) : 0.0; };
  const nlohmann::json rank = {
      {"rank", comm_.world_rank()},
      {"forward_ms", get("forward")},
      {"backward_ms", get("backward") + get("backward_input") + get("backward_weight")},
      {"wait_ms", get("wait")},
      {"allreduce_ms", get("allreduce")},
      // The dp all-reduce's buckets, how many started during the last flush (overlapped with its
      // backward), and their time in flight (overlapping other spans).
      {"dp_buckets", executor_->dp_reducer().buckets().size()},
      {"dp_reduce_bytes", executor_->dp_reducer().bytes()},
      {"dp_tied_bytes", executor_->dp_reducer().tied_bytes()},
      {"dp_buckets_overlapped", executor_->dp_reducer().started_early()},
      {"dp_reduce_inflight_ms", get("dp_reduce")},
      // On an asynchronous device, traced steps only: the time its streams spent in the actions'
      // work and in the transport's operations (the host's forward/backward time is enqueueing).
      {"device_compute_ms", get("device_compute")},
      {"device_comm_ms", get("device_comm")},
      {"peak_bytes", device_->allocator().peak_bytes()},
      {"rss_bytes", ResidentBytes()},
      {"activation_bytes_sent", outcome.activation_bytes},
      // Tensor parallelism: this rank's all-reduce payload and time during the step.
      {"tp_allreduce_bytes", outcome.tp_bytes},
      {"tp_allreduce_ms", outcome.tp_ms}};
  const std::vector<std::string> per_rank = comm_.GatherToRoot(rank.dump());
  if (!metrics_file_) return;
  nlohmann::json ranks = nlohmann::json::array();
  for (const std::string& text : per_rank) ranks.push_back(nlohmann::json::parse(text));
  const bool clipped = cfg_.optim().grad_clip() > 0 && outcome.norm > cfg_.optim().grad_clip();
  nlohmann::json line = {{"step", step + 1},
                         {"loss", outcome.loss},
                         {"lr", outcome.lr},
                         {"grad_norm", outcome.norm},
                         {"clipped", clipped},
                         {"skipped", outcome.skipped},
                         {"step_ms", outcome.ms},
                         {"tokens_per_s", tokens_per_step_ / (outcome.ms / 1000.0)},
                         {"peak_bytes", peak},
                         {"micro_batch_size", batch_},
                         {"num_microbatches", microbatches_},
                         {"precision", cfg_.precision().dtype()},
                         {"ranks", ranks}};
  if (val_loss) line["val_loss"] = *val_loss;
  metrics_file_->Append(line.dump() + "\n");
  CheckRecordFiles();
  if (!events_) return;
  // The same numbers as the line above, under TensorBoard tags (docs/planning.md).
  static constexpr std::pair<const char*, const char*> kScalars[] = {
      {"train/loss", "loss"},
      {"train/lr", "lr"},
      {"train/grad_norm", "grad_norm"},
      {"train/tokens_per_s", "tokens_per_s"},
      {"train/step_ms", "step_ms"}};
  for (const auto& [tag, key] : kScalars) {
    events_->AddScalar(tag, step + 1, line[key].get<double>());
  }
  events_->AddScalar("memory/peak_mib", step + 1, peak / (1 << 20));
  for (const nlohmann::json& r : ranks) {
    events_->AddScalar(Format("memory/peak_mib/rank_%d", r["rank"].get<int>()), step + 1,
                       r["peak_bytes"].get<double>() / (1 << 20));
  }
  CheckRecordFiles();
}

void Trainer::ReportProgress(int step, const StepOutcome& outcome) {
  if ((step + 1) % train_.log_interval() != 0 && step != 0 && step + 1 != train_.max_steps())
    return;
  Log(
      Format("step %d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s | %.1f ms | peak %.1f "
             "MiB%s",
             step + 1, train_.max_steps(), outcome.loss, outcome.lr, outcome.norm,
             tokens_per_step_ / (outcome.ms / 1000.0), outcome.ms, outcome.peak / (1 << 20),
             skipped_steps_ > 0 ? Format(" | skipped %d", skipped_steps_).c_str() : ""));
}

void Trainer::Save(int step) {
  comm::progress::SetAction("", "checkpoint");
  const checkpoint::SaveStats stats =
      checkpoint::Save(cfg_.checkpoint().dir(), step, resolved_, stage_->State(), adamw_, comm_,
                       cfg_.checkpoint().keep_last(), tokenizer_id_);
  last_saved_step_ = step;
  Log(Format("[ckpt] saved step %d to %s: %.2f MB in %.3f s (%.1f MB/s)", step, stats.dir.c_str(),
             double(stats.bytes) / 1e6, stats.seconds,
             double(stats.bytes) / 1e6 / std::max(stats.seconds, 1e-9)));
}

bool Trainer::StopRequested(int step) {
  // SIGTERM/SIGINT on any rank stops every rank after this step (they agree first, so no rank is
  // left waiting for a peer that stopped).
  const int signal_number = util::StopSignalReceived();
  if (comm_.AllOk(signal_number == 0)) return false;
  stopped_at_ = step + 1;
  const std::string& checkpoint_root = cfg_.checkpoint().dir();
  std::string saved = "no checkpoint (checkpoint.dir is empty)";
  if (!checkpoint_root.empty() && !cfg_.checkpoint().save_on_signal()) {
    saved = "no checkpoint (checkpoint.save_on_signal=false)";
  } else if (!checkpoint_root.empty()) {
    if (last_saved_step_ != step + 1) Save(step + 1);
    saved = Format("the checkpoint of step %d in %s", step + 1, checkpoint_root.c_str());
  }
  Log(Format("[signal] %s: stopping after step %d with %s. Continue with --resume auto.",
             signal_number ? util::SignalName(signal_number) : "stop signal on another rank",
             step + 1, saved.c_str()));
  return true;
}

void Trainer::Report(int steps_run) {
  const std::string stages = StageList(*stage_);
  const memory::DeviceAllocator& allocator = device_->allocator();
  const std::vector<std::string> memory_lines = comm_.GatherToRoot(
      Format("[memory] rank %d (pp %d, dp %d, stage %s): peak %.2f MiB of %.2f MiB capacity, "
             "activations peak "
             "%.2f MiB, at most %d micro-batch stage(s) of activations in flight, %lld parameters, "
             "optimizer state for %lld (%s); %lld system allocations after the first step",
             comm_.world_rank(), comm_.pp_rank(), comm_.dp_rank(), stages.c_str(),
             double(result_.peak_bytes) / (1 << 20), double(allocator.capacity_bytes()) / (1 << 20),
             double(stage_->max_activation_bytes()) / (1 << 20), result_.max_in_flight,
             static_cast<long long>(result_.parameter_count),
             static_cast<long long>(adamw_.StateElements()), OptimizerMemory().c_str(),
             static_cast<long long>(result_.steady_state_system_allocations)));
  for (const std::string& line : memory_lines) Log(line);
  std::string layer_ranges;
  for (const partition::StageRange& range : stage_->ranges()) {
    layer_ranges += (layer_ranges.empty() ? "" : ", ") +
                    partition::FormatRange(range, resolved_.partition.origin);
  }
  const auto& totals = timeline_.total_ms();
  auto total = [&totals](const char* key) { return totals.count(key) ? totals.at(key) : 0.0; };
  const std::vector<std::string> stage_lines = comm_.GatherToRoot(Format(
      "[stage] rank %d (pp %d, dp %d, stage %s, %s): forward %.1f ms, backward %.1f ms, waiting "
      "%.1f ms, "
      "all-reduce %.1f ms, optimizer %.1f ms over %d step(s); %.2f MB of activations and "
      "gradients sent per step (%s)",
      comm_.world_rank(), comm_.pp_rank(), comm_.dp_rank(), stages.c_str(), layer_ranges.c_str(),
      total("forward"), total("backward") + total("backward_input") + total("backward_weight"),
      total("wait"), total("allreduce"), total("optimizer"), steps_run,
      double(result_.activation_bytes_per_step) / 1e6,
      memory::DTypeName(stage_->activation_dtype()).c_str()));
  for (const std::string& line : stage_lines) Log(line);
}

std::string Trainer::OptimizerMemory() const {
  // Two fp32 moments per element with state.
  const double mib = double(adamw_.StateElements()) * 8 / (1 << 20);
  if (!zero_) return Format("%.2f MiB of AdamW moments, not sharded", mib);
  return Format("%.2f MiB of AdamW moments: ZeRO-1 shard of %.2f MiB over dp %d", mib,
                double(zero_->total_elements()) * 8 / (1 << 20), comm_.dp_size());
}

void Trainer::WriteTraceAndDump() {
  const std::string& output_dir = train_.output_dir();
  if (!output_dir.empty()) {
    const std::vector<std::string> events = comm_.GatherToRoot(timeline_.TraceEvents(
        comm_.world_rank(),
        Format("rank %d (pp %d, dp %d)", comm_.world_rank(), comm_.pp_rank(), comm_.dp_rank())));
    if (root_ && metrics_file_) {
      if (!metrics_file_->Close()) CheckRecordFiles();
      if (events_ && !events_->Close()) CheckRecordFiles();
      const std::string trace = output_dir + "/trace.json";
      if (std::string problem = util::WriteWholeFile(trace, metrics::MergeTraces(events));
          !problem.empty()) {
        OutputFailed(problem);
      } else if (!metrics_file_->failed()) {
        Log("[train] wrote " + output_dir + "/metrics.jsonl and " + trace +
            " (open it at https://ui.perfetto.dev)");
      }
    }
  }
  for (layer::Param* param : params_) {
    // Host copies in double, whatever the master dtype.
    memory::Tensor wide(device_, param->value.shape(), memory::DType::kF64);
    wide.ConvertFrom(param->value);
    std::vector<double> host(wide.numel());
    wide.CopyToHost(host.data());
    result_.final_parameters.insert(result_.final_parameters.end(), host.begin(), host.end());
  }
  if (!options_.dump_dir.empty()) {
    if (comm_.dp_rank() == 0) {
      for (const std::string& problem : DumpWeights(*stage_, options_.dump_dir, comm_))
        OutputFailed(problem);
    }
    if (root_) {
      std::string losses;
      for (double loss : result_.train_losses) losses += Format("%.17g\n", loss);
      if (std::string problem = util::WriteWholeFile(options_.dump_dir + "/losses.txt", losses);
          !problem.empty()) {
        OutputFailed(problem);
      }
    }
  }
}

TrainResult Trainer::Run() {
  LogModel();
  Resume();
  OpenMetrics();          // once the inputs (data, checkpoint) have been read
  Evaluate(start_step_);  // the starting point: about ln(vocab_size) for a fresh model
  adamw_.InitState(params_);
  memory::DeviceAllocator& allocator = device_->allocator();
  int64_t system_allocations_after_first_step = -1;
  const std::string& checkpoint_root = cfg_.checkpoint().dir();
  for (int step = start_step_; step < train_.max_steps(); ++step) {
    if (step == start_step_ + 1)
      system_allocations_after_first_step = allocator.system_allocations();
    running_step_ = step + 1;
    comm::progress::SetStep(step + 1);
    // Testing hook: the named rank stops responding, so that tests can show a peer's deadline
    // firing with a diagnostic instead of a hang.
    if (hooks_.stall_rank == comm_.world_rank() && hooks_.stall_step <= step + 1) {
      std::this_thread::sleep_for(std::chrono::hours(1));
    }
    const StepOutcome outcome = RunStep(step);
    ReportProgress(step, outcome);
    std::optional<double> val_loss;
    if ((train_.eval_interval() > 0 && (step + 1) % train_.eval_interval() == 0) ||
        step + 1 == train_.max_steps()) {
      val_loss = Evaluate(step + 1);
    }
    WriteMetrics(step, outcome, val_loss);
    Sample(step + 1);
    const int interval = cfg_.checkpoint().interval();
    if (!checkpoint_root.empty() &&
        ((interval > 0 && (step + 1) % interval == 0) || step + 1 == train_.max_steps())) {
      Save(step + 1);
    }
    if (StopRequested(step)) break;
  }
  // Steady state: after the first step every buffer comes from the allocator's cache.
  result_.steady_state_system_allocations =
      system_allocations_after_first_step < 0
          ? 0
          : allocator.system_allocations() - system_allocations_after_first_step;
  result_.skipped_steps = skipped_steps_;
  result_.stopped_at_step = stopped_at_;
  result_.peak_bytes = allocator.peak_bytes();
  result_.max_in_flight = stage_->max_in_flight();
  Report((stopped_at_ > 0 ? stopped_at_ : train_.max_steps()) - start_step_);
  WriteTraceAndDump();
  return std::move(result_);
}

}  // namespace

TrainResult Train(const config::ResolvedConfig& resolved, comm::PipelineComm& comm,
                  const TrainOptions& options) {
  Trainer trainer(resolved, comm, options);
  return trainer.Run();
}

TrainResult TrainSingleRank(const config::ResolvedConfig& config,
                            const std::function<void(const std::string&)>& log) {
  std::unique_ptr<comm::PipelineComm> comm = comm::MakeLocalPipelineComm();
  TrainOptions options;
  options.log = log;
  return Train(config, *comm, options);
}

}  // namespace bigmac::engine
