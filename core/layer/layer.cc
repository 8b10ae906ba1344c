#include "core/layer/layer.h"

namespace bigmac::layer {

int HeadLayerId(int num_layers) { return num_layers; }

std::string LayerIdName(int layer_id, int num_layers) {
  if (layer_id == kEmbeddingLayerId) return "embedding";
  if (layer_id == HeadLayerId(num_layers)) return "head";
  return "block " + std::to_string(layer_id);
}

int64_t Saved::bytes() const {
  int64_t total = 0;
  for (const Tensor& tensor : tensors) total += tensor.bytes();
  return total;
}

Tensor Layer::NewActivation(int batch, int seq, int width) const {
  return Tensor(spec_.allocator, {batch, seq, width}, spec_.dtype);
}

std::unique_ptr<Layer> CreateLayer(const LayerSpec& spec) {
  return LayerRegistry::Global().Create(spec.type, spec);
}

}  // namespace bigmac::layer
