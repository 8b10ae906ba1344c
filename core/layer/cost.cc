#include "core/layer/cost.h"

#include <algorithm>

#include "core/layer/tp_layer.h"

namespace bigmac::layer {

namespace {

// A block's matrices and per-token activations, whole (tp = 1); a tp rank holds 1/tp of the
// `sliced` parts. GPT-2: qkv 3C, proj C, fc 4C, proj back 4C, LayerNorms with biases, biases on
// every GEMM. Llama: q C, k and v kv_heads * head_dim each, o C, gate and up I, down I, RMSNorms,
// no biases.
struct BlockShape {
  int64_t sliced_matrix_params = 0;    // per rank: / tp
  int64_t sliced_vector_params = 0;    // column-parallel biases: / tp
  int64_t replicated_params = 0;       // norms and row-parallel biases
  int64_t sliced_activations = 0;      // per token, / tp: qkv, attention output, MLP inner rows
  int64_t replicated_activations = 0;  // per token: input, norms' outputs, residual, statistics
  // Per token, between BackwardInput and BackwardWeight (stages/gpt/cpu_block.h): the matmuls'
  // inputs and their output gradients; BackwardInput frees fc's output, the attention's
  // statistics and qkv, and adds dy, dfc, dln2, dres2, dln1 and dqkv. Unknown (< 0): taken to be
  // the forward's activations.
  int64_t sliced_deferred = -1;
  int64_t replicated_deferred = -1;
  // Per token, / tp: BackwardInput's locals, freed when it returns (the MLP's inner gradient
  // before its activation's backward, the attention output's gradient).
  int64_t sliced_backward_temporaries = 0;
};

BlockShape BlockShapeOf(const ModelDims& dims) {
  const int64_t c = dims.hidden_size;
  BlockShape shape;
  if (dims.arch == Arch::kLlama) {
    const int64_t kv_width = int64_t{dims.kv_heads()} * dims.head_dim();
    const int64_t inner = dims.intermediate_size;
    shape.sliced_matrix_params = 2 * c * c + 2 * c * kv_width + 3 * c * inner;
    shape.replicated_params = 2 * c;
    // qkv (C + 2 kv_width), attention output C, gate and up 2I, SwiGLU I.
    shape.sliced_activations = 2 * c + 2 * kv_width + 3 * inner;
    // x, norm 1, residual, norm 2; two RMS statistics.
    shape.replicated_activations = 4 * c + 2;
    // stages/llama/block.cc: BackwardInput frees gate/up, qkv and the log-sum-exps, keeps the
    // rest and adds dy, dgate_up 2I, dnorm2, dres2, dqkv and dnorm1.
    shape.sliced_deferred =
        2 * c + 2 * kv_width + 3 * inner;   // attention out, SwiGLU, dgate_up, dqkv
    shape.replicated_deferred = 8 * c + 2;  // x, norms, residual, dy, dnorm2, dres2, dnorm1; rstds
    shape.sliced_backward_temporaries = inner + c;  // dswiglu, datty
    return shape;
  }
  shape.sliced_matrix_params = 12 * c * c;
  shape.sliced_vector_params = 7 * c;  // qkv 3C and fc 4C biases
  shape.replicated_params = 6 * c;     // two LayerNorms and the two row-parallel biases
  shape.sliced_activations = 12 * c;   // qkv 3C, attention output C, fc 4C, gelu 4C
  shape.replicated_activations = 4 * c + 4;
  shape.sliced_deferred = 12 * c;         // attention output C, gelu 4C, dfc 4C, dqkv 3C
  shape.replicated_deferred = 8 * c + 4;  // x, ln1, res2, ln2, dy, dln2, dres2, dln1; statistics
  // dfch_gelu 4C, datty C. The CPU block makes no dfch_gelu (MatmulGeluBackwardInput writes GELU's
  // input gradient directly), so there the plan is high by 4C / tp per token of one block; kept
  // for the CUDA block, which makes it.
  shape.sliced_backward_temporaries = 5 * c;
  return shape;
}

}  // namespace

LayerCost EmbeddingCost(const ModelDims& dims, int batch, int seq) {
  const int64_t c = dims.hidden_size;
  LayerCost cost;
  cost.parameters = int64_t{dims.vocab_size} * c;
  if (dims.arch == Arch::kGpt) cost.parameters += int64_t{dims.max_seq_length} * c;  // wpe
  cost.forward_flops = int64_t{batch} * seq * c;
  cost.backward_flops = cost.forward_flops;
  cost.deferred_bytes = int64_t{batch} * seq * c * 4;  // dy, for the table gradients
  cost.backward_peak_bytes = 2 * cost.deferred_bytes;  // and the dy it was given
  return cost;
}

LayerCost BlockCost(const ModelDims& dims, int batch, int seq, bool activation_checkpointing,
                    int bytes_per_element, AttentionSaves saves) {
  return TpBlockCost(dims, 1, batch, seq, activation_checkpointing, bytes_per_element, saves);
}

LayerCost TpBlockCost(const ModelDims& dims, int tp, int batch, int seq,
                      bool activation_checkpointing, int bytes_per_element, AttentionSaves saves) {
  tp = tp < 1 ? 1 : tp;
  const int64_t n = int64_t{batch} * seq;
  const int64_t c = dims.hidden_size;
  const BlockShape shape = BlockShapeOf(dims);
  LayerCost cost;
  cost.parameters =
      (shape.sliced_matrix_params + shape.sliced_vector_params) / tp + shape.replicated_params;
  // The matmuls, and causal attention (QK^T and PV over half the T x T scores).
  cost.forward_flops =
      2 * n * shape.sliced_matrix_params / tp + 2 * int64_t{batch} * seq * seq * c / tp;
  cost.backward_flops =
      2 * cost.forward_flops + (activation_checkpointing ? cost.forward_flops : 0);
  // Kept: the per-token rows and the attention's statistics; only x with recomputation.
  const int64_t statistics = int64_t{batch} * (dims.num_heads / tp) * seq *
                             (saves == AttentionSaves::kProbabilities ? seq : 1);
  const int64_t elements =
      activation_checkpointing
          ? n * c
          : n * (shape.replicated_activations + shape.sliced_activations / tp) + statistics;
  cost.activation_bytes = elements * bytes_per_element;
  // With recomputation the internals are restored for the backward and kept until the weights'.
  cost.deferred_bytes =
      shape.sliced_deferred < 0
          ? cost.activation_bytes
          : n * (shape.replicated_deferred + shape.sliced_deferred / tp) * bytes_per_element;
  // During BackwardInput: the deferred set, the attention's statistics (freed only inside it; with
  // probabilities also their gradient), its locals, the dy it was given and the dx it makes.
  const int64_t saved_statistics =
      statistics * (saves == AttentionSaves::kProbabilities ? 2 : 1) * bytes_per_element;
  cost.backward_peak_bytes =
      cost.deferred_bytes + saved_statistics - cost.activation_bytes +
      n * (shape.sliced_backward_temporaries / tp + 2 * c) * bytes_per_element;
  if (tp > 1)
    cost.tp_allreduce_bytes = (activation_checkpointing ? 6 : 4) * n * c * bytes_per_element;
  return cost;
}

LayerCost HeadCost(const ModelDims& dims, int batch, int seq, int bytes_per_element) {
  return TpHeadCost(dims, 1, batch, seq, bytes_per_element);
}

int64_t TpVocabRows(const ModelDims& dims, int tp) {
  return tp <= 1 ? dims.vocab_size : PaddedVocabSize(dims.vocab_size, tp) / tp;
}

LayerCost TpEmbeddingCost(const ModelDims& dims, int tp, int batch, int seq) {
  LayerCost cost = EmbeddingCost(dims, batch, seq);
  if (tp <= 1) return cost;
  const int64_t c = dims.hidden_size;
  cost.parameters = TpVocabRows(dims, tp) * c;
  if (dims.arch == Arch::kGpt) cost.parameters += int64_t{dims.max_seq_length} * c;
  cost.tp_allreduce_bytes = int64_t{batch} * seq * c * 4;
  return cost;
}

LayerCost TpHeadCost(const ModelDims& dims, int tp, int batch, int seq, int bytes_per_element) {
  const int64_t n = int64_t{batch} * seq;
  const int64_t c = dims.hidden_size;
  const int64_t rows = TpVocabRows(dims, tp);
  LayerCost cost;
  // The final norm (GPT-2's LayerNorm has a bias); the output matrix when it is the head's own.
  cost.parameters = dims.arch == Arch::kGpt ? 2 * c : c;
  if (!dims.tied_head()) cost.parameters += rows * c;
  cost.forward_flops = 2 * n * c * rows;
  cost.backward_flops = 2 * cost.forward_flops;
  // x, the norm's output and statistics, the logits (and, split, the row max and sum).
  cost.activation_bytes = (2 * n * c + (tp > 1 ? 4 : 2) * n + n * rows) * bytes_per_element;
  // BackwardInput frees the logits and keeps their gradient and the norm's.
  cost.deferred_bytes = cost.activation_bytes + n * c * bytes_per_element;
  // The logits' gradient is made while the logits are still held; later the norm's gradient and
  // dx replace them.
  cost.backward_peak_bytes = std::max(n * rows, 2 * n * c) * bytes_per_element;
  // Row maxima, the f64 sums of exponentials and target logits, the input gradient.
  if (tp > 1)
    cost.tp_allreduce_bytes = n * bytes_per_element + 2 * n * 8 + n * c * bytes_per_element;
  return cost;
}

}  // namespace bigmac::layer
