// Blocked causal attention for the CPU (plugins/sdk/cpu_kernels.h FlashAttentionForward/Backward):
// the T x T probabilities are never kept. Per (batch, head), the queries are walked in blocks of
// kQueryBlock rows; a block's scores against its causal prefix of keys (rows x kend, at most
// kQueryBlock x T: 32 KiB at T = 256) are one small GEMM into a per-thread buffer that stays in
// L1/L2, so the exact two-pass softmax (row maximum, then exp and sum) costs no memory traffic and
// no online rescaling is needed. Forward keeps the log-sum-exp per row; backward rebuilds the
// probabilities from it as exp(s - lse). Against the full-square GEMMs of AttentionForward the
// GEMMs cover 5/8 of the T x T square at T = 128 (9/16 at T = 256), and the B*h*T*T floats that
// forward wrote and backward read are gone.
//
// Each (batch, head) is one OpenMP iteration (static schedule), and inside it every sum runs in a
// fixed order: results do not depend on the thread count. OpenBLAS runs single-threaded inside
// the parallel region.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/util/compute_progress.h"
#include "core/util/simd.h"
#include "plugins/sdk/cpu_kernels.h"
#include "stages/cpu/math.h"

namespace bigmac::sdk::cpu {
namespace {

using internal::Exp;
using internal::Gemm;
using internal::SoftmaxBackwardInPlace;
using internal::SoftmaxInPlace;

constexpr int kQueryBlock = 32;

}  // namespace

template <typename T>
BIGMAC_SIMD_CLONES void FlashAttentionForward(T* out, T* lse, const T* qkv, int b, int t, int c,
                                              int h) {
  const int hs = c / h;
  const T scale = T(1) / std::sqrt(T(hs));
  const int64_t c3 = 3 * int64_t{c};
  const int ld = static_cast<int>(c3);
#pragma omp parallel
  {
    std::vector<T> p(int64_t{std::min(t, kQueryBlock)} * t);  // this thread's score block
#pragma omp for collapse(2) schedule(static)
    for (int bi = 0; bi < b; ++bi) {
      for (int hi = 0; hi < h; ++hi) {
        const T* q = qkv + int64_t{bi} * t * c3 + hi * hs;
        const T* k = q + c;
        const T* v = q + 2 * c;
        T* o = out + int64_t{bi} * t * c + hi * hs;
        T* l = lse + (int64_t{bi} * h + hi) * t;
        for (int i0 = 0; i0 < t; i0 += kQueryBlock) {
          ::bigmac::util::ComputeProgress();  // messages in flight move on meanwhile
          const int rows = std::min(kQueryBlock, t - i0);
          const int kend = i0 + rows;  // keys 0 .. kend-1 are visible to some row of the block
          Gemm(CblasNoTrans, CblasTrans, rows, kend, hs, scale, q + i0 * c3, ld, k, ld, T(0),
               p.data(), kend);
          for (int r = 0; r < rows; ++r) {
            const int visible = i0 + r + 1;
            T* row = p.data() + int64_t{r} * kend;
            const internal::RowStats<T> stats = SoftmaxInPlace(row, visible);
            for (int j = visible; j < kend; ++j) row[j] = 0;
            l[i0 + r] = stats.max + std::log(stats.sum);
          }
          Gemm(CblasNoTrans, CblasNoTrans, rows, hs, kend, T(1), p.data(), kend, v, ld, T(0),
               o + int64_t{i0} * c, c);
        }
      }
    }
  }
}

template <typename T>
BIGMAC_SIMD_CLONES void FlashAttentionBackward(T* dqkv, const T* dout, const T* qkv, const T* lse,
                                               int b, int t, int c, int h) {
  const int hs = c / h;
  const T scale = T(1) / std::sqrt(T(hs));
  const int64_t c3 = 3 * int64_t{c};
  const int ld = static_cast<int>(c3);
#pragma omp parallel
  {
    const int64_t block = int64_t{std::min(t, kQueryBlock)} * t;
    std::vector<T> p(block), ds(block);  // this thread's P, then dP -> dS
#pragma omp for collapse(2) schedule(static)
    for (int bi = 0; bi < b; ++bi) {
      for (int hi = 0; hi < h; ++hi) {
        const T* q = qkv + int64_t{bi} * t * c3 + hi * hs;
        const T* k = q + c;
        const T* v = q + 2 * c;
        T* dq = dqkv + int64_t{bi} * t * c3 + hi * hs;
        T* dk = dq + c;
        T* dv = dq + 2 * c;
        const T* dy = dout + int64_t{bi} * t * c + hi * hs;
        const T* l = lse + (int64_t{bi} * h + hi) * t;
        for (int ti = 0; ti < t; ++ti) {  // dK and dV accumulate over the query blocks
          std::fill(dk + ti * c3, dk + ti * c3 + hs, T(0));
          std::fill(dv + ti * c3, dv + ti * c3 + hs, T(0));
        }
        for (int i0 = 0; i0 < t; i0 += kQueryBlock) {
          ::bigmac::util::ComputeProgress();
          const int rows = std::min(kQueryBlock, t - i0);
          const int kend = i0 + rows;
          // P = exp(scale Q K^T - lse), zero above the diagonal.
          Gemm(CblasNoTrans, CblasTrans, rows, kend, hs, scale, q + i0 * c3, ld, k, ld, T(0),
               p.data(), kend);
          for (int r = 0; r < rows; ++r) {
            const int visible = i0 + r + 1;
            T* row = p.data() + int64_t{r} * kend;
            const T m = l[i0 + r];
#pragma omp simd
            for (int j = 0; j < visible; ++j) row[j] = Exp(row[j] - m);
            for (int j = visible; j < kend; ++j) row[j] = 0;
          }
          // dV += P^T dO; dP = dO V^T.
          const T* dyb = dy + int64_t{i0} * c;
          Gemm(CblasTrans, CblasNoTrans, kend, hs, rows, T(1), p.data(), kend, dyb, c, T(1), dv,
               ld);
          Gemm(CblasNoTrans, CblasTrans, rows, kend, hs, T(1), dyb, c, v, ld, T(0), ds.data(),
               kend);
          // Softmax backward through the scale: dS = P * (dP - rowsum(dP * P)) * scale.
          for (int r = 0; r < rows; ++r) {
            const int visible = i0 + r + 1;
            const T* prow = p.data() + int64_t{r} * kend;
            T* row = ds.data() + int64_t{r} * kend;
            SoftmaxBackwardInPlace(row, prow, visible, scale);
            for (int j = visible; j < kend; ++j) row[j] = 0;
          }
          // dQ = dS K; dK += dS^T Q.
          Gemm(CblasNoTrans, CblasNoTrans, rows, hs, kend, T(1), ds.data(), kend, k, ld, T(0),
               dq + i0 * c3, ld);
          Gemm(CblasTrans, CblasNoTrans, kend, hs, rows, T(1), ds.data(), kend, q + i0 * c3, ld,
               T(1), dk, ld);
        }
      }
    }
  }
}

#define BIGMAC_INSTANTIATE(T)                                                   \
  template void FlashAttentionForward<T>(T*, T*, const T*, int, int, int, int); \
  template void FlashAttentionBackward<T>(T*, const T*, const T*, const T*, int, int, int, int);

BIGMAC_INSTANTIATE(float)
BIGMAC_INSTANTIATE(double)
#undef BIGMAC_INSTANTIATE

}  // namespace bigmac::sdk::cpu
