#include "core/cli/single_rank_model.h"

#include "core/checkpoint/checkpoint.h"
#include "core/comm/pipeline_comm.h"
#include "core/memory/allocator.h"
#include "core/optim/adamw.h"

namespace bigmac::cli {

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

SingleRankModel BuildSingleRankModel(config::ResolvedConfig resolved) {
  SingleRankModel model{std::move(resolved), nullptr, nullptr};
  const config::Config& cfg = model.resolved.values();
  model.device = device::MakeCpuDevice(0, memory::CpuCapacity("", 1));
  engine::StageOptions options;
  options.dims = config::ModelDimsOf(cfg);
  options.device = model.device.get();
  options.seed = static_cast<uint64_t>(cfg.train().seed());
  options.block_types = model.resolved.block_types;
  model.stage = std::make_unique<engine::Stage>(options, model.resolved.partition, 0);
  return model;
}

SingleRankModel LoadSingleRankModel(const std::string& dir, int64_t* step, std::string* step_dir) {
  *step_dir = checkpoint::ResolveStepDir(dir, "");
  config::LoadedConfig loaded;
  // The manifest's own config describes the model; Load then checks every file it reads.
  loaded.values = checkpoint::ReadManifestConfig(*step_dir);
  SingleRankModel model = BuildSingleRankModel(SingleRankConfig(std::move(loaded)));
  optim::AdamW adamw({});
  std::unique_ptr<comm::PipelineComm> comm = comm::MakeLocalPipelineComm();
  *step = checkpoint::Load(*step_dir, model.resolved, model.stage->State(), adamw, *comm);
  return model;
}

}  // namespace bigmac::cli
