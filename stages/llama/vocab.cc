// Llama's embedding (the token embedding only: positions enter through RoPE in each block) and
// head (final RMSNorm, the output matrix, untied unless model.tie_embeddings, cross-entropy),
// plain and vocab-parallel: the shared vocabulary layers (stages/vocab/vocab_layers.h).
#include "stages/llama/params.h"
#include "stages/vocab/vocab_layers.h"

namespace bigmac::stages::llama {
namespace {

const vocab::Registration<Vocab> kRegister("llama_embedding", "llama_head");

}  // namespace
}  // namespace bigmac::stages::llama
