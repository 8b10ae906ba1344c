#ifndef BIGMAC_STAGES_CUDA_KERNELS_H_
#define BIGMAC_STAGES_CUDA_KERNELS_H_

// The CUDA kernels of the GPT and llama layers (beside the cuBLASLt GEMMs of gemm.h and the cuDNN
// attention of sdpa.h), the GPU twins of plugins/sdk/cpu_kernels.h with the same names and
// conventions: rows are N = batch*seq tokens; "Forward"/"BackwardInput" overwrite their outputs
// unless they say "+="; "BackwardWeight" accumulates into fp32 master gradients.
//
// T is the activation and compute-weight type: float (precision fp32) or __nv_bfloat16 (bf16).
// Arithmetic is fp32 inside every kernel. Reductions are deterministic: a fixed assignment of
// elements to threads and a fixed combining order (two-stage through the context's
// reduce_scratch where a reduction spans blocks), never atomics on floats, so two identical runs
// are bitwise identical.
//
// Every pointer is device memory of the call site's device, used in stream order on its compute
// stream; nothing is kept between calls. Every launcher checks its launch (CheckLaunch) and names
// itself and the call site in an error.

#include <cuda_bf16.h>

#include <cstdint>

#include "core/device/cuda/context.h"

namespace bigmac::stages::cuda {

using device::cuda::CallSite;

// out = (inp - mean) * rstd * w + b per row of c; keeps mean and rstd (n floats each).
template <typename T>
void LayerNormForward(const CallSite& site, T* out, float* mean, float* rstd, const T* inp,
                      const T* w, const T* b, int n, int c);
// dinp += the gradient through the normalisation.
template <typename T>
void LayerNormBackwardInput(const CallSite& site, T* dinp, const T* dout, const T* inp, const T* w,
                            const float* mean, const float* rstd, int n, int c);
// dw += sum over rows of dout * xhat; db += sum over rows of dout.
template <typename T>
void LayerNormBackwardWeight(const CallSite& site, float* dw, float* db, const T* dout,
                             const T* inp, const float* mean, const float* rstd, int n, int c);

// RMSNorm: out = inp * rstd * w per row of c, rstd = (mean(inp^2) + eps)^(-1/2) (n floats, kept).
template <typename T>
void RmsNormForward(const CallSite& site, T* out, float* rstd, const T* inp, const T* w, int n,
                    int c, double eps);
// dinp += the gradient through the normalisation.
template <typename T>
void RmsNormBackwardInput(const CallSite& site, T* dinp, const T* dout, const T* inp, const T* w,
                          const float* rstd, int n, int c);
// dw += sum over rows of dout * inp * rstd.
template <typename T>
void RmsNormBackwardWeight(const CallSite& site, float* dw, const T* dout, const T* inp,
                           const float* rstd, int n, int c);

// Rotary embeddings (Hugging Face's half-rotation), in place: the first `heads` heads of hs
// channels of each of the b*t rows of x (row stride ld) turn by the angles of the row's position
// (row % t). cos and sin are fp32 device tables (>= t rows, hs/2 columns), as the CPU's RopeTable
// fills them. RopeBackward turns a gradient with respect to the rotated values back.
template <typename T>
void RopeForward(const CallSite& site, T* x, const float* cos, const float* sin, int b, int t,
                 int heads, int hs, int64_t ld);
template <typename T>
void RopeBackward(const CallSite& site, T* dx, const float* cos, const float* sin, int b, int t,
                  int heads, int hs, int64_t ld);

// SwiGLU on fused rows gate_up (n, 2*width) = [gate | up]: h (n, width) = silu(gate) * up.
template <typename T>
void SwigluForward(const CallSite& site, T* h, const T* gate_up, int n, int width);
// dgate_up (n, 2*width), overwritten, from dh (n, width).
template <typename T>
void SwigluBackward(const CallSite& site, T* dgate_up, const T* dh, const T* gate_up, int n,
                    int width);

// GELU, tanh approximation (GPT-2), as the CPU's.
template <typename T>
void GeluForward(const CallSite& site, T* out, const T* inp, int64_t n);
template <typename T>
void GeluBackward(const CallSite& site, T* dinp, const T* inp, const T* dout, int64_t n);

template <typename T>
void Add(const CallSite& site, T* out, const T* a, const T* b, int64_t n);
template <typename T>
void AddInPlace(const CallSite& site, T* out, const T* a, int64_t n);

// out(n, oc) (row stride ld_out) += bias(oc) per row: the GEMM's bias when no epilogue serves.
template <typename T>
void AddBias(const CallSite& site, T* out, const T* bias, int n, int oc, int64_t ld_out);
// dbias(oc) += column sums of dout(n, oc) (row stride ld_dout).
template <typename T>
void BiasGradAccumulate(const CallSite& site, float* dbias, const T* dout, int n, int oc,
                        int64_t ld_dout);

// out(B,T,C) = wte[token] + wpe[position] (wpe null: wte[token] alone). Tokens are device int32
// in [0, vocab).
template <typename T>
void EmbeddingForward(const CallSite& site, T* out, const int32_t* tokens, const T* wte,
                      const T* wpe, int b, int t, int c);
// dwte[token] += dout rows, dwpe[position] += dout rows (unless dwpe is null), deterministic: the
// positions of each token are summed in position order (tokens are bucketed on the host, as llm.c
// does). The bucketing reads `host_tokens`, the same b*t tokens in host memory, when not null;
// otherwise it copies `tokens` to the host and waits for the stream.
template <typename T>
void EmbeddingBackwardWeight(const CallSite& site, float* dwte, float* dwpe, const T* dout,
                             const int32_t* tokens, const int32_t* host_tokens, int b, int t, int c,
                             int vocab);

// The fused softmax cross-entropy over logits(n, v) with row stride ld >= v: one pass per row
// computes the row's loss, -log softmax(logits)[target], and overwrites the row in place with
// dlogits = (softmax - onehot(target)) * scale (columns v..ld-1 are zeroed). *loss (one float of
// device memory) = scale * the sum of the n row losses, summed in double in row order.
template <typename T>
void CrossEntropyForwardBackward(const CallSite& site, T* logits, float* loss,
                                 const int32_t* targets, int n, int v, int64_t ld, double scale);

// The fallback causal attention (shapes cuDNN's fused SDPA does not serve: fp32, head dim not a
// multiple of 8), the CPU kernel's algorithm, with grouped-query attention as the CPU's
// FlashAttention: a qkv row holds h query heads, then kv_heads key heads, then kv_heads value
// heads, each of hs = C/h channels (row width (h + 2 kv_heads) hs; kv_heads 0 means h, GPT's
// (B,T,3C)); query head i reads kv head i / (h / kv_heads). out (B,T,C); att (B,h,T,T) fp32
// keeps the softmax probabilities (zero above the diagonal).
template <typename T>
void AttentionForward(const CallSite& site, T* out, float* att, const T* qkv, int b, int t, int c,
                      int h, int kv_heads = 0);
// dqkv (same layout as qkv, overwritten) from dout (B,T,C); a kv head's gradient sums its group's
// query heads in head order.
template <typename T>
void AttentionBackward(const CallSite& site, T* dqkv, const T* dout, const T* qkv, const float* att,
                       int b, int t, int c, int h, int kv_heads = 0);

}  // namespace bigmac::stages::cuda

#endif  // BIGMAC_STAGES_CUDA_KERNELS_H_
