#ifndef BIGMAC_STAGES_GPT_TP_PARAMS_H_
#define BIGMAC_STAGES_GPT_TP_PARAMS_H_

// How the GPT layers' parameters (stages/gpt/params.h) are sliced over a tensor-parallel group,
// Megatron's layout (docs/tensor_parallel.md), and their initialisation from the full tensor, so
// that every tp size starts from the weights of tp = 1.

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
  std::vector<layer::TpShard> shards;
  for (size_t i = 0; i < specs.size(); ++i) {
    layer::TpShard shard;
    shard.rank = rank;
    shard.size = size;
    shard.full_shape = specs[i].shape;
    switch (static_cast<BlockParam>(i)) {
      case kQkvWeight:
      case kQkvBias:
        shard.dim = 0;
        shard.blocks = 3;
        break;
      case kFcWeight:
      case kFcBias:
        shard.dim = 0;
        break;
      case kProjWeight:
      case kFcProjWeight:
        shard.dim = 1;
        break;
      default:
        break;  // replicated
    }
    shards.push_back(shard);
  }
  return shards;
}

// The embedding's and the head's parameters (EmbeddingParams, HeadParams): the token embedding
// `wte` (the head's tied copy too) is vocab-parallel, rows of the padded vocabulary
// (layer::PaddedVocabSize) split over the ranks; wpe and lnf are replicated.
inline std::vector<layer::TpShard> VocabShards(const std::vector<ParamSpec>& specs, int rank,
                                               int size) {
  std::vector<layer::TpShard> shards;
  for (const ParamSpec& spec : specs) {
    layer::TpShard shard;
    shard.rank = rank;
    shard.size = size;
    shard.full_shape = spec.shape;
    if (spec.name == "wte") {
      shard.dim = 0;
      shard.padded = layer::PaddedVocabSize(spec.shape[0], size);
    }
    shards.push_back(shard);
  }
  return shards;
}

// Writes this rank's slice of `spec`'s initial full value into `local` (its LocalShape()).
inline void InitSlice(const ParamSpec& spec, const layer::TpShard& shard, memory::Tensor* local,
                      uint64_t seed, int layer_id) {
  memory::Tensor full(local->device(), spec.shape, local->dtype());
  InitParam(spec, &full, seed, layer_id);
  const int64_t element = memory::DTypeSize(local->dtype());
  std::vector<char> full_host(full.bytes()), local_host(local->bytes());
  full.CopyToHost(full_host.data());
  layer::FullToLocal(shard, full_host.data(), local_host.data(), element);
  local->CopyFromHost(local_host.data());
}

// The factory of a tensor-parallel CPU layer class template: LayerClass<float> or <double> for
// the spec's dtype (the CPU kernels' types), as layer::MakeForDType for plain layers.
template <template <typename> class LayerClass>
std::unique_ptr<layer::Layer> MakeTpForDType(const layer::LayerSpec& spec, layer::TpGroup* group) {
  if (spec.dtype == memory::DType::kF64) return std::make_unique<LayerClass<double>>(spec, group);
  if (spec.dtype == memory::DType::kF32) return std::make_unique<LayerClass<float>>(spec, group);
  throw std::invalid_argument("tensor-parallel " + spec.type +
                              ": CPU kernels support f32 and f64, not " +
                              memory::DTypeName(spec.dtype));
}

}  // namespace bigmac::stages::gpt

#endif  // BIGMAC_STAGES_GPT_TP_PARAMS_H_
