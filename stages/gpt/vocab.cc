// GPT-2's embedding (token plus learned position embedding; owns the tied `wte`) and head (final
// LayerNorm, the output projection tied to `wte`, cross-entropy), plain and vocab-parallel: the
// shared vocabulary layers (stages/vocab/vocab_layers.h) with GPT-2's parameter tables.
#include "stages/gpt/params.h"
#include "stages/vocab/vocab_layers.h"

namespace bigmac::stages::gpt {
namespace {

const vocab::Registration<Vocab> kRegister("gpt_embedding", "gpt_head");

}  // namespace
}  // namespace bigmac::stages::gpt
