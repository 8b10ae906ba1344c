#ifndef BIGMAC_CORE_ENGINE_MODEL_H_
#define BIGMAC_CORE_ENGINE_MODEL_H_

#include <string>
#include <vector>

#include "core/config/resolve.h"

namespace bigmac::engine {

// One parameter of one layer, by layer_id and the parameter's name in that layer.
struct ParamRef {
  int layer_id = 0;
  std::string name;
};

// A weight shared by two layers: the owner keeps the master, its gradient and its optimizer
// state; the copy is read-only, sends its gradient to the owner after the backward and receives
// the owner's value after each step.
struct TiedWeightSpec {
  ParamRef owner;
  ParamRef copy;
};

// What the stage builds: the layer types by layer_id and the tied weights. The stage knows no
// model names; a model is this description.
struct ModelDescription {
  std::string embedding_type;            // layer_id kEmbeddingLayerId
  std::vector<std::string> block_types;  // layer_id 0..num_layers-1
  std::string head_type;                 // layer_id num_layers
  std::vector<TiedWeightSpec> tied;
  bool empty() const { return block_types.empty(); }
  // The type of any layer_id of the model.
  const std::string& TypeOf(int layer_id) const;
};

// The model of `dims.arch` (config::LayerTypesOf): its embedding, the blocks (the arch's block
// unless `block_types`, model.layer_types resolved, says otherwise), its head, and the token
// embedding `wte` tied between the embedding (owner) and the head when dims.tied_head().
ModelDescription ModelOf(const layer::ModelDims& dims,
                         const std::vector<std::string>& block_types = {});
ModelDescription ModelOf(const config::ResolvedConfig& config);

}  // namespace bigmac::engine

#endif  // BIGMAC_CORE_ENGINE_MODEL_H_
