#include "core/engine/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/resume_preview.h"
#include "core/comm/progress.h"
#include "core/config/resolve.h"
#include "core/data/blend.h"
#include "core/data/dataset.h"
#include "core/data/error.h"
#include "core/data/shard.h"
#include "core/data/tokenizer.h"
#include "core/device/device_spans.h"
#include "core/engine/executor.h"
#include "core/engine/generate.h"
#include "core/engine/rank_model.h"
#include "core/engine/tp_group.h"
#include "core/engine/trainer_internal.h"
#include "core/engine/zero_shard.h"
#include "core/memory/allocator.h"
#include "core/metrics/timeline.h"
#include "core/optim/adamw.h"
#include "core/schedule/schedule.h"
#include "core/util/format.h"
#include "core/util/output_file.h"
#include "core/util/stop_signal.h"

namespace bigmac::engine {
using util::Format;

namespace {

// How a wait for a sum over the pipeline is named (the gradient norm, a sampled token).
constexpr char kPipelineSum[] = "OptimizerStep: all-reduce of the gradient norm over the pipeline";

}  // namespace

// ---- The training loop ------------------------------------------------------------------------

TrainResult Trainer::Run() {
  report_->Model(data_ ? data_->Summary() : "(data on other ranks)");
  // The moments exist before a checkpoint is read into them, as before a fresh first step.
  adamw_.InitState(params_);
  Resume();
  if (saver_) {
    const double seconds = saver_->Prepare(model_->State(), adamw_, comm_);
    Log(
        Format("[ckpt] snapshot buffer ready: %.2f MiB of host memory, touched in %.3f s (so the "
               "first save costs its step no more than the later ones)",
               double(saver_->buffer_bytes()) / (1 << 20), seconds));
  }
  if (datasets_.size() > 1) {
    // The exact tokens the blend will give each dataset over the steps to run (a function of the
    // sample indices alone); a count past 2^32 samples would take seconds, so it is left out.
    const int64_t samples =
        int64_t{train_.max_steps() - start_step_} * resolved_.batch.global_batch;
    if (samples <= (int64_t{1} << 32)) {
      std::vector<int64_t> counts;
      sampler_.Count(position_.next_sample, position_.next_sample + samples, &counts);
      Log(Format("[data] steps %d-%d draw %lld samples: %s", start_step_ + 1, train_.max_steps(),
                 static_cast<long long>(samples), DatasetTokens(counts).c_str()));
    }
  }
  report_->Open(start_step_);  // once the inputs (data, checkpoint) have been read
  Evaluate(start_step_);       // the starting point: about ln(vocab_size) for a fresh model
  memory::DeviceAllocator& allocator = device_->allocator();
  int64_t system_allocations_after_first_step = -1;
  for (int step = start_step_; step < train_.max_steps(); ++step) {
    if (step == start_step_ + 1)
      system_allocations_after_first_step = allocator.system_allocations();
    running_step_ = step + 1;
    comm::progress::SetStep(step + 1);
    // Testing hook: the named rank stops responding, so that tests can show a peer's deadline
    // firing with a diagnostic instead of a hang.
    if (faults_.stall_rank == comm_.world().rank() && faults_.stall_step <= step + 1) {
      std::this_thread::sleep_for(std::chrono::hours(1));
    }
    StepOutcome outcome = RunStep(step);
    report_->Progress(step, outcome);
    std::optional<double> val_loss;
    if ((train_.eval_interval() > 0 && (step + 1) % train_.eval_interval() == 0) ||
        step + 1 == train_.max_steps()) {
      val_loss = Evaluate(step + 1);
    }
    Sample(step + 1);
    Checkpoint(step, &outcome);
    report_->Metrics(step, outcome, val_loss);
    if (StopRequested(step)) break;
  }
  FinishSave();
  // Steady state: after the first step every buffer comes from the allocator's cache.
  result_.steady_state_system_allocations =
      system_allocations_after_first_step < 0
          ? 0
          : allocator.system_allocations() - system_allocations_after_first_step;
  result_.skipped_steps = skipped_steps_;
  result_.stopped_at_step = stopped_at_;
  result_.peak_bytes = allocator.peak_bytes();
  result_.checkpoint_buffer_bytes = saver_ ? saver_->buffer_bytes() : 0;
  result_.max_in_flight = model_->max_in_flight();
  report_->Summary(result_, (stopped_at_ > 0 ? stopped_at_ : train_.max_steps()) - start_step_);
  report_->TraceAndDump(result_.train_losses);
  result_.final_parameters = FinalParameters();
  result_.output_failures = report_->output_failures();
  return std::move(result_);
}

StepOutcome Trainer::RunStep(int step) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t bytes_before = comm_.links().activation_bytes_sent();
  const int64_t tp_bytes_before = comm_.tp().blocking_bytes();
  const double tp_seconds_before = comm_.tp().blocking_seconds();
  StepOutcome outcome;
  const bool tracing = step - start_step_ < train_.trace_steps();
  timeline_.set_recording(tracing);
  // A device with its own clock times every step's computations (the straggler report's
  // compute time); the trace keeps only the traced steps'.
  device_spans_->set_enabled(tracing || device_->has_timed_events());
  comm_.links().set_record_messages(tracing);
  comm_.links().TakeMessageSpans();  // an evaluation's or a generation's since the last step
  timeline_.ResetWindow();
  model_->ZeroGrads();
  double local_loss = 0;
  for (int flush = 0; flush < flushes_; ++flush) {
    comm::progress::SetStep(step + 1, flush, flushes_);
    FillBatches(step, flush);
    const double loss = executor_->RunFlush(
        [&](int mb) -> const layer::MicroBatch& { return slots_[mb].mb; }, flush + 1 == flushes_);
    if (comm_.tp().rank() == 0) local_loss += loss;  // each tp rank of the last stage has it
  }
  executor_->RunTail([&] { OptimizerStep(step, &outcome); });
  comm::progress::SetAction("", "losses and metrics");
  comm_.links().FinishSends();
  outcome.loss = comm_.world().SumToRoot(local_loss, "the sum of losses on rank 0");
  // The step's work has finished: its device spans get their host times.
  for (const device::DeviceSpans::Resolved& span : device_spans_->Resolve())
    timeline_.Record(span.name, span.category, span.start, span.end, span.track);
  device_spans_->set_enabled(false);  // an evaluation or a sample is no step's
  for (const comm::MessageSpan& span : comm_.links().TakeMessageSpans())
    timeline_.RecordMessage(span.name, span.start, span.end, span.in_compute);
  if (root_) {
    if (!std::isfinite(outcome.loss) && !outcome.skipped) {
      throw NumericalError(Format("step %d: the loss is %f", step + 1, outcome.loss));
    }
    result_.train_losses.push_back(outcome.loss);
  }
  outcome.ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  outcome.peak = comm_.world().MaxToRoot(double(device_->allocator().peak_bytes()),
                                         "the peak memory on rank 0");
  outcome.activation_bytes = comm_.links().activation_bytes_sent() - bytes_before;
  outcome.tp_bytes = comm_.tp().blocking_bytes() - tp_bytes_before;
  outcome.tp_ms = (comm_.tp().blocking_seconds() - tp_seconds_before) * 1e3;
  outcome.skipped_steps = skipped_steps_;
  result_.activation_bytes_per_step = outcome.activation_bytes;
  AdvanceDataPosition();
  for (int64_t samples : position_.samples) outcome.dataset_tokens.push_back(samples * seq_);
  return outcome;
}

void Trainer::OptimizerStep(int step, StepOutcome* outcome) {
  if (saver_) saver_->GuardState();  // a snapshot's copies may still be reading the state
  if (faults_.nan_step == step + 1) {
    // Every replica holding the layer: as a NaN from the backward would be after the
    // data-parallel all-reduce.
    for (const RankModel::NamedParam& named : model_->OwnedParams()) {
      if (named.layer_id != faults_.nan_layer) continue;
      const float nan = std::nanf("");
      device_->CopyHostToDevice(named.param->grad.raw(), &nan, sizeof(nan));
      break;
    }
  }
  if (faults_.kill_rank == comm_.world().rank() && faults_.kill_step == step + 1) {
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
    const std::vector<RankModel::NamedParam> owned = model_->OwnedParams();
    std::vector<const RankModel::NamedParam*> counted;
    std::vector<device::Device::Region> regions;
    for (const RankModel::NamedParam& named : owned) {
      if (!model_->CountsOnce(named.param)) continue;
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
  outcome->norm = std::sqrt(comm_.pp().Sum(
      comm_.tp().Sum(local_sumsq,
                     "OptimizerStep: all-reduce of the gradient norm over the tp group"),
      kPipelineSum));
  outcome->lr = optim::LearningRate(lr_schedule_, step);
  if (!std::isfinite(outcome->norm)) {
    DiagnoseNonFinite(step, bad, outcome);  // throws unless the step is skipped
    executor_->SendTiedWeight();
    return;
  }
  // The clip scales the gradients as AdamW reads them (no pass over them of its own).
  const bool clip = cfg_.optim().grad_clip() > 0 && outcome->norm > cfg_.optim().grad_clip();
  adamw_.Step(params_, outcome->lr, step + 1,  // under ZeRO-1: this rank's slices
              clip ? cfg_.optim().grad_clip() / outcome->norm : 1.0);
  if (zero_) zero_->AllGatherValues();
  executor_->SendTiedWeight();
}

// ---- Set-up and the parts of a step ------------------------------------------------------------

Trainer::Trainer(const config::ResolvedConfig& resolved, comm::PipelineComm& comm,
                 const TrainOptions& options)
    : resolved_(resolved),
      cfg_(resolved.values()),
      train_(cfg_.train()),
      comm_(comm),
      options_(options),
      faults_(options.faults),
      root_(comm.world().rank() == 0),
      batch_(train_.micro_batch_size()),
      seq_(train_.seq_length()),
      accum_(train_.gradient_accumulation_steps()),
      microbatches_(resolved.batch.num_microbatches),
      flushes_(resolved.batch.flushes_per_step),
      // Every token loss is scaled by 1/(tokens per optimizer step over all replicas), so the
      // summed gradient is the mean over the global batch, whatever the pp/dp split.
      tokens_per_step_(double(batch_) * seq_ * accum_ * resolved.dp),
      device_(options.device),
      datasets_(data::BlendEntries(resolved.data, cfg_.data().dir())),
      dataset_names_(data::DatasetNames(datasets_)),
      sampler_(data::BlendSampler::Of(datasets_, static_cast<uint64_t>(train_.seed()))),
      adamw_({cfg_.optim().beta1(), cfg_.optim().beta2(), cfg_.optim().eps(),
              cfg_.optim().weight_decay()}),
      lr_schedule_{cfg_.optim().lr(), cfg_.optim().min_lr(), cfg_.optim().warmup_steps(),
                   train_.max_steps()},
      slots_(microbatches_) {
  if (device_ == nullptr) {
    owned_device_ = device::MakeCpuDevice(
        comm.world().rank(),
        memory::CpuCapacity(resolved.memory_limit_bytes, options.ranks_on_node));
    device_ = owned_device_.get();
  }
  model_options_.dims = config::ModelDimsOf(cfg_);
  model_options_.bf16 = resolved.bf16;
  model_options_.device = device_;
  model_options_.activation_checkpointing = train_.activation_checkpointing();
  model_options_.seed = static_cast<uint64_t>(train_.seed());
  model_options_.model = ModelOf(resolved);
  if (comm.tp().size() > 1) {
    tp_group_ = std::make_unique<CommTpGroup>(comm.tp());
    model_options_.tp = tp_group_.get();
  }
  model_ = std::make_unique<RankModel>(model_options_, resolved.partition, comm.pp().rank());

  // The ranks' layers together must cover every layer_id once.
  if (std::string problem = CheckLayerCoverage(
          comm.pp().AllGatherInts(model_->LayerIds(), "the pipeline's layer_ids (all-gather)"),
          cfg_.model().num_layers());
      !problem.empty()) {
    throw std::logic_error("stage layout: " + problem);
  }

  // Only the ranks with the embedding (tokens) or the head (targets) read data.
  if (model_->has_embedding() || model_->has_head()) {
    data_ = std::make_unique<data::BlendedData>(data::BlendedData::Options{
        cfg_.data().dir(), cfg_.data().train_files(), cfg_.data().val_files(), resolved.data});
    data_->CheckFits(seq_, cfg_.model().vocab_size());
    if (root_) {
      for (const std::string& line : data_->Describe()) Log("[cfg] data " + line);
      for (const std::string& warning : data_->Warnings(seq_, batch_, train_.eval_batches()))
        Log("[data] warning: " + warning);
    }
  }
  position_.samples.assign(datasets_.size(), 0);
  if (const auto manifest =
          data::ReadTokenizerManifest(data::DataHome(resolved.data, cfg_.data().dir())))
    tokenizer_id_ = manifest->Id();

  const schedule::ScheduleSpec spec{resolved.schedule, comm.pp().size(), microbatches_,
                                    cfg_.parallel().virtual_stages(),
                                    !train_.activation_checkpointing()};
  if (faults_.mismatch_rank == comm.world().rank()) {
    executor_ = std::make_unique<Executor>(
        model_.get(), &comm, spec, cfg_.model().hidden_size(),
        schedule::MismatchForTesting(schedule::BuildRankActions(spec, comm.pp().rank())),
        schedule::BuildStepTail(spec, comm.pp().rank()));
  } else {
    executor_ = std::make_unique<Executor>(model_.get(), &comm, spec, cfg_.model().hidden_size());
  }
  executor_->set_timeline(&timeline_);
  device_spans_ = std::make_unique<device::DeviceSpans>(device_);
  executor_->set_device_spans(device_spans_.get());
  comm.set_device_spans(device_spans_.get());
  DpReduceOptions dp_reduce;
  dp_reduce.overlap = cfg_.parallel().overlap_dp_reduce();
  dp_reduce.bucket_bytes = resolved.dp_bucket_bytes;
  dp_reduce.shard = cfg_.parallel().zero_stage() == 1;
  executor_->set_dp_reduce(dp_reduce);
  if (dp_reduce.shard && comm.dp().size() > 1) {
    zero_ = std::make_unique<ZeroShards>(executor_->dp_reducer().buckets(), &comm.dp(), device_);
    zero_->InitState(&adamw_);  // before a checkpoint's moments arrive (read into the slices)
  }
  const bool stops = faults_.sigstop_rank == comm.world().rank();
  const bool slow = faults_.slow_rank == comm.world().rank() && faults_.slow_rank_ms > 0;
  if (stops || slow) {
    const int microbatch = std::min(1, microbatches_ - 1);
    executor_->set_action_hook([this, microbatch, stops, slow](const schedule::Action& action) {
      if (action.op != schedule::Op::kForward) return;
      if (slow) std::this_thread::sleep_for(std::chrono::milliseconds(faults_.slow_rank_ms));
      if (stops && running_step_ == faults_.sigstop_step && action.microbatch == microbatch) {
        std::fflush(stdout);
        std::raise(SIGSTOP);
      }
    });
  }
  for (const RankModel::NamedParam& named : model_->OwnedParams()) params_.push_back(named.param);
  result_.parameter_count = model_->OwnedParameterCount();
  // Messages in flight move on while this rank computes (core/util/compute_progress.h): the
  // transport's non-blocking progress, from the GEMMs, at most every 50 us. A rank alone in its
  // job has none: without it, the compute loops skip a clock read per chunk (0.3% of the
  // llama_20m step, bench/NOTES.md lever 24).
  if (comm.world().size() > 1) util::SetComputeProgress([&comm] { comm.Progress(); }, 50e-6);
  if (!cfg_.checkpoint().dir().empty())
    saver_ = std::make_unique<checkpoint::Saver>(cfg_.checkpoint().async());
  report_ = std::make_unique<RunReport>(RunView{resolved, comm, options, device_, *model_,
                                                *executor_, adamw_, zero_.get(), timeline_});
  report_->set_dataset_names(dataset_names_);
}

std::vector<double> Trainer::FinalParameters() const {
  std::vector<double> all;
  for (layer::Param* param : params_) {
    // Host copies in double, whatever the master dtype.
    memory::Tensor wide(device_, param->value.shape(), memory::DType::kF64);
    wide.ConvertFrom(param->value);
    std::vector<double> host(wide.numel());
    wide.CopyToHost(host.data());
    all.insert(all.end(), host.begin(), host.end());
  }
  return all;
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
  const checkpoint::Manifest manifest = checkpoint::ReadCheckedManifest(step_dir);
  data::CheckSameTokenizer(manifest.tokenizer(), data::DataHome(resolved_.data, cfg_.data().dir()),
                           step_dir);
  const auto load_start = std::chrono::steady_clock::now();
  start_step_ =
      static_cast<int>(checkpoint::Load(step_dir, resolved_, model_->State(), adamw_, comm_));
  model_->RefreshComputeCopies();
  RestoreDataPosition(manifest, start_step_);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  const double bytes = comm_.world().SumToRoot(
      comm_.dp().rank() == 0 ? double(3 * result_.parameter_count * sizeof(float)) : 0.0,
      "the bytes of the checkpoint read, summed on rank 0");
  Log(Format("[ckpt] resumed from %s at step %d: read %.2f MB in %.3f s (%.1f MB/s)",
             step_dir.c_str(), start_step_, bytes / 1e6, seconds,
             bytes / 1e6 / std::max(seconds, 1e-9)));
}

void Trainer::FillBatches(int step, int flush) {
  for (int mb = 0; mb < microbatches_; ++mb) {
    BatchSlot& slot = slots_[mb];
    slot.tokens.resize(int64_t{batch_} * seq_);
    slot.targets.resize(slot.tokens.size());
    // The sample key is the micro-batch's global index in the step, so any pp/dp layout of the
    // same global batch reads the same samples.
    const int global_microbatch = comm_.dp().rank() * accum_ + flush * microbatches_ + mb;
    if (data_) {
      data_->TrainBatch(sampler_, position_.next_sample, model_options_.seed, step,
                        global_microbatch, batch_, seq_, slot.tokens.data(), slot.targets.data());
    }
    slot.View(device_, batch_, seq_, 1.0 / tokens_per_step_, mb, cfg_.model().vocab_size());
  }
}

void Trainer::AdvanceDataPosition() {
  const int64_t samples = resolved_.batch.global_batch;
  if (datasets_.size() > 1) {
    sampler_.Count(position_.next_sample, position_.next_sample + samples, &position_.samples);
  } else {
    position_.samples[0] += samples;
  }
  position_.next_sample += samples;
}

void Trainer::RestoreDataPosition(const checkpoint::Manifest& manifest, int step) {
  position_.samples.assign(datasets_.size(), 0);
  const bool one = datasets_.size() == 1;
  if (!manifest.has_data()) {
    // Written before positions were saved, by a run of one dataset: `step` global batches in (a
    // new blend's datasets start at 0).
    position_.next_sample = int64_t{step} * resolved_.batch.global_batch;
    if (one) position_.samples[0] = position_.next_sample;
  } else {
    position_.next_sample = manifest.data().next_sample();
    const auto& saved = manifest.data().datasets();
    if (checkpoint::BlendChanges(manifest.config(), resolved_).empty() &&
        saved.size() == static_cast<int>(datasets_.size())) {
      // The same blend (a moved data.dir included): dataset by dataset.
      for (int d = 0; d < saved.size(); ++d) position_.samples[d] = saved[d].samples();
    } else {
      // Another blend (--allow-data-change): the k-th use of a path keeps the k-th saved count.
      std::map<std::string, int> used;
      for (size_t d = 0; d < datasets_.size(); ++d) {
        int k = used[datasets_[d].path]++;
        for (const checkpoint::DatasetDrawn& drawn : saved) {
          if (drawn.path() == datasets_[d].path && k-- == 0) {
            position_.samples[d] = drawn.samples();
            break;
          }
        }
      }
    }
  }
  if (!one) {
    Log(Format("[data] resumed at sample %lld: trained on so far %s",
               static_cast<long long>(position_.next_sample),
               DatasetTokens(position_.samples).c_str()));
  }
}

std::string Trainer::DatasetTokens(const std::vector<int64_t>& samples) const {
  std::vector<std::string> parts;
  for (size_t d = 0; d < datasets_.size(); ++d) {
    parts.push_back(Format("%s %lld tokens", dataset_names_[d].c_str(),
                           static_cast<long long>(samples[d] * seq_)));
  }
  return util::Join(parts, ", ");
}

std::optional<double> Trainer::Evaluate(int step) {
  comm::progress::SetAction("", "evaluation");
  const int batches = train_.eval_batches();
  const int datasets = static_cast<int>(datasets_.size());
  double loss = 0;
  int evaluated = batches;
  std::vector<std::string> parts;
  for (int d = 0; d < datasets; ++d) {
    const double dataset_loss = EvaluateDataset(d, batches, &evaluated);
    if (evaluated == 0 || (datasets > 1 && evaluated < batches)) {
      // A blend's loss needs every dataset's: a stop part-way leaves none.
      Log(Format("[val] step %d | stopped by a signal %s", step,
                 datasets > 1
                     ? Format("during %s's %d batches", dataset_names_[d].c_str(), batches).c_str()
                     : Format("before the first of %d batches", batches).c_str()));
      return std::nullopt;
    }
    loss += datasets_[d].weight * dataset_loss;
    if (datasets == 1) continue;
    parts.push_back(Format("%s %.4f", dataset_names_[d].c_str(), dataset_loss));
    if (root_) report_->DatasetValLoss(step, dataset_names_[d], dataset_loss);
  }
  if (root_) result_.val_losses.emplace_back(step, loss);
  report_->ValLoss(step, loss);
  Log(Format(
      "[val] step %d | val_loss %.4f | %d batches of %dx%d%s%s", step, loss, evaluated, batch_,
      seq_,
      datasets > 1 ? Format(" per dataset, weighted: %s", util::Join(parts, ", ").c_str()).c_str()
                   : "",
      evaluated < batches ? Format(" (stopped by a signal; %d asked)", batches).c_str() : ""));
  return loss;
}

double Trainer::EvaluateDataset(int d, int batches, int* evaluated) {
  double local = 0;
  BatchSlot slot;
  slot.tokens.resize(int64_t{batch_} * seq_);
  slot.targets.resize(slot.tokens.size());
  *evaluated = batches;
  // Rounds of one batch per dp replica. A long evaluation ends on a stop signal: all ranks agree
  // before each round (every rank runs the same rounds), so none waits for a peer that stopped.
  for (int first = 0; first < batches; first += comm_.dp().size()) {
    if (!comm_.world().AllOk(util::StopSignalReceived() == 0)) {
      *evaluated = first;
      break;
    }
    const int i = first + comm_.dp().rank();
    if (i >= batches) continue;
    if (data_) {
      data_->dataset(d).val.EvalBatch(i, batch_, seq_, slot.tokens.data(), slot.targets.data());
    }
    slot.View(device_, batch_, seq_, 1.0 / (double(batch_) * seq_), i, cfg_.model().vocab_size());
    const double loss = executor_->Evaluate(slot.mb);
    if (comm_.tp().rank() == 0) local += loss;  // each tp rank of the last stage has it
  }
  comm_.links().FinishSends();
  const double sum = comm_.world().SumToRoot(local, "the sum of losses on rank 0");
  return *evaluated > 0 ? sum / *evaluated : 0.0;
}

void Trainer::Sample(int step) {
  const int interval = train_.sample_interval();
  if (interval == 0 || step % interval != 0) return;
  comm::progress::SetAction("", "text sample");
  // The prompt: the start of the validation split (read where the embedding is; the other ranks
  // only need its length).
  const int prompt_length = std::max(1, std::min(16, seq_ / 2));
  std::vector<int32_t> prompt(prompt_length), unused(prompt_length);
  if (data_) data_->dataset(0).val.EvalBatch(0, 1, prompt_length, prompt.data(), unused.data());
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
    pick.token =
        static_cast<int32_t>(std::lround(comm_.pp().Sum(have ? local.token : 0, kPipelineSum)));
    pick.log_prob = comm_.pp().Sum(have ? local.log_prob : 0.0, kPipelineSum);
    return pick;
  };
  // A stop signal ends a long sample: all ranks agree before each token (a rank that stopped
  // alone would leave its pipeline peers waiting), then the step ends and the run saves.
  const auto stop = [&] { return !comm_.world().AllOk(util::StopSignalReceived() == 0); };
  const Generation sample = Generate(prompt, seq_, vocab, options, last_logits, share, stop);
  comm_.links().FinishSends();
  if (!root_) return;
  // The data's tokenizer by generate's rule; ids where no tokenizer here can spell them (data
  // without tokenizer.json and a vocabulary other than bytes'), never another tokenizer's text.
  std::unique_ptr<data::Tokenizer> tokenizer;
  try {
    tokenizer = data::RecordedTokenizer(
        tokenizer_id_, data::DataHome(resolved_.data, cfg_.data().dir()), vocab, "the data");
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
  report_->Sample(step, prompt_text + " -> " + text);
}

void Trainer::DiagnoseNonFinite(int step, const std::string& bad, StepOutcome* outcome) {
  // Gather where each rank found non-finite gradients; rank 0 reports them all before any rank
  // stops.
  std::string origin;
  if (model_->has_embedding() && model_->has_head()) {
    origin = model_->FirstNonFiniteLayer(slots_[0].mb);
    if (!origin.empty()) origin = "; non-finite values first appear in " + origin;
  }
  const std::vector<std::string> found = comm_.world().GatherToRoot(
      bad.empty()
          ? ""
          : Format("rank %d (stage %s, dp %d): %s%s", comm_.world().rank(),
                   StageList(*model_).c_str(), comm_.dp().rank(), bad.c_str(), origin.c_str()));
  std::string report;
  for (const std::string& where : found) {
    if (!where.empty()) report += (report.empty() ? "" : "; ") + where;
  }
  std::string message = Format("step %d: non-finite gradient norm; non-finite gradients in %s",
                               step + 1, report.empty() ? "(none found)" : report.c_str());
  const bool skip = resolved_.nan_policy == config::NanPolicy::kSkip;
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
  comm_.world().AllOk(false);
  // Every rank stops here together, so a save in flight can still commit; if it cannot, that is
  // said, and the stop is still the NaN's.
  try {
    FinishSave();
  } catch (const checkpoint::CheckpointError& error) {
    if (root_) std::fprintf(stderr, "bigmac: rank 0: %s\n", error.what());
  }
  throw NumericalError(message, /*reported=*/true);
}

void Trainer::Checkpoint(int step, StepOutcome* outcome) {
  if (!saver_) return;
  const auto start = std::chrono::steady_clock::now();
  checkpoint_wait_seconds_ = 0;
  if (std::optional<checkpoint::SaveStats> stats = saver_->Poll(comm_)) LogSaved(*stats);
  const int interval = cfg_.checkpoint().interval();
  if ((interval > 0 && (step + 1) % interval == 0) || step + 1 == train_.max_steps())
    Save(step + 1);
  outcome->checkpoint_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  outcome->checkpoint_wait_ms = checkpoint_wait_seconds_ * 1000;
}

void Trainer::Save(int step) {
  comm::progress::SetAction("", "checkpoint");
  checkpoint::DataPosition data;
  data.set_next_sample(position_.next_sample);
  for (size_t d = 0; d < datasets_.size(); ++d) {
    checkpoint::DatasetDrawn* drawn = data.add_datasets();
    drawn->set_path(datasets_[d].path);
    drawn->set_weight(datasets_[d].weight);
    drawn->set_samples(position_.samples[d]);
    drawn->set_tokens(position_.samples[d] * seq_);
  }
  const checkpoint::SaveRequest request{
      cfg_.checkpoint().dir(), step,    &resolved_,     cfg_.checkpoint().keep_last(),
      tokenizer_id_,           faults_, std::move(data)};
  // At most one save in flight: an unfinished one is waited for first, and the wait is logged.
  if (std::optional<checkpoint::SaveStats> previous =
          saver_->Start(request, model_->State(), adamw_, comm_)) {
    LogSaved(*previous);
  }
  last_saved_step_ = step;
  if (!cfg_.checkpoint().async()) FinishSave();
}

void Trainer::FinishSave() {
  if (!saver_) return;
  if (std::optional<checkpoint::SaveStats> stats = saver_->Finish(comm_)) LogSaved(*stats);
}

void Trainer::LogSaved(const checkpoint::SaveStats& stats) {
  const double mb = double(stats.bytes) / 1e6;
  if (!stats.async) {
    Log(Format("[ckpt] saved step %lld to %s: %.2f MB in %.3f s (%.1f MB/s)",
               static_cast<long long>(stats.step), stats.dir.c_str(), mb, stats.seconds,
               mb / std::max(stats.seconds, 1e-9)));
    return;
  }
  checkpoint_wait_seconds_ += stats.wait_seconds;
  Log(
      Format("[ckpt] saved step %lld to %s: %.2f MB; the step waited %.3f s for the snapshot, "
             "written in the background in %.3f s (%.1f MB/s), committed %.3f s after the "
             "snapshot%s",
             static_cast<long long>(stats.step), stats.dir.c_str(), mb, stats.snapshot_seconds,
             stats.write_seconds, mb / std::max(stats.write_seconds, 1e-9), stats.seconds,
             stats.wait_seconds > 5e-4
                 ? Format("; the step loop waited %.3f s for the write", stats.wait_seconds).c_str()
                 : ""));
}

bool Trainer::StopRequested(int step) {
  // SIGTERM/SIGINT on any rank stops every rank after this step (they agree first, so no rank is
  // left waiting for a peer that stopped).
  const int signal_number = util::StopSignalReceived();
  if (comm_.world().AllOk(signal_number == 0)) return false;
  stopped_at_ = step + 1;
  const std::string& checkpoint_root = cfg_.checkpoint().dir();
  std::string saved = "no checkpoint (checkpoint.dir is empty)";
  if (!checkpoint_root.empty() && !cfg_.checkpoint().save_on_signal()) {
    saved = "no checkpoint (checkpoint.save_on_signal=false)";
  } else if (!checkpoint_root.empty()) {
    if (last_saved_step_ != step + 1) Save(step + 1);
    FinishSave();
    result_.stop_checkpointed = true;
    saved = Format("the checkpoint of step %d in %s", step + 1, checkpoint_root.c_str());
  }
  Log(Format("[signal] %s: stopping after step %d with %s. Continue with --resume auto.",
             signal_number ? util::SignalName(signal_number) : "stop signal on another rank",
             step + 1, saved.c_str()));
  return true;
}

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
