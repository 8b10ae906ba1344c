#include "core/cli/commands.h"

#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <new>
#include <optional>
#include <thread>

#include "core/checkpoint/checkpoint.h"
#include "core/cli/exit_codes.h"
#include "core/cli/failure.h"
#include "core/cli/fault_env.h"
#include "core/cli/model_config.h"
#include "core/cli/run_record.h"
#include "core/cli/startup_checks.h"
#include "core/comm/cuda/cuda_probe.h"
#include "core/comm/device.h"
#include "core/comm/hang_watch.h"
#include "core/comm/mpi_world.h"
#include "core/comm/nccl/nccl_pipeline_comm.h"
#include "core/comm/topology.h"
#include "core/comm/transport.h"
#include "core/config/effective_log.h"
#include "core/config/errors.h"
#include "core/config/resolve.h"
#include "core/config/schema.h"
#include "core/data/blend.h"
#include "core/data/dataset.h"
#include "core/data/prep.h"
#include "core/data/shard.h"
#include "core/data/tokenizer_manifest.h"
#include "core/device/cuda/cuda_device.h"
#include "core/engine/trainer.h"
#include "core/memory/allocator.h"
#include "core/plan/plan.h"
#include "core/schedule/simulator.h"
#include "core/util/dir_lock.h"
#include "core/util/files.h"
#include "core/util/format.h"
#include "core/util/output_file.h"
#include "core/util/process.h"
#include "core/util/stop_signal.h"
#include "plugins/sdk/cpu_kernels.h"
#include "stages/gpt/cuda/constraints.h"

namespace bigmac::cli {
namespace {

// Actions a `bigmac schedule` simulates grow with pp * virtual * microbatches.
constexpr int64_t kMaxScheduleSize = int64_t{1} << 20;

void PrintProblems(const std::string& header, const std::vector<std::string>& problems) {
  std::fprintf(stderr, "%s (%zu problem%s):\n", header.c_str(), problems.size(),
               problems.size() == 1 ? "" : "s");
  for (const std::string& problem : problems) std::fprintf(stderr, "  - %s\n", problem.c_str());
}

// "0-3,6".
std::string FormatRanks(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    text += (text.empty() ? "" : ",") + std::to_string(ranks[i]) +
            (j > i ? "-" + std::to_string(ranks[j]) : "");
    i = j + 1;
  }
  return text;
}

// How the launcher told MPI the world size, for the [cfg] log.
std::string WorldSizeSource() {
  if (std::getenv("OMPI_COMM_WORLD_SIZE")) return "mpirun ranks (MPI_COMM_WORLD)";
  if (std::getenv("SLURM_STEP_ID") && std::getenv("SLURM_NTASKS")) {
    return "srun tasks (MPI_COMM_WORLD)";
  }
  return "MPI_COMM_WORLD";
}

uint64_t Fingerprint(const std::vector<std::string>& problems) {
  uint64_t hash = 1469598103934665603ULL;
  for (const std::string& problem : problems) {
    for (unsigned char byte : problem + "\n") {
      hash ^= byte;
      hash *= 1099511628211ULL;
    }
  }
  return hash;
}

// Start-up agreement, the first communication of a run: every rank learns whether every other
// rank accepted this step of the start-up and whether all hold the same configuration. Returns
// 0 when all agree; otherwise every rank has printed why and must exit with the returned code,
// the highest `code` of the ranks with problems. `what` names the step ("configuration",
// "output locations", "device placement").
int AllRanksAgree(const comm::MpiWorld& world, const std::string& what,
                  const std::vector<std::string>& problems, uint64_t config_hash,
                  int code = kExitConfig) {
  // 0 = fine; otherwise a fingerprint of the problems, so identical reports print once.
  const int64_t status = problems.empty() ? 0 : static_cast<int64_t>(Fingerprint(problems) | 1);
  const std::vector<int64_t> statuses = world.AllGather(status);
  const std::vector<int64_t> codes = world.AllGather(problems.empty() ? 0 : int64_t{code});
  const std::vector<int64_t> hashes = world.AllGather(static_cast<int64_t>(config_hash));
  std::vector<int> failed;
  int exit_code = 0;
  for (int r = 0; r < world.size(); ++r) {
    if (statuses[r] != 0) failed.push_back(r);
    exit_code = std::max(exit_code, static_cast<int>(codes[r]));
  }
  const int me = world.rank();
  if (!failed.empty()) {
    if (status != 0) {
      bool first_with_this_report = true;
      for (int r : failed) {
        if (r < me && statuses[r] == status) first_with_this_report = false;
      }
      if (first_with_this_report) {
        PrintProblems("bigmac: rank " + std::to_string(me) + ": invalid " + what, problems);
      }
    }
    std::fprintf(stderr, "bigmac: rank %d exits with code %d: %s rejected by rank(s) %s\n", me,
                 exit_code, what.c_str(), FormatRanks(failed).c_str());
    return exit_code;
  }
  std::map<int64_t, std::vector<int>> ranks_by_hash;
  for (int r = 0; r < world.size(); ++r) ranks_by_hash[hashes[r]].push_back(r);
  if (ranks_by_hash.size() > 1) {
    if (me == 0) {
      std::string groups;
      for (const auto& [hash, ranks] : ranks_by_hash) {
        char hex[17];
        std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(hash));
        groups += std::string(groups.empty() ? "" : "; ") + "ranks " + FormatRanks(ranks) +
                  " have " + hex;
      }
      std::fprintf(stderr,
                   "bigmac: the ranks hold different effective configurations (%s). Every rank "
                   "must read the same file and the same --set values.\n",
                   groups.c_str());
    }
    std::fprintf(stderr, "bigmac: rank %d exits with code %d: config hash differs across ranks\n",
                 me, kExitConfig);
    return kExitConfig;
  }
  return 0;
}

void PrintLines(const std::vector<std::string>& lines) {
  for (const std::string& line : lines) std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

// Runs the trainer and maps its failures to exit codes (docs/exit_codes.md).
int RunTraining(const config::ResolvedConfig& resolved, comm::PipelineComm& pipeline,
                const engine::TrainOptions& options) {
  const std::string rank = "bigmac: rank " + std::to_string(pipeline.world().rank()) + ": ";
  try {
    const engine::TrainResult result = engine::Train(resolved, pipeline, options);
    // Every rank agreed on the stop, so every rank returns the same code. Unfinished with a
    // checkpoint to resume from: kExitStopped (the sbatch scripts requeue on it); without one,
    // a requeue would start over, so the stop is a clean end.
    const bool stopped = result.stopped_at_step > 0 &&
                         result.stopped_at_step < resolved.values().train().max_steps() &&
                         result.stop_checkpointed;
    if (result.output_failures.empty()) return stopped ? kExitStopped : kExitOk;
    // The training itself (and its checkpoints) completed; outputs that are not whole are a
    // filesystem failure (docs/exit_codes.md): say which, once more, at the end.
    std::fprintf(stderr,
                 "%sexits with code %d: %zu output file(s) not written whole (each named in an "
                 "[output] warning above); training and its checkpoints completed\n",
                 rank.c_str(), kExitOutput, result.output_failures.size());
    return kExitOutput;  // before kExitStopped: a requeue would not mend the outputs
  } catch (...) {
    const config::Train& train = resolved.values().train();
    return ReportCurrentFailure(
        rank, "train.micro_batch_size=" + std::to_string(train.micro_batch_size()) +
                  " x train.seq_length=" + std::to_string(train.seq_length()) +
                  " tokens per micro-batch");
  }
}

// The rank's device: host memory, or the GPU the placement chose (its memory capped by
// device.memory_limit when that is set).
std::unique_ptr<::bigmac::device::Device> MakeRankDevice(const comm::DevicePlacement& placement,
                                                         int world_rank, int ranks_on_node,
                                                         int64_t memory_limit_bytes) {
  if (placement.backend == ::bigmac::device::Backend::kCuda) {
    return ::bigmac::device::cuda::MakeCudaDevice(placement.index, world_rank, memory_limit_bytes);
  }
  return ::bigmac::device::MakeCpuDevice(placement.index,
                                         memory::CpuCapacity(memory_limit_bytes, ranks_on_node));
}

// OpenMP and BLAS threads per rank: the node's cores shared by its ranks (spinning threads of
// oversubscribed ranks starve each other), unless the user set OMP_NUM_THREADS.
void ConfigureThreads(int ranks_on_node) {
  if (const char* threads = std::getenv("OMP_NUM_THREADS"); threads && *threads) return;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const int threads = std::max(1, cores / std::max(1, ranks_on_node));
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
}

}  // namespace

int ReportFailure(const std::string& message, int code) {
  std::fprintf(stderr, "bigmac: %s\n", util::Printable(message).c_str());
  return code;
}

namespace {

// What is wrong with the combination of --tokenizer, --vocab-size and --tokenizer-model, or "".
std::string TokenizerOptionsProblem(const DataPrepOptions& options) {
  const std::string kind = options.tokenizer.empty()
                               ? (options.tokenizer_model.empty() ? "byte" : "sentencepiece")
                               : options.tokenizer;
  if (kind == "byte" && (options.vocab_size != 0 || !options.tokenizer_model.empty())) {
    return "--vocab-size and --tokenizer-model need --tokenizer sentencepiece (byte-level has "
           "vocabulary 256)";
  }
  if (kind == "sentencepiece" && options.vocab_size == 0 && options.tokenizer_model.empty())
    return "--tokenizer sentencepiece needs --vocab-size N (train a model) or --tokenizer-model "
           "FILE";
  if (options.vocab_size != 0 && !options.tokenizer_model.empty()) {
    return "--vocab-size " + std::to_string(options.vocab_size) + " and --tokenizer-model " +
           options.tokenizer_model + " conflict: the model fixes the vocabulary";
  }
  return "";
}

}  // namespace

int RunDataPrep(const DataPrepOptions& options) {
  if (std::string problem = TokenizerOptionsProblem(options); !problem.empty())
    return ReportFailure(problem, kExitConfig);
  if (std::string problem = OutputDirProblem("--output", options.output); !problem.empty()) {
    return ReportFailure(problem, kExitOutput);
  }
  // Two preps replacing one directory's shards would mix their files: one at a time. (A new
  // directory needs no lock: it appears with one rename, and a second rename fails.)
  std::unique_ptr<util::DirectoryLock> lock;
  if (std::error_code error; std::filesystem::is_directory(options.output, error)) {
    std::string problem, note;
    lock = util::DirectoryLock::Acquire(options.output, "--output", "data prep", &problem, &note);
    if (!lock) return ReportFailure(problem, kExitOutput);
    if (!note.empty()) std::printf("%s\n", note.c_str());
  }
  const std::vector<std::string> old = data::ShardsIn(options.output);
  if (!old.empty() && !options.overwrite) {
    // Writing only some of them would leave a mix of two corpora for the next run to train on.
    return ReportFailure("--output " + options.output + ": already holds " +
                             std::to_string(old.size()) + " shard(s) (" + old.front() +
                             ", ...); pass --overwrite to replace all of them, or "
                             "choose another directory",
                         kExitOutput);
  }
  // The tokenizer files are outputs too: a directory may hold another tool's tokenizer.json.
  if (std::string problem = ReplaceProblem("--output",
                                           {options.output + "/" + data::kTokenizerManifest,
                                            options.output + "/" + data::kTokenizerModel},
                                           options.overwrite);
      !problem.empty()) {
    return ReportFailure(problem, kExitOutput);
  }
  data::PrepOptions prep;
  prep.inputs = options.inputs;
  prep.output = options.output;
  prep.val_every = options.val_every;
  prep.tokenizer =
      options.vocab_size != 0 || !options.tokenizer_model.empty() ? "sentencepiece" : "byte";
  prep.vocab_size = options.vocab_size;
  prep.model_type = options.model_type;
  prep.tokenizer_model = options.tokenizer_model;
  try {
    std::printf("%s%s\n", data::PrepareShards(prep).c_str(),
                old.empty()
                    ? ""
                    : ("; replaced the " + std::to_string(old.size()) + " old shard(s)").c_str());
    return kExitOk;
  } catch (const data::DataError& error) {
    return ReportFailure(error.what(), kExitBadData);
  }
}

int RunDataBatches(const DataBatchesOptions& options) {
  try {
    const config::ResolvedConfig resolved =
        LoadModelConfig(options.config, options.overrides, {}, options.world_size, "--world-size");
    const config::Config& cfg = resolved.values();
    if (std::string problem = OutputFileProblem("--output", options.output, options.overwrite);
        !problem.empty()) {
      return ReportFailure(problem, kExitOutput);
    }
    const data::BlendedData dataset(data::BlendedData::Options{
        cfg.data().dir(), cfg.data().train_files(), cfg.data().val_files(), resolved.data});
    dataset.CheckFits(cfg.train().seq_length(), cfg.model().vocab_size());
    const data::BlendSampler sampler(dataset.weights(), static_cast<uint64_t>(cfg.train().seed()));
    const int batch = cfg.train().micro_batch_size();
    const int seq = cfg.train().seq_length();
    const int per_step = cfg.train().gradient_accumulation_steps() * resolved.dp;
    std::string problem;
    std::unique_ptr<util::OutputFile> out = util::OutputFile::Open(options.output, &problem);
    if (!out) return ReportFailure(problem, kExitOutput);
    const int32_t header[5] = {0x54424d42, options.steps, per_step, batch, seq};
    auto put = [&out](const void* data, size_t bytes) {
      out->Write(std::string_view(static_cast<const char*>(data), bytes));
    };
    put(header, sizeof(header));
    std::vector<int32_t> tokens(int64_t{batch} * seq), targets(tokens.size());
    for (int step = 0; step < options.steps; ++step) {
      for (int global = 0; global < per_step; ++global) {
        // As the trainer reads them (engine/trainer.cc): keyed by the global micro-batch index,
        // the blend's samples counted from the first step.
        const int64_t first_sample = int64_t{step} * resolved.batch.global_batch;
        dataset.TrainBatch(sampler, first_sample, static_cast<uint64_t>(cfg.train().seed()), step,
                           global, batch, seq, tokens.data(), targets.data());
        put(tokens.data(), tokens.size() * 4);
        put(targets.data(), targets.size() * 4);
      }
    }
    if (problem = out->Commit(); !problem.empty()) return ReportFailure(problem, kExitOutput);
    std::printf("wrote %d steps x %d micro-batches of %dx%d tokens to %s\n", options.steps,
                per_step, batch, seq, options.output.c_str());
    return kExitOk;
  } catch (const config::ConfigError& error) {
    PrintProblems("bigmac: invalid configuration", error.problems());
    return kExitConfig;
  } catch (const data::DataError& error) {
    std::fprintf(stderr, "bigmac: %s\n", error.what());
    return kExitBadData;
  }
}

int RunSchedule(const ScheduleOptions& options) {
  schedule::Kind kind;
  if (!schedule::ParseKind(options.kind, &kind)) {
    std::fprintf(stderr, "bigmac: --kind %s is not one of gpipe, 1f1b, interleaved_1f1b, zb_h1\n",
                 options.kind.c_str());
    return kExitConfig;
  }
  // The parser bounded each size; their product bounds the actions simulated.
  std::vector<std::string> problems;
  if (int64_t{options.pp} * options.virtual_stages * options.microbatches > kMaxScheduleSize) {
    problems.push_back(
        "--pp * --virtual * --microbatches = " +
        std::to_string(int64_t{options.pp} * options.virtual_stages * options.microbatches) +
        " is over the limit of " + std::to_string(kMaxScheduleSize));
  } else {
    problems = schedule::CheckScheduleConstraints(kind, options.pp, options.virtual_stages,
                                                  options.microbatches);
  }
  if (!problems.empty()) {
    PrintProblems("bigmac: invalid schedule", problems);
    return kExitConfig;
  }
  const schedule::ScheduleSpec spec{kind, options.pp, options.microbatches, options.virtual_stages,
                                    !options.whole_backward};
  schedule::Costs costs;
  const int stages = options.pp * options.virtual_stages;
  const bool measured = !options.forward_ms.empty() || !options.backward_ms.empty();
  if (measured) {
    auto per_stage = [&](const std::vector<double>& values, const char* flag) {
      if (values.empty()) {
        throw std::invalid_argument(std::string(flag) +
                                    " is missing: --forward-ms and --backward-ms go together");
      }
      if (values.size() == 1) return std::vector<double>(stages, values[0]);
      if (static_cast<int>(values.size()) != stages) {
        throw std::invalid_argument(std::string(flag) +
                                    " needs 1 or pp*virtual=" + std::to_string(stages) + " values");
      }
      return values;
    };
    try {
      costs.stage_forward = per_stage(options.forward_ms, "--forward-ms");
      costs.stage_backward = per_stage(options.backward_ms, "--backward-ms");
    } catch (const std::invalid_argument& error) {
      std::fprintf(stderr, "bigmac: %s\n", error.what());
      return kExitConfig;
    }
    costs.transfer = options.transfer_ms;
  }
  const std::string trace_path = options.trace.empty()
                                     ? "runs/schedule/schedule_" + options.kind + "_pp" +
                                           std::to_string(options.pp) + "_m" +
                                           std::to_string(options.microbatches) + ".json"
                                     : options.trace;
  if (std::string problem =
          OutputFileProblem("--trace", trace_path, options.overwrite || options.trace.empty());
      !problem.empty()) {
    return ReportFailure(problem, kExitOutput);
  }
  const schedule::SimResult result =
      schedule::Simulate(schedule::BuildAllActions(spec), spec.virtual_stages, costs);
  std::printf("schedule %s: pp=%d microbatches=%d virtual_stages=%d; %s%s\n", options.kind.c_str(),
              options.pp, options.microbatches, options.virtual_stages,
              measured ? "per-stage costs in ms" : "unit costs F=1 B=2 (BI=W=1)",
              spec.virtual_stages > 1 ? ", divided by virtual_stages per chunk" : "");
  if (!measured) std::printf("%s", schedule::FormatGrid(result, options.pp).c_str());
  if (!result.problem.empty()) {
    std::fprintf(stderr, "bigmac: %s\n", result.problem.c_str());
    return kExitFailure;
  }
  std::string in_flight;
  for (size_t r = 0; r < result.max_in_flight.size(); ++r) {
    in_flight += (r ? ", " : "") + std::to_string(result.max_in_flight[r]);
  }
  std::printf("no deadlock; every send meets its receive\n");
  std::string tail;
  for (const schedule::Action& action : schedule::BuildStepTail(spec, 0))
    tail += " " + schedule::ShortName(action);
  std::printf("per step, once after the last flush:%s\n", tail.c_str());
  std::printf(
      "bubble: %.4f of %d ranks x %.2f time units; micro-batches in flight per rank: [%s]\n",
      result.bubble_fraction, options.pp, result.makespan, in_flight.c_str());
  // Each rank's computing time and its waiting before its last computation ends: what the
  // trainer's trace records as busy and wait spans for one flush (bench/pipeline_overhead.py).
  std::vector<double> last_end(options.pp, 0);
  for (const schedule::SimEvent& event : result.events) {
    if (event.rank < options.pp) last_end[event.rank] = std::max(last_end[event.rank], event.end);
  }
  for (int rank = 0; rank < options.pp; ++rank) {
    std::printf("rank %d: busy %.3f, waiting %.3f, last computation ends at %.3f\n", rank,
                result.busy[rank], last_end[rank] - result.busy[rank], last_end[rank]);
  }
  if (!options.allreduce_ms.empty() || !options.allreduce_tail_ms.empty()) {
    auto per_rank = [&](const std::vector<double>& values) {
      if (values.size() == 1) return std::vector<double>(options.pp, values[0]);
      return values;
    };
    schedule::DpReduceCosts dp;
    dp.allreduce = per_rank(options.allreduce_ms);
    dp.tail = per_rank(options.allreduce_tail_ms);
    dp.buckets = options.dp_buckets;
    bool valid = static_cast<int>(dp.allreduce.size()) == options.pp &&
                 (dp.tail.empty() || static_cast<int>(dp.tail.size()) == options.pp);
    for (size_t r = 0; valid && r < dp.tail.size(); ++r) valid = dp.tail[r] <= dp.allreduce[r];
    if (!valid) {
      std::fprintf(stderr,
                   "bigmac: --allreduce-ms needs 1 or pp=%d values, --allreduce-tail-ms 0, 1 or "
                   "pp values, each at most its rank's --allreduce-ms\n",
                   options.pp);
      return kExitConfig;
    }
    const schedule::DpReducePrediction dp_result = schedule::PredictDpReduce(result, dp);
    for (int rank = 0; rank < options.pp; ++rank) {
      std::printf(
          "dp all-reduce rank %d: %.3f (tail %.3f, %d bucket(s)); flush ends at %.3f; serial "
          "ends at %.3f; overlapped ends at %.3f\n",
          rank, dp.allreduce[rank], dp.tail.empty() ? 0.0 : dp.tail[rank], dp.buckets,
          dp_result.compute_end[rank], dp_result.serial_end[rank], dp_result.overlap_end[rank]);
    }
    std::printf("dp all-reduce step: serial %.3f, overlapped %.3f, saved %.3f\n",
                dp_result.serial_makespan, dp_result.overlap_makespan,
                dp_result.serial_makespan - dp_result.overlap_makespan);
  }
  {
    std::string problem;
    std::unique_ptr<util::OutputFile> file = util::OutputFile::Open(trace_path, &problem);
    if (file) {
      // Streamed: a large schedule's trace is hundreds of MB, not worth a second copy in memory.
      util::OutputFileBuffer buffer(file.get());
      std::ostream trace(&buffer);
      schedule::WriteChromeTrace(result, options.kind, trace);
      trace.flush();
      problem = file->Commit();
    }
    if (!problem.empty()) return ReportFailure(problem, kExitOutput);
  }
  std::printf("trace: %s (open in https://ui.perfetto.dev or chrome://tracing)\n",
              trace_path.c_str());
  return kExitOk;
}

std::string ConfigKeysHelp() {
  std::string text = "Config keys (YAML sections, or --set key=value):\n";
  const config::Config defaults;
  for (const config::KeyInfo& key : config::AllKeys()) {
    text += "  " + key.path + " = " + config::FormatValue(defaults, key) + "  [" +
            config::LayerName(key.layer) + (key.env.empty() ? "" : ": " + key.env) + "] " +
            key.help;
    if (!key.choices.empty()) {
      std::string choices;
      for (const std::string& choice : key.choices)
        choices += (choices.empty() ? "" : "|") + choice;
      text += " (" + choices + ")";
    }
    text += "\n";
  }
  text +=
      "Launch layer (never in the config): the rank count comes from mpirun -np / sbatch;\n"
      "[launch: VAR] keys are set by the launcher as that environment variable;\n"
      "dp = world_size / (pp_size * tp_size) is derived, never written.";
  return text;
}

int RunTrain(const TrainOptions& options, int* argc, char*** argv) {
  comm::MpiWorld world(argc, argv);
  util::InstallStopSignalHandlers();
  util::SetStopAtOnce(true);
  // The reliability tests' faults (docs/exit_codes.md), read once. A stalled start-up waits here
  // for a signal, as one blocked on a slow file system would.
  const util::FaultPlan faults = FaultPlanFromEnvironment();
  if (faults.stall_startup) {
    while (true) pause();
  }
  // Load and check locally: nothing is allocated and nothing is communicated until all agree.
  std::optional<config::ResolvedConfig> resolved;
  std::vector<std::string> problems;
  try {
    resolved = LoadModelConfig(options.config, options.overrides, options.plugins, world.size(),
                               WorldSizeSource());
  } catch (const config::ConfigError& error) {
    problems = error.problems();
  }
  if (int code = AllRanksAgree(world, "configuration", problems, resolved ? resolved->hash : 0))
    return code;
  // Before any work: a run must not train for hours and then find it cannot write its results,
  // nor resume from a checkpoint it cannot use. --dry-run runs the same checks.
  const StartupCheck outputs = CheckTrainOutputs(*resolved, options.dump_dir, options.overwrite);
  if (int code = AllRanksAgree(world, "output locations", outputs.problems, resolved->hash,
                               outputs.exit_code)) {
    return code;
  }
  // One run per directory: rank 0 claims checkpoint.dir and train.output_dir for the whole run
  // (the other ranks write under its claim); every rank stops if another run holds one.
  std::vector<std::unique_ptr<util::DirectoryLock>> locks;  // released when the run ends
  const StartupCheck lock_check =
      world.rank() == 0 ? LockTrainOutputs(*resolved, options.dry_run, &locks) : StartupCheck{};
  if (int code = AllRanksAgree(world, "output locations", lock_check.problems, resolved->hash,
                               kExitOutput)) {
    return code;
  }
  if (!lock_check.summary.empty()) PrintLines({lock_check.summary});
  const StartupCheck resume =
      CheckResumeSource(*resolved, options.resume, options.allow_data_change);
  if (int code = AllRanksAgree(world, "resume source", resume.problems, resolved->hash,
                               resume.exit_code)) {
    return code;
  }

  // Decided from the (agreed) config alone, so every rank stops together without communicating.
  if (!options.dry_run) {
    if (const std::vector<std::string> missing = UnsupportedForTraining(*resolved);
        !missing.empty()) {
      if (world.rank() == 0)
        PrintProblems("bigmac: this configuration cannot train with this build", missing);
      std::fprintf(stderr, "bigmac: rank %d exits with code %d\n", world.rank(), kExitConfig);
      return kExitConfig;
    }
  }
  world.DiscoverNode();
  comm::DevicePlacement device;
  std::string device_error;
  const int cuda_devices =
      resolved->backend == ::bigmac::device::Backend::kCuda ? comm::cuda::DeviceCount() : 0;
  const char* share = std::getenv(comm::kShareDevicesEnv);
  std::string launcher;
  if (std::string problem = comm::CheckLocalRank(
          world.rank(), world.size(), world.local_rank(),
          [](const char* name) { return std::getenv(name); }, &launcher);
      !problem.empty()) {
    problems = {"host " + world.host() + ": " + problem};
  } else if (!comm::ChooseDevice(resolved->backend, world.local_rank(), world.local_size(),
                                 cuda_devices, share != nullptr && std::string(share) == "1",
                                 &device, &device_error)) {
    problems = {"host " + world.host() + ": " + device_error};
  }
  if (int code = AllRanksAgree(world, "device placement", problems, resolved->hash)) return code;
  // The transport: the launch layer's device.transport against the job's GPU sharing (every rank
  // must pick the same one).
  comm::TransportChoice transport;
  {
    comm::TransportRequest request;
    request.requested = resolved->values().device().transport();
    request.source = resolved->sources().Get("device.transport").ToString();
    request.backend_source = resolved->sources().Get("device.backend").ToString();
    std::string error;
    if (!comm::ChooseJobTransport(world, request, device, cuda_devices, &transport, &error))
      problems = {error};
  }
  if (int code = AllRanksAgree(world, "transport", problems, resolved->hash)) return code;

  const comm::Topology topology(world.size(), resolved->pp, resolved->dp, resolved->tp);
  comm::GroupComms comms = comm::GroupComms::Create(topology, world.rank());
  if (world.rank() == 0) PrintLines(config::EffectiveConfigLines(*resolved));
  std::string placement =
      "host=" + world.host() + " local_rank=" + std::to_string(world.local_rank()) + "/" +
      std::to_string(world.local_size()) + (launcher.empty() ? "" : " (= " + launcher + "'s)") +
      " device=" + device.ToString();
  if (device.backend == ::bigmac::device::Backend::kCuda) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    placement += std::string(" CUDA_VISIBLE_DEVICES=") + (visible ? visible : "(unset)");
  }
  if (device.backend == ::bigmac::device::Backend::kCpu) {
    placement +=
        " capacity=" +
        memory::FormatMiB(memory::CpuCapacity(resolved->memory_limit_bytes, world.local_size())) +
        " gemm=" + sdk::cpu::FloatGemmLibrary();
  }
  placement += " " + transport.ToString();
  const std::vector<std::string> rank_lines = world.GatherToRoot(
      "[rank] " + comm::FormatRankLine(topology, resolved->partition, world.rank(), placement));
  if (world.rank() == 0) PrintLines(rank_lines);

  if (options.dry_run) {
    if (world.rank() == 0) {
      if (!resume.summary.empty()) std::printf("[dry-run] %s\n", resume.summary.c_str());
      std::printf(
          "[dry-run] configuration valid on all %d ranks; output locations writable; nothing "
          "was allocated\n",
          world.size());
    }
    comms.Free();
    return kExitOk;
  }
  util::SetStopAtOnce(false);  // from here a signal stops the trainer at a step boundary
  ConfigureThreads(world.local_size());
  // A rank with a core of its own polls a wait for 2 ms before sleeping; ranks that share cores
  // poll briefly, leaving the core to the rank they wait for (bench/NOTES.md).
  const bool core_each =
      world.local_size() <= static_cast<int>(std::thread::hardware_concurrency());
  // Hangs explained: every rank answers status requests from here on, and a wait past its
  // deadline prints the wait-for graph's verdict before the job stops (docs/reliability.md).
  std::unique_ptr<comm::HangWatch> hang_watch;
  if (world.size() > 1) {
    hang_watch = comm::HangWatch::Start(topology, world.rank(), world.host(),
                                        resolved->values().train().comm_timeout_seconds());
  }
  // The rank's device, chosen above; it outlives the training run and the transport.
  std::unique_ptr<::bigmac::device::Device> rank_device;
  try {
    rank_device =
        MakeRankDevice(device, world.rank(), world.local_size(), resolved->memory_limit_bytes);
  } catch (const ::bigmac::device::DeviceError& error) {
    problems = {error.what()};
  }
  if (int code = AllRanksAgree(world, "device set-up", problems, resolved->hash, kExitDevice))
    return code;
  // After the device: NCCL's communicators are created on it (collectively, under the deadline).
  std::unique_ptr<comm::PipelineComm> pipeline;
  int transport_code = kExitDevice;
  try {
    pipeline = comm::MakePipelineComm(
        transport.kind, topology, world.rank(), comms, rank_device.get(),
        resolved->values().train().comm_timeout_seconds(), core_each ? 2e-3 : 50e-6,
        /*stage_host_tensors=*/false, faults.max_message_bytes);
  } catch (const ::bigmac::device::DeviceError& error) {
    problems = {error.what()};
  } catch (const comm::DeadlineError& error) {
    problems = {error.what()};
    transport_code = kExitTimeout;
  }
  if (int code = AllRanksAgree(world, "transport set-up", problems, resolved->hash, transport_code))
    return code;
  if (device.backend == ::bigmac::device::Backend::kCuda) {
    const std::vector<std::string> lines =
        world.GatherToRoot("[device] rank " + std::to_string(world.rank()) + ": " +
                           ::bigmac::device::cuda::Describe(rank_device.get()) + "; " +
                           stages::gpt::cuda::CudaLayoutSummary(
                               config::ModelDimsOf(resolved->values()), resolved->bf16));
    if (world.rank() == 0) PrintLines(lines);
  }
  engine::TrainOptions train_options;
  train_options.device = rank_device.get();
  train_options.ranks_on_node = world.local_size();
  train_options.dump_dir = options.dump_dir;
  train_options.resume = options.resume;
  train_options.faults = faults;
  train_options.log = [](const std::string& line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  };
  const int code = RunTraining(*resolved, *pipeline, train_options);
  // A stop by signal was agreed on by every rank, which all return it: nobody waits, and rank 0
  // may still be writing its outputs, so no abort.
  if (code != kExitOk && code != kExitStopped && world.size() > 1) {
    // The other ranks may be waiting on this one: stop the whole job now, with this code.
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
  }
  pipeline.reset();
  comms.Free();
  return code;
}

int RunConfigKey(const std::string& name) {
  std::string normalized = name;
  std::replace(normalized.begin(), normalized.end(), '-', '_');
  const std::vector<config::KeyInfo> keys = config::AllKeys();
  const config::KeyInfo* key = config::LookupKeyName(keys, normalized);
  if (key == nullptr) return kExitFailure;
  std::printf("%s %s\n", key->path.c_str(), config::LayerName(key->layer).c_str());
  return kExitOk;
}

namespace {

// plan --check: the configured layout trained for a few steps, its measured peaks against the
// plan's. Exit 0 when every pipeline rank is within the tolerance, 1 otherwise.
int CheckPlanMemory(const PlanOptions& options, const config::ResolvedConfig& resolved,
                    const std::vector<plan::PolicyPlan>& plans) {
  const std::string configured = partition::PolicyName(resolved.policy);
  const auto it = std::find_if(plans.begin(), plans.end(), [&](const plan::PolicyPlan& plan) {
    return plan.policy == configured;
  });
  if (it == plans.end() || !it->valid) {
    std::fprintf(stderr, "bigmac: plan --check: the configured policy %s has no valid plan\n",
                 configured.c_str());
    return kExitFailure;
  }
  if (std::string problem = OutputDirProblem("--check-dir", options.check_dir); !problem.empty())
    return ReportFailure(problem, kExitOutput);
  // The directory is replaced: only one that an earlier --check made (it holds the marker), or a
  // new or empty one, never a directory of the user's.
  const std::filesystem::path dir(options.check_dir);
  const std::filesystem::path marker = dir / ".bigmac-plan-check";
  std::error_code error;
  if (std::filesystem::exists(dir, error) && !std::filesystem::is_empty(dir, error) &&
      !std::filesystem::exists(marker, error)) {
    return ReportFailure("--check-dir " + options.check_dir +
                             ": holds files that plan --check did not write (no " +
                             marker.filename().string() +
                             " in it); name a new directory, it is replaced on every check",
                         kExitOutput);
  }
  std::filesystem::remove_all(dir, error);
  std::filesystem::create_directories(dir, error);
  if (std::string problem = util::WriteWholeFile(marker.string(), "bigmac plan --check\n");
      !problem.empty())
    return ReportFailure(problem, kExitOutput);
  std::string command = options.launcher;
  for (size_t at = command.find("{np}"); at != std::string::npos; at = command.find("{np}"))
    command.replace(at, 4, std::to_string(resolved.world_size));
  command += " " + util::ShellQuote(util::SelfPath()) + " train --config " +
             util::ShellQuote(options.config);
  for (const std::string& plugin : options.plugins)
    command += " --plugin " + util::ShellQuote(plugin);
  for (const std::string& set : options.overrides) command += " --set " + util::ShellQuote(set);
  command += " --set train.max_steps=" + std::to_string(options.check_steps) +
             " --set train.output_dir=" + util::ShellQuote(options.check_dir) +
             " --set train.eval_interval=0 --set train.sample_interval=0"
             " --set 'checkpoint.dir=\"\"'";
  std::printf("[check] running %d step(s) on %d rank(s): %s\n", options.check_steps,
              resolved.world_size, command.c_str());
  std::fflush(stdout);
  const util::ChildResult run = util::RunChild(command);
  if (run.exit_code != 0) {
    std::fprintf(stderr, "bigmac: plan --check: the run failed with exit code %d:\n%s\n",
                 run.exit_code, run.output.c_str());
    return run.exit_code > kExitFailure && run.exit_code <= kExitDevice ? run.exit_code
                                                                        : kExitFailure;
  }
  const plan::RunRecord record = ReadRunRecord(options.config, options.check_dir, run.output, 0);
  const std::vector<plan::MemoryCheck> checks = plan::CheckMemory(*it, record.ranks);
  PrintLines(plan::FormatMemoryChecks(checks, configured, options.check_tolerance));
  const bool all_within = std::all_of(checks.begin(), checks.end(), [&](const auto& check) {
    return check.measured_mib > 0 && std::fabs(check.error()) <= options.check_tolerance;
  });
  return all_within ? kExitOk : kExitFailure;
}

}  // namespace

int RunPlan(const PlanOptions& options) {
  try {
    const config::ResolvedConfig resolved = LoadModelConfig(
        options.config, options.overrides, options.plugins, options.world_size, "--world-size");
    PrintLines(config::EffectiveConfigLines(resolved));
    const comm::Topology topology(resolved.world_size, resolved.pp, resolved.dp, resolved.tp);
    std::vector<std::string> lines;
    for (int rank = 0; rank < resolved.world_size; ++rank) {
      lines.push_back("[rank] " + comm::FormatRankLine(topology, resolved.partition, rank, ""));
    }
    PrintLines(lines);
    const plan::LayerTimes times = options.profile
                                       ? plan::MeasureLayerTimes(resolved)
                                       : plan::EstimateLayerTimes(resolved, options.gflops);
    const std::vector<plan::PolicyPlan> plans = plan::PlanPolicies(resolved, times);
    PrintLines(plan::FormatPlans(resolved, plans, times));
    return options.check ? CheckPlanMemory(options, resolved, plans) : kExitOk;
  } catch (const config::ConfigError& error) {
    PrintProblems("bigmac: invalid configuration", error.problems());
    return kExitConfig;
  }
}

}  // namespace bigmac::cli
