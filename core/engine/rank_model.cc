#include "core/engine/rank_model.h"

#include <stdexcept>

#include "core/optim/adamw.h"

namespace bigmac::engine {

using layer::Layer;
using layer::LayerSpec;
using memory::Tensor;

RankModel::RankModel(const RankModelOptions& options, const partition::Partition& partition,
                     int pp_rank)
    : options_(options) {
  if (options_.model.empty())
    options_.model = ModelOf(options_.dims, options_.block_types);
  const ModelDescription& model = options_.model;
  const int head_id = layer::HeadLayerId(options.dims.num_layers);
  auto add = [&](int layer_id, int stage) {
    const std::string& type = model.TypeOf(layer_id);
    const bool block = layer_id != layer::kEmbeddingLayerId && layer_id != head_id;
    LayerSpec spec;
    spec.type = type;
    spec.layer_id = layer_id;
    spec.dims = options.dims;
    spec.dtype = options.dtype;
    spec.bf16 = options.bf16;
    spec.device = options.device;
    spec.activation_checkpointing = options.activation_checkpointing && block;
    try {
      layer::TpBuiltLayer built = layer::CreateTpLayer(spec, options.tp);
      const std::vector<layer::Param*> params = built.layer->Params();
      for (size_t i = 0; i < params.size(); ++i) shards_[params[i]] = built.shards.at(i);
      layers_.push_back(std::move(built.layer));
    } catch (const memory::OutOfMemoryError&) {
      throw;  // its own exit code, worded like CUDA's
    } catch (const std::exception& error) {
      throw std::invalid_argument(layer::LayerIdName(layer_id, options.dims.num_layers) +
                                  " (layer type " + type + "): " + error.what());
    }
    stage_checkpointed_.push_back(spec.activation_checkpointing &&
                                  !layers_.back()->checkpoints_activations());
    layers_.back()->InitParams(options.seed);
    layers_of_stage_[stage].push_back(static_cast<int>(layers_.size()) - 1);
  };
  last_stage_ = static_cast<int>(partition.stages.size()) - 1;
  ranges_ = partition.StagesOfRank(pp_rank);
  for (const partition::StageRange& range : ranges_) {
    if (range.has_embedding) add(layer::kEmbeddingLayerId, range.stage);
    for (int id = range.first_layer; id < range.end_layer(); ++id) add(id, range.stage);
    if (range.has_head) add(head_id, range.stage);
  }
  // The pp rank that holds a layer_id: the rank of the stage whose range contains it.
  auto rank_of = [&](int layer_id) {
    for (const partition::StageRange& range : partition.stages) {
      if ((layer_id == layer::kEmbeddingLayerId && range.has_embedding) ||
          (layer_id == head_id && range.has_head) ||
          (layer_id >= range.first_layer && layer_id < range.end_layer()))
        return range.pp_rank;
    }
    throw std::logic_error("layer_id " + std::to_string(layer_id) + " is in no stage");
  };
  for (const TiedWeightSpec& tie : model.tied) {
    tied_.emplace_back(
        layer::LayerIdName(tie.owner.layer_id, options.dims.num_layers) + "/" + tie.owner.name,
        FindParam(tie.owner.layer_id, tie.owner.name), FindParam(tie.copy.layer_id, tie.copy.name),
        rank_of(tie.owner.layer_id), rank_of(tie.copy.layer_id));
  }
  RefreshComputeCopies();
  SyncTiedCopies();
}

std::vector<int> RankModel::LayerIds() const {
  std::vector<int> ids;
  for (const auto& layer : layers_) ids.push_back(layer->layer_id());
  return ids;
}

bool RankModel::has_embedding() const {
  return !layers_.empty() && layers_.front()->layer_id() == layer::kEmbeddingLayerId;
}

bool RankModel::has_head() const {
  return !layers_.empty() &&
         layers_.back()->layer_id() == layer::HeadLayerId(options_.dims.num_layers);
}

bool RankModel::is_last_stage(int stage) const { return stage == last_stage_; }

const std::vector<int>& RankModel::LayersOf(int stage) const {
  auto it = layers_of_stage_.find(stage);
  if (it == layers_of_stage_.end())
    throw std::logic_error("stage " + std::to_string(stage) + " is not on this rank");
  return it->second;
}

Tensor RankModel::ForwardStage(int stage, const layer::MicroBatch& mb, Tensor input, bool keep) {
  const std::vector<int>& indices = LayersOf(stage);
  // Evaluation reuses one scratch slot: each layer's Forward clears what the previous one kept.
  layer::Saved scratch;
  std::vector<layer::Saved>* saved = keep ? &saved_[{mb.index, stage}] : nullptr;
  if (saved) saved->resize(indices.size());
  Tensor activation = std::move(input);
  for (size_t i = 0; i < indices.size(); ++i) {
    Tensor next;
    if (saved) {
      ForwardLayer(indices[i], mb, activation, &next, &(*saved)[i]);
    } else {
      layers_[indices[i]]->Forward(mb, activation, &next, &scratch);
    }
    activation = std::move(next);
  }
  if (keep) RecordActivations();
  return activation;
}

void RankModel::ForwardLayer(int index, const layer::MicroBatch& mb, const Tensor& x, Tensor* y,
                             layer::Saved* saved) {
  Layer& layer = *layers_[index];
  if (!stage_checkpointed_[index]) {
    layer.Forward(mb, x, y, saved);
    return;
  }
  layer::Saved scratch;
  layer.Forward(mb, x, y, &scratch);
  saved->Clear();
  saved->tensors.push_back(x.Clone());
}

void RankModel::Recompute(int index, const layer::MicroBatch& mb, layer::Saved* saved) {
  if (!stage_checkpointed_[index]) return;
  const Tensor input = std::move(saved->tensors.at(0));
  Tensor discarded;
  layers_[index]->Forward(mb, input, &discarded, saved);
}

Tensor RankModel::BackwardInputStage(int stage, const layer::MicroBatch& mb, Tensor grad) {
  return Backward(stage, mb, std::move(grad), /*with_weights=*/false);
}

Tensor RankModel::BackwardStage(int stage, const layer::MicroBatch& mb, Tensor grad) {
  return Backward(stage, mb, std::move(grad), /*with_weights=*/true);
}

Tensor RankModel::Backward(int stage, const layer::MicroBatch& mb, Tensor grad, bool with_weights) {
  const std::vector<int>& indices = LayersOf(stage);
  auto it = saved_.find({mb.index, stage});
  if (it == saved_.end())
    throw std::logic_error("backward without forward for stage " + std::to_string(stage));
  for (size_t i = indices.size(); i-- > 0;) {
    Tensor dx;
    Layer& layer = *layers_[indices[i]];
    Recompute(indices[i], mb, &it->second[i]);
    layer.BackwardInput(mb, grad, layer.layer_id() == layer::kEmbeddingLayerId ? nullptr : &dx,
                        &it->second[i]);
    // Weight gradients right away free this layer's (possibly recomputed) activations before the
    // next layer recomputes its own.
    if (with_weights) {
      layer.BackwardWeight(mb, &it->second[i]);
      if (weight_gradient_hook_) weight_gradient_hook_(indices[i]);
    }
    grad = std::move(dx);
  }
  RecordActivations();
  if (with_weights) saved_.erase(it);
  return grad;
}

void RankModel::RecordActivations() {
  max_in_flight_ = std::max(max_in_flight_, in_flight());
  int64_t bytes = 0;
  for (const auto& [key, per_layer] : saved_) {
    for (const layer::Saved& saved : per_layer) bytes += saved.bytes();
  }
  max_activation_bytes_ = std::max(max_activation_bytes_, bytes);
}

void RankModel::BackwardWeightStage(int stage, const layer::MicroBatch& mb) {
  const std::vector<int>& indices = LayersOf(stage);
  auto it = saved_.find({mb.index, stage});
  if (it == saved_.end())
    throw std::logic_error("weight gradient without backward for stage " + std::to_string(stage));
  for (size_t i = indices.size(); i-- > 0;) {
    layers_[indices[i]]->BackwardWeight(mb, &it->second[i]);
    if (weight_gradient_hook_) weight_gradient_hook_(indices[i]);
  }
  saved_.erase(it);
}

double RankModel::ForwardBackward(const layer::MicroBatch& mb) {
  if (!has_embedding() || !has_head())
    throw std::logic_error("RankModel::ForwardBackward needs the whole model");
  Tensor activation;
  for (const partition::StageRange& range : ranges_)
    activation = ForwardStage(range.stage, mb, std::move(activation));
  const double loss = activation.Scalar();
  Tensor grad;
  for (size_t r = ranges_.size(); r-- > 0;)
    grad = BackwardStage(ranges_[r].stage, mb, std::move(grad));
  return loss;
}

double RankModel::ForwardLoss(const layer::MicroBatch& mb) {
  Tensor activation;
  for (const partition::StageRange& range : ranges_) {
    activation = ForwardStage(range.stage, mb, std::move(activation), /*keep=*/false);
  }
  return activation.Scalar();
}

std::string RankModel::FirstNonFiniteLayer(const layer::MicroBatch& mb) {
  Tensor activation;
  layer::Saved scratch;
  for (auto& layer : layers_) {
    const std::string name = layer::LayerIdName(layer->layer_id(), options_.dims.num_layers);
    for (layer::Param* param : layer->Params()) {
      if (!optim::AllFinite(param->value)) return name + " (parameter " + param->name + ")";
    }
    Tensor next;
    layer->Forward(mb, activation, &next, &scratch);
    if (!optim::AllFinite(next)) return name + " (output)";
    activation = std::move(next);
  }
  return "";
}

void RankModel::ZeroGrads() {
  for (auto& layer : layers_) {
    for (layer::Param* param : layer->Params()) {
      // A tied copy's gradient starts zeroed and is zeroed again by TiedWeight::ReduceGradient
      // each time it is handed to the owner: zeroing it here too would be a second memset.
      if (!param->tied_copy) param->grad.Zero();
    }
  }
}

layer::Param* RankModel::FindParam(int layer_id, const std::string& name) {
  for (auto& layer : layers_) {
    if (layer->layer_id() != layer_id) continue;
    for (layer::Param* param : layer->Params()) {
      if (param->name == name) return param;
    }
  }
  return nullptr;
}

void RankModel::RefreshComputeCopies() {
  for (auto& layer : layers_) {
    for (layer::Param* param : layer->Params()) layer::RefreshComputeCopy(param);
  }
}

layer::Param* RankModel::TiedOwner() { return tied_.empty() ? nullptr : tied_.front().owner(); }

layer::Param* RankModel::TiedCopy() { return tied_.empty() ? nullptr : tied_.front().copy(); }

void RankModel::ReduceTiedGradients() {
  for (TiedWeight& tie : tied_) {
    if (tie.local()) tie.ReduceGradient(nullptr);
  }
}

void RankModel::SyncTiedCopies() {
  for (TiedWeight& tie : tied_) {
    if (tie.local()) tie.SyncValue(nullptr);
  }
}

std::vector<RankModel::NamedParam> RankModel::OwnedParams() {
  std::vector<NamedParam> params;
  for (auto& layer : layers_) {
    for (layer::Param* param : layer->Params()) {
      if (param->tied_copy) continue;
      params.push_back(
          {layer::LayerIdName(layer->layer_id(), options_.dims.num_layers) + "/" + param->name,
           layer->layer_id(), param});
    }
  }
  return params;
}

std::vector<std::pair<const void*, int64_t>> RankModel::WeightBuffersReadAsIs() {
  std::vector<std::pair<const void*, int64_t>> buffers;
  for (auto& layer : layers_) {
    for (layer::Param* param : layer->Params()) {
      if (param->compute.empty() && !param->value.empty())
        buffers.emplace_back(param->value.raw(), param->value.bytes());
    }
  }
  return buffers;
}

const layer::TpShard& RankModel::TpShardOf(const layer::Param* param) const {
  auto it = shards_.find(param);
  if (it == shards_.end()) throw std::logic_error("a parameter of no layer of this stage");
  return it->second;
}

bool RankModel::CountsOnce(const layer::Param* param) const {
  return TpShardOf(param).sliced() || options_.tp == nullptr || options_.tp->rank() == 0;
}

checkpoint::ModelState RankModel::State() {
  checkpoint::ModelState state;
  state.num_layers = options_.dims.num_layers;
  for (auto& layer : layers_) {
    checkpoint::LayerParams params{layer->layer_id(), layer->Params(), {}};
    for (const layer::Param* param : params.params) params.shards.push_back(TpShardOf(param));
    state.layers.push_back(std::move(params));
  }
  return state;
}

int64_t RankModel::OwnedParameterCount() {
  int64_t count = 0;
  for (const NamedParam& named : OwnedParams()) count += named.param->value.numel();
  return count;
}

std::string CheckLayerCoverage(const std::vector<std::vector<int>>& ids_per_rank, int num_layers) {
  std::map<int, std::vector<int>> owners;
  for (size_t rank = 0; rank < ids_per_rank.size(); ++rank) {
    for (int id : ids_per_rank[rank]) owners[id].push_back(static_cast<int>(rank));
  }
  for (int id = layer::kEmbeddingLayerId; id <= layer::HeadLayerId(num_layers); ++id) {
    const std::string name = layer::LayerIdName(id, num_layers);
    auto it = owners.find(id);
    if (it == owners.end())
      return "layer_id " + std::to_string(id) + " (" + name + ") is built by no rank";
    if (it->second.size() > 1) {
      return "layer_id " + std::to_string(id) + " (" + name + ") is built by ranks " +
             std::to_string(it->second[0]) + " and " + std::to_string(it->second[1]);
    }
  }
  for (const auto& [id, ranks] : owners) {
    if (id < layer::kEmbeddingLayerId || id > layer::HeadLayerId(num_layers)) {
      return "layer_id " + std::to_string(id) + " built by rank " + std::to_string(ranks[0]) +
             " is not in the model";
    }
  }
  return "";
}

}  // namespace bigmac::engine
