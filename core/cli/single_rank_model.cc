#include "core/cli/single_rank_model.h"

#include <filesystem>
#include <map>

#include "core/checkpoint/checkpoint.h"
#include "core/comm/pipeline_comm.h"
#include "core/layer/layer.h"
#include "core/layer/plugin_loader.h"
#include "core/memory/allocator.h"
#include "core/optim/adamw.h"
#include "core/util/format.h"

namespace bigmac::cli {
namespace {

// Each unregistered block type of `resolved` and its blocks ("1-2"), in model order.
std::map<std::string, std::string> MissingTypes(const config::ResolvedConfig& resolved) {
  std::map<std::string, std::vector<int>> blocks;
  for (size_t i = 0; i < resolved.block_types.size(); ++i) {
    if (!layer::LayerRegistry::Global().Has(resolved.block_types[i]))
      blocks[resolved.block_types[i]].push_back(static_cast<int>(i));
  }
  std::map<std::string, std::string> missing;
  for (const auto& [type, ids] : blocks) {
    std::vector<std::string> names;
    for (int id : ids) names.push_back(std::to_string(id));
    missing[type] = util::Join(names, ",");
  }
  return missing;
}

// A plugin library a model needs that this process could not find.
std::string MissingPluginMessage(const std::map<std::string, std::string>& missing,
                                 const std::vector<std::string>& tried, const std::string& whose) {
  std::vector<std::string> types;
  for (const auto& [type, blocks] : missing) {
    types.push_back(type + (blocks.find(',') == std::string::npos ? " (block " : " (blocks ") +
                    blocks + ")");
  }
  return "layer type " + util::Join(types, ", ") + " of " + whose +
         " is not registered by any loaded plugin (" +
         (tried.empty() ? std::string("it names no plugin")
                        : "its plugins were not found: " + util::Join(tried, ", ")) +
         "); pass --plugin with the library that defines it (docs/plugins.md)";
}

}  // namespace

config::ResolvedConfig SingleRankConfig(config::LoadedConfig loaded) {
  config::Parallel* parallel = loaded.values.mutable_parallel();
  parallel->set_pp_size(1);
  parallel->set_tp_size(1);
  parallel->set_virtual_stages(1);
  parallel->set_schedule("gpipe");
  loaded.values.mutable_model()->clear_layers_per_stage();
  loaded.values.mutable_model()->clear_split_points();
  loaded.values.mutable_model()->set_partition("spread_first");
  return config::Resolve(std::move(loaded), 1, "ckpt tool");
}

void LoadModelPlugins(const config::ResolvedConfig& resolved, const std::vector<std::string>& flags,
                      const std::vector<std::string>& candidates, const std::string& whose) {
  for (const std::string& path : flags) {
    try {
      layer::LoadPlugin(path);
    } catch (const layer::PluginError& error) {
      throw layer::PluginError(std::string(error.what()) + " (--plugin)");
    }
  }
  std::vector<std::string> not_found;
  for (const std::string& path : candidates) {
    if (MissingTypes(resolved).empty()) return;
    std::error_code error;
    if (!std::filesystem::exists(path, error)) {
      not_found.push_back(path);
      continue;
    }
    try {
      layer::LoadPlugin(path);
    } catch (const layer::PluginError& failure) {
      throw layer::PluginError(std::string(failure.what()) + " (recorded by " + whose + ")");
    }
  }
  if (const auto missing = MissingTypes(resolved); !missing.empty())
    throw layer::PluginError(MissingPluginMessage(missing, not_found, whose));
}

SingleRankModel BuildSingleRankModel(config::ResolvedConfig resolved) {
  SingleRankModel model{std::move(resolved), nullptr, nullptr, ""};
  const config::Config& cfg = model.resolved.values();
  model.device = device::MakeCpuDevice(0, memory::CpuCapacity(0, 1));
  engine::RankModelOptions options;
  options.dims = config::ModelDimsOf(cfg);
  options.device = model.device.get();
  options.seed = static_cast<uint64_t>(cfg.train().seed());
  options.block_types = model.resolved.block_types;
  model.stage = std::make_unique<engine::RankModel>(options, model.resolved.partition, 0);
  return model;
}

SingleRankModel LoadSingleRankModel(const std::string& dir, const std::vector<std::string>& flags,
                                    int64_t* step, std::string* step_dir) {
  *step_dir = checkpoint::ResolveStepDir(dir, "");
  const checkpoint::Manifest manifest = checkpoint::ReadCheckedManifest(*step_dir);
  config::LoadedConfig loaded;
  // The manifest's own config describes the model; Load then checks every file it reads.
  loaded.values = manifest.config();
  config::ResolvedConfig resolved = SingleRankConfig(std::move(loaded));
  // Where the plugins were when it was saved, then as its config wrote them (from here).
  std::vector<std::string> recorded(manifest.plugin_paths().begin(), manifest.plugin_paths().end());
  recorded.insert(recorded.end(), manifest.config().plugins().begin(),
                  manifest.config().plugins().end());
  LoadModelPlugins(resolved, flags, recorded, "the checkpoint " + *step_dir);
  SingleRankModel model = BuildSingleRankModel(std::move(resolved));
  model.tokenizer = manifest.tokenizer();
  optim::AdamW adamw({});
  std::unique_ptr<comm::PipelineComm> comm = comm::MakeLocalPipelineComm();
  *step = checkpoint::Load(*step_dir, model.resolved, model.stage->State(), adamw, *comm);
  return model;
}

}  // namespace bigmac::cli
