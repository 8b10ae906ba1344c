#ifndef BIGMAC_CORE_LAYER_COST_H_
#define BIGMAC_CORE_LAYER_COST_H_

#include <cstdint>

#include "core/layer/layer.h"

namespace bigmac::layer {

// The cost model of the built-in layers (GPT-2 and llama, by ModelDims::arch), in one place: the
// layers report it (ForwardFlops, ActivationBytes) and the planner and the balanced partition use
// it without building a model.
struct LayerCost {
  int64_t parameters = 0;        // owned (the head's tied copy not counted)
  int64_t forward_flops = 0;     // a multiply-add counts 2
  int64_t backward_flops = 0;    // input and weight gradients (plus the recomputed forward)
  int64_t activation_bytes = 0;  // kept between forward and backward, per micro-batch
  // Kept between the zero-bubble split's BackwardInput and BackwardWeight, per micro-batch: what
  // the weight gradients still need (the inputs of the matmuls and their output gradients).
  int64_t deferred_bytes = 0;
  // The most this layer holds at once during its backward (or BackwardInput) above its forward
  // activations: the growth to its deferred set, its temporaries, the output gradient it is given
  // and the input gradient it returns. What the planner adds to a stage's held bytes while the
  // layer runs its backward.
  int64_t backward_peak_bytes = 0;
  // Bytes this rank puts into tensor-parallel all-reduces per micro-batch (forward, backward
  // and a recomputed forward); 0 at tp = 1.
  int64_t tp_allreduce_bytes = 0;
};

// What a block's attention keeps for its backward: the (B, h, T, T) probabilities (the CUDA
// fallback kernels) or one log-sum-exp per row, (B, h, T) (the CPU's blocked attention, cuDNN).
enum class AttentionSaves { kProbabilities, kRowLogSumExp };

LayerCost EmbeddingCost(const ModelDims& dims, int batch, int seq);
LayerCost BlockCost(const ModelDims& dims, int batch, int seq, bool activation_checkpointing,
                    int bytes_per_element = 4,
                    AttentionSaves saves = AttentionSaves::kProbabilities);
// One tp rank's share of a block split over `tp` ranks (stages/gpt/tp_block.cc,
// stages/llama/block.cc): the sliced matrices and activations divided by tp, norms,
// row-parallel biases and the block's input, residual and norm outputs whole, and four all-reduces
// of (batch, seq, hidden) (six with recomputation). tp = 1 gives BlockCost.
LayerCost TpBlockCost(const ModelDims& dims, int tp, int batch, int seq,
                      bool activation_checkpointing, int bytes_per_element = 4,
                      AttentionSaves saves = AttentionSaves::kProbabilities);
LayerCost HeadCost(const ModelDims& dims, int batch, int seq, int bytes_per_element = 4);

// One tp rank's share of the vocab-parallel embedding and head (stages/vocab): wte
// rows of the padded vocabulary split over tp, the logits too; all-reduces of the embedding's
// output, and of the head's row statistics and input gradient. tp = 1 gives the whole layers.
int64_t TpVocabRows(const ModelDims& dims, int tp);  // this rank's rows of wte
LayerCost TpEmbeddingCost(const ModelDims& dims, int tp, int batch, int seq);
LayerCost TpHeadCost(const ModelDims& dims, int tp, int batch, int seq, int bytes_per_element = 4);

}  // namespace bigmac::layer

#endif  // BIGMAC_CORE_LAYER_COST_H_
