#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/util/compute_progress.h"
#include "core/util/simd.h"
#include "plugins/sdk/cpu_kernels.h"
#include "stages/cpu/math.h"
#include "stages/numerics.h"

// GCC's jump threading copied the division after exp's clamp for the clamped value
// (x / (1 + exp(88))), so every vector of GELU, its gradient and SwiGLU's sigmoid divided twice.
// Without it GELU alone runs 2.4x faster, with the same bits (bench/NOTES.md, lever 19). A pragma,
// not a flag: clang (the fuzz build) has no -fno-thread-jumps.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-thread-jumps")
#endif

namespace bigmac::sdk::cpu {
namespace {

using ::bigmac::stages::kGeluCubic;
using ::bigmac::stages::kLayerNormEpsilon;
using internal::Exp;
using internal::Gemm;
using internal::GemmWeight;
using internal::SoftmaxBackwardInPlace;
using internal::SoftmaxInPlace;

// This OpenMP thread's share [begin, end) of `columns`, in contiguous blocks.
std::pair<int, int> ThreadColumns(int columns) {
  const int threads = omp_get_num_threads();
  const int per = (columns + threads - 1) / threads;
  const int begin = std::min(columns, per * omp_get_thread_num());
  return {begin, std::min(columns, begin + per)};
}

// Every row of out (n x oc) set to bias.
template <typename T>
void FillRows(T* out, const T* bias, int n, int oc) {
#pragma omp parallel for schedule(static)
  for (int row = 0; row < n; ++row) std::memcpy(out + int64_t{row} * oc, bias, sizeof(T) * oc);
}

}  // namespace

template <typename T>
BIGMAC_SIMD_CLONES void MatmulForward(T* out, const T* inp, const T* w, const T* bias, int n, int c,
                                      int oc) {
  if (!bias) {
    GemmWeight(CblasTrans, n, oc, c, T(1), inp, c, w, c, T(0), out, oc);
    return;
  }
  // The bias goes in first and the GEMM accumulates onto it (beta = 1), as llm.c's fused matmul
  // does: one write pass over out instead of the GEMM's zeroing pass plus a read-modify-write
  // pass for the bias (bench/NOTES.md, lever 12).
  FillRows(out, bias, n, oc);
  GemmWeight(CblasTrans, n, oc, c, T(1), inp, c, w, c, T(1), out, oc);
}

template <typename T>
void MatmulBackwardInput(T* dinp, const T* dout, const T* w, int n, int c, int oc) {
  GemmWeight(CblasNoTrans, n, c, oc, T(1), dout, oc, w, c, T(0), dinp, c);
}

template <typename T>
BIGMAC_SIMD_CLONES void MatmulBackwardWeight(T* dw, T* dbias, const T* dout, const T* inp, int n,
                                             int c, int oc) {
  Gemm(CblasTrans, CblasNoTrans, oc, c, n, T(1), dout, oc, inp, c, T(1), dw, c);
  if (!dbias) return;
    // Column sums, walking rows in order (contiguous) inside each thread's block of columns: the
    // same per-column summation order as one thread, so the result does not depend on threads.
#pragma omp parallel
  {
    const std::pair<int, int> columns = ThreadColumns(oc);
    const int begin = columns.first;
    const int end = columns.second;
    if (begin < end) {
      std::vector<T> sum(end - begin, T(0));
      for (int row = 0; row < n; ++row) {
        const T* d = dout + int64_t{row} * oc + begin;
#pragma omp simd
        for (int j = 0; j < end - begin; ++j) sum[j] += d[j];
      }
      for (int j = begin; j < end; ++j) dbias[j] += sum[j - begin];
    }
  }
}

template <typename T>
BIGMAC_SIMD_CLONES void LayerNormForward(T* out, T* mean, T* rstd, const T* inp, const T* w,
                                         const T* b, int n, int c) {
#pragma omp parallel for schedule(static)
  for (int row = 0; row < n; ++row) {
    const T* x = inp + int64_t{row} * c;
    T m = 0;
#pragma omp simd reduction(+ : m)
    for (int i = 0; i < c; ++i) m += x[i];
    m /= c;
    T var = 0;
#pragma omp simd reduction(+ : var)
    for (int i = 0; i < c; ++i) var += (x[i] - m) * (x[i] - m);
    var /= c;
    const T s = T(1) / std::sqrt(var + T(kLayerNormEpsilon));
    T* o = out + int64_t{row} * c;
    for (int i = 0; i < c; ++i) o[i] = (x[i] - m) * s * w[i] + b[i];
    mean[row] = m;
    rstd[row] = s;
  }
}

template <typename T>
BIGMAC_SIMD_CLONES void LayerNormBackwardInput(T* dinp, const T* dout, const T* inp, const T* w,
                                               const T* mean, const T* rstd, int n, int c,
                                               const T* residual) {
#pragma omp parallel for schedule(static)
  for (int row = 0; row < n; ++row) {
    const T* x = inp + int64_t{row} * c;
    const T* dy = dout + int64_t{row} * c;
    T* dx = dinp + int64_t{row} * c;
    const T* r = residual ? residual + int64_t{row} * c : dx;
    const T m = mean[row];
    const T s = rstd[row];
    T dnorm_mean = 0;
    T dnorm_norm_mean = 0;
#pragma omp simd reduction(+ : dnorm_mean, dnorm_norm_mean)
    for (int i = 0; i < c; ++i) {
      const T norm = (x[i] - m) * s;
      const T dnorm = w[i] * dy[i];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= c;
    dnorm_norm_mean /= c;
    for (int i = 0; i < c; ++i) {
      const T norm = (x[i] - m) * s;
      const T dnorm = w[i] * dy[i];
      dx[i] = r[i] + s * (dnorm - dnorm_mean - norm * dnorm_norm_mean);
    }
  }
}

template <typename T>
BIGMAC_SIMD_CLONES void LayerNormBackwardWeight(T* dw, T* db, const T* dout, const T* inp,
                                                const T* mean, const T* rstd, int n, int c) {
  // Each thread owns a block of columns and walks the rows in order (contiguous reads): per column
  // the same summation order whatever the thread count.
#pragma omp parallel
  {
    const std::pair<int, int> columns = ThreadColumns(c);
    const int begin = columns.first;
    const int end = columns.second;
    if (begin < end) {
      std::vector<T> sum_w(end - begin, T(0)), sum_b(end - begin, T(0));
      for (int row = 0; row < n; ++row) {
        const T* d = dout + int64_t{row} * c + begin;
        const T* x = inp + int64_t{row} * c + begin;
        const T m = mean[row];
        const T s = rstd[row];
#pragma omp simd
        for (int j = 0; j < end - begin; ++j) {
          sum_w[j] += d[j] * (x[j] - m) * s;
          sum_b[j] += d[j];
        }
      }
      for (int j = begin; j < end; ++j) {
        dw[j] += sum_w[j - begin];
        db[j] += sum_b[j - begin];
      }
    }
  }
}

template <typename T>
BIGMAC_SIMD_CLONES void RmsNormForward(T* out, T* rstd, const T* inp, const T* w, int n, int c,
                                       double eps) {
#pragma omp parallel for schedule(static)
  for (int row = 0; row < n; ++row) {
    const T* x = inp + int64_t{row} * c;
    T sum_squares = 0;
#pragma omp simd reduction(+ : sum_squares)
    for (int i = 0; i < c; ++i) sum_squares += x[i] * x[i];
    const T s = T(1) / std::sqrt(sum_squares / c + T(eps));
    T* o = out + int64_t{row} * c;
    for (int i = 0; i < c; ++i) o[i] = x[i] * s * w[i];
    rstd[row] = s;
  }
}

// y_i = x_i s w_i, s = (mean(x^2) + eps)^(-1/2), ds/dx_j = -s^3 x_j / C:
// dx_j = s w_j dy_j - x_j s^3 / C * sum_i(w_i dy_i x_i).
template <typename T>
BIGMAC_SIMD_CLONES void RmsNormBackwardInput(T* dinp, const T* dout, const T* inp, const T* w,
                                             const T* rstd, int n, int c, const T* residual) {
#pragma omp parallel for schedule(static)
  for (int row = 0; row < n; ++row) {
    const T* x = inp + int64_t{row} * c;
    const T* dy = dout + int64_t{row} * c;
    T* dx = dinp + int64_t{row} * c;
    const T* r = residual ? residual + int64_t{row} * c : dx;
    const T s = rstd[row];
    T dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int i = 0; i < c; ++i) dot += w[i] * dy[i] * x[i];
    const T scale = s * s * s * dot / c;
    for (int i = 0; i < c; ++i) dx[i] = r[i] + (s * w[i] * dy[i] - x[i] * scale);
  }
}

template <typename T>
BIGMAC_SIMD_CLONES void RmsNormBackwardWeight(T* dw, const T* dout, const T* inp, const T* rstd,
                                              int n, int c) {
  // As LayerNormBackwardWeight: threads own columns and walk the rows in order.
#pragma omp parallel
  {
    const std::pair<int, int> columns = ThreadColumns(c);
    const int begin = columns.first;
    const int end = columns.second;
    if (begin < end) {
      std::vector<T> sum_w(end - begin, T(0));
      for (int row = 0; row < n; ++row) {
        const T* d = dout + int64_t{row} * c + begin;
        const T* x = inp + int64_t{row} * c + begin;
        const T s = rstd[row];
#pragma omp simd
        for (int j = 0; j < end - begin; ++j) sum_w[j] += d[j] * x[j] * s;
      }
      for (int j = begin; j < end; ++j) dw[j] += sum_w[j - begin];
    }
  }
}

// Attention runs as per-(batch, head) GEMMs on strided views of qkv: S = scale Q K^T, P = causal
// softmax(S), O = P V (and the transposes in backward). The GEMMs also compute the masked upper
// triangle (twice the flops of the loops this replaced), but at BLAS speed (bench/NOTES.md).
// Each (b, h) is one OpenMP task; OpenBLAS runs single-threaded inside the parallel region.
template <typename T>
BIGMAC_SIMD_CLONES void AttentionForward(T* out, T* att, const T* qkv, int b, int t, int c, int h) {
  const int hs = c / h;
  const T scale = T(1) / std::sqrt(T(hs));
  const int64_t c3 = 3 * int64_t{c};
#pragma omp parallel for collapse(2) schedule(static)
  for (int bi = 0; bi < b; ++bi) {
    for (int hi = 0; hi < h; ++hi) {
      const T* q = qkv + int64_t{bi} * t * c3 + hi * hs;
      const T* k = q + c;
      const T* v = q + 2 * c;
      T* p = att + (int64_t{bi} * h + hi) * t * t;
      Gemm(CblasNoTrans, CblasTrans, t, t, hs, scale, q, static_cast<int>(c3), k,
           static_cast<int>(c3), T(0), p, t);
      for (int ti = 0; ti < t; ++ti) {
        T* row = p + int64_t{ti} * t;
        SoftmaxInPlace(row, ti + 1);
        for (int t2 = ti + 1; t2 < t; ++t2) row[t2] = 0;
      }
      T* o = out + int64_t{bi} * t * c + hi * hs;
      Gemm(CblasNoTrans, CblasNoTrans, t, hs, t, T(1), p, t, v, static_cast<int>(c3), T(0), o, c);
    }
  }
}

template <typename T>
BIGMAC_SIMD_CLONES void AttentionBackward(T* dqkv, const T* dout, const T* qkv, const T* att, int b,
                                          int t, int c, int h) {
  const int hs = c / h;
  const T scale = T(1) / std::sqrt(T(hs));
  const int64_t c3 = 3 * int64_t{c};
  const int ld = static_cast<int>(c3);
#pragma omp parallel
  {
    std::vector<T> ds(int64_t{t} * t);  // this thread's dP, then dS
#pragma omp for collapse(2) schedule(static)
    for (int bi = 0; bi < b; ++bi) {
      for (int hi = 0; hi < h; ++hi) {
        const T* q = qkv + int64_t{bi} * t * c3 + hi * hs;
        const T* k = q + c;
        const T* v = q + 2 * c;
        T* dq = dqkv + int64_t{bi} * t * c3 + hi * hs;
        T* dk = dq + c;
        T* dv = dq + 2 * c;
        const T* p = att + (int64_t{bi} * h + hi) * t * t;
        const T* dy = dout + int64_t{bi} * t * c + hi * hs;
        // dP = dO V^T; dV = P^T dO.
        Gemm(CblasNoTrans, CblasTrans, t, t, hs, T(1), dy, c, v, ld, T(0), ds.data(), t);
        Gemm(CblasTrans, CblasNoTrans, t, hs, t, T(1), p, t, dy, c, T(0), dv, ld);
        // Softmax backward through the scale: dS = P * (dP - rowsum(dP * P)) * scale.
        for (int ti = 0; ti < t; ++ti) {
          const T* prow = p + int64_t{ti} * t;
          T* row = ds.data() + int64_t{ti} * t;
          SoftmaxBackwardInPlace(row, prow, ti + 1, scale);
          for (int t2 = ti + 1; t2 < t; ++t2) row[t2] = 0;
        }
        // dQ = dS K; dK = dS^T Q.
        Gemm(CblasNoTrans, CblasNoTrans, t, hs, t, T(1), ds.data(), t, k, ld, T(0), dq, ld);
        Gemm(CblasTrans, CblasNoTrans, t, hs, t, T(1), ds.data(), t, q, ld, T(0), dk, ld);
      }
    }
  }
}

namespace {

// GELU (tanh approximation) as x * sigmoid(2u), u = k (x + 0.044715 x^3): 0.5 (1 + tanh(u)) is
// sigmoid(2u), which costs one exp and one division (tanh through exp cost two of each). The one
// formula of the separate kernels and of the GEMM epilogues below, inlined into each loop.
template <typename T>
inline T Gelu(T x) {
  const T k = std::sqrt(T(2) / T(M_PI));
  const T u = k * (x + T(kGeluCubic) * x * x * x);
  return x / (T(1) + Exp(T(-2) * u));
}

// d GELU / dx at x: d/dx [x s(2u)] = s + 2 x s (1 - s) du/dx, du/dx = k (1 + 3 * 0.044715 x^2).
template <typename T>
inline T GeluGrad(T x) {
  const T k = std::sqrt(T(2) / T(M_PI));
  const T u = k * (x + T(kGeluCubic) * x * x * x);
  const T s = T(1) / (T(1) + Exp(T(-2) * u));
  return s + T(2) * x * s * (T(1) - s) * k * (T(1) + T(3 * kGeluCubic) * x * x);
}

// The epilogues' rows: act = GELU(c), or c = GELU'(pre) c, `cols` columns at a time.
BIGMAC_SIMD_CLONES void GeluRow(float* act, const float* c, int cols) {
#pragma omp simd
  for (int j = 0; j < cols; ++j) act[j] = Gelu(c[j]);
}
BIGMAC_SIMD_CLONES void GeluGradRow(float* c, const float* pre, int cols) {
#pragma omp simd
  for (int j = 0; j < cols; ++j) c[j] = GeluGrad(pre[j]) * c[j];
}

// The epilogues' second matrix, with C's columns: the forward writes act, the backward reads pre.
struct GeluContext {
  float* act;
  const float* pre;
  int64_t ld;
};

void GeluEpilogue(void* context, float* c, int64_t ldc, int row0, int col0, int rows, int cols) {
  const auto* g = static_cast<const GeluContext*>(context);
  for (int r = 0; r < rows; ++r) GeluRow(g->act + (row0 + r) * g->ld + col0, c + r * ldc, cols);
}

void GeluGradEpilogue(void* context, float* c, int64_t ldc, int row0, int col0, int rows,
                      int cols) {
  const auto* g = static_cast<const GeluContext*>(context);
  for (int r = 0; r < rows; ++r) {
    GeluGradRow(c + r * ldc, g->pre + (row0 + r) * g->ld + col0, cols);
  }
}

// The residual a projection's output joins: c += residual, AddInPlace's arithmetic, on a finished
// block of the product while it is in cache.
struct ResidualContext {
  const float* residual;
  int64_t ld;
};

BIGMAC_SIMD_CLONES void AddRow(float* c, const float* residual, int cols) {
#pragma omp simd
  for (int j = 0; j < cols; ++j) c[j] += residual[j];
}

void ResidualEpilogue(void* context, float* c, int64_t ldc, int row0, int col0, int rows,
                      int cols) {
  const auto* g = static_cast<const ResidualContext*>(context);
  for (int r = 0; r < rows; ++r) AddRow(c + r * ldc, g->residual + (row0 + r) * g->ld + col0, cols);
}

// SwiGLU's rows, the one formula of the separate kernels and of the epilogues:
// h = silu(g) u with silu(g) = g sigmoid(g); d silu / dg = sigmoid(g) (1 + g (1 - sigmoid(g))).
template <typename T>
BIGMAC_SIMD_CLONES void SwigluRow(T* h, const T* gate, const T* up, int cols) {
#pragma omp simd
  for (int j = 0; j < cols; ++j) h[j] = gate[j] / (T(1) + Exp(-gate[j])) * up[j];
}
template <typename T>
BIGMAC_SIMD_CLONES void SwigluGradRow(T* dgate, T* dup, const T* dh, const T* gate, const T* up,
                                      int cols) {
#pragma omp simd
  for (int j = 0; j < cols; ++j) {
    const T sig = T(1) / (T(1) + Exp(-gate[j]));
    dgate[j] = dh[j] * up[j] * sig * (T(1) + gate[j] * (T(1) - sig));
    dup[j] = dh[j] * gate[j] * sig;
  }
}

// The SwiGLU epilogues' matrices (rows of 2 width gate/up values, of width h values).
struct SwigluContext {
  float* h;              // forward: written
  const float* gate_up;  // backward: read (the forward's product)
  float* dgate_up;       // backward: written
  int width;
};

// The forward's C is gate_up. Its column blocks finish in order, all rows of one before the next
// (GemmEpilogue, blocked_gemm.h), so when a block's up columns are final their gate columns, in
// this block or an earlier one, are too: h for those columns, from C while it is in cache.
void SwigluEpilogue(void* context, float* c, int64_t ldc, int row0, int col0, int rows, int cols) {
  const auto* g = static_cast<const SwigluContext*>(context);
  const int begin = std::max(col0, g->width);  // the block's up columns
  const int end = col0 + cols;
  if (begin >= end) return;
  for (int r = 0; r < rows; ++r) {
    const float* up = c + r * ldc + (begin - col0);
    SwigluRow(g->h + int64_t{row0 + r} * g->width + (begin - g->width), up - g->width, up,
              end - begin);
  }
}

// The backward's C is dh: the gradient of gate_up for the block's columns, while dh is in cache.
void SwigluGradEpilogue(void* context, float* c, int64_t ldc, int row0, int col0, int rows,
                        int cols) {
  const auto* g = static_cast<const SwigluContext*>(context);
  for (int r = 0; r < rows; ++r) {
    const int64_t row = int64_t{row0 + r} * 2 * g->width + col0;
    SwigluGradRow(g->dgate_up + row, g->dgate_up + row + g->width, c + r * ldc, g->gate_up + row,
                  g->gate_up + row + g->width, cols);
  }
}

}  // namespace

template <typename T>
BIGMAC_SIMD_CLONES void GeluForward(T* out, const T* inp, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = Gelu(inp[i]);
}

template <typename T>
BIGMAC_SIMD_CLONES void GeluBackward(T* dinp, const T* inp, const T* dout, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dinp[i] = GeluGrad(inp[i]) * dout[i];
}

namespace {

// MatmulForward's float product with `epilogue` on each finished block of out (BigMac's GEMM).
void MatmulForwardFused(float* out, const float* inp, const float* w, const float* bias, int n,
                        int c, int oc, const internal::GemmEpilogue& epilogue) {
  if (bias) FillRows(out, bias, n, oc);
  internal::SgemmWeight(true, n, oc, c, 1.0f, inp, c, w, c, bias ? 1.0f : 0.0f, out, oc, epilogue);
}

}  // namespace

template <typename T>
void MatmulResidualForward(T* out, const T* inp, const T* w, const T* bias, const T* residual,
                           int n, int c, int oc) {
  if constexpr (std::is_same_v<T, float>) {
    if (internal::GemmFusesEpilogue()) {
      ResidualContext context{residual, oc};
      MatmulForwardFused(out, inp, w, bias, n, c, oc, {ResidualEpilogue, &context});
      return;
    }
  }
  MatmulForward(out, inp, w, bias, n, c, oc);
  AddInPlace(out, residual, int64_t{n} * oc);
}

template <typename T>
void MatmulGeluForward(T* out, T* act, const T* inp, const T* w, const T* bias, int n, int c,
                       int oc) {
  if constexpr (std::is_same_v<T, float>) {
    if (internal::GemmFusesEpilogue()) {
      GeluContext context{act, nullptr, oc};
      MatmulForwardFused(out, inp, w, bias, n, c, oc, {GeluEpilogue, &context});
      return;
    }
  }
  MatmulForward(out, inp, w, bias, n, c, oc);
  GeluForward(act, out, int64_t{n} * oc);
}

template <typename T>
void MatmulGeluBackwardInput(T* dinp, const T* dout, const T* w, const T* pre, int n, int c,
                             int oc) {
  if constexpr (std::is_same_v<T, float>) {
    if (internal::GemmFusesEpilogue()) {
      GeluContext context{nullptr, pre, c};
      internal::SgemmWeight(false, n, c, oc, 1.0f, dout, oc, w, c, 0.0f, dinp, c,
                            {GeluGradEpilogue, &context});
      return;
    }
  }
  MatmulBackwardInput(dinp, dout, w, n, c, oc);
  GeluBackward(dinp, pre, dinp, int64_t{n} * c);
}

template <typename T>
BIGMAC_SIMD_CLONES void SwigluForward(T* h, const T* gate_up, int n, int width) {
#pragma omp parallel for schedule(static)
  for (int row = 0; row < n; ++row) {
    const T* gate = gate_up + int64_t{row} * 2 * width;
    SwigluRow(h + int64_t{row} * width, gate, gate + width, width);
  }
}

template <typename T>
BIGMAC_SIMD_CLONES void SwigluBackward(T* dgate_up, const T* dh, const T* gate_up, int n,
                                       int width) {
#pragma omp parallel for schedule(static)
  for (int row = 0; row < n; ++row) {
    const T* gate = gate_up + int64_t{row} * 2 * width;
    T* dgate = dgate_up + int64_t{row} * 2 * width;
    SwigluGradRow(dgate, dgate + width, dh + int64_t{row} * width, gate, gate + width, width);
  }
}

template <typename T>
void MatmulSwigluForward(T* gate_up, T* h, const T* inp, const T* w, int n, int c, int width) {
  if constexpr (std::is_same_v<T, float>) {
    if (internal::GemmFusesEpilogue()) {
      SwigluContext context{h, gate_up, nullptr, width};
      internal::SgemmWeight(true, n, 2 * width, c, 1.0f, inp, c, w, c, 0.0f, gate_up, 2 * width,
                            {SwigluEpilogue, &context});
      return;
    }
  }
  MatmulForward(gate_up, inp, w, static_cast<const T*>(nullptr), n, c, 2 * width);
  SwigluForward(h, gate_up, n, width);
}

template <typename T>
void MatmulSwigluBackwardInput(T* dh, T* dgate_up, const T* dout, const T* w, const T* gate_up,
                               int n, int width, int oc) {
  if constexpr (std::is_same_v<T, float>) {
    if (internal::GemmFusesEpilogue()) {
      SwigluContext context{nullptr, gate_up, dgate_up, width};
      internal::SgemmWeight(false, n, width, oc, 1.0f, dout, oc, w, width, 0.0f, dh, width,
                            {SwigluGradEpilogue, &context});
      return;
    }
  }
  MatmulBackwardInput(dh, dout, w, n, width, oc);
  SwigluBackward(dgate_up, dh, gate_up, n, width);
}

template <typename T>
void RopeTable(T* cos, T* sin, int t, int hs, double theta) {
  const int half = hs / 2;
  for (int pos = 0; pos < t; ++pos) {
    for (int i = 0; i < half; ++i) {
      const double angle = pos * std::pow(theta, -2.0 * i / hs);
      cos[int64_t{pos} * half + i] = static_cast<T>(std::cos(angle));
      sin[int64_t{pos} * half + i] = static_cast<T>(std::sin(angle));
    }
  }
}

namespace {

// One rotation for both directions: `sign` +1 turns forward, -1 back (the transpose).
template <typename T>
BIGMAC_SIMD_CLONES void Rotate(T* x, const T* cos, const T* sin, int b, int t, int heads, int hs,
                               int64_t ld, T sign) {
  const int half = hs / 2;
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < int64_t{b} * t; ++row) {
    const T* c = cos + (row % t) * half;
    const T* s = sin + (row % t) * half;
    for (int head = 0; head < heads; ++head) {
      T* lo = x + row * ld + int64_t{head} * hs;
      T* hi = lo + half;
#pragma omp simd
      for (int i = 0; i < half; ++i) {
        const T a = lo[i];
        const T z = hi[i];
        lo[i] = a * c[i] - sign * z * s[i];
        hi[i] = z * c[i] + sign * a * s[i];
      }
    }
  }
}

}  // namespace

template <typename T>
void RopeForward(T* x, const T* cos, const T* sin, int b, int t, int heads, int hs, int64_t ld) {
  Rotate(x, cos, sin, b, t, heads, hs, ld, T(1));
}

template <typename T>
void RopeBackward(T* dx, const T* cos, const T* sin, int b, int t, int heads, int hs, int64_t ld) {
  Rotate(dx, cos, sin, b, t, heads, hs, ld, T(-1));
}

template <typename T>
BIGMAC_SIMD_CLONES void Add(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <typename T>
BIGMAC_SIMD_CLONES void AddInPlace(T* out, const T* a, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] += a[i];
}

template <typename T>
BIGMAC_SIMD_CLONES void EmbeddingForward(T* out, const int32_t* tokens, const T* wte, const T* wpe,
                                         int b, int t, int c) {
#pragma omp parallel for schedule(static)
  for (int row = 0; row < b * t; ++row) {
    const T* te = wte + int64_t{tokens[row]} * c;
    T* o = out + int64_t{row} * c;
    if (wpe == nullptr) {
      std::copy(te, te + c, o);
      continue;
    }
    const T* pe = wpe + int64_t{row % t} * c;
    for (int i = 0; i < c; ++i) o[i] = te[i] + pe[i];
  }
}

template <typename T>
BIGMAC_SIMD_CLONES void EmbeddingBackwardWeight(T* dwte, T* dwpe, const T* dout,
                                                const int32_t* tokens, int b, int t, int c) {
  // Rows share token ids, so parallelise over channels: each thread owns a block of columns and
  // walks the rows in order, so the summation order is fixed.
#pragma omp parallel
  {
    const std::pair<int, int> columns = ThreadColumns(c);
    const int begin = columns.first;
    const int end = columns.second;
    for (int row = 0; row < b * t && begin < end; ++row) {
      const T* g = dout + int64_t{row} * c;
      T* te = dwte + int64_t{tokens[row]} * c;
#pragma omp simd
      for (int i = begin; i < end; ++i) te[i] += g[i];
      if (dwpe == nullptr) continue;
      T* pe = dwpe + int64_t{row % t} * c;
#pragma omp simd
      for (int i = begin; i < end; ++i) pe[i] += g[i];
    }
  }
}

template <typename T>
BIGMAC_SIMD_CLONES double CrossEntropyLossSum(const T* logits, const int32_t* targets, int n,
                                              int v) {
  std::vector<double> losses(n);
#pragma omp parallel for schedule(static)
  for (int row = 0; row < n; ++row) {
    ::bigmac::util::ComputeProgress();  // a row is a vocabulary's exponentials
    const T* l = logits + int64_t{row} * v;
    double maxval = -INFINITY;
    for (int j = 0; j < v; ++j) maxval = std::max(maxval, double(l[j]));
    double sum = 0;
    for (int j = 0; j < v; ++j) sum += std::exp(double(l[j]) - maxval);
    losses[row] = maxval + std::log(sum) - double(l[targets[row]]);
  }
  double total = 0;
  for (double loss : losses) total += loss;  // fixed order: reproducible
  return total;
}

template <typename T>
BIGMAC_SIMD_CLONES void CrossEntropyBackward(T* dlogits, const T* logits, const int32_t* targets,
                                             int n, int v, double scale) {
#pragma omp parallel for schedule(static)
  for (int row = 0; row < n; ++row) {
    ::bigmac::util::ComputeProgress();
    const T* l = logits + int64_t{row} * v;
    T* d = dlogits + int64_t{row} * v;
    T maxval = -INFINITY;
#pragma omp simd reduction(max : maxval)
    for (int j = 0; j < v; ++j) maxval = l[j] > maxval ? l[j] : maxval;
    T sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < v; ++j) {
      d[j] = Exp(l[j] - maxval);
      sum += d[j];
    }
    const T inv = T(1) / sum;
    for (int j = 0; j < v; ++j) d[j] = T(scale) * (d[j] * inv - (j == targets[row] ? T(1) : T(0)));
  }
}

#define BIGMAC_INSTANTIATE(T)                                                                      \
  template void MatmulForward<T>(T*, const T*, const T*, const T*, int, int, int);                 \
  template void MatmulResidualForward<T>(T*, const T*, const T*, const T*, const T*, int, int,     \
                                         int);                                                     \
  template void MatmulBackwardInput<T>(T*, const T*, const T*, int, int, int);                     \
  template void MatmulBackwardWeight<T>(T*, T*, const T*, const T*, int, int, int);                \
  template void LayerNormForward<T>(T*, T*, T*, const T*, const T*, const T*, int, int);           \
  template void LayerNormBackwardInput<T>(T*, const T*, const T*, const T*, const T*, const T*,    \
                                          int, int, const T*);                                     \
  template void LayerNormBackwardWeight<T>(T*, T*, const T*, const T*, const T*, const T*, int,    \
                                           int);                                                   \
  template void AttentionForward<T>(T*, T*, const T*, int, int, int, int);                         \
  template void AttentionBackward<T>(T*, const T*, const T*, const T*, int, int, int, int);        \
  template void RmsNormForward<T>(T*, T*, const T*, const T*, int, int, double);                   \
  template void RmsNormBackwardInput<T>(T*, const T*, const T*, const T*, const T*, int, int,      \
                                        const T*);                                                 \
  template void RmsNormBackwardWeight<T>(T*, const T*, const T*, const T*, int, int);              \
  template void SwigluForward<T>(T*, const T*, int, int);                                          \
  template void SwigluBackward<T>(T*, const T*, const T*, int, int);                               \
  template void MatmulSwigluForward<T>(T*, T*, const T*, const T*, int, int, int);                 \
  template void MatmulSwigluBackwardInput<T>(T*, T*, const T*, const T*, const T*, int, int, int); \
  template void RopeTable<T>(T*, T*, int, int, double);                                            \
  template void RopeForward<T>(T*, const T*, const T*, int, int, int, int, int64_t);               \
  template void RopeBackward<T>(T*, const T*, const T*, int, int, int, int, int64_t);              \
  template void GeluForward<T>(T*, const T*, int64_t);                                             \
  template void GeluBackward<T>(T*, const T*, const T*, int64_t);                                  \
  template void MatmulGeluForward<T>(T*, T*, const T*, const T*, const T*, int, int, int);         \
  template void MatmulGeluBackwardInput<T>(T*, const T*, const T*, const T*, int, int, int);       \
  template void Add<T>(T*, const T*, const T*, int64_t);                                           \
  template void AddInPlace<T>(T*, const T*, int64_t);                                              \
  template void EmbeddingForward<T>(T*, const int32_t*, const T*, const T*, int, int, int);        \
  template void EmbeddingBackwardWeight<T>(T*, T*, const T*, const int32_t*, int, int, int);       \
  template double CrossEntropyLossSum<T>(const T*, const int32_t*, int, int);                      \
  template void CrossEntropyBackward<T>(T*, const T*, const int32_t*, int, int, double);

BIGMAC_INSTANTIATE(float)
BIGMAC_INSTANTIATE(double)
#undef BIGMAC_INSTANTIATE

}  // namespace bigmac::sdk::cpu
