#include "stages/gpt/cuda/constraints.h"

#include "stages/cuda/sdpa_layout.h"

namespace bigmac::stages::gpt::cuda {

int64_t PaddedVocab(int vocab_size) {
  return (int64_t{vocab_size} + kVocabPadding - 1) / kVocabPadding * kVocabPadding;
}

std::vector<std::string> CudaModelProblems(const layer::ModelDims& dims) {
  std::vector<std::string> problems;
  if (dims.hidden_size % 8 != 0) {
    problems.push_back("model.hidden_size=" + std::to_string(dims.hidden_size) +
                       ": device.backend=cuda needs hidden_size % 8 == 0 (16-byte aligned bf16 "
                       "rows for cuBLASLt and 128-bit loads)");
  }
  if (dims.num_heads <= 0 || dims.hidden_size % dims.num_heads != 0) {
    problems.push_back("model.hidden_size=" + std::to_string(dims.hidden_size) +
                       ", model.num_heads=" + std::to_string(dims.num_heads) +
                       ": hidden_size % num_heads must be 0");
  }
  return problems;
}

std::string CudaLayoutSummary(const layer::ModelDims& dims, bool bf16) {
  const int head_dim = dims.num_heads > 0 ? dims.hidden_size / dims.num_heads : 0;
  const stages::cuda::AttentionChoice attention =
      stages::cuda::ChooseAttention(bf16 ? memory::DType::kBF16 : memory::DType::kF32, head_dim);
  std::string summary = "attention: " + attention.reason;
  const int64_t padded = PaddedVocab(dims.vocab_size);
  summary += "; logits rows " + std::to_string(dims.vocab_size) +
             (padded == dims.vocab_size ? "" : " padded to " + std::to_string(padded));
  return summary;
}

}  // namespace bigmac::stages::gpt::cuda
