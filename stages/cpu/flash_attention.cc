// Blocked causal attention for the CPU (plugins/sdk/cpu_kernels.h FlashAttentionForward/Backward):
// the T x T probabilities are never kept. Per (batch, head), the queries are walked in blocks of
// kQueryBlock rows; a block's scores against its causal prefix of keys (rows x kend, at most
// kQueryBlock x T: 48 KiB at T = 256) are one small GEMM into a per-thread buffer that stays in
// L1/L2, so the exact two-pass softmax (row maximum, then exp and sum) costs no memory traffic and
// no online rescaling is needed. Forward keeps the log-sum-exp per row; backward rebuilds the
// probabilities from it as exp(s - lse). Against the full-square GEMMs of AttentionForward the
// GEMMs cover 59% of the T x T square at T = 256 (67% at T = 128), and the B*h*T*T floats that
// forward wrote and backward read are gone.
//
// Why 48 rows: the GEMM's micro-tile is 6 x 16, and a multiple of both fills every tile of the
// products whose rows are a block's (S, O, dP, dQ) and of those whose rows are its keys (dV, dK).
// With 32, each block's sixth row tile had 2 rows of 6, and the attention ran 5-7% slower; 24 ran
// as fast at T = 256 and slower at T = 1024, 96 slower (bench/NOTES.md, lever 21).
//
// Grouped-query attention (Llama's GQA; kv_heads = 1 is multi-query): each group of h / kv_heads
// query heads reads one key head and one value head in place, never copied per query head.
//
// One OpenMP iteration (static schedule) per (batch, head) forward and per (batch, kv head)
// backward, where a group's query heads add into their shared dK and dV in head order; inside an
// iteration every sum runs in a fixed order: results do not depend on the thread count. With
// kv_heads = h the arithmetic is that of multi-head attention, bit for bit. OpenBLAS runs
// single-threaded inside the parallel region.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <type_traits>
#include <vector>

#include "core/util/compute_progress.h"
#include "core/util/host_memory.h"
#include "core/util/simd.h"
#include "plugins/sdk/cpu_kernels.h"
#include "stages/cpu/blocked_gemm.h"
#include "stages/cpu/math.h"

namespace bigmac::sdk::cpu {
namespace {

using internal::Exp;
using internal::Gemm;
using internal::SoftmaxBackwardInPlace;
using internal::SoftmaxInPlace;

constexpr int kQueryBlock = 48;  // see above

// Where one (batch, kv-head group) reads and writes: the row stride of qkv, and the columns of q
// head `hi`, of its group's k and of its group's v within a row.
struct QkvLayout {
  int hs;            // head size
  int64_t width;     // qkv row: h query heads, then kv key heads, then kv value heads
  int group;         // query heads per kv head
  int64_t k_offset;  // first key column
  int64_t v_offset;  // first value column
  QkvLayout(int c, int h, int kv_heads)
      : hs(c / h),
        width(int64_t{c} + 2 * int64_t{kv_heads} * (c / h)),
        group(h / kv_heads),
        k_offset(c),
        v_offset(int64_t{c} + int64_t{kv_heads} * (c / h)) {}
  int64_t Query(int hi) const { return int64_t{hi} * hs; }
  int64_t Key(int g) const { return k_offset + int64_t{g} * hs; }
  int64_t Value(int g) const { return v_offset + int64_t{g} * hs; }
};

// One head's keys or values, t x hs with row stride ld, as the B of the products that read them:
// transposed (S = Q K^T, dP = dO V^T read the first kend columns of X^T) or as they are (O = P V,
// dQ = dS K read the first kend rows of X). Packed once per head for all its query blocks: packed
// again for every block, the transposed ones made the attention 3-6% slower (bench/NOTES.md, lever
// 17), and the plain ones were another 4% of its time (lever 21). Doubles, another float GEMM
// library, and a k over kGemmKc (hs transposed, t plain) take the GEMM with the plain matrix. One
// per thread and use; Pack, then Times as often as needed.
template <typename T>
class PackedOperand {
 public:
  enum class Use { kTransposed, kPlain };

  PackedOperand(Use use, int t, int hs)
      : transposed_(use == Use::kTransposed),
        hs_(hs),
        packed_k_(transposed_ ? hs : t),
        packed_n_(transposed_ ? t : hs) {
    if constexpr (std::is_same_v<T, float>) {
      // 64-byte aligned, uninitialised: Pack writes every float the products read. Without
      // memory for it (null), the products take the plain GEMM.
      if (internal::CanPackBOnce(packed_k_)) {
        packed_.reset(static_cast<float*>(::bigmac::util::AllocateHost(
            internal::BlockedPackedBFloats(packed_k_, packed_n_) * int64_t{sizeof(float)})));
      }
    }
  }
  PackedOperand(const PackedOperand&) = delete;
  PackedOperand& operator=(const PackedOperand&) = delete;

  // x stays valid and unchanged while Times reads it, and while this object lives (the query
  // heads of a group pack the same keys: the second Pack of them does nothing).
  void Pack(const T* x, int ld) {
    if (x == x_ && ld == ld_) return;
    x_ = x;
    ld_ = ld;
    if constexpr (std::is_same_v<T, float>) {
      if (packed_) {
        internal::BlockedPackB(transposed_, packed_k_, packed_n_, x, ld, packed_.get());
      }
    }
  }

  // kTransposed: c (rows x kend) = alpha a X[0, kend)^T, a rows x hs. kPlain: c (rows x hs) =
  // alpha a X[0, kend), a rows x kend. a has row stride lda, c ldc.
  void Times(int rows, int kend, T alpha, const T* a, int lda, T* c, int ldc) {
    const int n = transposed_ ? kend : hs_;
    const int k = transposed_ ? hs_ : kend;
    if constexpr (std::is_same_v<T, float>) {
      if (packed_) {
        internal::SgemmPackedB(rows, n, k, alpha, a, lda, packed_.get(), 0.0f, c, ldc, packed_k_);
        return;
      }
    }
    Gemm(CblasNoTrans, transposed_ ? CblasTrans : CblasNoTrans, rows, n, k, alpha, a, lda, x_, ld_,
         T(0), c, ldc);
  }

 private:
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };

  const bool transposed_;
  const int hs_;
  const int packed_k_, packed_n_;  // op(X) as packed: hs x t transposed, t x hs plain
  const T* x_ = nullptr;
  int ld_ = 0;
  std::unique_ptr<float, Free> packed_;  // null: no packing
};

}  // namespace

template <typename T>
BIGMAC_SIMD_CLONES void FlashAttentionForward(T* out, T* lse, const T* qkv, int b, int t, int c,
                                              int h, int kv_heads) {
  if (kv_heads <= 0) kv_heads = h;
  const QkvLayout L(c, h, kv_heads);
  const int hs = L.hs;
  const T scale = T(1) / std::sqrt(T(hs));
  const int ld = static_cast<int>(L.width);
#pragma omp parallel
  {
    std::vector<T> p(int64_t{std::min(t, kQueryBlock)} * t);  // this thread's score block
    using Operand = PackedOperand<T>;
    Operand keys(Operand::Use::kTransposed, t, hs), values(Operand::Use::kPlain, t, hs);
#pragma omp for collapse(2) schedule(static)
    for (int bi = 0; bi < b; ++bi) {
      for (int hi = 0; hi < h; ++hi) {
        const T* row0 = qkv + int64_t{bi} * t * L.width;
        const T* q = row0 + L.Query(hi);
        const T* k = row0 + L.Key(hi / L.group);  // shared by the group's query heads
        const T* v = row0 + L.Value(hi / L.group);
        T* o = out + int64_t{bi} * t * c + hi * hs;
        T* l = lse + (int64_t{bi} * h + hi) * t;
        keys.Pack(k, ld);
        values.Pack(v, ld);
        for (int i0 = 0; i0 < t; i0 += kQueryBlock) {
          ::bigmac::util::ComputeProgress();  // messages in flight move on meanwhile
          const int rows = std::min(kQueryBlock, t - i0);
          const int kend = i0 + rows;  // keys 0 .. kend-1 are visible to some row of the block
          keys.Times(rows, kend, scale, q + i0 * L.width, ld, p.data(), kend);
          for (int r = 0; r < rows; ++r) {
            const int visible = i0 + r + 1;
            T* row = p.data() + int64_t{r} * kend;
            const internal::RowStats<T> stats = SoftmaxInPlace(row, visible);
            for (int j = visible; j < kend; ++j) row[j] = 0;
            l[i0 + r] = stats.max + std::log(stats.sum);
          }
          values.Times(rows, kend, T(1), p.data(), kend, o + int64_t{i0} * c, c);
        }
      }
    }
  }
}

template <typename T>
BIGMAC_SIMD_CLONES void FlashAttentionBackward(T* dqkv, const T* dout, const T* qkv, const T* lse,
                                               int b, int t, int c, int h, int kv_heads) {
  if (kv_heads <= 0) kv_heads = h;
  const QkvLayout L(c, h, kv_heads);
  const int hs = L.hs;
  const T scale = T(1) / std::sqrt(T(hs));
  const int ld = static_cast<int>(L.width);
#pragma omp parallel
  {
    const int64_t block = int64_t{std::min(t, kQueryBlock)} * t;
    std::vector<T> p(block), ds(block);  // this thread's P, then dP -> dS
    // The group's keys and values, for all its query heads.
    using Operand = PackedOperand<T>;
    Operand keys(Operand::Use::kTransposed, t, hs), values(Operand::Use::kTransposed, t, hs);
    Operand plain_keys(Operand::Use::kPlain, t, hs);
    // One iteration per (batch, kv head): the group's query heads add into its dK and dV one after
    // the other, in head order, so no two threads write the same dK/dV and the sums' order is
    // fixed.
#pragma omp for collapse(2) schedule(static)
    for (int bi = 0; bi < b; ++bi) {
      for (int g = 0; g < kv_heads; ++g) {
        const T* row0 = qkv + int64_t{bi} * t * L.width;
        T* drow0 = dqkv + int64_t{bi} * t * L.width;
        const T* k = row0 + L.Key(g);
        const T* v = row0 + L.Value(g);
        T* dk = drow0 + L.Key(g);
        T* dv = drow0 + L.Value(g);
        for (int ti = 0; ti < t; ++ti) {  // dK and dV accumulate over heads and query blocks
          std::fill(dk + ti * L.width, dk + ti * L.width + hs, T(0));
          std::fill(dv + ti * L.width, dv + ti * L.width + hs, T(0));
        }
        keys.Pack(k, ld);
        values.Pack(v, ld);
        plain_keys.Pack(k, ld);
        for (int hi = g * L.group; hi < (g + 1) * L.group; ++hi) {
          const T* q = row0 + L.Query(hi);
          T* dq = drow0 + L.Query(hi);
          const T* dy = dout + int64_t{bi} * t * c + hi * hs;
          const T* l = lse + (int64_t{bi} * h + hi) * t;
          for (int i0 = 0; i0 < t; i0 += kQueryBlock) {
            ::bigmac::util::ComputeProgress();
            const int rows = std::min(kQueryBlock, t - i0);
            const int kend = i0 + rows;
            // P = exp(scale Q K^T - lse), zero above the diagonal.
            keys.Times(rows, kend, scale, q + i0 * L.width, ld, p.data(), kend);
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
            values.Times(rows, kend, T(1), dyb, c, ds.data(), kend);
            // Softmax backward through the scale: dS = P * (dP - rowsum(dP * P)) * scale.
            for (int r = 0; r < rows; ++r) {
              const int visible = i0 + r + 1;
              const T* prow = p.data() + int64_t{r} * kend;
              T* row = ds.data() + int64_t{r} * kend;
              SoftmaxBackwardInPlace(row, prow, visible, scale);
              for (int j = visible; j < kend; ++j) row[j] = 0;
            }
            // dQ = dS K; dK += dS^T Q.
            plain_keys.Times(rows, kend, T(1), ds.data(), kend, dq + i0 * L.width, ld);
            Gemm(CblasTrans, CblasNoTrans, kend, hs, rows, T(1), ds.data(), kend, q + i0 * L.width,
                 ld, T(1), dk, ld);
          }
        }
      }
    }
  }
}

#define BIGMAC_INSTANTIATE(T)                                                                   \
  template void FlashAttentionForward<T>(T*, T*, const T*, int, int, int, int, int);            \
  template void FlashAttentionBackward<T>(T*, const T*, const T*, const T*, int, int, int, int, \
                                          int);

BIGMAC_INSTANTIATE(float)
BIGMAC_INSTANTIATE(double)
#undef BIGMAC_INSTANTIATE

}  // namespace bigmac::sdk::cpu
