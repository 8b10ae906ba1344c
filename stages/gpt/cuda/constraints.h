#ifndef BIGMAC_STAGES_GPT_CUDA_CONSTRAINTS_H_
#define BIGMAC_STAGES_GPT_CUDA_CONSTRAINTS_H_

// Pure rules (no CUDA) the CUDA GPT layers impose on a model, checked at start-up with the config
// errors (exit 2, every rank) and shown in the [device] line, so a shape the kernels cannot serve
// is refused before anything is allocated, never discovered as a misaligned access on the GPU.

#include <cstdint>
#include <string>
#include <vector>

#include "core/layer/layer.h"

namespace bigmac::stages::gpt::cuda {

// Rows of the logits are padded to a multiple of this many elements (128 bytes of bf16), so every
// row starts 16-byte aligned for the GEMM and the 128-bit loads of the cross-entropy.
inline constexpr int kVocabPadding = 64;
int64_t PaddedVocab(int vocab_size);

// The alignment rules: hidden_size a multiple of 8 (each (n, C) row of bf16 is 16-byte aligned,
// which cuBLASLt's fast kernels and the 128-bit loads need), and heads dividing it. Each problem
// names the fields, their values and the rule.
std::vector<std::string> CudaModelProblems(const layer::ModelDims& dims);

// "attention: cuDNN fused SDPA (bf16, head dim 64); logits rows padded 50257 -> 50304" for the
// [device] line.
std::string CudaLayoutSummary(const layer::ModelDims& dims, bool bf16);

}  // namespace bigmac::stages::gpt::cuda

#endif  // BIGMAC_STAGES_GPT_CUDA_CONSTRAINTS_H_
