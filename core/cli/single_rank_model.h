#ifndef BIGMAC_CORE_CLI_SINGLE_RANK_MODEL_H_
#define BIGMAC_CORE_CLI_SINGLE_RANK_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "core/config/loader.h"
#include "core/config/resolve.h"
#include "core/device/device.h"
#include "core/engine/stage.h"

namespace bigmac::cli {

// The whole model on one CPU rank (pp = tp = 1), as the tools that read or write checkpoints
// (`ckpt export | import`, `generate`) hold it, with fp32 weights. Owns its device and stage.
struct SingleRankModel {
  config::ResolvedConfig resolved;
  std::unique_ptr<device::Device> device;
  std::unique_ptr<engine::Stage> stage;  // every layer; weights from `seed` until loaded
};

// `loaded` resolved for one rank: the pipeline, tensor-parallel and partition keys reset.
config::ResolvedConfig SingleRankConfig(config::LoadedConfig loaded);

// The model of `resolved` (from SingleRankConfig), freshly initialised from train.seed.
SingleRankModel BuildSingleRankModel(config::ResolvedConfig resolved);

// A checkpoint of any pp/dp/tp layout on one rank: `dir` is a step directory, or a checkpoint
// directory (its latest). The model comes from the manifest's config; every file is verified.
// Sets `step` and `step_dir`. Throws checkpoint::CheckpointError, or config::ConfigError if the
// manifest's config is not valid.
SingleRankModel LoadSingleRankModel(const std::string& dir, int64_t* step, std::string* step_dir);

}  // namespace bigmac::cli

#endif  // BIGMAC_CORE_CLI_SINGLE_RANK_MODEL_H_
