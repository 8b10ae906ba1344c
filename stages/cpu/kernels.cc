#include "stages/cpu/kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace bigmac::stages::cpu {
namespace {

void Gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha, const float* a,
          int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void Gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha,
          const double* a, int lda, const double* b, int ldb, double beta, double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

constexpr double kLayerNormEps = 1e-5;

// tanh through exp: libm's tanhf is several times slower than expf and dominated the step time.
template <typename T>
T FastTanh(T u) {
  if (u > T(15)) return T(1);
  if (u < T(-15)) return T(-1);
  const T e = std::exp(T(2) * u);
  return (e - T(1)) / (e + T(1));
}

}  // namespace

template <typename T>
void MatmulForward(T* out, const T* inp, const T* w, const T* bias, int n, int c, int oc) {
  Gemm(CblasNoTrans, CblasTrans, n, oc, c, T(1), inp, c, w, c, T(0), out, oc);
  if (!bias) return;
#pragma omp parallel for schedule(static)
  for (int row = 0; row < n; ++row) {
    T* o = out + int64_t{row} * oc;
    for (int j = 0; j < oc; ++j) o[j] += bias[j];
  }
}

template <typename T>
void MatmulBackwardInput(T* dinp, const T* dout, const T* w, int n, int c, int oc) {
  Gemm(CblasNoTrans, CblasNoTrans, n, c, oc, T(1), dout, oc, w, c, T(0), dinp, c);
}

template <typename T>
void MatmulBackwardWeight(T* dw, T* dbias, const T* dout, const T* inp, int n, int c, int oc) {
  Gemm(CblasTrans, CblasNoTrans, oc, c, n, T(1), dout, oc, inp, c, T(1), dw, c);
  if (!dbias) return;
#pragma omp parallel for schedule(static)
  for (int j = 0; j < oc; ++j) {
    T sum = 0;
    for (int row = 0; row < n; ++row) sum += dout[int64_t{row} * oc + j];
    dbias[j] += sum;
  }
}

template <typename T>
void LayerNormForward(T* out, T* mean, T* rstd, const T* inp, const T* w, const T* b, int n,
                      int c) {
#pragma omp parallel for schedule(static)
  for (int row = 0; row < n; ++row) {
    const T* x = inp + int64_t{row} * c;
    T m = 0;
    for (int i = 0; i < c; ++i) m += x[i];
    m /= c;
    T var = 0;
    for (int i = 0; i < c; ++i) var += (x[i] - m) * (x[i] - m);
    var /= c;
    const T s = T(1) / std::sqrt(var + T(kLayerNormEps));
    T* o = out + int64_t{row} * c;
    for (int i = 0; i < c; ++i) o[i] = (x[i] - m) * s * w[i] + b[i];
    mean[row] = m;
    rstd[row] = s;
  }
}

template <typename T>
void LayerNormBackwardInput(T* dinp, const T* dout, const T* inp, const T* w, const T* mean,
                            const T* rstd, int n, int c) {
#pragma omp parallel for schedule(static)
  for (int row = 0; row < n; ++row) {
    const T* x = inp + int64_t{row} * c;
    const T* dy = dout + int64_t{row} * c;
    T* dx = dinp + int64_t{row} * c;
    const T m = mean[row];
    const T s = rstd[row];
    T dnorm_mean = 0;
    T dnorm_norm_mean = 0;
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
      dx[i] += s * (dnorm - dnorm_mean - norm * dnorm_norm_mean);
    }
  }
}

template <typename T>
void LayerNormBackwardWeight(T* dw, T* db, const T* dout, const T* inp, const T* mean,
                             const T* rstd, int n, int c) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < c; ++i) {
    T sum_w = 0;
    T sum_b = 0;
    for (int row = 0; row < n; ++row) {
      const int64_t at = int64_t{row} * c + i;
      sum_w += dout[at] * (inp[at] - mean[row]) * rstd[row];
      sum_b += dout[at];
    }
    dw[i] += sum_w;
    db[i] += sum_b;
  }
}

template <typename T>
void AttentionForward(T* out, T* att, const T* qkv, int b, int t, int c, int h) {
  const int hs = c / h;
  const T scale = T(1) / std::sqrt(T(hs));
  const int64_t c3 = 3 * int64_t{c};
#pragma omp parallel for collapse(2) schedule(static)
  for (int bi = 0; bi < b; ++bi) {
    for (int hi = 0; hi < h; ++hi) {
      const T* base = qkv + int64_t{bi} * t * c3;
      T* att_bh = att + (int64_t{bi} * h + hi) * t * t;
      for (int ti = 0; ti < t; ++ti) {
        const T* q = base + ti * c3 + hi * hs;
        T* row = att_bh + int64_t{ti} * t;
        T maxval = -INFINITY;
        for (int t2 = 0; t2 <= ti; ++t2) {
          const T* k = base + t2 * c3 + c + hi * hs;
          T dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int i = 0; i < hs; ++i) dot += q[i] * k[i];
          row[t2] = dot * scale;
          maxval = std::max(maxval, row[t2]);
        }
        T sum = 0;
        for (int t2 = 0; t2 <= ti; ++t2) {
          row[t2] = std::exp(row[t2] - maxval);
          sum += row[t2];
        }
        const T inv = T(1) / sum;
        for (int t2 = 0; t2 <= ti; ++t2) row[t2] *= inv;
        for (int t2 = ti + 1; t2 < t; ++t2) row[t2] = 0;
        T* o = out + (int64_t{bi} * t + ti) * c + hi * hs;
        for (int i = 0; i < hs; ++i) o[i] = 0;
        for (int t2 = 0; t2 <= ti; ++t2) {
          const T* v = base + t2 * c3 + 2 * c + hi * hs;
          const T p = row[t2];
          for (int i = 0; i < hs; ++i) o[i] += p * v[i];
        }
      }
    }
  }
}

template <typename T>
void AttentionBackward(T* dqkv, const T* dout, const T* qkv, const T* att, int b, int t, int c,
                       int h) {
  const int hs = c / h;
  const T scale = T(1) / std::sqrt(T(hs));
  const int64_t c3 = 3 * int64_t{c};
#pragma omp parallel for collapse(2) schedule(static)
  for (int bi = 0; bi < b; ++bi) {
    for (int hi = 0; hi < h; ++hi) {
      std::vector<T> datt(t);
      const T* base = qkv + int64_t{bi} * t * c3;
      T* dbase = dqkv + int64_t{bi} * t * c3;
      const T* att_bh = att + (int64_t{bi} * h + hi) * t * t;
      // This (b, h) owns its q, k, v columns of dqkv: clear them, then accumulate.
      for (int ti = 0; ti < t; ++ti) {
        for (int part = 0; part < 3; ++part) {
          T* d = dbase + ti * c3 + part * c + hi * hs;
          for (int i = 0; i < hs; ++i) d[i] = 0;
        }
      }
      for (int ti = 0; ti < t; ++ti) {
        const T* row = att_bh + int64_t{ti} * t;
        const T* dy = dout + (int64_t{bi} * t + ti) * c + hi * hs;
        // datt = dy . v;  dv += p * dy
        T dot_sum = 0;
        for (int t2 = 0; t2 <= ti; ++t2) {
          const T* v = base + t2 * c3 + 2 * c + hi * hs;
          T* dv = dbase + t2 * c3 + 2 * c + hi * hs;
          T dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int i = 0; i < hs; ++i) {
            dot += dy[i] * v[i];
            dv[i] += row[t2] * dy[i];
          }
          datt[t2] = dot;
          dot_sum += dot * row[t2];
        }
        // Softmax backward, then through the scaled dot product.
        const T* q = base + ti * c3 + hi * hs;
        T* dq = dbase + ti * c3 + hi * hs;
        for (int t2 = 0; t2 <= ti; ++t2) {
          const T dpre = row[t2] * (datt[t2] - dot_sum) * scale;
          const T* k = base + t2 * c3 + c + hi * hs;
          T* dk = dbase + t2 * c3 + c + hi * hs;
          for (int i = 0; i < hs; ++i) {
            dq[i] += dpre * k[i];
            dk[i] += dpre * q[i];
          }
        }
      }
    }
  }
}

template <typename T>
void GeluForward(T* out, const T* inp, int64_t n) {
  const T k = std::sqrt(T(2) / T(M_PI));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const T x = inp[i];
    out[i] = T(0.5) * x * (T(1) + FastTanh(k * (x + T(0.044715) * x * x * x)));
  }
}

template <typename T>
void GeluBackward(T* dinp, const T* inp, const T* dout, int64_t n) {
  const T k = std::sqrt(T(2) / T(M_PI));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const T x = inp[i];
    const T u = k * (x + T(0.044715) * x * x * x);
    const T th = FastTanh(u);
    const T sech2 = T(1) - th * th;
    const T grad = T(0.5) * (T(1) + th) + T(0.5) * x * sech2 * k * (T(1) + T(3 * 0.044715) * x * x);
    dinp[i] = grad * dout[i];
  }
}

template <typename T>
void Add(T* out, const T* a, const T* b, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <typename T>
void AddInPlace(T* out, const T* a, int64_t n) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] += a[i];
}

template <typename T>
void EmbeddingForward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int b, int t,
                      int c) {
#pragma omp parallel for schedule(static)
  for (int row = 0; row < b * t; ++row) {
    const T* te = wte + int64_t{tokens[row]} * c;
    const T* pe = wpe + int64_t{row % t} * c;
    T* o = out + int64_t{row} * c;
    for (int i = 0; i < c; ++i) o[i] = te[i] + pe[i];
  }
}

template <typename T>
void EmbeddingBackwardWeight(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int b, int t,
                             int c) {
  // Rows share token ids, so parallelise over channels: each thread owns columns, order is fixed.
#pragma omp parallel for schedule(static)
  for (int i = 0; i < c; ++i) {
    for (int row = 0; row < b * t; ++row) {
      const T g = dout[int64_t{row} * c + i];
      dwte[int64_t{tokens[row]} * c + i] += g;
      dwpe[int64_t{row % t} * c + i] += g;
    }
  }
}

template <typename T>
double CrossEntropyLossSum(const T* logits, const int32_t* targets, int n, int v) {
  std::vector<double> losses(n);
#pragma omp parallel for schedule(static)
  for (int row = 0; row < n; ++row) {
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
void CrossEntropyBackward(T* dlogits, const T* logits, const int32_t* targets, int n, int v,
                          double scale) {
#pragma omp parallel for schedule(static)
  for (int row = 0; row < n; ++row) {
    const T* l = logits + int64_t{row} * v;
    T* d = dlogits + int64_t{row} * v;
    T maxval = -INFINITY;
    for (int j = 0; j < v; ++j) maxval = std::max(maxval, l[j]);
    T sum = 0;
    for (int j = 0; j < v; ++j) {
      d[j] = std::exp(l[j] - maxval);
      sum += d[j];
    }
    const T inv = T(1) / sum;
    for (int j = 0; j < v; ++j) d[j] = T(scale) * (d[j] * inv - (j == targets[row] ? T(1) : T(0)));
  }
}

#define BIGMAC_INSTANTIATE(T)                                                                   \
  template void MatmulForward<T>(T*, const T*, const T*, const T*, int, int, int);              \
  template void MatmulBackwardInput<T>(T*, const T*, const T*, int, int, int);                  \
  template void MatmulBackwardWeight<T>(T*, T*, const T*, const T*, int, int, int);             \
  template void LayerNormForward<T>(T*, T*, T*, const T*, const T*, const T*, int, int);        \
  template void LayerNormBackwardInput<T>(T*, const T*, const T*, const T*, const T*, const T*, \
                                          int, int);                                            \
  template void LayerNormBackwardWeight<T>(T*, T*, const T*, const T*, const T*, const T*, int, \
                                           int);                                                \
  template void AttentionForward<T>(T*, T*, const T*, int, int, int, int);                      \
  template void AttentionBackward<T>(T*, const T*, const T*, const T*, int, int, int, int);     \
  template void GeluForward<T>(T*, const T*, int64_t);                                          \
  template void GeluBackward<T>(T*, const T*, const T*, int64_t);                               \
  template void Add<T>(T*, const T*, const T*, int64_t);                                        \
  template void AddInPlace<T>(T*, const T*, int64_t);                                           \
  template void EmbeddingForward<T>(T*, const int32_t*, const T*, const T*, int, int, int);     \
  template void EmbeddingBackwardWeight<T>(T*, T*, const T*, const int32_t*, int, int, int);    \
  template double CrossEntropyLossSum<T>(const T*, const int32_t*, int, int);                   \
  template void CrossEntropyBackward<T>(T*, const T*, const int32_t*, int, int, double);

BIGMAC_INSTANTIATE(float)
BIGMAC_INSTANTIATE(double)
#undef BIGMAC_INSTANTIATE

}  // namespace bigmac::stages::cpu
