#include "core/engine/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <thread>

#include "core/checkpoint/checkpoint.h"
#include "core/data/dataset.h"
#include "core/data/shard.h"
#include "core/engine/executor.h"
#include "core/engine/stage.h"
#include "core/memory/allocator.h"
#include "core/metrics/timeline.h"
#include "core/optim/adamw.h"
#include "core/schedule/schedule.h"
#include "core/util/format.h"
#include "core/util/stop_signal.h"

namespace bigmac::engine {
using util::Format;

namespace {

// One micro-batch's tokens and the MicroBatch view of them.
struct BatchSlot {
  std::vector<int32_t> tokens;
  std::vector<int32_t> targets;
  layer::MicroBatch mb;
};

// Writes this rank's owned parameters as <dir>/layer_<id>.f32 (every parameter of the layer, in
// order, float32), so that runs under different layouts can be compared by layer_id.
void DumpWeights(Stage& stage, const std::string& dir) {
  std::filesystem::create_directories(dir);
  // The consumer's read-only copy of the tied weight, to check that it equals the owner's.
  if (layer::Param* copy = stage.TiedCopy(); copy && !stage.TiedOwner()) {
    std::ofstream(dir + "/tied_copy.bin", std::ios::binary)
        .write(reinterpret_cast<const char*>(copy->value.data<float>()), copy->value.bytes());
  }
  std::map<int, std::ofstream> files;
  for (const Stage::NamedParam& named : stage.OwnedParams()) {
    auto [it, inserted] = files.try_emplace(named.layer_id);
    if (inserted)
      it->second.open(dir + "/layer_" + std::to_string(named.layer_id) + ".f32", std::ios::binary);
    it->second.write(reinterpret_cast<const char*>(named.param->value.data<float>()),
                     named.param->value.bytes());
  }
}

// Parameters on this rank that have AdamW state: the owned ones, never a tied copy.
int64_t OptimizerStateCount(Stage& stage, const optim::AdamW& adamw) {
  int64_t count = 0;
  for (const auto& layer : stage.layers()) {
    for (layer::Param* param : layer->Params()) {
      if (adamw.FirstMoment(param)) count += param->value.numel();
    }
  }
  return count;
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

}  // namespace

TrainResult Train(const config::ResolvedConfig& resolved, comm::PipelineComm& comm,
                  const TrainOptions& options) {
  const config::Config& cfg = resolved.values();
  const config::Train& train = cfg.train();
  const int batch = train.micro_batch_size();
  const int seq = train.seq_length();
  const int accum = train.gradient_accumulation_steps();
  const int m = resolved.batch.num_microbatches;
  const int flushes = resolved.batch.flushes_per_step;
  const bool root = comm.world_rank() == 0;
  auto log = [&](const std::string& line) {
    if (root) options.log(line);
  };

  memory::DeviceAllocator allocator(
      "cpu:" + std::to_string(comm.world_rank()),
      memory::CpuCapacity(cfg.device().memory_limit(), options.ranks_on_node));
  StageOptions stage_options;
  stage_options.dims = {cfg.model().vocab_size(), cfg.model().hidden_size(),
                        cfg.model().num_heads(), cfg.model().num_layers(), seq};
  stage_options.allocator = &allocator;
  stage_options.activation_checkpointing = train.activation_checkpointing();
  stage_options.seed = static_cast<uint64_t>(train.seed());
  stage_options.block_types = resolved.block_types;
  Stage stage(stage_options, resolved.partition, comm.pp_rank());

  // The ranks' layers together must cover every layer_id once.
  if (std::string problem =
          CheckLayerCoverage(comm.AllGatherPp(stage.LayerIds()), cfg.model().num_layers());
      !problem.empty()) {
    throw std::logic_error("stage layout: " + problem);
  }

  // Only the ranks with the embedding (tokens) or the head (targets) read data.
  std::optional<data::TokenDataset> train_data, val_data;
  if (stage.has_embedding() || stage.has_head()) {
    train_data.emplace(cfg.data().dir(), "train");
    val_data.emplace(cfg.data().dir(), "val");
    train_data->CheckFits(seq, cfg.model().vocab_size());
    val_data->CheckFits(seq, cfg.model().vocab_size());
  }

  schedule::Kind kind = schedule::Kind::k1F1B;
  schedule::ParseKind(cfg.parallel().schedule(), &kind);
  const schedule::ScheduleSpec spec{kind, comm.pp_size(), m, cfg.parallel().virtual_stages()};
  metrics::Timeline timeline;
  Executor executor(&stage, &comm, spec, cfg.model().hidden_size());
  executor.set_timeline(&timeline);
  const std::string& output_dir = train.output_dir();
  std::ofstream metrics_file;  // opened once the inputs (data, checkpoint) have been read

  std::vector<layer::Param*> params;
  for (const Stage::NamedParam& named : stage.OwnedParams()) params.push_back(named.param);
  TrainResult result;
  result.parameter_count = stage.OwnedParameterCount();
  const double total_params =
      comm.SumToRoot(comm.dp_rank() == 0 ? double(result.parameter_count) : 0.0);
  log(
      Format("[train] model: %.0f parameters, %d blocks, hidden %d, %d heads, vocab %d | %s | %d "
             "flush(es) of %d "
             "micro-batches per step",
             total_params, cfg.model().num_layers(), cfg.model().hidden_size(),
             cfg.model().num_heads(), cfg.model().vocab_size(),
             train_data ? train_data->description().c_str() : "(data on other ranks)", flushes, m));

  optim::AdamW adamw(
      {cfg.optim().beta1(), cfg.optim().beta2(), cfg.optim().eps(), cfg.optim().weight_decay()});
  const optim::LrSchedule lr_schedule{cfg.optim().lr(), cfg.optim().min_lr(),
                                      cfg.optim().warmup_steps(), train.max_steps()};
  // Every token loss is scaled by 1/(tokens per optimizer step over all replicas), so the summed
  // gradient is the mean over the global batch, whatever the pp/dp split.
  const double tokens_per_step = double(batch) * seq * accum * resolved.dp;
  std::vector<BatchSlot> slots(m);

  auto evaluate = [&](int step) {
    double local = 0;
    BatchSlot slot;
    slot.tokens.resize(int64_t{batch} * seq);
    slot.targets.resize(slot.tokens.size());
    for (int i = comm.dp_rank(); i < train.eval_batches(); i += comm.dp_size()) {
      if (val_data) val_data->EvalBatch(i, batch, seq, slot.tokens.data(), slot.targets.data());
      slot.mb = {batch, seq, slot.tokens.data(), slot.targets.data(), 1.0 / (double(batch) * seq),
                 i};
      local += executor.Evaluate(slot.mb);
    }
    comm.FinishSends();
    const double loss = comm.SumToRoot(local) / train.eval_batches();
    if (root) result.val_losses.emplace_back(step, loss);
    log(Format("[val] step %d | val_loss %.4f | %d batches of %dx%d", step, loss,
               train.eval_batches(), batch, seq));
  };

  int start_step = 0;
  const std::string& checkpoint_root = cfg.checkpoint().dir();
  if (!options.resume.empty()) {
    const std::string step_dir = checkpoint::ResolveStepDir(options.resume, checkpoint_root);
    if (step_dir.empty()) {
      log("[ckpt] --resume auto: no checkpoint in " + checkpoint_root + " yet; starting fresh");
    } else {
      const auto load_start = std::chrono::steady_clock::now();
      start_step =
          static_cast<int>(checkpoint::Load(step_dir, resolved, stage.State(), adamw, comm));
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
      const double bytes = comm.SumToRoot(
          comm.dp_rank() == 0 ? double(3 * result.parameter_count * sizeof(float)) : 0.0);
      log(Format("[ckpt] resumed from %s at step %d: read %.2f MB in %.3f s (%.1f MB/s)",
                 step_dir.c_str(), start_step, bytes / 1e6, seconds,
                 bytes / 1e6 / std::max(seconds, 1e-9)));
    }
  }
  if (root && !output_dir.empty()) {
    // Metrics are a convenience: a directory that cannot be written costs a warning, not the run.
    std::error_code error;
    std::filesystem::create_directories(output_dir, error);
    metrics_file.open(output_dir + "/metrics.jsonl", std::ios::trunc);
    if (!metrics_file.is_open()) {
      log("[train] warning: cannot write " + output_dir +
          "/metrics.jsonl; no metrics or trace this run");
    }
  }
  auto save = [&](int step) {
    const checkpoint::SaveStats stats = checkpoint::Save(
        checkpoint_root, step, resolved, stage.State(), adamw, comm, cfg.checkpoint().keep_last());
    log(Format("[ckpt] saved step %d to %s: %.2f MB in %.3f s (%.1f MB/s)", step, stats.dir.c_str(),
               double(stats.bytes) / 1e6, stats.seconds,
               double(stats.bytes) / 1e6 / std::max(stats.seconds, 1e-9)));
  };

  evaluate(start_step);  // the starting point: about ln(vocab_size) for a fresh model
  const FaultHooks hooks = FaultHooks::FromEnvironment();
  const bool skip_nan = train.nan_policy() == "skip";
  int skipped_steps = 0;
  int last_saved_step = -1;
  int stopped_at = -1;
  adamw.InitState(params);
  int64_t system_allocations_after_first_step = -1;
  for (int step = start_step; step < train.max_steps(); ++step) {
    if (step == start_step + 1)
      system_allocations_after_first_step = allocator.system_allocations();
    // Testing hook: the named rank stops responding, so that tests can show a peer's deadline
    // firing with a diagnostic instead of a hang.
    if (hooks.stall_rank == comm.world_rank() && hooks.stall_step <= step + 1) {
      std::this_thread::sleep_for(std::chrono::hours(1));
    }
    const auto start = std::chrono::steady_clock::now();
    bool skipped = false;
    timeline.set_recording(step - start_step < train.trace_steps());
    timeline.ResetWindow();
    stage.ZeroGrads();
    double local_loss = 0;
    double norm = 0;
    double lr = 0;
    for (int flush = 0; flush < flushes; ++flush) {
      for (int mb = 0; mb < m; ++mb) {
        BatchSlot& slot = slots[mb];
        slot.tokens.resize(int64_t{batch} * seq);
        slot.targets.resize(slot.tokens.size());
        // The sample key is the micro-batch's global index in the step, so any pp/dp layout
        // of the same global batch reads the same samples.
        const int global_microbatch = comm.dp_rank() * accum + flush * m + mb;
        if (train_data) {
          train_data->TrainBatch(stage_options.seed, step, 0, global_microbatch, batch, seq,
                                 slot.tokens.data(), slot.targets.data());
        }
        slot.mb = {batch, seq, slot.tokens.data(), slot.targets.data(), 1.0 / tokens_per_step, mb};
      }
      local_loss += executor.RunFlush(
          [&](int mb) -> const layer::MicroBatch& { return slots[mb].mb; }, flush == flushes - 1,
          [&] {
            if (hooks.nan_step == step + 1) {
              // Every replica holding the layer: as a NaN from the backward would be after the
              // data-parallel all-reduce.
              for (const Stage::NamedParam& named : stage.OwnedParams()) {
                if (named.layer_id != hooks.nan_layer) continue;
                named.param->grad.data<float>()[0] = std::nanf("");
                break;
              }
            }
            if (hooks.kill_rank == comm.world_rank() && hooks.kill_step == step + 1) {
              std::fflush(stdout);
              std::raise(SIGKILL);
            }
            // Each parameter is owned by one rank of the pipeline and is
            // identical across dp replicas: sum over the pipeline only.
            double local_sumsq = 0;
            std::string bad;
            for (const Stage::NamedParam& named : stage.OwnedParams()) {
              const double sq = optim::GlobalGradNorm({named.param});
              if (!std::isfinite(sq) && bad.empty()) bad = named.name;
              local_sumsq += sq * sq;
            }
            norm = std::sqrt(comm.AllReduceSumPp(local_sumsq));
            if (!std::isfinite(norm)) {
              // Every rank of every replica sees the non-finite norm. Gather where each found
              // non-finite gradients; rank 0 reports them all before any rank stops.
              std::string origin;
              if (stage.has_embedding() && stage.has_head()) {
                origin = stage.FirstNonFiniteLayer(slots[0].mb);
                if (!origin.empty()) origin = "; non-finite values first appear in " + origin;
              }
              std::string stages;
              for (const partition::StageRange& range : stage.ranges())
                stages += (stages.empty() ? "" : ",") + std::to_string(range.stage);
              const std::vector<std::string> found = comm.GatherToRoot(
                  bad.empty()
                      ? ""
                      : Format("rank %d (stage %s, dp %d): %s%s", comm.world_rank(), stages.c_str(),
                               comm.dp_rank(), bad.c_str(), origin.c_str()));
              std::string report;
              for (const std::string& where : found) {
                if (!where.empty()) report += (report.empty() ? "" : "; ") + where;
              }
              std::string message =
                  Format("step %d: non-finite gradient norm; non-finite gradients in %s", step + 1,
                         report.empty() ? "(none found)" : report.c_str());
              if (skip_nan && skipped_steps < train.max_skipped_steps()) {
                // Every rank saw the same norm, so all skip together: no update, the tied copy
                // gets the unchanged weight, and the next step starts from zeroed gradients.
                skipped = true;
                ++skipped_steps;
                log(
                    Format("[nan] %s; train.nan_policy=skip: the update is skipped (%d of at "
                           "most %d skipped steps)",
                           message.c_str(), skipped_steps, train.max_skipped_steps()));
                lr = optim::LearningRate(lr_schedule, step);
                executor.SendTiedWeight();
                return;
              }
              if (skip_nan) {
                message += Format(
                    "; train.nan_policy=skip, but %d steps were skipped already "
                    "(train.max_skipped_steps=%d)",
                    skipped_steps, train.max_skipped_steps());
              } else {
                message += " (train.nan_policy=stop; skip would drop this step's update)";
              }
              if (root) std::fprintf(stderr, "bigmac: rank 0: %s\n", message.c_str());
              comm.AllOk(false);
              throw NumericalError(message, /*reported=*/true);
            }
            if (cfg.optim().grad_clip() > 0 && norm > cfg.optim().grad_clip()) {
              optim::ScaleGradients(params, cfg.optim().grad_clip() / norm);
            }
            lr = optim::LearningRate(lr_schedule, step);
            adamw.Step(params, lr, step + 1);
            executor.SendTiedWeight();
          });
    }
    comm.FinishSends();
    const double loss = comm.SumToRoot(local_loss);
    const double peak = comm.MaxToRoot(double(allocator.peak_bytes()));
    if (root) {
      if (!std::isfinite(loss) && !skipped) {
        throw NumericalError(Format("step %d: the loss is %f", step + 1, loss));
      }
      result.train_losses.push_back(loss);
    }
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    // Per-rank milliseconds in compute and waiting this step, for metrics.jsonl.
    const auto& w = timeline.window_ms();
    auto get = [&w](const char* key) { return w.count(key) ? w.at(key) : 0.0; };
    const std::vector<std::string> per_rank = comm.GatherToRoot(
        Format("{\"rank\":%d,\"forward_ms\":%.3f,\"backward_ms\":%.3f,\"wait_"
               "ms\":%.3f,\"allreduce_ms\":%.3f,\"peak_bytes\":%lld,\"rss_bytes\":%lld}",
               comm.world_rank(), get("forward"),
               get("backward") + get("backward_input") + get("backward_weight"), get("wait"),
               get("allreduce"), static_cast<long long>(allocator.peak_bytes()),
               static_cast<long long>(ResidentBytes())));
    if (metrics_file.is_open()) {
      std::string ranks;
      for (const std::string& r : per_rank) ranks += (ranks.empty() ? "" : ",") + r;
      metrics_file
          << Format(
                 "{\"step\":%d,\"loss\":%.9g,\"lr\":%.6g,\"grad_norm\":%.6g,\"clipped\":%s,"
                 "\"skipped\":%s,"
                 "\"step_ms\":%.3f,\"tokens_per_s\":%.1f,\"peak_bytes\":%.0f,\"micro_batch_size\":%"
                 "d,"
                 "\"num_microbatches\":%d,\"ranks\":[",
                 step + 1, loss, lr, norm,
                 cfg.optim().grad_clip() > 0 && norm > cfg.optim().grad_clip() ? "true" : "false",
                 skipped ? "true" : "false", ms, tokens_per_step / (ms / 1000.0), peak, batch, m)
          << ranks << "]}\n";
      metrics_file.flush();
    }
    if ((step + 1) % train.log_interval() == 0 || step == 0 || step + 1 == train.max_steps()) {
      log(Format(
          "step %d/%d | loss %.4f | lr %.2e | norm %.3f | %.0f tok/s | %.1f ms | peak %.1f MiB%s",
          step + 1, train.max_steps(), loss, lr, norm, tokens_per_step / (ms / 1000.0), ms,
          peak / (1 << 20),
          skipped_steps > 0 ? Format(" | skipped %d", skipped_steps).c_str() : ""));
    }
    if (train.eval_interval() > 0 && (step + 1) % train.eval_interval() == 0 &&
        step + 1 != train.max_steps()) {
      evaluate(step + 1);
    }
    const int interval = cfg.checkpoint().interval();
    if (!checkpoint_root.empty() &&
        ((interval > 0 && (step + 1) % interval == 0) || step + 1 == train.max_steps())) {
      save(step + 1);
      last_saved_step = step + 1;
    }
    // SIGTERM/SIGINT on any rank stops every rank after this step (they agree first, so no rank
    // is left waiting for a peer that stopped).
    const int signal_number = util::StopSignalReceived();
    if (!comm.AllOk(signal_number == 0)) {
      stopped_at = step + 1;
      std::string saved = "no checkpoint (checkpoint.dir is empty)";
      if (!checkpoint_root.empty() && !cfg.checkpoint().save_on_signal()) {
        saved = "no checkpoint (checkpoint.save_on_signal=false)";
      } else if (!checkpoint_root.empty()) {
        if (last_saved_step != step + 1) save(step + 1);
        saved = Format("the checkpoint of step %d in %s", step + 1, checkpoint_root.c_str());
      }
      log(Format("[signal] %s: stopping after step %d with %s. Continue with --resume auto.",
                 signal_number ? util::SignalName(signal_number) : "stop signal on another rank",
                 step + 1, saved.c_str()));
      break;
    }
  }
  // Steady state: after the first step every buffer comes from the allocator's cache.
  result.steady_state_system_allocations =
      system_allocations_after_first_step < 0
          ? 0
          : allocator.system_allocations() - system_allocations_after_first_step;
  if (stopped_at < 0) evaluate(train.max_steps());
  result.skipped_steps = skipped_steps;
  result.stopped_at_step = stopped_at;

  result.peak_bytes = allocator.peak_bytes();
  result.max_in_flight = stage.max_in_flight();
  std::string stages;
  for (const partition::StageRange& range : stage.ranges())
    stages += (stages.empty() ? "" : ",") + std::to_string(range.stage);
  const std::vector<std::string> memory_lines = comm.GatherToRoot(
      Format("[memory] rank %d (pp %d, dp %d, stage %s): peak %.2f MiB of %.2f MiB capacity, "
             "activations peak "
             "%.2f MiB, at most %d micro-batch stage(s) of activations in flight, %lld parameters, "
             "optimizer state for %lld; %lld system allocations after the first step",
             comm.world_rank(), comm.pp_rank(), comm.dp_rank(), stages.c_str(),
             double(result.peak_bytes) / (1 << 20), double(allocator.capacity_bytes()) / (1 << 20),
             double(stage.max_activation_bytes()) / (1 << 20), result.max_in_flight,
             static_cast<long long>(result.parameter_count),
             static_cast<long long>(OptimizerStateCount(stage, adamw)),
             static_cast<long long>(result.steady_state_system_allocations)));
  for (const std::string& line : memory_lines) log(line);
  std::string layer_ranges;
  for (const partition::StageRange& range : stage.ranges()) {
    layer_ranges += (layer_ranges.empty() ? "" : ", ") +
                    partition::FormatRange(range, resolved.partition.origin);
  }
  const auto& totals = timeline.total_ms();
  auto total = [&totals](const char* key) { return totals.count(key) ? totals.at(key) : 0.0; };
  const std::vector<std::string> stage_lines = comm.GatherToRoot(Format(
      "[stage] rank %d (pp %d, dp %d, stage %s, %s): forward %.1f ms, backward %.1f ms, waiting "
      "%.1f ms, "
      "all-reduce %.1f ms, optimizer %.1f ms over %d step(s)",
      comm.world_rank(), comm.pp_rank(), comm.dp_rank(), stages.c_str(), layer_ranges.c_str(),
      total("forward"), total("backward") + total("backward_input") + total("backward_weight"),
      total("wait"), total("allreduce"), total("optimizer"),
      (stopped_at > 0 ? stopped_at : train.max_steps()) - start_step));
  for (const std::string& line : stage_lines) log(line);
  if (!output_dir.empty()) {
    const std::vector<std::string> events = comm.GatherToRoot(timeline.TraceEvents(
        comm.world_rank(),
        Format("rank %d (pp %d, dp %d)", comm.world_rank(), comm.pp_rank(), comm.dp_rank())));
    if (root && metrics_file.is_open()) {
      std::ofstream(output_dir + "/trace.json", std::ios::trunc) << metrics::MergeTraces(events);
      log("[train] wrote " + output_dir + "/metrics.jsonl and " + output_dir +
          "/trace.json (open it at https://ui.perfetto.dev)");
    }
  }
  for (layer::Param* param : params) {
    for (int64_t i = 0; i < param->value.numel(); ++i) {
      result.final_parameters.push_back(param->value.dtype() == memory::DType::kF64
                                            ? param->value.data<double>()[i]
                                            : param->value.data<float>()[i]);
    }
  }
  if (!options.dump_dir.empty()) {
    if (comm.dp_rank() == 0) DumpWeights(stage, options.dump_dir);
    if (root) {
      std::ofstream losses(options.dump_dir + "/losses.txt");
      for (double loss : result.train_losses) losses << Format("%.17g\n", loss);
    }
  }
  return result;
}

TrainResult TrainSingleRank(const config::ResolvedConfig& config,
                            const std::function<void(const std::string&)>& log) {
  std::unique_ptr<comm::PipelineComm> comm = comm::MakeLocalPipelineComm();
  TrainOptions options;
  options.log = log;
  return Train(config, *comm, options);
}

}  // namespace bigmac::engine
