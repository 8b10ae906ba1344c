#include "core/engine/stage.h"

#include <stdexcept>

#include "core/optim/adamw.h"

namespace bigmac::engine {

using layer::Layer;
using layer::LayerSpec;
using memory::Tensor;

Stage::Stage(const StageOptions& options, const partition::Partition& partition, int pp_rank)
    : options_(options) {
  auto add = [&](const std::string& type, int layer_id) {
    LayerSpec spec;
    spec.type = type;
    spec.layer_id = layer_id;
    spec.dims = options.dims;
    spec.dtype = options.dtype;
    spec.allocator = options.allocator;
    spec.activation_checkpointing = options.activation_checkpointing && type == "gpt_block";
    layers_.push_back(layer::CreateLayer(spec));
    layers_.back()->InitParams(options.seed);
  };
  for (const partition::StageRange& range : partition.StagesOfRank(pp_rank)) {
    if (range.has_embedding) add("gpt_embedding", layer::kEmbeddingLayerId);
    for (int id = range.first_layer; id < range.end_layer(); ++id) add("gpt_block", id);
    if (range.has_head) add("gpt_head", layer::HeadLayerId(options.dims.num_layers));
  }
  saved_.resize(layers_.size());
  SyncTiedCopies();
}

bool Stage::has_embedding() const {
  return !layers_.empty() && layers_.front()->layer_id() == layer::kEmbeddingLayerId;
}

bool Stage::has_head() const {
  return !layers_.empty() &&
         layers_.back()->layer_id() == layer::HeadLayerId(options_.dims.num_layers);
}

double Stage::ForwardBackward(const layer::MicroBatch& mb) {
  if (!has_embedding() || !has_head())
    throw std::logic_error("Stage::ForwardBackward needs the whole model");
  Tensor activation;
  for (size_t i = 0; i < layers_.size(); ++i) {
    Tensor next;
    layers_[i]->Forward(mb, activation, &next, &saved_[i]);
    activation = std::move(next);
  }
  const double loss = activation.dtype() == memory::DType::kF64 ? activation.data<double>()[0]
                                                                : activation.data<float>()[0];
  Tensor grad;
  for (size_t i = layers_.size(); i-- > 0;) {
    Tensor dx;
    layers_[i]->BackwardInput(mb, grad, i == 0 ? nullptr : &dx, &saved_[i]);
    layers_[i]->BackwardWeight(mb, &saved_[i]);
    grad = std::move(dx);
  }
  return loss;
}

double Stage::ForwardLoss(const layer::MicroBatch& mb) {
  Tensor activation;
  layer::Saved scratch;
  for (auto& layer : layers_) {
    Tensor next;
    layer->Forward(mb, activation, &next, &scratch);
    activation = std::move(next);
  }
  scratch.Clear();
  return activation.dtype() == memory::DType::kF64 ? activation.data<double>()[0]
                                                   : activation.data<float>()[0];
}

std::string Stage::FirstNonFiniteLayer(const layer::MicroBatch& mb) {
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

void Stage::ZeroGrads() {
  for (auto& layer : layers_) {
    for (layer::Param* param : layer->Params()) param->grad.Zero();
  }
}

layer::Param* Stage::FindParam(int layer_id, const std::string& name) {
  for (auto& layer : layers_) {
    if (layer->layer_id() != layer_id) continue;
    for (layer::Param* param : layer->Params()) {
      if (param->name == name) return param;
    }
  }
  return nullptr;
}

void Stage::ReduceTiedGradients() {
  layer::Param* owner = FindParam(layer::kEmbeddingLayerId, "wte");
  if (!owner || !has_head()) return;
  layer::Param* copy = FindParam(layer::HeadLayerId(options_.dims.num_layers), "wte");
  const int64_t n = owner->grad.numel();
  if (owner->grad.dtype() == memory::DType::kF64) {
    for (int64_t i = 0; i < n; ++i) owner->grad.data<double>()[i] += copy->grad.data<double>()[i];
  } else {
    for (int64_t i = 0; i < n; ++i) owner->grad.data<float>()[i] += copy->grad.data<float>()[i];
  }
  copy->grad.Zero();
}

void Stage::SyncTiedCopies() {
  layer::Param* owner = FindParam(layer::kEmbeddingLayerId, "wte");
  if (!owner || !has_head()) return;
  FindParam(layer::HeadLayerId(options_.dims.num_layers), "wte")->value.CopyFrom(owner->value);
}

std::vector<Stage::NamedParam> Stage::OwnedParams() {
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

int64_t Stage::OwnedParameterCount() {
  int64_t count = 0;
  for (const NamedParam& named : OwnedParams()) count += named.param->value.numel();
  return count;
}

}  // namespace bigmac::engine
