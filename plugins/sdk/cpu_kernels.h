#ifndef BIGMAC_PLUGINS_SDK_CPU_KERNELS_H_
#define BIGMAC_PLUGINS_SDK_CPU_KERNELS_H_

// Plugin SDK: the public CPU kernel library, the kernels of the built-in GPT and llama layers, for
// T = float (training) and T = double (gradient checks); instantiated for those two only.
// Target //plugins/sdk:cpu_kernels; implemented in stages/cpu/kernels.cc.
//
// Rows are N = batch*seq tokens. Float matmuls go to the library FloatGemmLibrary() names
// (BigMac's own blocked GEMM by default, whose bits do not depend on the thread count), double
// ones to OpenBLAS; the rest are OpenMP loops with static schedules and no cross-thread
// reductions, so results are bitwise reproducible run to run.
// Conventions: "Forward" and "BackwardInput" overwrite their outputs unless they say "+=";
// "BackwardWeight" always accumulates (gradient accumulation over micro-batches).
//
// Ownership: every pointer is the caller's host memory (a CPU tensor's data), read or written
// during the call only; no kernel keeps a pointer or state between calls (small scratch
// buffers are host heap for the call's duration).
//
// Stability: a plugin links this library statically (its .so carries its own copy), so there is
// no binary dependency on the host's copy. The declarations below are a source API kept for the
// whole plugin ABI version: within it, kernels are added, never removed or changed in meaning.

#include <cstdint>
#include <string>

namespace bigmac::sdk::cpu {

// out(N,OC) = inp(N,C) @ w(OC,C)^T + bias (bias may be null).
template <typename T>
void MatmulForward(T* out, const T* inp, const T* w, const T* bias, int n, int c, int oc);
// MatmulForward, then AddInPlace(out, residual): the same bits. With BigMac's GEMM the residual
// joins each block of the product while it is in cache (a transformer block's projections into its
// residual stream), instead of in a pass over memory of its own. residual must not overlap out (the
// GEMM writes out before the residual is read).
template <typename T>
void MatmulResidualForward(T* out, const T* inp, const T* w, const T* bias, const T* residual,
                           int n, int c, int oc);
// dinp(N,C) = dout(N,OC) @ w(OC,C).
template <typename T>
void MatmulBackwardInput(T* dinp, const T* dout, const T* w, int n, int c, int oc);
// dw(OC,C) += dout^T @ inp; dbias(OC) += column sums of dout (dbias may be null).
template <typename T>
void MatmulBackwardWeight(T* dw, T* dbias, const T* dout, const T* inp, int n, int c, int oc);

// out = (inp - mean) * rstd * w + b per row; keeps mean and rstd (N each).
template <typename T>
void LayerNormForward(T* out, T* mean, T* rstd, const T* inp, const T* w, const T* b, int n, int c);
// dinp = residual + the gradient through the normalisation; with residual null, dinp += it.
// (A block's input gradient is its residual branch's plus this: written in one pass, without
// copying the residual's gradient into dinp first.) residual may be dinp, and no other input.
template <typename T>
void LayerNormBackwardInput(T* dinp, const T* dout, const T* inp, const T* w, const T* mean,
                            const T* rstd, int n, int c, const T* residual = nullptr);
template <typename T>
void LayerNormBackwardWeight(T* dw, T* db, const T* dout, const T* inp, const T* mean,
                             const T* rstd, int n, int c);

// Causal multi-head self-attention. qkv (B,T,3C) holds q|k|v; out (B,T,C); att (B,H,T,T) keeps
// the softmax probabilities (zero above the diagonal). Softmax subtracts the row maximum.
template <typename T>
void AttentionForward(T* out, T* att, const T* qkv, int b, int t, int c, int h);
// dqkv (B,T,3C) from dout (B,T,C).
template <typename T>
void AttentionBackward(T* dqkv, const T* dout, const T* qkv, const T* att, int b, int t, int c,
                       int h);
// The same attention, blocked (stages/cpu/flash_attention.cc): the T x T probabilities are not
// kept. Forward writes out (B,T,C) and lse (B,h,T), each row's log-sum-exp of its scaled scores;
// backward overwrites dqkv from dout, qkv and lse. Sums run in other orders than the full-square
// kernels above, so the results agree with them to rounding, not bitwise.
// Grouped-query attention with `kv_heads` key/value heads (dividing h; 0 or h: multi-head, as
// above): a qkv row is the h query heads, then kv_heads key heads, then kv_heads value heads, each
// C/h wide (C + 2 * kv_heads * C/h in all, 3C for multi-head); query head i attends with key and
// value head i / (h / kv_heads).
template <typename T>
void FlashAttentionForward(T* out, T* lse, const T* qkv, int b, int t, int c, int h,
                           int kv_heads = 0);
template <typename T>
void FlashAttentionBackward(T* dqkv, const T* dout, const T* qkv, const T* lse, int b, int t, int c,
                            int h, int kv_heads = 0);

// Rotary position embeddings in Hugging Face Llama's half-rotation convention: in a head of size
// hs, element i < hs/2 pairs with element i + hs/2 and the pair turns by pos * theta^(-2i/hs).
// RopeTable fills cos and sin, each (t, hs/2), for positions 0..t-1 (computed in double, rounded
// once). RopeForward rotates in place the first `heads` heads of each of the b*t rows of x (row
// stride ld); RopeBackward turns in place a gradient with respect to the rotated values into the
// one with respect to the inputs (the inverse rotation: the transpose).
template <typename T>
void RopeTable(T* cos, T* sin, int t, int hs, double theta);
template <typename T>
void RopeForward(T* x, const T* cos, const T* sin, int b, int t, int heads, int hs, int64_t ld);
template <typename T>
void RopeBackward(T* dx, const T* cos, const T* sin, int b, int t, int heads, int hs, int64_t ld);

// RMSNorm (Llama): out = inp * rstd * w per row, rstd = 1 / sqrt(mean(inp^2) + eps), kept (N) for
// the backward. BackwardInput adds to residual or accumulates into dinp, as LayerNorm's does.
template <typename T>
void RmsNormForward(T* out, T* rstd, const T* inp, const T* w, int n, int c, double eps);
template <typename T>
void RmsNormBackwardInput(T* dinp, const T* dout, const T* inp, const T* w, const T* rstd, int n,
                          int c, const T* residual = nullptr);
template <typename T>
void RmsNormBackwardWeight(T* dw, const T* dout, const T* inp, const T* rstd, int n, int c);

// SwiGLU (Llama's MLP) on the fused gate/up projection: each of the n rows of gate_up holds
// `width` gate values, then `width` up values; h(n, width) = silu(gate) * up, silu(g) =
// g * sigmoid(g). The backward overwrites dgate_up (same layout as gate_up).
template <typename T>
void SwigluForward(T* h, const T* gate_up, int n, int width);
template <typename T>
void SwigluBackward(T* dgate_up, const T* dh, const T* gate_up, int n, int width);
// The MLP's GEMMs and SwiGLU in one, as MatmulGeluForward below: gate_up = inp w^T (w holds
// 2 width rows of c, no bias), then SwigluForward into h; and dh = dout w (w: oc x width, the
// down projection), then SwigluBackward into dgate_up. The same bits as the separate calls; with
// BigMac's GEMM the SwiGLU runs on each block of the product while it is in cache. No argument
// aliases another.
template <typename T>
void MatmulSwigluForward(T* gate_up, T* h, const T* inp, const T* w, int n, int c, int width);
template <typename T>
void MatmulSwigluBackwardInput(T* dh, T* dgate_up, const T* dout, const T* w, const T* gate_up,
                               int n, int width, int oc);

// GELU, tanh approximation (GPT-2).
template <typename T>
void GeluForward(T* out, const T* inp, int64_t n);
template <typename T>
void GeluBackward(T* dinp, const T* inp, const T* dout, int64_t n);

// The MLP's GEMM and GELU in one: MatmulForward into out, then GeluForward(act, out); and
// MatmulBackwardInput, then GeluBackward through pre (the GELU's input) into dinp. The same bits
// as the two calls. With BigMac's GEMM the GELU runs on each block of the product as it is
// finished, still in cache, instead of in a pass over memory of its own. out and act are
// distinct; dinp aliases neither dout nor pre.
template <typename T>
void MatmulGeluForward(T* out, T* act, const T* inp, const T* w, const T* bias, int n, int c,
                       int oc);
template <typename T>
void MatmulGeluBackwardInput(T* dinp, const T* dout, const T* w, const T* pre, int n, int c,
                             int oc);

template <typename T>
void Add(T* out, const T* a, const T* b, int64_t n);
template <typename T>
void AddInPlace(T* out, const T* a, int64_t n);

// out(B,T,C) = wte[token] + wpe[position]; wpe (and dwpe) null: no position embedding (llama).
template <typename T>
void EmbeddingForward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int b, int t,
                      int c);
template <typename T>
void EmbeddingBackwardWeight(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int b, int t,
                             int c);

// Sum over rows of -log softmax(logits)[target], computed with a stable log-sum-exp, in double.
template <typename T>
double CrossEntropyLossSum(const T* logits, const int32_t* targets, int n, int v);
// dlogits = (softmax(logits) - onehot(target)) * scale.
template <typename T>
void CrossEntropyBackward(T* dlogits, const T* logits, const int32_t* targets, int n, int v,
                          double scale);

// The library behind the float matmuls for this process, from the environment variable
// BIGMAC_CPU_GEMM, read once: "bigmac" (BigMac's blocked GEMM, the default on CPUs with AVX2 and
// FMA, with its AVX2 micro-kernel, also named "bigmac-avx2"; "bigmac-avx512" its AVX-512 one),
// "openblas" (the default elsewhere) or "onednn" (it fails the bitwise layout equivalence suite;
// docs/build.md). Returns the library and, for BigMac's, its kernel ("bigmac-avx512",
// "bigmac-avx2", "openblas", "onednn"). Returns null, and says why in *problem when given, if that
// variable holds anything else, asks for a kernel this CPU lacks, or oneDNN cannot be loaded (the
// matmuls then use OpenBLAS; bigmac refuses to start).
const char* FloatGemmLibrary(std::string* problem = nullptr);

}  // namespace bigmac::sdk::cpu

#endif  // BIGMAC_PLUGINS_SDK_CPU_KERNELS_H_
