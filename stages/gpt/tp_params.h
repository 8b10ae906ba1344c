#ifndef BIGMAC_STAGES_GPT_TP_PARAMS_H_
#define BIGMAC_STAGES_GPT_TP_PARAMS_H_

// How the GPT block's parameters (stages/gpt/params.h) are sliced over a tensor-parallel group,
// Megatron's layout (docs/tensor_parallel.md); the embedding's and head's: stages/vocab.

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <vector>

#include "core/layer/tp_layer.h"
#include "stages/gpt/params.h"

namespace bigmac::stages::gpt {

// The slicing of each BlockParams entry, in its order: the fused q, k, v (column-parallel by
// heads) and fc (column-parallel) split their output rows; proj and fc2 (row-parallel) split
// their input columns; LayerNorms and the row-parallel biases are replicated.
inline std::vector<layer::TpShard> BlockShards(const std::vector<ParamSpec>& specs, int rank,
                                               int size) {
  return ShardsOf(specs, rank, size, [](size_t index, layer::TpShard* shard) {
    switch (static_cast<BlockParam>(index)) {
      case kQkvWeight:
      case kQkvBias:
        shard->dim = 0;
        shard->blocks = 3;
        break;
      case kFcWeight:
      case kFcBias:
        shard->dim = 0;
        break;
      case kProjWeight:
      case kFcProjWeight:
        shard->dim = 1;
        break;
      default:
        break;  // replicated
    }
  });
}

}  // namespace bigmac::stages::gpt

#endif  // BIGMAC_STAGES_GPT_TP_PARAMS_H_
