#ifndef BIGMAC_STAGES_CPU_MATH_H_
#define BIGMAC_STAGES_CPU_MATH_H_

// Private helpers of the CPU kernels (stages/cpu/*.cc): the GEMM for float and double, and the
// exp the elementwise loops vectorise. Stateless; the float GEMM's library is chosen once per
// process (gemm.cc).
#include <cblas.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "stages/cpu/blocked_gemm.h"

namespace bigmac::sdk::cpu::internal {

// Row-major C = alpha op(A) op(B) + beta C. Floats go to the library FloatGemmLibrary() names
// (gemm.cc: BigMac's blocked GEMM by default); doubles (the gradient checks) to OpenBLAS. An
// epilogue (blocked_gemm.h) needs BigMac's GEMM, GemmFusesEpilogue(); with another library it
// aborts.
void SgemmRowMajor(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                   int lda, const float* b, int ldb, float beta, float* c, int ldc,
                   const GemmEpilogue& epilogue = {});

// Whether SgemmRowMajor takes an epilogue (BigMac's GEMM is the chosen one). Kernels with an
// epilogue run it as a parallel pass of their own when it does not.
bool GemmFusesEpilogue();

// B packed once (blocked_gemm.h, BlockedPackB) for several float products: possible when the
// chosen library is BigMac's GEMM and 0 < k <= kGemmKc (CanPackBOnce). SgemmPackedB multiplies by
// the first k rows of such a B, packed for packed_k rows (0: k), with the chosen micro-kernel and
// the bits of SgemmRowMajor on the plain B.
bool CanPackBOnce(int k);
void SgemmPackedB(int m, int n, int k, float alpha, const float* a, int lda, const float* packed_b,
                  float beta, float* c, int ldc, int packed_k = 0);

// SgemmRowMajor with A untransposed and B a weight w (op(B) = w, or w^T with trans_b): while a
// util::ConstantWeightsScope lists w, BigMac's GEMM packs it once per scope and reuses the pack
// (gemm.cc); otherwise, and with another library, SgemmRowMajor. The same bits either way.
void SgemmWeight(bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                 const float* w, int ldw, float beta, float* c, int ldc,
                 const GemmEpilogue& epilogue = {});

inline void GemmWeight(CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha, const float* a,
                       int lda, const float* w, int ldw, float beta, float* c, int ldc) {
  SgemmWeight(tb == CblasTrans, m, n, k, alpha, a, lda, w, ldw, beta, c, ldc);
}

inline void Gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, float alpha,
                 const float* a, int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  SgemmRowMajor(ta == CblasTrans, tb == CblasTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

inline void Gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha,
                 const double* a, int lda, const double* b, int ldb, double beta, double* c,
                 int ldc) {
  cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

inline void GemmWeight(CBLAS_TRANSPOSE tb, int m, int n, int k, double alpha, const double* a,
                       int lda, const double* w, int ldw, double beta, double* c, int ldc) {
  Gemm(CblasNoTrans, tb, m, n, k, alpha, a, lda, w, ldw, beta, c, ldc);
}

// exp for the elementwise loops. Doubles (the gradient checks) use libm. Floats use a Cephes-style
// polynomial that the compiler vectorises (libm's expf is a scalar call, and its vector variants
// need -ffast-math, which would break the NaN checks): 2^n * p(r), n = round(x / ln 2) by the
// 1.5 * 2^23 trick, r = x - n ln 2, relative error about 2e-7 (1-2 ulp). NaN stays NaN; inputs are
// clamped to [-87.3, 88], the range of normal float results.
inline double Exp(double x) { return std::exp(x); }
inline float Exp(float x) {
  x = x < -87.3f ? -87.3f : x;
  x = x > 88.0f ? 88.0f : x;
  constexpr float kShift = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float shifted = x * 1.44269504088896341f + kShift;
  const float n = shifted - kShift;
  const float r = (x - n * 0.693359375f) + n * 2.12194440e-4f;  // ln 2 in two parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t bits;
  std::memcpy(&bits, &shifted, sizeof(bits));
  const int32_t scale_bits = (bits - 0x4B400000 + 127) << 23;  // n + 127 in the exponent field
  float scale;
  std::memcpy(&scale, &scale_bits, sizeof(scale));
  return p * scale;
}

// Softmax of row[0, n) in place (n >= 1): exp(x - max) / sum. Returns the max and the sum (the
// row's log-sum-exp is max + log(sum)).
template <typename T>
struct RowStats {
  T max, sum;
};
template <typename T>
inline RowStats<T> SoftmaxInPlace(T* row, int n) {
  T maxval = row[0];
#pragma omp simd reduction(max : maxval)
  for (int j = 1; j < n; ++j) maxval = row[j] > maxval ? row[j] : maxval;
  T sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int j = 0; j < n; ++j) {
    row[j] = Exp(row[j] - maxval);
    sum += row[j];
  }
  const T inv = T(1) / sum;
#pragma omp simd
  for (int j = 0; j < n; ++j) row[j] *= inv;
  return {maxval, sum};
}

// Softmax backward in place through a scale: d[j] = p[j] * (d[j] - sum_k d[k] p[k]) * scale.
template <typename T>
inline void SoftmaxBackwardInPlace(T* d, const T* p, int n, T scale) {
  T dot = 0;
#pragma omp simd reduction(+ : dot)
  for (int j = 0; j < n; ++j) dot += d[j] * p[j];
#pragma omp simd
  for (int j = 0; j < n; ++j) d[j] = p[j] * (d[j] - dot) * scale;
}

}  // namespace bigmac::sdk::cpu::internal

#endif  // BIGMAC_STAGES_CPU_MATH_H_
