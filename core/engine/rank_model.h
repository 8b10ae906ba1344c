#ifndef BIGMAC_CORE_ENGINE_RANK_MODEL_H_
#define BIGMAC_CORE_ENGINE_RANK_MODEL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/checkpoint/model_state.h"
#include "core/engine/model.h"
#include "core/engine/tied_weight.h"
#include "core/layer/layer.h"
#include "core/layer/tp_layer.h"
#include "core/partition/partition.h"

namespace bigmac::engine {

struct RankModelOptions {
  layer::ModelDims dims;
  memory::DType dtype = memory::DType::kF32;  // masters and gradients
  bool bf16 = false;                      // bf16 compute copies and activations (LayerSpec::bf16)
  device::Device* device = nullptr;       // outlives the stage
  bool activation_checkpointing = false;  // every block
  uint64_t seed = 1337;
  // What to build (ModelOf(config) for the trainer); empty: ModelOf(dims, block_types).
  ModelDescription model;
  // Layer type of each block when `model` is empty; empty: all gpt_block.
  std::vector<std::string> block_types;
  // The tensor-parallel group (outlives the stage), or null for tp_size = 1. Layer types with a
  // tensor-parallel implementation are built sliced over it; the others replicated.
  layer::TpGroup* tp = nullptr;
};

// The part of the model one pipeline rank holds: the layers of every pipeline stage it hosts,
// built from the registry in layer_id order, for the device's backend: for each stage the rank
// hosts (several with virtual stages), the embedding if it is stage 0, its blocks, the head if it
// is the last stage, with the model's tied weights.
// Activations kept between forward and backward are held per (micro-batch, stage). With
// activation checkpointing, a block that cannot recompute itself keeps only its input here and
// is run forward again before its backward (bitwise the same results).
// Owns its layers; the device outlives it. Not copyable.
class RankModel {
 public:
  RankModel(const RankModelOptions& options, const partition::Partition& partition, int pp_rank);
  RankModel(const RankModel&) = delete;
  RankModel& operator=(const RankModel&) = delete;

  const std::vector<std::unique_ptr<layer::Layer>>& layers() const { return layers_; }
  device::Device* device() const { return options_.device; }
  // What travels between stages: bf16, or the masters' dtype.
  memory::DType activation_dtype() const {
    return options_.bf16 ? memory::DType::kBF16 : options_.dtype;
  }
  // The pipeline stages this rank hosts, in model order.
  const std::vector<partition::StageRange>& ranges() const { return ranges_; }
  std::vector<int> LayerIds() const;
  bool has_embedding() const;
  bool has_head() const;
  bool is_last_stage(int stage) const;

  // One stage's part of a micro-batch. ForwardStage returns the activation for the next stage, or
  // the 1-element scaled loss on the last stage; it keeps what the backward needs unless
  // `keep` is false (evaluation). BackwardInputStage returns the gradient for the previous stage
  // (empty on stage 0); BackwardWeightStage accumulates parameter gradients and frees the state.
  memory::Tensor ForwardStage(int stage, const layer::MicroBatch& mb, memory::Tensor input,
                              bool keep = true);
  // BackwardStage does both halves layer by layer (the memory-friendly order); the zero-bubble
  // schedule calls BackwardInputStage now and BackwardWeightStage later.
  memory::Tensor BackwardStage(int stage, const layer::MicroBatch& mb, memory::Tensor grad);
  memory::Tensor BackwardInputStage(int stage, const layer::MicroBatch& mb, memory::Tensor grad);
  void BackwardWeightStage(int stage, const layer::MicroBatch& mb);

  // Called right after each layer's weight gradient of one micro-batch has been accumulated
  // (BackwardStage, BackwardWeightStage), with the layer's index in layers(): the executor counts
  // these to know when a layer's gradient is final and polls the transport in between.
  void set_weight_gradient_hook(std::function<void(int layer_index)> hook) {
    weight_gradient_hook_ = std::move(hook);
  }

  // Whole model on this rank (pp = 1): forward and backward of one micro-batch; returns its loss.
  double ForwardBackward(const layer::MicroBatch& mb);
  // Forward only (evaluation); nothing is kept. Returns the scaled loss.
  double ForwardLoss(const layer::MicroBatch& mb);

  // Where non-finite numbers first appear in a forward of `mb` through the whole model:
  // "block 1 (parameter attn.qkv.weight)", "block 2 (output)", or "".
  std::string FirstNonFiniteLayer(const layer::MicroBatch& mb);

  void ZeroGrads();
  // Every parameter's compute copy re-rounded from its master (after init, a load, a step).
  void RefreshComputeCopies();
  // The model's tied weights as this rank holds them.
  std::vector<TiedWeight>& tied() { return tied_; }
  // Tied weights whose owner and copy live on this rank: add the copy's gradient into the
  // owner's and clear it (after the backward); copy the owner's value into the copy (after the
  // step, a load or an import).
  void ReduceTiedGradients();
  void SyncTiedCopies();
  // The first tied weight's owner or copy parameter on this rank, or null.
  layer::Param* TiedOwner();
  layer::Param* TiedCopy();

  // The parameters this rank owns and updates (tied copies excluded), with "layer/param" names.
  struct NamedParam {
    std::string name;
    int layer_id;
    layer::Param* param;
  };
  std::vector<NamedParam> OwnedParams();
  // (start, bytes) of each parameter buffer the layers multiply by as it is (masters without a
  // compute copy, tied copies included), for util::ConstantWeightsScope. Valid while this
  // RankModel lives.
  std::vector<std::pair<const void*, int64_t>> WeightBuffersReadAsIs();
  // How this rank holds `param` over the tp group (replicated at tp = 1 and for layers without a
  // tensor-parallel implementation).
  const layer::TpShard& TpShardOf(const layer::Param* param) const;
  // Whether this rank counts `param` in the gradient norm and in parameter totals: a slice, or
  // a replicated parameter on tp rank 0 (so that each parameter counts once over the group).
  bool CountsOnce(const layer::Param* param) const;
  // Every parameter this rank holds, by layer_id, for checkpoints: a view, valid while this
  // RankModel lives.
  checkpoint::ModelState State();
  int64_t OwnedParameterCount();

  // (micro-batch, stage) pairs holding activations now, and the most at any time.
  int in_flight() const { return static_cast<int>(saved_.size()); }
  int max_in_flight() const { return max_in_flight_; }
  // The most bytes of kept activations (and deferred-gradient inputs) at any time.
  int64_t max_activation_bytes() const { return max_activation_bytes_; }

 private:
  memory::Tensor Backward(int stage, const layer::MicroBatch& mb, memory::Tensor grad,
                          bool with_weights);
  // Runs layer `index` forward; a layer the stage checkpoints keeps only its input in `saved`.
  void ForwardLayer(int index, const layer::MicroBatch& mb, const memory::Tensor& x,
                    memory::Tensor* y, layer::Saved* saved);
  // Before the backward of a layer the stage checkpoints: its forward again, from the input.
  void Recompute(int index, const layer::MicroBatch& mb, layer::Saved* saved);
  // Indices into layers_ of stage `stage`'s layers.
  const std::vector<int>& LayersOf(int stage) const;
  layer::Param* FindParam(int layer_id, const std::string& name);

  RankModelOptions options_;
  std::vector<std::unique_ptr<layer::Layer>> layers_;
  std::vector<bool> stage_checkpointed_;  // per layer: the stage recomputes it
  std::vector<TiedWeight> tied_;
  std::map<const layer::Param*, layer::TpShard> shards_;
  std::vector<partition::StageRange> ranges_;
  std::map<int, std::vector<int>> layers_of_stage_;
  int last_stage_ = 0;
  std::map<std::pair<int, int>, std::vector<layer::Saved>> saved_;  // (mb, stage) -> per layer
  std::function<void(int)> weight_gradient_hook_;
  int max_in_flight_ = 0;
  int64_t max_activation_bytes_ = 0;
  void RecordActivations();
};

// Checks that the layer_ids every rank built cover the embedding, every block and the head exactly
// once. Returns "" or the problem (a gap or an overlap, naming the layer and the ranks).
std::string CheckLayerCoverage(const std::vector<std::vector<int>>& ids_per_rank, int num_layers);

}  // namespace bigmac::engine

#endif  // BIGMAC_CORE_ENGINE_RANK_MODEL_H_
