#ifndef BIGMAC_STAGES_GPT_PARAMS_H_
#define BIGMAC_STAGES_GPT_PARAMS_H_

// The GPT layers' parameters, backend-neutral: names (what checkpoints store), shapes, weight
// decay, the tied copy, and initialisation. The CPU layers (stages/gpt) and the CUDA layers
// (stages/gpt/cuda) both build from these tables, so a checkpoint and a seed mean the same
// weights on either backend; they differ only in their kernels. Index a layer's parameters with
// the enums (the tables are in enum order).

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "core/layer/layer.h"
#include "plugins/sdk/init.h"

namespace bigmac::stages::gpt {

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

enum BlockParam {
  kLn1Weight,
  kLn1Bias,
  kQkvWeight,
  kQkvBias,
  kProjWeight,
  kProjBias,
  kLn2Weight,
  kLn2Bias,
  kFcWeight,
  kFcBias,
  kFcProjWeight,
  kFcProjBias,
};
// The tensors a block keeps between Forward and its backward, in the order Forward (then
// BackwardInput) appends them: one order for both backends. kAtt holds the attention's softmax
// statistics (B,h,T): the CPU's blocked attention and cuDNN keep each row's log-sum-exp; the CUDA
// path without cuDNN keeps the probabilities (B,h,T,T).
struct BlockSaved {
  enum Index {
    kX,
    kLn1,
    kLn1Mean,
    kLn1Rstd,
    kQkv,
    kAtt,
    kAtty,
    kRes2,
    kLn2,
    kLn2Mean,
    kLn2Rstd,
    kFch,
    kFchGelu,
    kForwardCount,
    kDy = kForwardCount,
    kDFch,
    kDLn2,
    kDRes2,
    kDQkv,
    kDLn1,
  };
};

enum EmbeddingParam { kWte, kWpe };
enum HeadParam { kLnfWeight, kLnfBias, kHeadWte };

inline std::vector<ParamSpec> BlockParams(const layer::ModelDims& dims) {
  const int64_t c = dims.hidden_size;
  using Init = ParamSpec::Init;
  // GPT-2: N(0, 0.02); projections into the residual stream scaled by 1/sqrt(2 * layers).
  const double residual_std = 0.02 / std::sqrt(2.0 * dims.num_layers);
  return {
      {"ln1.weight", {c}, false, Init::kOnes},
      {"ln1.bias", {c}, false, Init::kZeros},
      {"attn.qkv.weight", {3 * c, c}, true, Init::kNormal, 0.02},
      {"attn.qkv.bias", {3 * c}, false, Init::kZeros},
      {"attn.proj.weight", {c, c}, true, Init::kNormal, residual_std},
      {"attn.proj.bias", {c}, false, Init::kZeros},
      {"ln2.weight", {c}, false, Init::kOnes},
      {"ln2.bias", {c}, false, Init::kZeros},
      {"mlp.fc.weight", {4 * c, c}, true, Init::kNormal, 0.02},
      {"mlp.fc.bias", {4 * c}, false, Init::kZeros},
      {"mlp.proj.weight", {c, 4 * c}, true, Init::kNormal, residual_std},
      {"mlp.proj.bias", {c}, false, Init::kZeros},
  };
}

// Owns the tied token embedding `wte` that the head also uses.
inline std::vector<ParamSpec> EmbeddingParams(const layer::ModelDims& dims) {
  using Init = ParamSpec::Init;
  return {
      {"wte", {dims.vocab_size, dims.hidden_size}, true, Init::kNormal, 0.02},
      {"wpe", {dims.max_seq_length, dims.hidden_size}, true, Init::kNormal, 0.01},
  };
}

// The head's `wte` is a read-only copy of the embedding's (the embedding's stage owns it).
inline std::vector<ParamSpec> HeadParams(const layer::ModelDims& dims) {
  using Init = ParamSpec::Init;
  return {
      {"lnf.weight", {dims.hidden_size}, false, Init::kOnes},
      {"lnf.bias", {dims.hidden_size}, false, Init::kZeros},
      {"wte",
       {dims.vocab_size, dims.hidden_size},
       false,
       Init::kNormal,
       0.02,
       /*own_layer_stream=*/false,
       /*tied_copy=*/true,
       "embedding/wte"},
  };
}

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

}  // namespace bigmac::stages::gpt

#endif  // BIGMAC_STAGES_GPT_PARAMS_H_
