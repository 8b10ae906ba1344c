#ifndef BIGMAC_STAGES_CUDA_SDPA_H_
#define BIGMAC_STAGES_CUDA_SDPA_H_

// cuDNN's fused scaled-dot-product attention (flash-style), causal, bf16, forward and backward,
// through the cuDNN frontend's C++ graph API, over the block's interleaved qkv (B,T,3C) buffer
// without copies: the dims and strides come from sdpa_layout.h's pure function (tested on the
// CPU). Built graphs are cached per (device, b, t, h, kv heads, d, forward/backward); a graph that
// fails to build is never cached, and the error says which shape and why. sdpa_layout.h's
// ChooseAttention says which shapes come here; the rest use kernels.h's fallback.
//
// Pointers are bf16 device memory of the call site's device, 16-byte aligned; stats is fp32
// (B,h,T), the softmax log-sum-exp the backward needs. Workspace comes from the device's
// allocator (counted like any tensor). Deterministic: the backward asks for cuDNN's
// deterministic algorithm.

#include <string>

#include "core/device/cuda/context.h"

namespace bigmac::stages::cuda {

using device::cuda::CallSite;

// Builds (and caches) the forward and backward graphs for the shape: "" when both build, else why
// not (a DeviceError's words, never thrown). A layer calls it before choosing where its
// attention runs, so a shape this cuDNN refuses falls back as a whole, forward and backward.
std::string CudnnAttentionUnavailable(const CallSite& site, int b, int t, int h, int d,
                                      int kv_heads = 0);

// out (B,T,C) = softmax(q k^T * scale, causal) v per head; qkv (B,T,3C) holds q|k|v, heads of
// d = C/h channels; scale = 1/sqrt(d). With kv_heads (0: h) dividing h, grouped-query attention:
// a qkv row holds h query heads, then kv_heads key and kv_heads value heads (sdpa_layout.h's
// GroupedQkvLayout), query head i attending with kv head i / (h / kv_heads).
void CudnnAttentionForward(const CallSite& site, void* out, float* stats, const void* qkv, int b,
                           int t, int h, int d, int kv_heads = 0);
// dqkv (qkv's layout) from dout (B,T,C), with the forward's qkv, out and stats.
void CudnnAttentionBackward(const CallSite& site, void* dqkv, const void* dout, const void* qkv,
                            const void* out, const float* stats, int b, int t, int h, int d,
                            int kv_heads = 0);

}  // namespace bigmac::stages::cuda

#endif  // BIGMAC_STAGES_CUDA_SDPA_H_
