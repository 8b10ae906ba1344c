// The bigmac command line: `bigmac train`, `bigmac plan`.
#include <CLI/CLI.hpp>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/cli/blas_core.h"
#include "core/cli/commands.h"
#include "core/cli/exit_codes.h"
#include "core/cli/failure.h"
#include "core/cli/model_config.h"
#include "core/config/environment.h"
#include "plugins/sdk/cpu_kernels.h"

namespace {

// The largest sizes the commands accept, checked by the parser before anything is allocated
// (docs/reliability.md, "Sizes"); a bigger value is a typo, not a plan.
constexpr int kMaxRanks = 65536;
constexpr int kMaxStages = 1024;
constexpr int kMaxMicrobatches = 4096;
constexpr int kMaxVirtualStages = 64;
constexpr int kMaxSteps = 1000000;
constexpr int kMaxMicroBatchSize = 65536;
constexpr int kMaxTimeoutSeconds = 7 * 24 * 3600;
constexpr double kMaxMilliseconds = 1e9;
constexpr int kMaxGeneratedTokens = 1000000;

// A finite number in [lo, hi] (CLI::Range lets NaN through); `what` says so in the message:
// "number of milliseconds in [0, 1e9]".
CLI::Validator FiniteIn(double lo, double hi, const std::string& what) {
  return CLI::Validator(
      [lo, hi, what](std::string& text) -> std::string {
        double value = 0;
        try {
          size_t used = 0;
          value = std::stod(text, &used);
          if (used != text.size()) return "'" + text + "' is not a number";
        } catch (const std::exception&) {
          return "'" + text + "' is not a number";
        }
        if (!std::isfinite(value) || value < lo || value > hi) {
          return "'" + text + "' must be a finite " + what;
        }
        return "";
      },
      what);
}

// An unsigned 64-bit integer written as digits only: CLI11 converts "-1" to 2^64 - 1 and clamps
// a number past 2^64 to it, so a typo would run as a huge value and be printed as one.
const CLI::Validator kUnsigned64(
    [](std::string& text) -> std::string {
      uint64_t value = 0;
      const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (text.empty() || text[0] == '-' || text[0] == '+' ||
          error == std::errc::invalid_argument || end != text.data() + text.size()) {
        return "'" + text + "' is not a whole number >= 0";
      }
      if (error == std::errc::result_out_of_range) {
        return "'" + text + "' is too large: the most is 18446744073709551615 (2^64 - 1)";
      }
      return "";
    },
    "INT in [0, 2^64 - 1]");

// A cost in milliseconds: finite and >= 0.
const CLI::Validator kMilliseconds =
    FiniteIn(0, kMaxMilliseconds, "number of milliseconds in [0, 1e9]");

// Runs a command; no exception reaches std::terminate: each becomes its exit code and message
// (core/cli/failure.h, docs/exit_codes.md).
int Guarded(const std::function<int()>& command) {
  try {
    return command();
  } catch (...) {
    return bigmac::cli::ReportCurrentFailure("bigmac: ",
                                             "lower the sizes in the command or the config");
  }
}

// "unknown command 'frob'; the commands are: ..." when the first word after `app`'s own words is
// not one of its subcommands (CLI11 says only "A subcommand is required"), else "".
std::string UnknownCommand(CLI::App* app, int argc, char** argv, int at) {
  std::vector<CLI::App*> commands = app->get_subcommands([](CLI::App*) { return true; });
  if (commands.empty() || at >= argc || argv[at][0] == '-') return "";
  std::string names;
  for (CLI::App* command : commands) {
    if (command->get_name() == argv[at]) return UnknownCommand(command, argc, argv, at + 1);
    names += (names.empty() ? "" : ", ") + command->get_name();
  }
  return std::string("unknown command '") + argv[at] + "' after '" +
         (at == 1 ? std::string("bigmac") : std::string(argv[at - 1])) +
         "'; the commands are: " + names;
}

}  // namespace

int main(int argc, char** argv) {
  using bigmac::cli::kExitConfig;
  // Before any OpenMP region or BLAS call: a bad OMP_NUM_THREADS crashes inside libgomp.
  if (const std::vector<std::string> problems =
          bigmac::config::CheckEnvironment([](const char* name) { return std::getenv(name); });
      !problems.empty()) {
    for (const std::string& problem : problems)
      std::fprintf(stderr, "bigmac: %s\n", problem.c_str());
    return kExitConfig;
  }
  bigmac::cli::EnsureFastBlasKernels(argv);
  // A file-size limit (ulimit -f) makes a write fail with EFBIG, reported as exit 8 with the path,
  // instead of killing the process (every command; train's signal handlers keep it so).
  std::signal(SIGXFSZ, SIG_IGN);
  if (std::string problem; !bigmac::sdk::cpu::FloatGemmLibrary(&problem)) {
    std::fprintf(stderr, "bigmac: %s\n", problem.c_str());
    return kExitConfig;
  }
  CLI::App app{
      "BigMac: pipeline-parallel training of transformer models.\n"
      "Run `bigmac <command> --help` for a command's options."};
  app.require_subcommand(1);
  app.footer("Exit codes: docs/exit_codes.md. Config layers: docs/config.md.");

  bigmac::cli::TrainOptions train_options;
  CLI::App* train = app.add_subcommand(
      "train",
      "Train under mpirun (one rank per device). --dry-run validates the configuration on "
      "every rank and prints the effective config and each rank's coordinates and stage.");
  train
      ->add_option("--config", train_options.config,
                   "YAML (.yaml) or text proto (.textproto) config file")
      ->required();
  train->add_option(
      "--set", train_options.overrides,
      "override a key: --set parallel.pp_size=4 --set model.layers_per_stage=[7,7,7,6]; "
      "applied after the file, in order");
  train->add_flag("--overwrite", train_options.overwrite,
                  "replace the files of an earlier --dump in its directory");
  train->add_flag("--dry-run", train_options.dry_run,
                  "check and print the effective configuration and topology, then exit");
  train->add_option(
      "--dump", train_options.dump_dir,
      "write the final weights (one file per layer_id) and per-step losses here, to compare runs");
  train->add_option(
      "--resume", train_options.resume,
      "continue from a checkpoint: auto (checkpoint.dir/latest, if any), a step directory, "
      "or a checkpoint directory; any pp/dp layout");
  train->add_flag("--allow-data-change", train_options.allow_data_change,
                  "with --resume: continue although data.path (the blend) or data.split differs "
                  "from the checkpoint's (the resume preview says what changes)");
  train->add_option("--plugin", train_options.plugins,
                    "load a layer plugin library (.so) before building the model; repeatable; "
                    "after the config's plugins: (docs/plugins.md)");
  train->footer(bigmac::cli::ConfigKeysHelp());

  bigmac::cli::PlanOptions plan_options;
  CLI::App* plan = app.add_subcommand(
      "plan",
      "Print what `train --dry-run` would print for a world size, without MPI, then the stage "
      "table of every partition policy (parameters, memory, times, predicted step and bubble) "
      "and a recommendation.");
  plan->add_option("--config", plan_options.config,
                   "YAML (.yaml) or text proto (.textproto) config file")
      ->required();
  plan->add_option("--world-size", plan_options.world_size, "number of ranks mpirun would start")
      ->required()
      ->check(CLI::Range(1, kMaxRanks));
  plan->add_option("--set", plan_options.overrides, "override a key (as for train)");
  plan->add_option("--gflops", plan_options.gflops,
                   "per-rank throughput assumed for estimated times (default 20)")
      ->check(CLI::Range(1e-3, 1e9));
  plan->add_flag(
      "--profile", plan_options.profile,
      "time each kind of layer on this machine (CPU backend) instead of estimating from FLOPs");
  plan->add_option("--plugin", plan_options.plugins, "load a layer plugin library (as for train)");
  plan->add_flag("--check", plan_options.check,
                 "train the configured layout for a few steps and print each pipeline rank's "
                 "predicted peak memory against the measured one (exit 1 if any is more than "
                 "--check-tolerance off)");
  plan->add_option("--check-steps", plan_options.check_steps,
                   "steps of the --check run (default 3)")
      ->check(CLI::Range(1, 1000));
  plan->add_option("--check-tolerance", plan_options.check_tolerance,
                   "the largest relative error --check accepts per rank (default 0.10)")
      ->check(CLI::Range(0.0, 10.0));
  plan->add_option("--launcher", plan_options.launcher,
                   "how --check starts the ranks ({np} is --world-size)");
  plan->add_option("--check-dir", plan_options.check_dir,
                   "the --check run's output directory (default runs/plan_check, replaced)");
  plan->footer(bigmac::cli::ConfigKeysHelp());

  std::vector<std::string> layer_plugins;
  CLI::App* layers = app.add_subcommand(
      "layers",
      "List the registered layer types and the library each came from (built-in or a "
      "plugin's path).");
  layers->add_option("--plugin", layer_plugins, "load a layer plugin library first; repeatable");

  std::string key_name;
  CLI::App* config_key =
      app.add_subcommand("config-key",
                         "For launch scripts: print the config key a name refers to and its layer "
                         "(`parallel.pp_size schedule`), exit 1 if it is not a config key.");
  config_key->add_option("name", key_name, "pp_size, pp-size, parallel.pp_size, micro_batch, ...")
      ->required();

  bigmac::cli::DataPrepOptions prep_options;
  CLI::App* data = app.add_subcommand("data", "Prepare training data.");
  data->require_subcommand(1);
  CLI::App* prep = data->add_subcommand(
      "prep",
      "Turn UTF-8 text files into token shards, byte-level (vocabulary 256) or SentencePiece, "
      "holding out every Nth block of 4096 tokens for validation; tokenizer.json (and "
      "tokenizer.model) go beside them. Formats: docs/data.md.");
  // Inputs are checked by `data prep` itself (the checked opener: exit 5 naming the file), not
  // by the parser, whose refusal would be a command-line error (exit 2).
  prep->add_option("--input", prep_options.inputs, "text files, concatenated in this order")
      ->required();
  prep->add_option("--output", prep_options.output, "directory for train_NNN.bin and val_NNN.bin")
      ->required();
  prep->add_flag("--overwrite", prep_options.overwrite,
                 "replace the shards already in --output (all of them, in one step)");
  prep->add_option("--val-every", prep_options.val_every,
                   "hold out every Nth block (default 20: 5%)")
      ->check(CLI::Range(2, 1000));
  prep->add_option("--tokenizer", prep_options.tokenizer, "byte (default) or sentencepiece")
      ->check(CLI::IsMember({"byte", "sentencepiece"}));
  prep->add_option("--vocab-size", prep_options.vocab_size,
                   "sentencepiece: train a model of N pieces on the input text")
      ->check(CLI::Range(260, 1 << 20));
  prep->add_option("--model-type", prep_options.model_type,
                   "sentencepiece: bpe (default) or unigram")
      ->check(CLI::IsMember({"bpe", "unigram"}));
  prep->add_option("--tokenizer-model", prep_options.tokenizer_model,
                   "sentencepiece: encode with this existing .model file instead of training one");

  bigmac::cli::DataBatchesOptions batches_options;
  CLI::App* batches = data->add_subcommand(
      "batches",
      "Write the exact training batches a run of this config reads (int32 tokens and targets "
      "per step and micro-batch), to feed another trainer the same data (bench/).");
  batches->add_option("--config", batches_options.config, "the training config")->required();
  batches->add_option("--set", batches_options.overrides, "override a key (as for train)");
  batches->add_option("--steps", batches_options.steps, "optimizer steps (default 10)")
      ->check(CLI::Range(1, kMaxSteps));
  batches
      ->add_option("--world-size", batches_options.world_size,
                   "ranks the run would use (for dp; default 1)")
      ->check(CLI::Range(1, kMaxRanks));
  batches->add_option("--output", batches_options.output, "output file")->required();
  batches->add_flag("--overwrite", batches_options.overwrite, "replace an existing --output file");

  bigmac::cli::ScheduleOptions schedule_options;
  CLI::App* schedule = app.add_subcommand(
      "schedule",
      "Print a pipeline schedule's per-rank grid, simulate it (deadlock check, bubble, "
      "micro-batches in flight) and write a Chrome/Perfetto trace of the timeline.");
  schedule->add_option("--kind", schedule_options.kind, "gpipe, 1f1b, interleaved_1f1b or zb_h1")
      ->required();
  schedule->add_option("--pp", schedule_options.pp, "pipeline stages")
      ->required()
      ->check(CLI::Range(1, kMaxStages));
  schedule->add_option("--microbatches", schedule_options.microbatches, "micro-batches per flush")
      ->required()
      ->check(CLI::Range(1, kMaxMicrobatches));
  schedule
      ->add_option("--virtual", schedule_options.virtual_stages,
                   "chunks per rank (interleaved_1f1b)")
      ->check(CLI::Range(1, kMaxVirtualStages));
  schedule->add_flag("--whole-backward", schedule_options.whole_backward,
                     "keep each backward whole, as train.activation_checkpointing does (by default "
                     "a stage sends its input gradient before computing its weight gradients)");
  schedule->add_option("--trace", schedule_options.trace,
                       "trace file (default runs/schedule/schedule_<kind>_pp<P>_m<M>.json)");
  schedule->add_flag("--overwrite", schedule_options.overwrite,
                     "replace an existing --trace file (the default path is replaced freely)");
  schedule
      ->add_option("--forward-ms", schedule_options.forward_ms,
                   "forward ms per micro-batch: one value, or one per stage (comma-separated)")
      ->delimiter(',')
      ->check(kMilliseconds);
  schedule
      ->add_option("--backward-ms", schedule_options.backward_ms,
                   "backward ms per micro-batch: one value, or one per stage")
      ->delimiter(',')
      ->check(kMilliseconds);
  schedule
      ->add_option("--transfer-ms", schedule_options.transfer_ms,
                   "ms from a send to its receive (default 0)")
      ->check(kMilliseconds);
  schedule
      ->add_option("--allreduce-ms", schedule_options.allreduce_ms,
                   "dp all-reduce ms per step after the flush: one value, or one per rank; "
                   "predicts it serial and overlapped with the backward")
      ->delimiter(',')
      ->check(kMilliseconds);
  schedule
      ->add_option("--allreduce-tail-ms", schedule_options.allreduce_tail_ms,
                   "of --allreduce-ms, the part that starts only after the flush (a tied "
                   "weight's bucket): one value, or one per rank (default 0)")
      ->delimiter(',')
      ->check(kMilliseconds);
  schedule
      ->add_option("--dp-buckets", schedule_options.dp_buckets,
                   "equal buckets of the rest of the all-reduce (default 1)")
      ->check(CLI::Range(1, 1 << 20));

  CLI::App* ckpt =
      app.add_subcommand("ckpt", "Inspect, export and import checkpoints (docs/checkpoint.md).");
  ckpt->require_subcommand(1);
  std::string ckpt_dir, safetensors, import_config, import_output;
  std::vector<std::string> import_overrides;
  CLI::App* inspect = ckpt->add_subcommand(
      "inspect", "Print a checkpoint's step, layers, owners, sizes, and verify every checksum.");
  inspect->add_option("dir", ckpt_dir, "a step directory, or a checkpoint directory (uses latest)")
      ->required();
  CLI::App* export_cmd = ckpt->add_subcommand(
      "export",
      "Write a checkpoint's weights as safetensors with Hugging Face names and layouts "
      "(GPT2LMHeadModel or LlamaForCausalLM, by model.arch), and config.json beside them.");
  export_cmd
      ->add_option("dir", ckpt_dir, "a step directory, or a checkpoint directory (uses latest)")
      ->required();
  export_cmd->add_option("--safetensors", safetensors, "output .safetensors file")->required();
  bool export_overwrite = false;
  export_cmd->add_flag("--overwrite", export_overwrite,
                       "replace an existing --safetensors file and config.json beside it");
  std::vector<std::string> ckpt_plugins;
  export_cmd->add_option("--plugin", ckpt_plugins,
                         "load a layer plugin library first (repeatable); else the plugins the "
                         "checkpoint recorded (docs/plugins.md)");
  CLI::App* import_cmd =
      ckpt->add_subcommand("import",
                           "Turn Hugging Face GPT-2 or Llama safetensors (model.arch of --config) "
                           "into a step-0 checkpoint to start training from.");
  import_cmd->add_option("--safetensors", safetensors, "input .safetensors file")->required();
  import_cmd->add_option("--config", import_config, "the config describing the model")->required();
  import_cmd->add_option("--set", import_overrides, "override a key (as for train)");
  import_cmd->add_option("--plugin", ckpt_plugins,
                         "load a layer plugin library first (repeatable), before the config's "
                         "plugins:");
  import_cmd
      ->add_option("--output", import_output, "checkpoint directory to write step_000000 into")
      ->required();
  bool import_overwrite = false;
  import_cmd->add_flag("--overwrite", import_overwrite,
                       "write into a directory that already holds checkpoints (latest moves back "
                       "to step 0, and says so)");

  bigmac::cli::GenerateOptions generate_options;
  CLI::App* generate = app.add_subcommand(
      "generate",
      "Continue a prompt with text sampled from a checkpoint of any pp/dp/tp layout, loaded on "
      "one CPU rank; prints the prompt and its continuation (docs/generate.md).");
  generate
      ->add_option("--checkpoint", generate_options.checkpoint,
                   "a step directory, or a checkpoint directory (uses latest)")
      ->required();
  generate->add_option("--prompt", generate_options.prompt, "the text to continue")->required();
  generate->add_option("--tokens", generate_options.tokens, "tokens to write (default 64)")
      ->check(CLI::Range(1, kMaxGeneratedTokens));
  generate
      ->add_option("--temperature", generate_options.temperature,
                   "divides the logits (default 1; 0: always the most likely token)")
      ->check(FiniteIn(0, 100, "temperature in [0, 100]"));
  generate
      ->add_option("--top-k", generate_options.top_k,
                   "draw among the k most likely tokens (default 0: all)")
      ->check(CLI::Range(0, 1 << 24));
  generate
      ->add_option("--seed", generate_options.seed,
                   "seed of the draws: the same seed gives the same text (default 1)")
      ->check(kUnsigned64);
  generate->add_option("--plugin", generate_options.plugins,
                       "load a layer plugin library first (repeatable); else the plugins the "
                       "checkpoint recorded (docs/plugins.md)");
  generate->add_option("--data-dir", generate_options.data_dir,
                       "where the checkpoint's recorded tokenizer is (tokenizer.json), if not "
                       "its data.dir");

  bigmac::cli::TuneMbsOptions tune_options;
  CLI::App* tune = app.add_subcommand("tune-mbs",
                                      "Find the largest micro-batch that fits: bisection over real "
                                      "training runs (a few steps each); "
                                      "only out-of-memory counts as not fitting.");
  tune->add_option("--config", tune_options.config, "the config to tune (YAML for --write)")
      ->required();
  tune->add_option("--set", tune_options.overrides, "override a key (as for train)");
  tune->add_option("--lo", tune_options.lo, "a micro-batch known to fit (default 1)")
      ->check(CLI::Range(1, kMaxMicroBatchSize));
  tune->add_option("--hi", tune_options.hi, "an upper bound to search below (default 256)")
      ->check(CLI::Range(1, kMaxMicroBatchSize));
  tune->add_option("--steps", tune_options.steps, "training steps per try (default 3)")
      ->check(CLI::Range(1, kMaxSteps));
  tune->add_option("--timeout", tune_options.timeout_seconds,
                   "seconds per try before it counts as a timeout (default 900)")
      ->check(CLI::Range(1, kMaxTimeoutSeconds));
  tune->add_flag("--write", tune_options.write, "write the recommendation into the config file");
  tune->add_flag("--pipeline", tune_options.pipeline,
                 "search with the config's real pipeline layout (pp_size * tp_size ranks) and name "
                 "the binding stage");
  tune->add_option("--launcher", tune_options.launcher,
                   "how --pipeline starts ranks ({np} is the count)");
  tune->add_option(
      "--child-command", tune_options.child_command,
      "run this instead of the trainer ({mbs} is substituted); for testing the search");

  bigmac::cli::CompareOptions compare_options;
  CLI::App* compare = app.add_subcommand(
      "compare",
      "Run two configs for a few steps on the same data, seed and sequence length; print a table, "
      "the verdict (memory below 90%, stable step time, loss following the baseline), the "
      "bottleneck "
      "stage with a fix, and write a Markdown report with an SVG chart.");
  compare->add_flag("--overwrite", compare_options.overwrite,
                    "replace report.md and report.svg in an --out you named (runs/compare is "
                    "replaced freely)");
  compare->add_option("--baseline", compare_options.baseline, "the reference config")->required();
  compare->add_option("--candidate", compare_options.candidate, "the layout to judge")->required();
  compare->add_option("--set-baseline", compare_options.baseline_overrides,
                      "override a baseline key");
  compare->add_option("--set-candidate", compare_options.candidate_overrides,
                      "override a candidate key");
  compare->add_option("--steps", compare_options.steps, "steps per run (default 40)")
      ->check(CLI::Range(1, kMaxSteps));
  compare
      ->add_option("--warmup", compare_options.warmup,
                   "first steps left out of the timings (default 5)")
      ->check(CLI::Range(0, kMaxSteps));
  compare
      ->add_option("--np-baseline", compare_options.np_baseline,
                   "ranks for the baseline (default pp*tp)")
      ->check(CLI::Range(1, kMaxRanks));
  compare
      ->add_option("--np-candidate", compare_options.np_candidate,
                   "ranks for the candidate (default pp*tp)")
      ->check(CLI::Range(1, kMaxRanks));
  compare->add_option("--out", compare_options.out, "report directory (default runs/compare)");
  compare->add_option("--launcher", compare_options.launcher,
                      "how ranks start ({np} is the count)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    if (const std::string unknown = UnknownCommand(&app, argc, argv, 1); !unknown.empty()) {
      return bigmac::cli::ReportFailure(unknown, kExitConfig);
    }
    const int code = app.exit(error);
    return code == 0 ? 0 : kExitConfig;
  }
  const int code = Guarded([&]() -> int {
    using namespace bigmac::cli;
    if (train->parsed()) return RunTrain(train_options, &argc, &argv);
    if (config_key->parsed()) return RunConfigKey(key_name);
    if (layers->parsed()) return RunLayers(layer_plugins);
    if (batches->parsed()) return RunDataBatches(batches_options);
    if (prep->parsed()) return RunDataPrep(prep_options);
    if (schedule->parsed()) return RunSchedule(schedule_options);
    if (tune->parsed()) return RunTuneMbs(tune_options);
    if (compare->parsed()) return RunCompare(compare_options);
    if (generate->parsed()) return RunGenerate(generate_options);
    if (inspect->parsed()) return RunCkptInspect(ckpt_dir);
    if (export_cmd->parsed())
      return RunCkptExport(ckpt_dir, safetensors, ckpt_plugins, export_overwrite);
    if (import_cmd->parsed()) {
      return RunCkptImport(safetensors, import_config, import_overrides, ckpt_plugins,
                           import_output, import_overwrite);
    }
    return RunPlan(plan_options);
  });
  // Standard output is an output too (generate's text, plan's table) when it is a file: a full
  // disk must not end in exit 0 with the text cut short.
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
    std::fprintf(stderr, "bigmac: standard output: write failed: %s\n", std::strerror(errno));
    return code == 0 ? bigmac::cli::kExitOutput : code;
  }
  return code;
}
