#ifndef BIGMAC_PLUGINS_EXAMPLES_RMS_SWIGLU_RMS_SWIGLU_KERNELS_H_
#define BIGMAC_PLUGINS_EXAMPLES_RMS_SWIGLU_RMS_SWIGLU_KERNELS_H_

// CPU kernels of the example plugin, for T = float and double. Rows are N tokens of width C.
// Like bigmac's own kernels: static OpenMP schedules, no cross-thread reductions (bitwise
// reproducible), "Forward" overwrites, "BackwardInput" and "BackwardWeight" accumulate (+=).

#include <cmath>
#include <cstdint>

namespace rms_swiglu {

inline constexpr double kRmsEpsilon = 1e-5;

// out = inp * rstd * w per row, rstd = 1 / sqrt(mean(inp^2) + eps); keeps rstd (N).
template <typename T>
void RmsNormForward(T* out, T* rstd, const T* inp, const T* w, int n, int c) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < n; ++i) {
    const T* x = inp + int64_t{i} * c;
    double sum_squares = 0;
    for (int j = 0; j < c; ++j) sum_squares += double{x[j]} * x[j];
    const T r = static_cast<T>(1.0 / std::sqrt(sum_squares / c + kRmsEpsilon));
    rstd[i] = r;
    T* y = out + int64_t{i} * c;
    for (int j = 0; j < c; ++j) y[j] = x[j] * r * w[j];
  }
}

// dinp += d/dinp of sum(dout * out): rstd * w * dout - inp * rstd^3 / C * sum(w * dout * inp).
template <typename T>
void RmsNormBackwardInput(T* dinp, const T* dout, const T* inp, const T* w, const T* rstd, int n,
                          int c) {
#pragma omp parallel for schedule(static)
  for (int i = 0; i < n; ++i) {
    const T* x = inp + int64_t{i} * c;
    const T* dy = dout + int64_t{i} * c;
    T* dx = dinp + int64_t{i} * c;
    double dot = 0;
    for (int j = 0; j < c; ++j) dot += double{w[j]} * dy[j] * x[j];
    const double r = rstd[i];
    const T scale = static_cast<T>(r * r * r * dot / c);
    for (int j = 0; j < c; ++j) dx[j] += static_cast<T>(r) * w[j] * dy[j] - x[j] * scale;
  }
}

// dw += sum over rows of dout * inp * rstd. Threads own columns, so no reduction across threads.
template <typename T>
void RmsNormBackwardWeight(T* dw, const T* dout, const T* inp, const T* rstd, int n, int c) {
#pragma omp parallel for schedule(static)
  for (int j = 0; j < c; ++j) {
    double sum = 0;
    for (int i = 0; i < n; ++i) {
      const int64_t at = int64_t{i} * c + j;
      sum += double{dout[at]} * inp[at] * rstd[i];
    }
    dw[j] += static_cast<T>(sum);
  }
}

template <typename T>
T Sigmoid(T x) {
  return T{1} / (T{1} + std::exp(-x));
}

// h = silu(gate) * up, silu(g) = g * sigmoid(g).
template <typename T>
void SwigluForward(T* h, const T* gate, const T* up, int64_t count) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) h[i] = gate[i] * Sigmoid(gate[i]) * up[i];
}

// dgate = dh * up * silu'(gate), dup = dh * silu(gate) (overwritten).
template <typename T>
void SwigluBackward(T* dgate, T* dup, const T* dh, const T* gate, const T* up, int64_t count) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) {
    const T s = Sigmoid(gate[i]);
    dgate[i] = dh[i] * up[i] * (s + gate[i] * s * (T{1} - s));
    dup[i] = dh[i] * gate[i] * s;
  }
}

}  // namespace rms_swiglu

#endif  // BIGMAC_PLUGINS_EXAMPLES_RMS_SWIGLU_RMS_SWIGLU_KERNELS_H_
