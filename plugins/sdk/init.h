#ifndef BIGMAC_PLUGINS_SDK_INIT_H_
#define BIGMAC_PLUGINS_SDK_INIT_H_

// Plugin SDK: deterministic parameter initialisation, for InitParams(seed). Target
// //plugins/sdk:init (linked statically into each plugin).
//
// Stability: the number stream is part of the model's definition (a checkpoint-free run with the
// same seed starts from the same weights on every partition and every release), so the values
// FillNormal writes for a given (seed, layer_id, name, numel) never change. The tensors are the
// caller's (f32 or f64, on any device); these functions only write their elements. They compute
// on the host: on the CPU in place, on another device into a host buffer uploaded once, so every
// backend starts from identical weights.

#include <cstdint>
#include <string>

#include "core/memory/tensor.h"

namespace bigmac::sdk {

// Fills `tensor` with N(0, std^2) from a stream keyed by (seed, layer_id, param name): the same
// values wherever the layer lives, for every pipeline partition. Box-Muller on splitmix64, so the
// numbers do not depend on the standard library.
void FillNormal(memory::Tensor* tensor, double std, uint64_t seed, int layer_id,
                const std::string& name);
void FillConstant(memory::Tensor* tensor, double value);

}  // namespace bigmac::sdk

#endif  // BIGMAC_PLUGINS_SDK_INIT_H_
