#ifndef BIGMAC_CORE_CLI_COMMANDS_H_
#define BIGMAC_CORE_CLI_COMMANDS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace bigmac::cli {

struct TrainOptions {
  std::string config;
  std::vector<std::string> overrides;
  bool dry_run = false;
  std::string dump_dir;  // final weights per layer_id and per-step losses, to compare runs
  std::string resume;    // "auto", a checkpoint step directory or root, or ""
  std::vector<std::string> plugins;  // --plugin: layer plugin libraries, after the config's
  bool overwrite = false;            // replace an earlier --dump
  bool allow_data_change = false;    // resume although data.path or data.split changed
};

struct PlanOptions {
  std::string config;
  std::vector<std::string> overrides;
  int world_size = 1;
  double gflops = 20;    // assumed per-rank throughput for the estimated times
  bool profile = false;  // measure each kind of layer on this machine instead
  std::vector<std::string> plugins;
  // --check: train the configured layout for check_steps steps (launcher, {np} = world size)
  // and print each pipeline rank's predicted peak memory against the measured one.
  bool check = false;
  int check_steps = 3;
  double check_tolerance = 0.10;
  std::string launcher = "mpirun --oversubscribe -np {np}";
  std::string check_dir = "runs/plan_check";  // the run's output directory (replaced)
};

// `bigmac train`: one rank per process under mpirun. Returns the exit code (exit_codes.h).
int RunTrain(const TrainOptions& options, int* argc, char*** argv);

// `bigmac config-key NAME`: "path layer" of the config key NAME means ('-' read as '_'), or
// exit 1.
int RunConfigKey(const std::string& name);

// `bigmac plan`: the dry-run's printout for a given world size, without MPI.
int RunPlan(const PlanOptions& options);

struct DataPrepOptions {
  std::vector<std::string> inputs;
  std::string output;
  int val_every = 20;
  bool overwrite = false;  // replace the shards already in `output`
  std::string tokenizer;   // "byte" (default) or "sentencepiece"
  int vocab_size = 0;      // sentencepiece: train a model of this many pieces
  std::string model_type = "bpe";
  std::string tokenizer_model;  // sentencepiece: encode with this model instead of training one
};

// `bigmac data prep`: text files -> token shards (byte-level or SentencePiece) with a held-out
// validation split and tokenizer.json beside them.
int RunDataPrep(const DataPrepOptions& options);

struct DataBatchesOptions {
  std::string config;
  std::vector<std::string> overrides;
  int steps = 10;
  int world_size = 1;  // for dp: the batches of every replica, in global micro-batch order
  std::string output;
  bool overwrite = false;  // replace an existing `output`
};

// `bigmac data batches`: the exact training batches a run would read, for feeding another
// trainer (bench/) the same data. Format: int32 header {magic 0x54424d42 "BMBT", steps,
// micro-batches per step, batch, seq}, then per step and global micro-batch: tokens, then
// targets, as int32 (batch x seq each).
int RunDataBatches(const DataBatchesOptions& options);

struct ScheduleOptions {
  std::string kind = "1f1b";
  int pp = 4;
  int microbatches = 8;
  int virtual_stages = 1;
  // Backward whole on every stage, as under train.activation_checkpointing (otherwise a stage that
  // sends a gradient sends it before its weight gradients: ScheduleSpec::send_grad_before_weights).
  bool whole_backward = false;
  std::string trace;       // empty: runs/schedule/schedule_<kind>_pp<P>_m<M>.json (replaced freely)
  bool overwrite = false;  // replace an existing --trace file the user named
  // Measured or estimated milliseconds per micro-batch, per stage (one value: every stage);
  // empty: unit costs F=1, B=2.
  std::vector<double> forward_ms;
  std::vector<double> backward_ms;
  double transfer_ms = 0;
  // The dp all-reduce after the flush, serial and overlapped (schedule::PredictDpReduce): ms per
  // rank (one value: every rank), the part of it that waits for the flush's end (a tied weight),
  // and the buckets of the rest. Empty: not predicted.
  std::vector<double> allreduce_ms;
  std::vector<double> allreduce_tail_ms;
  int dp_buckets = 1;
};

// `bigmac schedule`: the per-rank grid of a schedule, its simulated bubble and memory, and a
// Chrome/Perfetto trace of the timeline.
int RunSchedule(const ScheduleOptions& options);

// `bigmac ckpt inspect DIR`, `ckpt export DIR --safetensors OUT`, `ckpt import`.
int RunCkptInspect(const std::string& dir);
// Export and import load `plugins` (--plugin) first, then those the checkpoint (the config)
// names, for blocks of plugin types. Export replaces an existing file only with `overwrite`.
int RunCkptExport(const std::string& dir, const std::string& safetensors,
                  const std::vector<std::string>& plugins, bool overwrite);
// An import refuses an `output` that holds checkpoints unless `overwrite`.
int RunCkptImport(const std::string& safetensors, const std::string& config_file,
                  const std::vector<std::string>& overrides,
                  const std::vector<std::string>& plugins, const std::string& output,
                  bool overwrite);

struct GenerateOptions {
  std::string checkpoint;  // a step directory, or a checkpoint directory (its latest)
  std::string prompt;
  int tokens = 64;
  double temperature = 1.0;  // 0: greedy
  int top_k = 0;             // 0: the whole vocabulary
  uint64_t seed = 1;
  std::vector<std::string> plugins;  // --plugin: before those the checkpoint recorded
  std::string data_dir;              // --data-dir: where the recorded tokenizer is, if not data.dir
};

// `bigmac generate`: the prompt and its continuation on stdout (detokenized), sampled from a
// checkpoint of any layout loaded on one CPU rank; a summary line on stderr.
int RunGenerate(const GenerateOptions& options);

struct TuneMbsOptions {
  std::string config;
  std::vector<std::string> overrides;
  int lo = 1;
  int hi = 256;
  int steps = 3;
  int timeout_seconds = 900;
  bool write = false;
  bool pipeline = false;
  std::string launcher = "mpirun --oversubscribe -np {np}";
  std::string child_command;  // replaces the trainer ({mbs} is substituted), for tests
};

// `bigmac tune-mbs`: the largest micro-batch that fits, by bisection over real training runs.
int RunTuneMbs(const TuneMbsOptions& options);

struct CompareOptions {
  std::string baseline;
  std::string candidate;
  std::vector<std::string> baseline_overrides;
  std::vector<std::string> candidate_overrides;
  int steps = 40;
  int warmup = 5;
  int np_baseline = 0;  // 0: pp_size * tp_size of its config
  int np_candidate = 0;
  std::string out = "runs/compare";  // the default is BigMac's scratch: replaced freely
  bool overwrite = false;            // replace the reports of an --out the user named
  std::string launcher = "mpirun --oversubscribe -np {np}";
};

// `bigmac compare`: both configs for a few steps on the same data, a table, the seed's verdict
// (memory, stable step time, loss following the baseline), the bottleneck stage, a Markdown
// report and an SVG chart.
int RunCompare(const CompareOptions& options);

// Prints "bigmac: <message>" (made printable) on stderr and returns `code`.
int ReportFailure(const std::string& message, int code);

// Help text listing every config key with its layer, default and meaning.
std::string ConfigKeysHelp();

}  // namespace bigmac::cli

#endif  // BIGMAC_CORE_CLI_COMMANDS_H_
