// CUDA kernels: LayerNorm and RMSNorm, forward and backward. The CPU twin: stages/cpu/kernels.cc:
// LayerNorm*, RmsNorm* (the contract: stages/cuda/kernels.h; the shared conventions:
// kernel_common.h). RMSNorm is LayerNorm without the centring and the bias (kRms: mean 0), so one
// set of kernels serves both.

#include "stages/cuda/kernel_common.h"

namespace bigmac::stages::cuda {
namespace {

// ---------------------------------------------------------------------------------------------
// LayerNorm: one warp per row, 8 rows per block. With kRms (RMSNorm) the mean is 0 and there
// is no bias (b, mean and db unused).

constexpr int kRowsPerBlock = kThreads / kWarp;

template <typename T, int W, bool kRms>
__global__ void LayerNormForwardKernel(T* out, float* mean, float* rstd, const T* inp, const T* w,
                                       const T* b, int n, int c, float eps) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= n) return;  // the whole warp leaves together
  const T* x = inp + int64_t{row} * c;
  float m = 0.0f;
  if constexpr (!kRms) {
    float sum = 0.0f;
    for (int i = lane * W; i < c; i += kWarp * W) {
      const Pack<T, W> p = LoadPack<W>(x + i);
#pragma unroll
      for (int k = 0; k < W; ++k) sum += ToF(p.v[k]);
    }
    m = WarpReduce(sum, SumOp{}) / c;
  }
  float var = 0.0f;
  for (int i = lane * W; i < c; i += kWarp * W) {
    const Pack<T, W> p = LoadPack<W>(x + i);
#pragma unroll
    for (int k = 0; k < W; ++k) var += (ToF(p.v[k]) - m) * (ToF(p.v[k]) - m);
  }
  const float s = 1.0f / sqrtf(WarpReduce(var, SumOp{}) / c + eps);
  T* o = out + int64_t{row} * c;
  for (int i = lane * W; i < c; i += kWarp * W) {
    const Pack<T, W> xp = LoadPack<W>(x + i);
    const Pack<T, W> wp = LoadPack<W>(w + i);
    Pack<T, W> y;
    if constexpr (kRms) {
#pragma unroll
      for (int k = 0; k < W; ++k) y.v[k] = FromF<T>(ToF(xp.v[k]) * s * ToF(wp.v[k]));
    } else {
      const Pack<T, W> bp = LoadPack<W>(b + i);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        y.v[k] = FromF<T>((ToF(xp.v[k]) - m) * s * ToF(wp.v[k]) + ToF(bp.v[k]));
      }
    }
    StorePack(o + i, y);
  }
  if (lane == 0) {
    if (mean) mean[row] = m;
    if (rstd) rstd[row] = s;
  }
}

// dx += s (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = w dy, norm = (x - m) s;
// for RMSNorm (m = 0, no mean(dnorm) term) this is the CPU's s w dy - x s^3 / C sum(w dy x).
template <typename T, int W, bool kRms>
__global__ void LayerNormBackwardInputKernel(T* dinp, const T* dout, const T* inp, const T* w,
                                             const float* mean, const float* rstd, int n, int c) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= n) return;
  const T* x = inp + int64_t{row} * c;
  const T* dy = dout + int64_t{row} * c;
  T* dx = dinp + int64_t{row} * c;
  const float m = kRms ? 0.0f : mean[row];
  const float s = rstd[row];
  float dnorm_sum = 0.0f;
  float dnorm_norm_sum = 0.0f;
  for (int i = lane * W; i < c; i += kWarp * W) {
    const Pack<T, W> xp = LoadPack<W>(x + i);
    const Pack<T, W> wp = LoadPack<W>(w + i);
    const Pack<T, W> dp = LoadPack<W>(dy + i);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float norm = (ToF(xp.v[k]) - m) * s;
      const float dnorm = ToF(wp.v[k]) * ToF(dp.v[k]);
      dnorm_sum += dnorm;
      dnorm_norm_sum += dnorm * norm;
    }
  }
  const float dnorm_mean = kRms ? 0.0f : WarpReduce(dnorm_sum, SumOp{}) / c;
  const float dnorm_norm_mean = WarpReduce(dnorm_norm_sum, SumOp{}) / c;
  for (int i = lane * W; i < c; i += kWarp * W) {
    const Pack<T, W> xp = LoadPack<W>(x + i);
    const Pack<T, W> wp = LoadPack<W>(w + i);
    const Pack<T, W> dp = LoadPack<W>(dy + i);
    Pack<T, W> g = LoadPack<W>(dx + i);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float norm = (ToF(xp.v[k]) - m) * s;
      const float dnorm = ToF(wp.v[k]) * ToF(dp.v[k]);
      g.v[k] = FromF<T>(ToF(g.v[k]) + s * (dnorm - dnorm_mean - norm * dnorm_norm_mean));
    }
    StorePack(dx + i, g);
  }
}

// Stage one of the weight gradients: thread (column group, row chunk) sums its chunk's rows in
// order into partial_w/partial_b[chunk][col]. RMSNorm: mean and partial_b are null.
template <typename T, int W>
__global__ void LayerNormWeightPartialsKernel(float* partial_w, float* partial_b, const T* dout,
                                              const T* inp, const float* mean, const float* rstd,
                                              int n, int c, int rows_per_chunk) {
  const int col = (blockIdx.x * blockDim.x + threadIdx.x) * W;
  if (col >= c) return;
  const int chunk = blockIdx.y;
  const int begin = chunk * rows_per_chunk;
  const int end = min(n, begin + rows_per_chunk);
  float sum_w[W] = {};
  float sum_b[W] = {};
  for (int row = begin; row < end; ++row) {
    const float m = mean ? mean[row] : 0.0f;
    const float s = rstd[row];
    const Pack<T, W> dp = LoadPack<W>(dout + int64_t{row} * c + col);
    const Pack<T, W> xp = LoadPack<W>(inp + int64_t{row} * c + col);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float d = ToF(dp.v[k]);
      sum_w[k] += d * (ToF(xp.v[k]) - m) * s;
      sum_b[k] += d;
    }
  }
#pragma unroll
  for (int k = 0; k < W; ++k) {
    partial_w[int64_t{chunk} * c + col + k] = sum_w[k];
    if (partial_b) partial_b[int64_t{chunk} * c + col + k] = sum_b[k];
  }
}

// The launchers LayerNorm and RMSNorm share.
template <bool kRms, typename T>
void NormForward(const CallSite& site, T* out, float* mean, float* rstd, const T* inp, const T* w,
                 const T* b, int n, int c, float eps) {
  if (n <= 0 || c <= 0) return;
  constexpr int V = kVec<T>;
  const int blocks = static_cast<int>(CeilDiv(n, kRowsPerBlock));
  if (c % V == 0 && Aligned(out, inp, w, b)) {
    LaunchKernel("LayerNormForwardKernel", LayerNormForwardKernel<T, V, kRms>, blocks, kThreads, 0,
                 site.stream(), out, mean, rstd, inp, w, b, n, c, eps);
  } else {
    LaunchKernel("LayerNormForwardKernel", LayerNormForwardKernel<T, 1, kRms>, blocks, kThreads, 0,
                 site.stream(), out, mean, rstd, inp, w, b, n, c, eps);
  }
  CheckLaunch("LayerNormForwardKernel", site);
}

template <bool kRms, typename T>
void NormBackwardInput(const CallSite& site, T* dinp, const T* dout, const T* inp, const T* w,
                       const float* mean, const float* rstd, int n, int c) {
  if (n <= 0 || c <= 0) return;
  constexpr int V = kVec<T>;
  const int blocks = static_cast<int>(CeilDiv(n, kRowsPerBlock));
  if (c % V == 0 && Aligned(dinp, dout, inp, w)) {
    LaunchKernel("LayerNormBackwardInputKernel", LayerNormBackwardInputKernel<T, V, kRms>, blocks,
                 kThreads, 0, site.stream(), dinp, dout, inp, w, mean, rstd, n, c);
  } else {
    LaunchKernel("LayerNormBackwardInputKernel", LayerNormBackwardInputKernel<T, 1, kRms>, blocks,
                 kThreads, 0, site.stream(), dinp, dout, inp, w, mean, rstd, n, c);
  }
  CheckLaunch("LayerNormBackwardInputKernel", site);
}

// db and mean null: RMSNorm.
template <typename T>
void NormBackwardWeight(const CallSite& site, float* dw, float* db, const T* dout, const T* inp,
                        const float* mean, const float* rstd, int n, int c, const char* name) {
  if (n <= 0 || c <= 0) return;
  constexpr int V = kVec<T>;
  const int arrays = db ? 2 : 1;
  const ColumnChunks chunks = ChunkRows(n, c, arrays, name, site);
  float* partial_w = static_cast<float*>(site.context->reduce_scratch);
  float* partial_b = db ? partial_w + int64_t{chunks.chunks} * c : nullptr;
  const bool vector = c % V == 0 && Aligned(dout, inp);
  const int w = vector ? V : 1;
  const dim3 grid(static_cast<unsigned>(CeilDiv(CeilDiv(c, w), kColumnThreads)), chunks.chunks);
  if (vector) {
    LaunchKernel("LayerNormWeightPartialsKernel", LayerNormWeightPartialsKernel<T, V>, grid,
                 kColumnThreads, 0, site.stream(), partial_w, partial_b, dout, inp, mean, rstd, n,
                 c, chunks.rows_per_chunk);
  } else {
    LaunchKernel("LayerNormWeightPartialsKernel", LayerNormWeightPartialsKernel<T, 1>, grid,
                 kColumnThreads, 0, site.stream(), partial_w, partial_b, dout, inp, mean, rstd, n,
                 c, chunks.rows_per_chunk);
  }
  CheckLaunch("LayerNormWeightPartialsKernel", site);
  AddChunkSums(dw, partial_w, chunks.chunks, c, site);
  if (db) AddChunkSums(db, partial_b, chunks.chunks, c, site);
}

}  // namespace

template <typename T>
void LayerNormForward(const CallSite& site, T* out, float* mean, float* rstd, const T* inp,
                      const T* w, const T* b, int n, int c) {
  NormForward<false>(site, out, mean, rstd, inp, w, b, n, c, kLayerNormEps);
}

template <typename T>
void LayerNormBackwardInput(const CallSite& site, T* dinp, const T* dout, const T* inp, const T* w,
                            const float* mean, const float* rstd, int n, int c) {
  NormBackwardInput<false>(site, dinp, dout, inp, w, mean, rstd, n, c);
}

template <typename T>
void LayerNormBackwardWeight(const CallSite& site, float* dw, float* db, const T* dout,
                             const T* inp, const float* mean, const float* rstd, int n, int c) {
  NormBackwardWeight(site, dw, db, dout, inp, mean, rstd, n, c, "LayerNormBackwardWeight");
}

template <typename T>
void RmsNormForward(const CallSite& site, T* out, float* rstd, const T* inp, const T* w, int n,
                    int c, double eps) {
  NormForward<true>(site, out, static_cast<float*>(nullptr), rstd, inp, w,
                    static_cast<const T*>(nullptr), n, c, static_cast<float>(eps));
}

template <typename T>
void RmsNormBackwardInput(const CallSite& site, T* dinp, const T* dout, const T* inp, const T* w,
                          const float* rstd, int n, int c) {
  NormBackwardInput<true>(site, dinp, dout, inp, w, static_cast<const float*>(nullptr), rstd, n, c);
}

template <typename T>
void RmsNormBackwardWeight(const CallSite& site, float* dw, const T* dout, const T* inp,
                           const float* rstd, int n, int c) {
  NormBackwardWeight(site, dw, static_cast<float*>(nullptr), dout, inp,
                     static_cast<const float*>(nullptr), rstd, n, c, "RmsNormBackwardWeight");
}

#define BIGMAC_INSTANTIATE(T)                                                                   \
  template void LayerNormForward<T>(const CallSite&, T*, float*, float*, const T*, const T*,    \
                                    const T*, int, int);                                        \
  template void LayerNormBackwardInput<T>(const CallSite&, T*, const T*, const T*, const T*,    \
                                          const float*, const float*, int, int);                \
  template void LayerNormBackwardWeight<T>(const CallSite&, float*, float*, const T*, const T*, \
                                           const float*, const float*, int, int);               \
  template void RmsNormForward<T>(const CallSite&, T*, float*, const T*, const T*, int, int,    \
                                  double);                                                      \
  template void RmsNormBackwardInput<T>(const CallSite&, T*, const T*, const T*, const T*,      \
                                        const float*, int, int);                                \
  template void RmsNormBackwardWeight<T>(const CallSite&, float*, const T*, const T*,           \
                                         const float*, int, int);

BIGMAC_INSTANTIATE(float)
BIGMAC_INSTANTIATE(__nv_bfloat16)
#undef BIGMAC_INSTANTIATE

}  // namespace bigmac::stages::cuda
