#ifndef BIGMAC_CORE_CLI_SINGLE_RANK_MODEL_H_
#define BIGMAC_CORE_CLI_SINGLE_RANK_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config/loader.h"
#include "core/config/resolve.h"
#include "core/device/device.h"
#include "core/engine/rank_model.h"

namespace bigmac::cli {

// The whole model on one CPU rank (pp = tp = 1), as the tools that read or write checkpoints
// (`ckpt export | import`, `generate`) hold it, with fp32 weights. Owns its device and stage.
struct SingleRankModel {
  config::ResolvedConfig resolved;
  std::unique_ptr<device::Device> device;
  std::unique_ptr<engine::RankModel> stage;  // every layer; weights from `seed` until loaded
  std::string tokenizer;                     // the checkpoint's (Manifest.tokenizer), when loaded
};

// `loaded` resolved for one rank: the pipeline, tensor-parallel and partition keys reset.
config::ResolvedConfig SingleRankConfig(config::LoadedConfig loaded);

// Makes every block type of `resolved` available before the model is built: loads `flags`
// (--plugin) first, then each of `candidates` in order while a type is still unregistered (a
// candidate that does not exist is skipped). `whose` names where the candidates come from ("the
// checkpoint ckpt/step_000002", "config.yaml"). Throws layer::PluginError (exit 2) when a library
// fails to load, or when a type is still unregistered, naming the type, the blocks that use it,
// the paths tried and --plugin.
void LoadModelPlugins(const config::ResolvedConfig& resolved, const std::vector<std::string>& flags,
                      const std::vector<std::string>& candidates, const std::string& whose);

// The model of `resolved` (from SingleRankConfig), freshly initialised from train.seed. Its block
// types must be registered (LoadModelPlugins).
SingleRankModel BuildSingleRankModel(config::ResolvedConfig resolved);

// A checkpoint of any pp/dp/tp layout on one rank: `dir` is a step directory, or a checkpoint
// directory (its latest). The model comes from the manifest's config, with the plugins `flags`
// and then those the checkpoint recorded (LoadModelPlugins); every file is verified. Sets `step`
// and `step_dir`. Throws checkpoint::CheckpointError, layer::PluginError, or config::ConfigError
// if the manifest's config is not valid.
SingleRankModel LoadSingleRankModel(const std::string& dir, const std::vector<std::string>& flags,
                                    int64_t* step, std::string* step_dir);

}  // namespace bigmac::cli

#endif  // BIGMAC_CORE_CLI_SINGLE_RANK_MODEL_H_
