#ifndef BIGMAC_STAGES_PARAM_SPEC_H_
#define BIGMAC_STAGES_PARAM_SPEC_H_

// A built-in layer's parameters, backend-neutral: names (what checkpoints store), shapes, weight
// decay, the tied copy, and initialisation. Each architecture's tables (stages/gpt/params.h,
// stages/llama/params.h) are lists of ParamSpec; the CPU and CUDA layers both build from them, so a
// checkpoint and a seed mean the same weights on either backend, and every tp size starts from
// the weights of tp = 1 (InitSlice).

#include <cmath>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/layer/layer.h"
#include "core/layer/tp_layer.h"
#include "plugins/sdk/init.h"

namespace bigmac::stages {

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  bool weight_decay = false;
  enum class Init { kZeros, kOnes, kNormal } init = Init::kZeros;
  double std = 0;
  // kNormal draws from the stream of (seed, init_layer_id, name); the head's copy of wte draws
  // the embedding's, so the copy starts equal to the owner even before the first exchange.
  bool own_layer_stream = true;
  bool tied_copy = false;
  std::string tied_owner;
};

// Writes a parameter's initial master value (on the host; uploaded once on a GPU).
inline void InitParam(const ParamSpec& spec, memory::Tensor* value, uint64_t seed, int layer_id) {
  switch (spec.init) {
    case ParamSpec::Init::kZeros:
      sdk::FillConstant(value, 0.0);
      break;
    case ParamSpec::Init::kOnes:
      sdk::FillConstant(value, 1.0);
      break;
    case ParamSpec::Init::kNormal:
      sdk::FillNormal(value, spec.std, seed,
                      spec.own_layer_stream ? layer_id : layer::kEmbeddingLayerId, spec.name);
      break;
  }
}

// A Param for `spec` on `layer_spec`'s device: master and gradient of the master dtype, plus a
// bf16 compute copy under precision bf16.
inline layer::Param MakeParam(const ParamSpec& spec, const layer::LayerSpec& layer_spec) {
  layer::Param param;
  param.name = spec.name;
  param.value = memory::Tensor(layer_spec.device, spec.shape, layer_spec.dtype);
  param.grad = memory::Tensor(layer_spec.device, spec.shape, layer_spec.dtype);
  if (layer_spec.bf16)
    param.compute = memory::Tensor(layer_spec.device, spec.shape, memory::DType::kBF16);
  param.weight_decay = spec.weight_decay;
  param.tied_copy = spec.tied_copy;
  param.tied_owner = spec.tied_owner;
  return param;
}

// One TpShard per spec, in order, for `rank` of a group of `size`: replicated unless
// `slice(index, &shard)` sets its dim (and parts, blocks or padding).
template <typename Slice>
std::vector<layer::TpShard> ShardsOf(const std::vector<ParamSpec>& specs, int rank, int size,
                                     Slice slice) {
  std::vector<layer::TpShard> shards;
  for (size_t i = 0; i < specs.size(); ++i) {
    layer::TpShard shard;
    shard.rank = rank;
    shard.size = size;
    shard.full_shape = specs[i].shape;
    slice(i, &shard);
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

}  // namespace bigmac::stages

#endif  // BIGMAC_STAGES_PARAM_SPEC_H_
