#ifndef BIGMAC_STAGES_LLAMA_PARAMS_H_
#define BIGMAC_STAGES_LLAMA_PARAMS_H_

// The llama layers' parameter tables (stages/param_spec.h) and their tensor-parallel slicing.
// Names follow Hugging Face's LlamaForCausalLM where a tensor is the same (the fused q|k|v and
// gate|up are split into q_proj, k_proj, v_proj and gate_proj, up_proj on export). Index a
// layer's parameters with the enums (the tables are in enum order).

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/layer/layer.h"
#include "core/layer/tp_layer.h"
#include "stages/param_spec.h"

namespace bigmac::stages::llama {

enum BlockParam {
  kAttnNormWeight,  // input_layernorm.weight (RMSNorm)
  kQkvWeight,       // q (num_heads), k and v (num_kv_heads) heads, fused by rows
  kOWeight,         // attention output projection
  kMlpNormWeight,   // post_attention_layernorm.weight (RMSNorm)
  kGateUpWeight,    // gate and up projections, fused by rows
  kDownWeight,      // down projection
};

// The tensors a block keeps between Forward and its backward, in the order Forward (then
// BackwardInput) appends them. kQkv holds q and k after the rotation; kLse the attention rows'
// log-sum-exp (B, h, T).
struct BlockSaved {
  enum Index {
    kX,
    kNorm1,
    kRstd1,
    kQkv,
    kLse,
    kAtty,
    kRes2,
    kNorm2,
    kRstd2,
    kGateUp,
    kSwiglu,
    kForwardCount,
    kDy = kForwardCount,
    kDGateUp,
    kDNorm2,
    kDRes2,
    kDQkv,
    kDNorm1,
  };
};

// The rows of the fused q|k|v projection: q (hidden_size), then k and v (kv_heads * head_dim).
inline std::vector<int64_t> QkvParts(const layer::ModelDims& dims) {
  const int64_t kv_width = int64_t{dims.kv_heads()} * dims.head_dim();
  return {dims.hidden_size, kv_width, kv_width};
}

inline std::vector<ParamSpec> BlockParams(const layer::ModelDims& dims) {
  const int64_t c = dims.hidden_size;
  const int64_t inner = dims.intermediate_size;
  int64_t qkv_rows = 0;
  for (int64_t part : QkvParts(dims)) qkv_rows += part;
  using Init = ParamSpec::Init;
  // N(0, 0.02); the projections into the residual stream scaled by 1/sqrt(2 * layers), as
  // GPT-2 and Megatron-LM do.
  const double residual_std = 0.02 / std::sqrt(2.0 * dims.num_layers);
  return {
      {"input_layernorm.weight", {c}, false, Init::kOnes},
      {"self_attn.qkv_proj.weight", {qkv_rows, c}, true, Init::kNormal, 0.02},
      {"self_attn.o_proj.weight", {c, c}, true, Init::kNormal, residual_std},
      {"post_attention_layernorm.weight", {c}, false, Init::kOnes},
      {"mlp.gate_up_proj.weight", {2 * inner, c}, true, Init::kNormal, 0.02},
      {"mlp.down_proj.weight", {c, inner}, true, Init::kNormal, residual_std},
  };
}

// Megatron's layout: q|k|v column-parallel by heads (each rank num_heads/tp query heads and
// num_kv_heads/tp key and value heads: whole groups), gate|up column-parallel, o and down
// row-parallel (input columns), the RMSNorms replicated.
inline std::vector<layer::TpShard> BlockShards(const layer::ModelDims& dims,
                                               const std::vector<ParamSpec>& specs, int rank,
                                               int size) {
  return ShardsOf(specs, rank, size, [&](size_t index, layer::TpShard* shard) {
    switch (static_cast<BlockParam>(index)) {
      case kQkvWeight:
        shard->dim = 0;
        shard->parts = QkvParts(dims);
        break;
      case kGateUpWeight:
        shard->dim = 0;
        shard->blocks = 2;
        break;
      case kOWeight:
      case kDownWeight:
        shard->dim = 1;
        break;
      default:
        break;  // replicated
    }
  });
}

inline std::vector<ParamSpec> EmbeddingParams(const layer::ModelDims& dims) {
  using Init = ParamSpec::Init;
  return {{"wte", {dims.vocab_size, dims.hidden_size}, true, Init::kNormal, 0.02}};
}

// The final RMSNorm, then the output matrix: the head's own `lm_head.weight`, or (tied) a
// read-only copy of the embedding's `wte`, drawn from the embedding's stream.
inline std::vector<ParamSpec> HeadParams(const layer::ModelDims& dims) {
  using Init = ParamSpec::Init;
  std::vector<ParamSpec> specs = {{"norm.weight", {dims.hidden_size}, false, Init::kOnes}};
  if (dims.tie_embeddings) {
    specs.push_back({"wte",
                     {dims.vocab_size, dims.hidden_size},
                     false,
                     Init::kNormal,
                     0.02,
                     /*own_layer_stream=*/false,
                     /*tied_copy=*/true,
                     "embedding/wte"});
  } else {
    specs.push_back(
        {"lm_head.weight", {dims.vocab_size, dims.hidden_size}, true, Init::kNormal, 0.02});
  }
  return specs;
}

// Llama's embedding (no position table) and head (final RMSNorm; lm_head.weight, or the tied
// copy of wte) for the vocabulary layers written once per backend (stages/vocab/vocab_layers.h,
// stages/cuda/vocab_layers.h).
struct Vocab {
  static std::vector<ParamSpec> EmbeddingParams(const layer::ModelDims& dims) {
    return llama::EmbeddingParams(dims);
  }
  static std::vector<ParamSpec> HeadParams(const layer::ModelDims& dims) {
    return llama::HeadParams(dims);
  }
  static constexpr bool kPositions = false;
  static constexpr bool kRmsNorm = true;
};

}  // namespace bigmac::stages::llama

#endif  // BIGMAC_STAGES_LLAMA_PARAMS_H_
