#ifndef BIGMAC_STAGES_CUDA_SDPA_LAYOUT_H_
#define BIGMAC_STAGES_CUDA_SDPA_LAYOUT_H_

// Pure functions (no CUDA): which attention the CUDA block uses, and the dims and strides through
// which cuDNN's SDPA reads the block's interleaved qkv buffer. A CPU test runs a strided
// attention through exactly these numbers and compares it with the CPU attention, so a wrong
// stride fails here, not silently on a GPU.

#include <array>
#include <cstdint>
#include <string>

#include "core/memory/dtype.h"

namespace bigmac::stages::cuda {

// One tensor as cuDNN sees it: logical dims {B, H, T, D} (stats: {B, H, T, 1}), the element
// strides of each, and the element offset of its first element from the buffer's start.
struct SdpaTensor {
  std::array<int64_t, 4> dims{};
  std::array<int64_t, 4> strides{};
  int64_t offset = 0;
};

// q, k, v inside qkv (B,T,3C) (C = h*d, q|k|v along the last axis, each head's d channels
// contiguous), o and do inside out (B,T,C), stats (B,h,T) fp32. The gradients dq, dk, dv use q,
// k and v's layout inside dqkv.
struct SdpaLayout {
  SdpaTensor q, k, v, o, stats;
};
SdpaLayout InterleavedQkvLayout(int b, int t, int h, int d);
// Grouped-query attention (llama): a qkv row holds h query heads, then kv_heads key heads, then
// kv_heads value heads ((h + 2 kv_heads) d wide); k and v have dims {B, kv_heads, T, D}, and
// cuDNN gives query head i the kv head i / (h / kv_heads). kv_heads = h is InterleavedQkvLayout.
SdpaLayout GroupedQkvLayout(int b, int t, int h, int kv_heads, int d);

// Which attention a CUDA block runs for (dtype, head dim), and why, for the [rank] line.
struct AttentionChoice {
  bool cudnn = false;
  std::string reason;  // "cuDNN fused SDPA (bf16, head dim 64)" / "fallback: head dim 12 is not..."
};
AttentionChoice ChooseAttention(memory::DType activation_dtype, int head_dim);

}  // namespace bigmac::stages::cuda

#endif  // BIGMAC_STAGES_CUDA_SDPA_LAYOUT_H_
