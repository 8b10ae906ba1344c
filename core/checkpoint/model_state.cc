#include "core/checkpoint/model_state.h"

namespace bigmac::checkpoint {

std::string ParamName(const ModelState& state, int layer_id, const layer::Param& param) {
  return layer::LayerIdName(layer_id, state.num_layers) + "/" + param.name;
}

}  // namespace bigmac::checkpoint
