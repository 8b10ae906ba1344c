#include "core/engine/run_report.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/checkpoint/tp_slices.h"
#include "core/config/effective_log.h"
#include "core/metrics/stragglers.h"
#include "core/util/format.h"
#include "core/util/process.h"
#include "nlohmann/json.hpp"

namespace bigmac::engine {
using util::Format;

namespace {

// This process's resident set size, from /proc (0 where there is none).
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0;
  int64_t resident = 0;
  if (!(statm >> pages >> resident)) return 0;
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

// Writes this rank's owned parameters as <dir>/layer_<id>.f32 (every parameter of the layer, in
// order, float32, full tensors), so that runs under different layouts can be compared by
// layer_id. Collective over the tp group, whose rank 0 writes. Returns the files that could not
// be written (each whole or not at all: util::WriteWholeFile).
std::vector<std::string> DumpWeights(RankModel& stage, const std::string& dir,
                                     comm::PipelineComm& comm) {
  std::vector<memory::Tensor> full;  // gathered from the tp slices
  for (const RankModel::NamedParam& named : stage.OwnedParams())
    full.push_back(
        checkpoint::GatherTpSlices(named.param->value, stage.TpShardOf(named.param), comm.tp()));
  // The consumer's read-only copy of the tied weight, to check that it equals the owner's.
  layer::Param* copy = stage.TiedOwner() ? nullptr : stage.TiedCopy();
  const memory::Tensor copy_full =
      copy ? checkpoint::GatherTpSlices(copy->value, stage.TpShardOf(copy), comm.tp())
           : memory::Tensor();
  if (comm.tp().rank() != 0) return {};
  auto host_bytes = [](const memory::Tensor& tensor) {
    std::string host(static_cast<size_t>(tensor.bytes()), '\0');
    tensor.CopyToHost(host.data());
    return host;
  };
  std::map<std::string, std::string> files;  // name -> contents
  if (copy) files["tied_copy.bin"] = host_bytes(copy_full);
  size_t index = 0;
  for (const RankModel::NamedParam& named : stage.OwnedParams())
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

}  // namespace

std::string StageList(const RankModel& stage) {
  std::string stages;
  for (const partition::StageRange& range : stage.ranges())
    stages += (stages.empty() ? "" : ",") + std::to_string(range.stage);
  return stages;
}

RunReport::RunReport(const RunView& view)
    : view_(view),
      cfg_(view.resolved.values()),
      root_(view.comm.world().rank() == 0),
      tokens_per_step_(double(cfg_.train().micro_batch_size()) * cfg_.train().seq_length() *
                       cfg_.train().gradient_accumulation_steps() * view.resolved.dp),
      host_(util::HostName()),
      work_([&view] {
        double flops = 0;
        const config::Train& train = view.resolved.values().train();
        for (const auto& layer : view.stage.layers())
          flops += double(layer->ForwardFlops(train.micro_batch_size(), train.seq_length()));
        return flops;
      }()) {}

void RunReport::Log(const std::string& line) const {
  if (root_) view_.options.log(line);
}

void RunReport::OutputFailed(const std::string& problem) {
  const std::string line =
      "[output] warning: " + problem + "; training goes on, and the run will exit with code 8";
  if (root_) {
    Log(line);
  } else {  // a --dump file of another stage: only rank 0 logs, so say it here
    std::fprintf(stderr, "bigmac: rank %d: %s\n", view_.comm.world().rank(), line.c_str());
  }
  output_failures_.push_back(problem);
}

void RunReport::Model(const std::string& data_description) {
  comm::PipelineComm& comm = view_.comm;
  int64_t counted_once = 0;  // over the tp group
  for (const RankModel::NamedParam& named : view_.stage.OwnedParams())
    if (view_.stage.CountsOnce(named.param)) counted_once += named.param->value.numel();
  const double total_params = comm.world().SumToRoot(
      comm.dp().rank() == 0 ? double(counted_once) : 0.0, "the parameter count on rank 0");
  Log(Format("[train] model: %.0f parameters, %s | %s | %d flush(es) of %d micro-batches per step",
             total_params, config::DescribeModel(config::ModelDimsOf(cfg_)).c_str(),
             data_description.c_str(), view_.resolved.batch.flushes_per_step,
             view_.resolved.batch.num_microbatches));
  if (view_.resolved.bf16) {
    Log("[train] precision: bf16 compute copies and activations, fp32 masters, gradients, "
        "AdamW moments, loss and norm (" +
        device::BackendName(view_.device->backend()) + " backend)");
  }
}

void RunReport::Open(int start_step) {
  const std::string& output_dir = cfg_.train().output_dir();
  if (!root_ || output_dir.empty()) return;
  // The start-up checks found the directory writable and the lock created it: a failure here is
  // a filesystem failing later (docs/reliability.md, "Outputs"): a warning now, exit 8 at the end.
  std::error_code error;
  std::filesystem::create_directories(output_dir, error);
  const std::string metrics_path = output_dir + "/metrics.jsonl";
  std::filesystem::remove(metrics_path + ".incomplete", error);  // an earlier run's
  // A resumed run (a requeued job) continues the earlier run's record: its lines up to the step
  // resumed from are kept, and so are its TensorBoard events. A fresh run replaces both.
  std::vector<std::string> kept;
  if (std::filesystem::exists(metrics_path, error)) {
    if (start_step > 0) {
      std::ifstream earlier(metrics_path);
      for (std::string line; std::getline(earlier, line);) {
        const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
        if (!record.is_discarded() && record.contains("step") &&
            record["step"].is_number_integer() && record["step"].get<int64_t>() <= start_step)
          kept.push_back(line + "\n");
      }
      Log(
          Format("[train] %s: resumed at step %d: metrics.jsonl keeps the earlier run's %zu "
                 "line(s) up to it, and its TensorBoard events stay",
                 output_dir.c_str(), start_step, kept.size()));
    } else {
      Log("[train] " + output_dir + ": replacing the earlier run's metrics.jsonl, trace.json and " +
          "TensorBoard events (one run per train.output_dir; set another to keep them)");
    }
  }
  std::string problem;
  metrics_file_ = util::RecordFile::Create(metrics_path, &problem);
  if (!metrics_file_) {
    OutputFailed(problem + "; no metrics, events or trace this run");
    return;
  }
  for (const std::string& line : kept) metrics_file_->Append(line);
  if (start_step == 0) metrics::RemoveEventFiles(output_dir);  // one run per directory
  events_ = metrics::EventWriter::Open(output_dir, &problem);
  if (!events_) {
    OutputFailed(problem + "; no TensorBoard events this run");
    return;
  }
  // The effective config, indented so that TensorBoard's Markdown shows it as written.
  std::string text;
  for (const std::string& line : config::EffectiveConfigLines(view_.resolved))
    text += "    " + line + "\n";
  events_->AddText("config", start_step, text);
  CheckRecordFiles();
}

void RunReport::CheckRecordFiles() {
  if (metrics_file_ && metrics_file_->failed() && !metrics_failure_reported_) {
    metrics_failure_reported_ = true;
    OutputFailed(metrics_file_->problem());
  }
  if (events_ && !events_->problem().empty() && !events_failure_reported_) {
    events_failure_reported_ = true;
    OutputFailed(events_->problem());
  }
}

void RunReport::ValLoss(int step, double loss) {
  if (events_) events_->AddScalar("val/loss", step, loss);
}

void RunReport::DatasetValLoss(int step, const std::string& name, double loss) {
  dataset_val_losses_[name] = loss;
  if (events_) events_->AddScalar("val/loss/" + name, step, loss);
}

void RunReport::Sample(int step, const std::string& text) {
  if (events_) events_->AddText("sample", step, "    " + text);
}

void RunReport::Progress(int step, const StepOutcome& outcome) {
  const std::vector<std::string> per_rank =
      view_.comm.world().GatherToRoot(RankRecord(outcome).dump());
  if (root_) {
    step_ranks_ = nlohmann::json::array();
    for (const std::string& text : per_rank) step_ranks_.push_back(nlohmann::json::parse(text));
    interval_ms_.resize(step_ranks_.size(), 0.0);
    for (size_t r = 0; r < step_ranks_.size(); ++r)
      interval_ms_[r] += step_ranks_[r]["compute_ms"].get<double>();
    ++interval_steps_;
  }
  spread_ = nullptr;
  const config::Train& train = cfg_.train();
  if ((step + 1) % train.log_interval() == 0 || step == 0 || step + 1 == train.max_steps()) {
    const std::string spread = root_ ? ComputeSpreadWords() : "";
    Log(Format(
        "step %d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s | %.1f ms | peak %.1f "
        "MiB%s%s",
        step + 1, train.max_steps(), outcome.loss, outcome.lr, outcome.norm,
        tokens_per_step_ / (outcome.ms / 1000.0), outcome.ms, outcome.peak / (1 << 20),
        outcome.skipped_steps > 0 ? Format(" | skipped %d", outcome.skipped_steps).c_str() : "",
        spread.c_str()));
    if (spread_.is_object()) {  // rank 0 of a run of several ranks
      for (const nlohmann::json& straggler : spread_["stragglers"])
        Log(straggler["line"].get<std::string>());
    }
  }
}

std::string RunReport::ComputeSpreadWords() {
  const int steps = interval_steps_;
  std::vector<metrics::RankCompute> ranks;
  for (size_t r = 0; r < step_ranks_.size(); ++r) {
    const nlohmann::json& record = step_ranks_[r];
    ranks.push_back({record["rank"].get<int>(), record["pp"].get<int>(),
                     record["host"].get<std::string>(), interval_ms_[r] / std::max(steps, 1),
                     record["work"].get<double>()});
  }
  interval_ms_.assign(interval_ms_.size(), 0.0);
  interval_steps_ = 0;
  if (ranks.size() < 2) return "";
  const metrics::ComputeSpread spread =
      metrics::AnalyzeCompute(ranks, cfg_.train().straggler_ratio());
  nlohmann::json stragglers = nlohmann::json::array();
  for (const metrics::Straggler& s : spread.stragglers) {
    stragglers.push_back({{"rank", s.rank},
                          {"host", s.host},
                          {"ratio", s.ratio},
                          {"peers", s.peers},
                          {"line", metrics::FormatStraggler(s)}});
  }
  spread_ = {{"steps", steps},
             {"median_ms", spread.median_ms},
             {"slowest_rank", spread.slowest_rank},
             {"slowest_host", spread.slowest_host},
             {"slowest_ms", spread.slowest_ms},
             {"slowest_ratio", spread.ratio},
             {"stragglers", stragglers}};
  return Format(" | compute %.1f ms median, slowest rank %d (%s) %.2fx", spread.median_ms,
                spread.slowest_rank, spread.slowest_host.c_str(), spread.ratio);
}

nlohmann::json RunReport::RankRecord(const StepOutcome& outcome) const {
  const DpReducer& dp = view_.executor.dp_reducer();
  // Per-rank milliseconds in compute and waiting this step.
  const auto& w = view_.timeline.window_ms();
  auto get = [&w](const char* key) { return w.count(key) ? w.at(key) : 0.0; };
  const double backward_ms = get("backward") + get("backward_input") + get("backward_weight");
  return {
      {"rank", view_.comm.world().rank()},
      {"pp", view_.comm.pp().rank()},
      {"host", host_},
      {"forward_ms", get("forward")},
      {"backward_ms", backward_ms},
      // What the straggler report compares: the computations' time, on the device's own clock
      // where the host's would time only their enqueueing.
      {"compute_ms",
       view_.device->has_timed_events() ? get("device_compute") : get("forward") + backward_ms},
      // What compare's bottleneck compares: the computations' cost on a clock that does not
      // count the time a rank waits for a core it shares (its thread's CPU time in forward and
      // backward), or the device's. The straggler report keeps compute_ms, wall clock: a rank
      // slowed by a neighbour on its cores slows the job all the same.
      {"busy_ms", view_.device->has_timed_events() ? get("device_compute") : get("compute_cpu")},
      {"work", work_},
      {"wait_ms", get("wait")},
      {"allreduce_ms", get("allreduce")},
      // The dp all-reduce's buckets, how many started during the last flush (overlapped with
      // its backward), and their time in flight (overlapping other spans).
      {"dp_buckets", dp.buckets().size()},
      {"dp_reduce_bytes", dp.bytes()},
      {"dp_tied_bytes", dp.tied_bytes()},
      {"dp_buckets_overlapped", dp.started_early()},
      {"dp_reduce_inflight_ms", get("dp_reduce")},
      // On an asynchronous device: the time its streams spent in the actions' work and in the
      // transport's operations (the host's forward/backward time is enqueueing).
      {"device_compute_ms", get("device_compute")},
      {"device_comm_ms", get("device_comm")},
      {"peak_bytes", view_.device->allocator().peak_bytes()},
      {"rss_bytes", ResidentBytes()},
      {"activation_bytes_sent", outcome.activation_bytes},
      // Tensor parallelism: this rank's all-reduce payload and time during the step.
      {"tp_allreduce_bytes", outcome.tp_bytes},
      {"tp_allreduce_ms", outcome.tp_ms}};
}

void RunReport::Metrics(int step, const StepOutcome& outcome, std::optional<double> val_loss) {
  const double peak = outcome.peak;
  if (!metrics_file_) return;
  const nlohmann::json& ranks = step_ranks_;
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
                         {"checkpoint_ms", outcome.checkpoint_ms},
                         {"checkpoint_wait_ms", outcome.checkpoint_wait_ms},
                         {"micro_batch_size", cfg_.train().micro_batch_size()},
                         {"num_microbatches", view_.resolved.batch.num_microbatches},
                         {"precision", cfg_.precision().dtype()},
                         {"ranks", ranks}};
  if (val_loss) line["val_loss"] = *val_loss;
  if (val_loss && !dataset_val_losses_.is_null()) line["val_loss_by_dataset"] = dataset_val_losses_;
  dataset_val_losses_ = nullptr;
  // The tokens trained on from each dataset since the first step (of the first run, on a resume).
  if (dataset_names_.size() == outcome.dataset_tokens.size() && dataset_names_.size() > 1) {
    nlohmann::json tokens = nlohmann::json::object();
    for (size_t d = 0; d < dataset_names_.size(); ++d)
      tokens[dataset_names_[d]] = outcome.dataset_tokens[d];
    line["tokens_by_dataset"] = tokens;
  }
  // On the steps that end a logging interval: the ranks' compute spread over it (Progress).
  if (!spread_.is_null()) line["compute_spread"] = spread_;
  metrics_file_->Append(line.dump() + "\n");
  CheckRecordFiles();
  if (!events_) return;
  // The same numbers as the line above, under TensorBoard tags (docs/planning.md).
  static constexpr std::pair<const char*, const char*> kScalars[] = {
      {"train/loss", "loss"},
      {"train/lr", "lr"},
      {"train/grad_norm", "grad_norm"},
      {"train/tokens_per_s", "tokens_per_s"},
      {"train/step_ms", "step_ms"},
      {"checkpoint/ms", "checkpoint_ms"},
      {"checkpoint/wait_ms", "checkpoint_wait_ms"}};
  for (const auto& [tag, key] : kScalars) {
    events_->AddScalar(tag, step + 1, line[key].get<double>());
  }
  events_->AddScalar("memory/peak_mib", step + 1, peak / (1 << 20));
  if (line.contains("tokens_by_dataset")) {
    for (const auto& [name, tokens] : line["tokens_by_dataset"].items())
      events_->AddScalar("data/tokens/" + name, step + 1, tokens.get<double>());
  }
  if (!spread_.is_null()) {
    events_->AddScalar("compute/median_ms", step + 1, spread_["median_ms"].get<double>());
    events_->AddScalar("compute/slowest_ratio", step + 1, spread_["slowest_ratio"].get<double>());
  }
  for (const nlohmann::json& r : ranks) {
    events_->AddScalar(Format("memory/peak_mib/rank_%d", r["rank"].get<int>()), step + 1,
                       r["peak_bytes"].get<double>() / (1 << 20));
  }
  CheckRecordFiles();
}

void RunReport::Summary(const TrainResult& result, int steps_run) {
  comm::PipelineComm& comm = view_.comm;
  const RankModel& stage = view_.stage;
  const std::string stages = StageList(stage);
  const memory::DeviceAllocator& allocator = view_.device->allocator();
  const std::vector<std::string> memory_lines = comm.world().GatherToRoot(
      Format("[memory] rank %d (pp %d, dp %d, stage %s): peak %.2f MiB of %.2f MiB capacity, "
             "activations peak "
             "%.2f MiB, at most %d micro-batch stage(s) of activations in flight, %lld parameters, "
             "optimizer state for %lld (%s); %lld system allocations after the first step; "
             "checkpoint snapshot %.2f MiB of host memory",
             comm.world().rank(), comm.pp().rank(), comm.dp().rank(), stages.c_str(),
             double(result.peak_bytes) / (1 << 20), double(allocator.capacity_bytes()) / (1 << 20),
             double(stage.max_activation_bytes()) / (1 << 20), result.max_in_flight,
             static_cast<long long>(result.parameter_count),
             static_cast<long long>(view_.adamw.StateElements()), OptimizerMemory().c_str(),
             static_cast<long long>(result.steady_state_system_allocations),
             double(result.checkpoint_buffer_bytes) / (1 << 20)));
  for (const std::string& line : memory_lines) Log(line);
  std::string layer_ranges;
  for (const partition::StageRange& range : stage.ranges()) {
    layer_ranges += (layer_ranges.empty() ? "" : ", ") +
                    partition::FormatRange(range, view_.resolved.partition.origin);
  }
  const auto& totals = view_.timeline.total_ms();
  auto total = [&totals](const char* key) { return totals.count(key) ? totals.at(key) : 0.0; };
  const std::vector<std::string> stage_lines = comm.world().GatherToRoot(Format(
      "[stage] rank %d (pp %d, dp %d, stage %s, %s): forward %.1f ms, backward %.1f ms, waiting "
      "%.1f ms, "
      "all-reduce %.1f ms, optimizer %.1f ms over %d step(s); %.2f MB of activations and "
      "gradients sent per step (%s)",
      comm.world().rank(), comm.pp().rank(), comm.dp().rank(), stages.c_str(), layer_ranges.c_str(),
      total("forward"), total("backward") + total("backward_input") + total("backward_weight"),
      total("wait"), total("allreduce"), total("optimizer"), steps_run,
      double(result.activation_bytes_per_step) / 1e6,
      memory::DTypeName(stage.activation_dtype()).c_str()));
  for (const std::string& line : stage_lines) Log(line);
}

std::string RunReport::OptimizerMemory() const {
  // Two fp32 moments per element with state.
  const double mib = double(view_.adamw.StateElements()) * 8 / (1 << 20);
  if (!view_.zero) return Format("%.2f MiB of AdamW moments, not sharded", mib);
  return Format("%.2f MiB of AdamW moments: ZeRO-1 shard of %.2f MiB over dp %d", mib,
                double(view_.zero->total_elements()) * 8 / (1 << 20), view_.comm.dp().size());
}

void RunReport::TraceAndDump(const std::vector<double>& train_losses) {
  comm::PipelineComm& comm = view_.comm;
  const std::string& output_dir = cfg_.train().output_dir();
  if (!output_dir.empty()) {
    const std::vector<std::string> events = comm.world().GatherToRoot(view_.timeline.TraceEvents(
        comm.world().rank(),
        Format("rank %d (pp %d, dp %d)", comm.world().rank(), comm.pp().rank(), comm.dp().rank())));
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
  const std::string& dump_dir = view_.options.dump_dir;
  if (dump_dir.empty()) return;
  if (comm.dp().rank() == 0) {
    for (const std::string& problem : DumpWeights(view_.stage, dump_dir, comm))
      OutputFailed(problem);
  }
  if (root_) {
    std::string losses;
    for (double loss : train_losses) losses += Format("%.17g\n", loss);
    if (std::string problem = util::WriteWholeFile(dump_dir + "/losses.txt", losses);
        !problem.empty()) {
      OutputFailed(problem);
    }
  }
}

}  // namespace bigmac::engine
