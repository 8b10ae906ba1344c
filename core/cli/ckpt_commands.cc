// `bigmac ckpt inspect | export | import`.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
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
#include "core/engine/rank_model.h"
#include "core/layer/plugin_loader.h"
#include "core/memory/allocator.h"
#include "core/optim/adamw.h"
#include "core/util/dir_lock.h"
#include "core/util/format.h"
#include "core/util/output_file.h"

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

int RunCkptExport(const std::string& dir, const std::string& safetensors,
                  const std::vector<std::string>& plugins, bool overwrite) {
  try {
    // transformers' from_pretrained reads the weights' directory: config.json goes beside them.
    const std::string config_json =
        (std::filesystem::path(safetensors).parent_path() / "config.json").string();
    for (const auto& [label, file] : {std::pair{"--safetensors", safetensors},
                                      std::pair{"config.json beside --safetensors", config_json}}) {
      if (std::string problem = OutputFileProblem(label, file, overwrite); !problem.empty())
        return ReportFailure(problem, kExitOutput);
    }
    int64_t step = 0;
    std::string step_dir;
    const SingleRankModel model = LoadSingleRankModel(dir, plugins, &step, &step_dir);
    const config::ResolvedConfig& resolved = model.resolved;
    const layer::ModelDims dims = config::ModelDimsOf(resolved.values());
    const bool llama = dims.arch == layer::Arch::kLlama;
    std::map<std::string, std::string> metadata = {
        {"format", "pt"},
        {"source", "bigmac " + step_dir},
        {"step", std::to_string(step)},
        {"arch", resolved.values().model().arch()},
        {"n_layer", std::to_string(dims.num_layers)},
        {"n_embd", std::to_string(dims.hidden_size)},
        {"n_head", std::to_string(dims.num_heads)},
        {"vocab_size", std::to_string(dims.vocab_size)},
        {"n_positions", std::to_string(dims.max_seq_length)}};
    const std::string own_block = config::DefaultBlockType(resolved.values());
    const bool plugin_blocks =
        std::any_of(resolved.block_types.begin(), resolved.block_types.end(),
                    [&](const std::string& type) { return type != own_block; });
    if (plugin_blocks) metadata["bigmac_block_types"] = util::Join(resolved.block_types, ",");
    checkpoint::WriteSafetensors(
        safetensors, checkpoint::ToHuggingFace(model.stage->State(), dims, resolved.block_types),
        metadata);
    if (std::string problem =
            util::WriteWholeFile(config_json, checkpoint::HuggingFaceConfigJson(dims));
        !problem.empty())
      throw util::OutputError(problem);
    const char* names = llama ? "LlamaForCausalLM" : "GPT-2";
    std::printf("exported %s (step %lld) to %s with Hugging Face %s names%s\n", step_dir.c_str(),
                static_cast<long long>(step), safetensors.c_str(), names,
                plugin_blocks ? (std::string(" (blocks of other types under their own parameter "
                                             "names: bigmac ckpt import reads them back, Hugging "
                                             "Face's ") +
                                 names + " does not)")
                                    .c_str()
                              : "");
    std::printf("wrote %s beside it (what transformers' from_pretrained reads with the weights)\n",
                config_json.c_str());
    return kExitOk;
  } catch (const checkpoint::CheckpointError& error) {
    return ReportFailure(error.what(), kExitCheckpoint);
  } catch (const config::ConfigError& error) {
    return ReportFailure(std::string("the checkpoint's config is not valid: ") + error.what(),
                         kExitCheckpoint);
  } catch (const layer::PluginError& error) {
    return ReportFailure(error.what(), kExitConfig);
  }
}

int RunCkptImport(const std::string& safetensors, const std::string& config_file,
                  const std::vector<std::string>& overrides,
                  const std::vector<std::string>& plugins, const std::string& output,
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
    config::LoadedConfig loaded = config::LoadConfig(config_file, overrides);
    const std::vector<std::string> listed(loaded.values.plugins().begin(),
                                          loaded.values.plugins().end());
    // Recorded like training's --plugin, so that the checkpoint names every plugin it needs.
    for (const std::string& path : plugins) loaded.values.add_plugins(path);
    config::ResolvedConfig single = SingleRankConfig(std::move(loaded));
    LoadModelPlugins(single, plugins, listed, config_file);
    const SingleRankModel model = BuildSingleRankModel(std::move(single));
    const config::ResolvedConfig& resolved = model.resolved;
    const checkpoint::ModelState state = model.stage->State();
    const layer::ModelDims dims = config::ModelDimsOf(resolved.values());
    const std::vector<std::string> unused = checkpoint::FromHuggingFace(
        checkpoint::ReadSafetensors(
            safetensors, checkpoint::HuggingFaceNames(state, dims, resolved.block_types)),
        state, dims, resolved.block_types, safetensors);
    if (!unused.empty()) {
      const std::vector<std::string> shown(unused.begin(),
                                           unused.begin() + std::min<size_t>(unused.size(), 3));
      std::printf("note: %zu tensor(s) of %s have no place in this model and were not read: %s%s\n",
                  unused.size(), safetensors.c_str(), util::Join(shown, ", ").c_str(),
                  unused.size() > shown.size() ? ", ..." : "");
    }
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
  } catch (const layer::PluginError& error) {
    return ReportFailure(error.what(), kExitConfig);
  } catch (const std::exception& error) {
    return ReportFailure(error.what(), kExitCheckpoint);
  }
}

}  // namespace bigmac::cli
