// Llama's embedding (the token embedding only: positions enter through RoPE in each block) and
// head (final RMSNorm, the output matrix, untied unless model.tie_embeddings, cross-entropy),
// plain and vocab-parallel: the shared vocabulary layers (stages/vocab/vocab_layers.h).
#include "stages/llama/params.h"
#include "stages/vocab/vocab_layers.h"

namespace bigmac::stages::llama {
namespace {

struct LlamaVocab {
  static std::vector<ParamSpec> EmbeddingParams(const layer::ModelDims& dims) {
    return llama::EmbeddingParams(dims);
  }
  static std::vector<ParamSpec> HeadParams(const layer::ModelDims& dims) {
    return llama::HeadParams(dims);
  }
  static constexpr bool kPositions = false;
  static constexpr bool kRmsNorm = true;
};

const vocab::Registration<LlamaVocab> kRegister("llama_embedding", "llama_head");

}  // namespace
}  // namespace bigmac::stages::llama
