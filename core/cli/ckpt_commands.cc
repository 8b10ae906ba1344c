// `bigmac ckpt inspect | export | import`.
#include <cstdio>
#include <filesystem>
#include <memory>

#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/output_guard.h"
#include "core/checkpoint/safetensors.h"
#include "core/cli/commands.h"
#include "core/cli/exit_codes.h"
#include "core/cli/single_rank_model.h"
#include "core/cli/startup_checks.h"
#include "core/comm/pipeline_comm.h"
#include "core/config/errors.h"
#include "core/config/resolve.h"
#include "core/engine/stage.h"
#include "core/memory/allocator.h"
#include "core/optim/adamw.h"
#include "core/util/dir_lock.h"

namespace bigmac::cli {
namespace {

// "step_000002", what `root`/latest names, or "".
std::string LatestName(const std::string& root) {
  std::error_code error;
  if (!std::filesystem::exists(root + "/latest", error)) return "";
  try {
    return std::filesystem::path(checkpoint::ResolveStepDir(root, "")).filename().string();
  } catch (const std::exception&) {
    return "(unreadable)";
  }
}

}  // namespace

int RunCkptInspect(const std::string& dir) {
  try {
    const std::string step_dir = checkpoint::ResolveStepDir(dir, "");
    std::vector<std::string> lines;
    const bool ok = checkpoint::Inspect(step_dir, &lines);
    for (const std::string& line : lines) std::printf("%s\n", line.c_str());
    return ok ? kExitOk : kExitCheckpoint;
  } catch (const std::exception& error) {
    return ReportFailure(error.what(), kExitCheckpoint);
  }
}

int RunCkptExport(const std::string& dir, const std::string& safetensors, bool overwrite) {
  try {
    if (std::string problem = OutputFileProblem("--safetensors", safetensors, overwrite);
        !problem.empty())
      return ReportFailure(problem, kExitOutput);
    int64_t step = 0;
    std::string step_dir;
    const SingleRankModel model = LoadSingleRankModel(dir, &step, &step_dir);
    const config::ResolvedConfig& resolved = model.resolved;
    const config::Model& m = resolved.values().model();
    checkpoint::WriteSafetensors(
        safetensors, checkpoint::ToHuggingFaceGpt2(model.stage->State()),
        {{"format", "pt"},
         {"source", "bigmac " + step_dir},
         {"step", std::to_string(step)},
         {"n_layer", std::to_string(m.num_layers())},
         {"n_embd", std::to_string(m.hidden_size())},
         {"n_head", std::to_string(m.num_heads())},
         {"vocab_size", std::to_string(m.vocab_size())},
         {"n_positions", std::to_string(resolved.values().train().seq_length())}});
    std::printf("exported %s (step %lld) to %s with Hugging Face GPT-2 names\n", step_dir.c_str(),
                static_cast<long long>(step), safetensors.c_str());
    return kExitOk;
  } catch (const checkpoint::CheckpointError& error) {
    return ReportFailure(error.what(), kExitCheckpoint);
  } catch (const config::ConfigError& error) {
    return ReportFailure(std::string("the checkpoint's config is not valid: ") + error.what(),
                         kExitCheckpoint);
  }
}

int RunCkptImport(const std::string& safetensors, const std::string& config_file,
                  const std::vector<std::string>& overrides, const std::string& output,
                  bool overwrite) {
  if (std::string problem = OutputDirProblem("--output", output); !problem.empty())
    return ReportFailure(problem, kExitOutput);
  // A training run's directory: importing step 0 there would move `latest` back, and the next
  // `--resume auto` would train over the later steps.
  const std::string latest = LatestName(output);
  if (checkpoint::HoldsCheckpoints(output) && !overwrite) {
    return ReportFailure("--output " + output + ": already holds checkpoints" +
                             (latest.empty() ? "" : " (latest: " + latest + ")") +
                             "; importing would move latest back to step_000000. Import into a "
                             "new directory, or pass --overwrite",
                         kExitOutput);
  }
  try {
    const SingleRankModel model =
        BuildSingleRankModel(SingleRankConfig(config::LoadConfig(config_file, overrides)));
    const config::ResolvedConfig& resolved = model.resolved;
    checkpoint::FromHuggingFaceGpt2(checkpoint::ReadSafetensors(safetensors), model.stage->State(),
                                    safetensors);
    // A training run writing this directory would have `latest` moved under it: one writer.
    std::string problem, note;
    const std::unique_ptr<util::DirectoryLock> lock =
        util::DirectoryLock::Acquire(output, "--output", "ckpt import", &problem, &note);
    if (!lock) return ReportFailure(problem, kExitOutput);
    if (!note.empty()) std::printf("%s\n", note.c_str());
    optim::AdamW adamw({});
    std::unique_ptr<comm::PipelineComm> comm = comm::MakeLocalPipelineComm();
    const checkpoint::SaveStats stats =
        checkpoint::Save(output, 0, resolved, model.stage->State(), adamw, *comm,
                         resolved.values().checkpoint().keep_last());
    if (!latest.empty() && latest != checkpoint::StepDirName(0)) {
      std::printf("--overwrite: latest in %s moved back from %s to %s\n", output.c_str(),
                  latest.c_str(), checkpoint::StepDirName(0).c_str());
    }
    std::printf(
        "imported %s as %s (step 0, zero optimizer state); train from it with --resume %s\n",
        safetensors.c_str(), stats.dir.c_str(), stats.dir.c_str());
    return kExitOk;
  } catch (const checkpoint::CheckpointError& error) {
    return ReportFailure(error.what(), kExitCheckpoint);
  } catch (const config::ConfigError& error) {
    return ReportFailure(error.what(), kExitConfig);
  } catch (const std::exception& error) {
    return ReportFailure(error.what(), kExitCheckpoint);
  }
}

}  // namespace bigmac::cli
