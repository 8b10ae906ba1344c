#include "core/engine/model.h"

#include <stdexcept>

#include "core/layer/layer.h"

namespace bigmac::engine {

const std::string& ModelDescription::TypeOf(int layer_id) const {
  if (layer_id == layer::kEmbeddingLayerId) return embedding_type;
  if (layer_id == layer::HeadLayerId(static_cast<int>(block_types.size()))) return head_type;
  if (layer_id < 0 || layer_id >= static_cast<int>(block_types.size()))
    throw std::out_of_range("layer_id " + std::to_string(layer_id) + " is not in the model");
  return block_types[layer_id];
}

ModelDescription ModelOf(const layer::ModelDims& dims,
                         const std::vector<std::string>& block_types) {
  const config::ArchLayerTypes types = config::LayerTypesOf(dims.arch);
  ModelDescription model;
  model.embedding_type = types.embedding;
  model.block_types =
      block_types.empty() ? std::vector<std::string>(dims.num_layers, types.block) : block_types;
  model.head_type = types.head;
  if (dims.tied_head()) {
    model.tied.push_back(
        {{layer::kEmbeddingLayerId, "wte"}, {layer::HeadLayerId(dims.num_layers), "wte"}});
  }
  return model;
}

ModelDescription ModelOf(const config::ResolvedConfig& config) {
  return ModelOf(config::ModelDimsOf(config.values()), config.block_types);
}

}  // namespace bigmac::engine
