#include "stages/cuda/sdpa_layout.h"

namespace bigmac::stages::cuda {
namespace {

// The widest head cuDNN's fused SDPA is trusted with here. cuDNN 9 on Hopper supports more
// (up to 256), but the backward's support for d > 128 has moved between cuDNN releases; GPT
// heads are 64 or 128, so the conservative bound costs nothing and keeps a surprise off the GPU.
constexpr int kMaxCudnnHeadDim = 128;

std::string PrecisionName(memory::DType dtype) {
  switch (dtype) {
    case memory::DType::kF32:
      return "fp32";
    case memory::DType::kF64:
      return "fp64";
    case memory::DType::kBF16:
      return "bf16";
    case memory::DType::kI32:
      return "i32";
  }
  return "?";
}

}  // namespace

SdpaLayout InterleavedQkvLayout(int b, int t, int h, int d) {
  return GroupedQkvLayout(b, t, h, h, d);
}

SdpaLayout GroupedQkvLayout(int b, int t, int h, int kv_heads, int d) {
  const int64_t B = b, T = t, H = h, KV = kv_heads, D = d;
  const int64_t C = H * D;
  const int64_t W = (H + 2 * KV) * D;  // one token's row
  SdpaLayout layout;
  // qkv (B,T,W) row-major: a head's d channels are contiguous and heads follow one another, the H
  // query heads first; k and v start C and C + KV*D elements into the row.
  layout.q = {{B, H, T, D}, {T * W, D, W, 1}, 0};
  layout.k = {{B, KV, T, D}, {T * W, D, W, 1}, C};
  layout.v = layout.k;
  layout.v.offset = C + KV * D;
  // out (B,T,C) is (B,T,H,D) row-major.
  layout.o = {{B, H, T, D}, {T * C, D, C, 1}, 0};
  // stats (B,H,T) fp32, packed.
  layout.stats = {{B, H, T, 1}, {H * T, T, 1, 1}, 0};
  return layout;
}

AttentionChoice ChooseAttention(memory::DType activation_dtype, int head_dim) {
  const std::string dim = std::to_string(head_dim);
  if (activation_dtype != memory::DType::kBF16) {
    return {false, "fallback attention: " + PrecisionName(activation_dtype) +
                       " (cuDNN fused SDPA is bf16 here)"};
  }
  if (head_dim <= 0) {
    return {false, "fallback attention: head dim " + dim + " is not positive"};
  }
  if (head_dim % 8 != 0) {
    // cuDNN's kernels load Q, K, V and O in 16-byte vectors: a head must be whole vectors.
    return {false, "fallback attention: head dim " + dim +
                       " is not a multiple of 8 (cuDNN fused SDPA needs it)"};
  }
  if (head_dim > kMaxCudnnHeadDim) {
    return {false, "fallback attention: head dim " + dim + " is above " +
                       std::to_string(kMaxCudnnHeadDim) +
                       " (cuDNN fused SDPA is only used up to 128 here: its backward's support "
                       "beyond that depends on the cuDNN version)"};
  }
  return {true, "cuDNN fused SDPA (bf16, head dim " + dim + ")"};
}

}  // namespace bigmac::stages::cuda
