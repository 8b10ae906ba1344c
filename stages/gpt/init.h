#ifndef BIGMAC_STAGES_GPT_INIT_H_
#define BIGMAC_STAGES_GPT_INIT_H_

#include <cstdint>
#include <string>

#include "core/memory/tensor.h"

namespace bigmac::stages::gpt {

// Fills `tensor` with N(0, std^2) from a stream keyed by (seed, layer_id, param name): the same
// values wherever the layer lives, for every pipeline partition. Box-Muller on splitmix64, so the
// numbers do not depend on the standard library.
void FillNormal(memory::Tensor* tensor, double std, uint64_t seed, int layer_id,
                const std::string& name);
void FillConstant(memory::Tensor* tensor, double value);

}  // namespace bigmac::stages::gpt

#endif  // BIGMAC_STAGES_GPT_INIT_H_
