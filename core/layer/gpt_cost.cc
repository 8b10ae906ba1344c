#include "core/layer/gpt_cost.h"

#include "core/layer/tp_layer.h"

namespace bigmac::layer {

LayerCost EmbeddingCost(const ModelDims& dims, int batch, int seq) {
  const int64_t c = dims.hidden_size;
  LayerCost cost;
  cost.parameters = int64_t{dims.vocab_size} * c + int64_t{dims.max_seq_length} * c;
  cost.forward_flops = int64_t{batch} * seq * c;
  cost.backward_flops = cost.forward_flops;
  return cost;
}

LayerCost BlockCost(const ModelDims& dims, int batch, int seq, bool activation_checkpointing,
                    int bytes_per_element) {
  const int64_t n = int64_t{batch} * seq;
  const int64_t c = dims.hidden_size;
  LayerCost cost;
  cost.parameters = 12 * c * c + 13 * c;
  // Four matmuls (qkv 3C, proj C, fc 4C, proj back 4C: 12 C^2 per token) and causal attention.
  cost.forward_flops = 2 * n * 12 * c * c + 2 * int64_t{batch} * seq * seq * c;
  cost.backward_flops =
      2 * cost.forward_flops + (activation_checkpointing ? cost.forward_flops : 0);
  // Kept: x, ln1, qkv (3), attention output, residual, ln2, fc (4) and gelu (4) rows of C; two
  // LayerNorm statistics; the attention probabilities. Only x with recomputation.
  const int64_t elements = activation_checkpointing
                               ? n * c
                               : n * c * 16 + 4 * n + int64_t{batch} * dims.num_heads * seq * seq;
  cost.activation_bytes = elements * bytes_per_element;
  return cost;
}

LayerCost TpBlockCost(const ModelDims& dims, int tp, int batch, int seq,
                      bool activation_checkpointing, int bytes_per_element) {
  if (tp <= 1) return BlockCost(dims, batch, seq, activation_checkpointing, bytes_per_element);
  const int64_t n = int64_t{batch} * seq;
  const int64_t c = dims.hidden_size;
  LayerCost cost;
  cost.parameters = 12 * c * c / tp + 7 * c / tp + 6 * c;
  cost.forward_flops = 2 * n * 12 * c * c / tp + 2 * int64_t{batch} * seq * seq * c / tp;
  cost.backward_flops =
      2 * cost.forward_flops + (activation_checkpointing ? cost.forward_flops : 0);
  const int64_t elements =
      activation_checkpointing
          ? n * c
          : n * (4 * c + 12 * c / tp) + 4 * n + int64_t{batch} * (dims.num_heads / tp) * seq * seq;
  cost.activation_bytes = elements * bytes_per_element;
  cost.tp_allreduce_bytes = (activation_checkpointing ? 6 : 4) * n * c * bytes_per_element;
  return cost;
}

LayerCost HeadCost(const ModelDims& dims, int batch, int seq, int bytes_per_element) {
  const int64_t n = int64_t{batch} * seq;
  const int64_t c = dims.hidden_size;
  LayerCost cost;
  cost.parameters = 2 * c;
  cost.forward_flops = 2 * n * c * dims.vocab_size;
  cost.backward_flops = 2 * cost.forward_flops;
  cost.activation_bytes = (2 * n * c + 2 * n + n * dims.vocab_size) * bytes_per_element;
  return cost;
}

int64_t TpVocabRows(const ModelDims& dims, int tp) {
  return tp <= 1 ? dims.vocab_size : PaddedVocabSize(dims.vocab_size, tp) / tp;
}

LayerCost TpEmbeddingCost(const ModelDims& dims, int tp, int batch, int seq) {
  LayerCost cost = EmbeddingCost(dims, batch, seq);
  if (tp <= 1) return cost;
  const int64_t c = dims.hidden_size;
  cost.parameters = TpVocabRows(dims, tp) * c + int64_t{dims.max_seq_length} * c;
  cost.tp_allreduce_bytes = int64_t{batch} * seq * c * 4;
  return cost;
}

LayerCost TpHeadCost(const ModelDims& dims, int tp, int batch, int seq, int bytes_per_element) {
  LayerCost cost = HeadCost(dims, batch, seq, bytes_per_element);
  if (tp <= 1) return cost;
  const int64_t n = int64_t{batch} * seq;
  const int64_t c = dims.hidden_size;
  const int64_t rows = TpVocabRows(dims, tp);
  cost.forward_flops = 2 * n * c * rows;
  cost.backward_flops = 2 * cost.forward_flops;
  cost.activation_bytes = (2 * n * c + 4 * n + n * rows) * bytes_per_element;
  // Row maxima, the f64 sums of exponentials and target logits, the input gradient.
  cost.tp_allreduce_bytes = n * bytes_per_element + 2 * n * 8 + n * c * bytes_per_element;
  return cost;
}

}  // namespace bigmac::layer
