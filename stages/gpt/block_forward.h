#ifndef BIGMAC_STAGES_GPT_BLOCK_FORWARD_H_
#define BIGMAC_STAGES_GPT_BLOCK_FORWARD_H_

#include "core/layer/layer.h"

namespace bigmac::stages::gpt {

// The Forward of a GPT block (tp = 1 and tensor-parallel), one rule for activation checkpointing:
// `saved` keeps the input and, unless `checkpointing`, the internals the backward needs; with
// checkpointing the internals are computed into a scratch set that is dropped at return, and
// BackwardInput recomputes them from the input. `internals(Saved*)` appends the internals after the
// input, `allocate()` allocates the output, `output(const Saved&)` computes it.
template <typename Internals, typename Allocate, typename Output>
void BlockForward(bool checkpointing, const layer::Tensor& x, layer::Saved* saved,
                  Internals internals, Allocate allocate, Output output) {
  saved->Clear();
  saved->tensors.push_back(x.Clone());
  if (!checkpointing) internals(saved);
  allocate();
  if (checkpointing) {
    layer::Saved scratch;
    scratch.tensors.push_back(x.Clone());
    internals(&scratch);
    output(scratch);
  } else {
    output(*saved);
  }
}

}  // namespace bigmac::stages::gpt

#endif  // BIGMAC_STAGES_GPT_BLOCK_FORWARD_H_
