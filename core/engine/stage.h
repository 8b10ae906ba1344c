#ifndef BIGMAC_CORE_ENGINE_STAGE_H_
#define BIGMAC_CORE_ENGINE_STAGE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/layer/layer.h"
#include "core/partition/partition.h"

namespace bigmac::engine {

struct StageOptions {
  layer::ModelDims dims;
  memory::DType dtype = memory::DType::kF32;
  memory::DeviceAllocator* allocator = nullptr;
  bool activation_checkpointing = false;
  uint64_t seed = 1337;
};

// The layers of one pipeline rank, built from the registry in layer_id order: the embedding if the
// rank holds stage 0, its blocks, the head if it holds the last stage.
class Stage {
 public:
  Stage(const StageOptions& options, const partition::Partition& partition, int pp_rank);

  const std::vector<std::unique_ptr<layer::Layer>>& layers() const { return layers_; }
  bool has_embedding() const;
  bool has_head() const;

  // Forward through every layer of this stage, then the whole backward, accumulating gradients.
  // Needs the embedding and the head here (pp = 1). Returns this micro-batch's scaled loss.
  double ForwardBackward(const layer::MicroBatch& mb);
  // Forward only (evaluation); nothing is kept. Returns the scaled loss.
  double ForwardLoss(const layer::MicroBatch& mb);

  // Where non-finite numbers first appear in a forward of `mb`: "block 1 (parameter
  // attn.qkv.weight)", "block 2 (output)", or "" if nowhere. Used to name the layer when the loss
  // is NaN or Inf.
  std::string FirstNonFiniteLayer(const layer::MicroBatch& mb);

  void ZeroGrads();
  // Tied weights when owner and copy live on this stage: add the copy's gradient into the owner's
  // and clear it (after the backward); copy the owner's value into the copy (after the step).
  void ReduceTiedGradients();
  void SyncTiedCopies();

  // The parameters this stage owns and updates (tied copies excluded), with "layer/param" names.
  struct NamedParam {
    std::string name;
    int layer_id;
    layer::Param* param;
  };
  std::vector<NamedParam> OwnedParams();
  int64_t OwnedParameterCount();

 private:
  layer::Param* FindParam(int layer_id, const std::string& name);
  StageOptions options_;
  std::vector<std::unique_ptr<layer::Layer>> layers_;
  std::vector<layer::Saved> saved_;
};

}  // namespace bigmac::engine

#endif  // BIGMAC_CORE_ENGINE_STAGE_H_
