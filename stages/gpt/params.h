#ifndef BIGMAC_STAGES_GPT_PARAMS_H_
#define BIGMAC_STAGES_GPT_PARAMS_H_

// The GPT layers' parameter tables (stages/param_spec.h): the CPU layers (stages/gpt) and the
// CUDA layers (stages/gpt/cuda) both build from them. Index a layer's parameters with the enums
// (the tables are in enum order).

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/layer/layer.h"
#include "stages/param_spec.h"

namespace bigmac::stages::gpt {

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

// GPT-2's embedding (token plus learned position embedding) and head (final LayerNorm, the tied
// wte) for the vocabulary layers written once per backend (stages/vocab/vocab_layers.h,
// stages/cuda/vocab_layers.h).
struct Vocab {
  static std::vector<ParamSpec> EmbeddingParams(const layer::ModelDims& dims) {
    return gpt::EmbeddingParams(dims);
  }
  static std::vector<ParamSpec> HeadParams(const layer::ModelDims& dims) {
    return gpt::HeadParams(dims);
  }
  static constexpr bool kPositions = true;
  static constexpr bool kRmsNorm = false;
};

}  // namespace bigmac::stages::gpt

#endif  // BIGMAC_STAGES_GPT_PARAMS_H_
