#ifndef BIGMAC_TESTS_FUZZ_CHECKPOINT_TARGET_H_
#define BIGMAC_TESTS_FUZZ_CHECKPOINT_TARGET_H_

// The checkpoint readers (inspect, and the verified load into a model) on a real one-block
// checkpoint (tests/fuzz/base_ckpt) whose manifest and/or block file the fuzzer replaces.
#include <filesystem>
#include <memory>

#include "core/checkpoint/checkpoint.h"
#include "core/comm/pipeline_comm.h"
#include "core/config/errors.h"
#include "core/config/loader.h"
#include "core/config/resolve.h"
#include "core/engine/rank_model.h"
#include "core/memory/allocator.h"
#include "core/optim/adamw.h"
#include "tests/fuzz/fuzz_util.h"

namespace bigmac::fuzz {

class CheckpointTarget {
 public:
  CheckpointTarget() {
    namespace fs = std::filesystem;
    const std::string base = FuzzDataPath("base_ckpt/step_000001");
    step_dir_ = ScratchDir() + "/step_000001";
    fs::create_directories(step_dir_);
    for (const auto& entry : fs::directory_iterator(base)) {
      fs::copy_file(entry.path(), step_dir_ + "/" + entry.path().filename().string(),
                    fs::copy_options::overwrite_existing);
    }
    // The model the checkpoint was saved from, as `--resume` would build it on one rank.
    config::LoadedConfig loaded;
    loaded.values = checkpoint::ReadManifestConfig(step_dir_);
    resolved_ =
        std::make_unique<config::ResolvedConfig>(config::Resolve(std::move(loaded), 1, "fuzz"));
    const config::Config& cfg = resolved_->values();
    device_ = device::MakeCpuDevice(0, int64_t{1} << 30);
    engine::RankModelOptions options;
    options.dims = {cfg.model().vocab_size(), cfg.model().hidden_size(), cfg.model().num_heads(),
                    cfg.model().num_layers(), cfg.train().seq_length()};
    options.device = device_.get();
    stage_ = std::make_unique<engine::RankModel>(options, resolved_->partition, 0);
    adamw_ = std::make_unique<optim::AdamW>(optim::AdamWOptions{});
    comm_ = comm::MakeLocalPipelineComm();
  }

  const std::string& step_dir() const { return step_dir_; }

  // Inspect, then load; both must accept or throw CheckpointError.
  void Read() {
    std::vector<std::string> lines;
    checkpoint::Inspect(step_dir_, &lines);
    try {
      checkpoint::Load(step_dir_, *resolved_, stage_->State(), *adamw_, *comm_);
    } catch (const checkpoint::CheckpointError&) {
    }
  }

 private:
  std::string step_dir_;
  std::unique_ptr<config::ResolvedConfig> resolved_;
  std::unique_ptr<device::Device> device_;
  std::unique_ptr<engine::RankModel> stage_;
  std::unique_ptr<optim::AdamW> adamw_;
  std::unique_ptr<comm::PipelineComm> comm_;
};

}  // namespace bigmac::fuzz

#endif  // BIGMAC_TESTS_FUZZ_CHECKPOINT_TARGET_H_
