#ifndef BIGMAC_STAGES_CHECKPOINTED_BLOCK_H_
#define BIGMAC_STAGES_CHECKPOINTED_BLOCK_H_

// The one rule for activation checkpointing in the built-in CPU blocks (stages/gpt/cpu_block.h,
// stages/llama/block.cc): Forward keeps the input and, unless checkpointing, the internals the
// backward needs; with checkpointing the internals go into a scratch set dropped at return, and
// BackwardInput recomputes them from the input with the same kernels (RestoreInternals), so
// results are bitwise unchanged. The block does this itself, so the stage must not rerun Forward.

#include "plugins/sdk/cpu_layer.h"

namespace bigmac::stages {

template <typename T>
class CheckpointedBlock : public sdk::CpuLayer<T> {
 public:
  using sdk::CpuLayer<T>::CpuLayer;

  bool checkpoints_activations() const override { return true; }

  void Forward(const sdk::MicroBatch& mb, const sdk::Tensor& x, sdk::Tensor* y,
               sdk::Saved* saved) final {
    saved->Clear();
    saved->tensors.push_back(x.Clone());
    const bool checkpointing = this->spec_.activation_checkpointing;
    if (!checkpointing) ComputeInternals(mb, saved);
    // ComputeOutput writes every element of y (its GEMM overwrites), so y is not zeroed first.
    *y = this->NewForOverwrite({mb.batch, mb.seq, this->C()});
    if (checkpointing) {
      sdk::Saved scratch;
      scratch.tensors.push_back(x.Clone());
      ComputeInternals(mb, &scratch);
      ComputeOutput(mb, scratch, y);
    } else {
      ComputeOutput(mb, *saved, y);
    }
  }

 protected:
  // Appends the internals the backward needs to `saved`, which holds the input alone.
  virtual void ComputeInternals(const sdk::MicroBatch& mb, sdk::Saved* saved) = 0;
  // y from the input and the internals.
  virtual void ComputeOutput(const sdk::MicroBatch& mb, const sdk::Saved& saved,
                             sdk::Tensor* y) = 0;
  // At the start of BackwardInput: the internals, recomputed if Forward kept only the input.
  void RestoreInternals(const sdk::MicroBatch& mb, sdk::Saved* saved) {
    if (saved->tensors.size() == 1) ComputeInternals(mb, saved);
  }
};

}  // namespace bigmac::stages

#endif  // BIGMAC_STAGES_CHECKPOINTED_BLOCK_H_
