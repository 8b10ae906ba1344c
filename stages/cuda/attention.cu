// CUDA kernels: the fallback causal attention (where cuDNN SDPA does not run: stages/cuda/sdpa.h).
// The CPU twin: stages/cpu/kernels.cc and flash_attention.cc: Attention* (the contract:
// stages/cuda/kernels.h; the shared conventions: kernel_common.h).

#include "stages/cuda/kernel_common.h"

namespace bigmac::stages::cuda {
namespace {

// ---------------------------------------------------------------------------------------------
// Fallback causal attention: one block per (b, h, row) (the key gradients: per (b, kv head, row)),
// the CPU kernel's algorithm.

constexpr int kAttentionThreads = 128;

// sum over d of a[d] * b[d], in d order (shared-memory a, global b).
template <typename T>
__device__ __forceinline__ float Dot(const float* a, const T* b, int hs) {
  float sum = 0.0f;
  for (int d = 0; d < hs; ++d) sum += a[d] * ToF(b[d]);
  return sum;
}

// hs channels per head; a qkv row is w = (h + 2 kvh) hs wide: h query heads, then kvh key heads,
// then kvh value heads; query head hi reads kv head hi / group.
struct AttentionShape {
  int t, c, h, kvh, hs, group;
  int64_t w;
  float scale;
};

// Row 0 of (batch bi, query head hi)'s q, and of its kv head's k and v, inside qkv (or dqkv).
template <typename P>
struct HeadRows {
  P q, k, v;
};
template <typename P>
__device__ __forceinline__ HeadRows<P> Rows(P qkv, const AttentionShape& s, int bi, int hi) {
  P row0 = qkv + int64_t{bi} * s.t * s.w;
  P k = row0 + s.c + (hi / s.group) * s.hs;
  return {row0 + hi * s.hs, k, k + int64_t{s.kvh} * s.hs};
}

// Block (bi, hi, ti): P[ti, :] = causal softmax(scale * q_ti . k_t2) into att; out_ti = P v.
// Dynamic shared memory: q_ti (hs floats), then the row of P (t floats).
template <typename T>
__global__ void AttentionForwardKernel(T* out, float* att, const T* qkv, AttentionShape s) {
  BIGMAC_DYNAMIC_SHARED(float, smem);
  float* q = smem;
  float* p = smem + s.hs;
  const int ti = blockIdx.x % s.t;
  const int bh = blockIdx.x / s.t;
  const int hi = bh % s.h;
  const int bi = bh / s.h;
  const HeadRows<const T*> r = Rows(qkv, s, bi, hi);
  for (int d = threadIdx.x; d < s.hs; d += blockDim.x) q[d] = ToF(r.q[ti * s.w + d]);
  __syncthreads();
  float m = -INFINITY;
  for (int t2 = threadIdx.x; t2 <= ti; t2 += blockDim.x) {
    p[t2] = s.scale * Dot(q, r.k + t2 * s.w, s.hs);
    m = fmaxf(m, p[t2]);
  }
  m = BlockMax(m);
  float sum = 0.0f;
  for (int t2 = threadIdx.x; t2 <= ti; t2 += blockDim.x) {
    p[t2] = expf(p[t2] - m);
    sum += p[t2];
  }
  const float inv = 1.0f / BlockSum(sum);
  float* arow = att + (int64_t{bh} * s.t + ti) * s.t;
  for (int t2 = threadIdx.x; t2 < s.t; t2 += blockDim.x) {
    float prob = 0.0f;
    if (t2 <= ti) {
      prob = p[t2] * inv;
      p[t2] = prob;
    }
    arow[t2] = prob;
  }
  __syncthreads();
  T* o = out + (int64_t{bi} * s.t + ti) * s.c + hi * s.hs;
  for (int d = threadIdx.x; d < s.hs; d += blockDim.x) {
    float acc = 0.0f;
    for (int t2 = 0; t2 <= ti; ++t2) acc += p[t2] * ToF(r.v[t2 * s.w + d]);
    o[d] = FromF<T>(acc);
  }
}

// Backward, query rows. Block (bi, hi, ti): dP[ti, t2] = dO_ti . v_t2; D[ti] = sum dP * P (kept
// in dsum for the key kernel); dS = P (dP - D) scale; dq_ti = dS k.
// Dynamic shared memory: dO_ti (hs floats), then the row of dS (t floats).
template <typename T>
__global__ void AttentionBackwardQueryKernel(T* dqkv, float* dsum, const T* dout, const T* qkv,
                                             const float* att, AttentionShape s) {
  BIGMAC_DYNAMIC_SHARED(float, smem);
  float* dy = smem;
  float* ds = smem + s.hs;
  const int ti = blockIdx.x % s.t;
  const int bh = blockIdx.x / s.t;
  const int hi = bh % s.h;
  const int bi = bh / s.h;
  const HeadRows<const T*> r = Rows(qkv, s, bi, hi);
  const float* prow = att + (int64_t{bh} * s.t + ti) * s.t;
  const T* dy_row = dout + (int64_t{bi} * s.t + ti) * s.c + hi * s.hs;
  for (int d = threadIdx.x; d < s.hs; d += blockDim.x) dy[d] = ToF(dy_row[d]);
  __syncthreads();
  float local = 0.0f;
  for (int t2 = threadIdx.x; t2 <= ti; t2 += blockDim.x) {
    ds[t2] = Dot(dy, r.v + t2 * s.w, s.hs);
    local += ds[t2] * prow[t2];
  }
  const float dot = BlockSum(local);
  for (int t2 = threadIdx.x; t2 <= ti; t2 += blockDim.x) {
    ds[t2] = prow[t2] * (ds[t2] - dot) * s.scale;
  }
  if (threadIdx.x == 0) dsum[int64_t{bh} * s.t + ti] = dot;
  __syncthreads();
  T* dq = Rows(dqkv, s, bi, hi).q + ti * s.w;
  for (int d = threadIdx.x; d < s.hs; d += blockDim.x) {
    float acc = 0.0f;
    for (int t2 = 0; t2 <= ti; ++t2) acc += ds[t2] * ToF(r.k[t2 * s.w + d]);
    dq[d] = FromF<T>(acc);
  }
}

// Backward, key rows. Block (bi, kv head, t2): for each query head hi of the group in order and
// ti >= t2, dS[ti, t2] recomputed from dO_ti . v_t2 and D[ti]; dk_t2 = sum_hi sum_ti dS[ti, t2]
// q_ti; dv_t2 = sum_hi sum_ti P[ti, t2] dO_ti (ti in order).
// Dynamic shared memory: v_t2 (hs floats), the column of dS (t floats), the column of P (t), the
// dk and dv sums (hs each).
template <typename T>
__global__ void AttentionBackwardKeyKernel(T* dqkv, const float* dsum, const T* dout, const T* qkv,
                                           const float* att, AttentionShape s) {
  BIGMAC_DYNAMIC_SHARED(float, smem);
  float* vrow = smem;
  float* ds = smem + s.hs;
  float* pcol = ds + s.t;
  float* acc_k = pcol + s.t;
  float* acc_v = acc_k + s.hs;
  const int t2 = blockIdx.x % s.t;
  const int bkv = blockIdx.x / s.t;
  const int kv = bkv % s.kvh;
  const int bi = bkv / s.kvh;
  const int first = kv * s.group;  // the group's first query head
  const HeadRows<const T*> r0 = Rows(qkv, s, bi, first);
  for (int d = threadIdx.x; d < s.hs; d += blockDim.x) {
    vrow[d] = ToF(r0.v[t2 * s.w + d]);
    acc_k[d] = 0.0f;
    acc_v[d] = 0.0f;
  }
  __syncthreads();
  for (int hi = first; hi < first + s.group; ++hi) {
    const int64_t bh = int64_t{bi} * s.h + hi;
    const T* q = Rows(qkv, s, bi, hi).q;
    const T* dy = dout + int64_t{bi} * s.t * s.c + hi * s.hs;  // dO of row 0 of this (b, h)
    for (int ti = t2 + threadIdx.x; ti < s.t; ti += blockDim.x) {
      const float prob = att[(bh * s.t + ti) * s.t + t2];
      const float dp = Dot(vrow, dy + ti * int64_t{s.c}, s.hs);
      pcol[ti] = prob;
      ds[ti] = prob * (dp - dsum[bh * s.t + ti]) * s.scale;
    }
    __syncthreads();
    for (int d = threadIdx.x; d < s.hs; d += blockDim.x) {
      float sum_k = 0.0f;
      float sum_v = 0.0f;
      for (int ti = t2; ti < s.t; ++ti) {
        sum_k += ds[ti] * ToF(q[ti * s.w + d]);
        sum_v += pcol[ti] * ToF(dy[ti * int64_t{s.c} + d]);
      }
      acc_k[d] += sum_k;
      acc_v[d] += sum_v;
    }
    __syncthreads();  // the next head overwrites ds and pcol
  }
  const HeadRows<T*> g = Rows(dqkv, s, bi, first);
  for (int d = threadIdx.x; d < s.hs; d += blockDim.x) {
    g.k[t2 * s.w + d] = FromF<T>(acc_k[d]);
    g.v[t2 * s.w + d] = FromF<T>(acc_v[d]);
  }
}

AttentionShape CheckAttentionShape(int b, int t, int c, int h, int kv_heads, const char* name,
                                   const CallSite& site) {
  if (h <= 0 || c % h != 0) {
    throw DeviceError(std::string(name) + ": channels " + std::to_string(c) +
                      " are not a multiple of heads " + std::to_string(h) + ", in " + site.where);
  }
  const int kvh = kv_heads == 0 ? h : kv_heads;
  if (kvh <= 0 || h % kvh != 0) {
    throw DeviceError(std::string(name) + ": heads " + std::to_string(h) +
                      " are not a multiple of kv heads " + std::to_string(kvh) + ", in " +
                      site.where);
  }
  if (int64_t{b} * h * t >= int64_t{1} << 31) {  // gridDim.x <= 2^31 - 1
    throw DeviceError(std::string(name) + ": b*h*t = " + std::to_string(int64_t{b} * h * t) +
                      " blocks is more than one grid holds, in " + site.where);
  }
  const int hs = c / h;
  // The CPU's T(1)/sqrt(T(hs)).
  return {t,
          c,
          h,
          kvh,
          hs,
          h / kvh,
          int64_t{h + 2 * kvh} * hs,
          1.0f / std::sqrt(static_cast<float>(hs))};
}

}  // namespace

template <typename T>
void AttentionForward(const CallSite& site, T* out, float* att, const T* qkv, int b, int t, int c,
                      int h, int kv_heads) {
  if (b <= 0 || t <= 0 || c <= 0) return;
  const AttentionShape s = CheckAttentionShape(b, t, c, h, kv_heads, "AttentionForward", site);
  const int64_t smem = (int64_t{s.hs} + t) * sizeof(float);
  AllowSharedMemory(AttentionForwardKernel<T>, smem, "AttentionForwardKernel", site);
  LaunchKernel("AttentionForwardKernel", AttentionForwardKernel<T>, b * h * t, kAttentionThreads,
               smem, site.stream(), out, att, qkv, s);
  CheckLaunch("AttentionForwardKernel", site);
}

template <typename T>
void AttentionBackward(const CallSite& site, T* dqkv, const T* dout, const T* qkv, const float* att,
                       int b, int t, int c, int h, int kv_heads) {
  if (b <= 0 || t <= 0 || c <= 0) return;
  const AttentionShape s = CheckAttentionShape(b, t, c, h, kv_heads, "AttentionBackward", site);
  float* dsum = static_cast<float*>(Scratch(site, int64_t{b} * h * t * sizeof(float),
                                            "AttentionBackward", "the softmax row dots"));
  const int64_t query_smem = (int64_t{s.hs} + t) * sizeof(float);
  AllowSharedMemory(AttentionBackwardQueryKernel<T>, query_smem, "AttentionBackwardQueryKernel",
                    site);
  LaunchKernel("AttentionBackwardQueryKernel", AttentionBackwardQueryKernel<T>, b * h * t,
               kAttentionThreads, query_smem, site.stream(), dqkv, dsum, dout, qkv, att, s);
  CheckLaunch("AttentionBackwardQueryKernel", site);
  const int64_t key_smem = (3 * int64_t{s.hs} + 2 * int64_t{t}) * sizeof(float);
  AllowSharedMemory(AttentionBackwardKeyKernel<T>, key_smem, "AttentionBackwardKeyKernel", site);
  LaunchKernel("AttentionBackwardKeyKernel", AttentionBackwardKeyKernel<T>, b * s.kvh * t,
               kAttentionThreads, key_smem, site.stream(), dqkv, dsum, dout, qkv, att, s);
  CheckLaunch("AttentionBackwardKeyKernel", site);
}

#define BIGMAC_INSTANTIATE(T)                                                                    \
  template void AttentionForward<T>(const CallSite&, T*, float*, const T*, int, int, int, int,   \
                                    int);                                                        \
  template void AttentionBackward<T>(const CallSite&, T*, const T*, const T*, const float*, int, \
                                     int, int, int, int);

BIGMAC_INSTANTIATE(float)
BIGMAC_INSTANTIATE(__nv_bfloat16)
#undef BIGMAC_INSTANTIATE

}  // namespace bigmac::stages::cuda
