// CUDA kernels: LayerNorm forward and backward. The CPU twin: stages/cpu/kernels.cc:
// LayerNormForward/Backward (the contract: stages/cuda/kernels.h; the shared conventions:
// kernel_common.h).

#include "stages/cuda/kernel_common.h"

namespace bigmac::stages::cuda {
namespace {

// ---------------------------------------------------------------------------------------------
// LayerNorm: one warp per row, 8 rows per block.

constexpr int kRowsPerBlock = kThreads / kWarp;

template <typename T, int W>
__global__ void LayerNormForwardKernel(T* out, float* mean, float* rstd, const T* inp, const T* w,
                                       const T* b, int n, int c) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= n) return;  // the whole warp leaves together
  const T* x = inp + int64_t{row} * c;
  float sum = 0.0f;
  for (int i = lane * W; i < c; i += kWarp * W) {
    const Pack<T, W> p = LoadPack<W>(x + i);
#pragma unroll
    for (int k = 0; k < W; ++k) sum += ToF(p.v[k]);
  }
  const float m = WarpReduce(sum, SumOp{}) / c;
  float var = 0.0f;
  for (int i = lane * W; i < c; i += kWarp * W) {
    const Pack<T, W> p = LoadPack<W>(x + i);
#pragma unroll
    for (int k = 0; k < W; ++k) var += (ToF(p.v[k]) - m) * (ToF(p.v[k]) - m);
  }
  const float s = 1.0f / sqrtf(WarpReduce(var, SumOp{}) / c + kLayerNormEps);
  T* o = out + int64_t{row} * c;
  for (int i = lane * W; i < c; i += kWarp * W) {
    const Pack<T, W> xp = LoadPack<W>(x + i);
    const Pack<T, W> wp = LoadPack<W>(w + i);
    const Pack<T, W> bp = LoadPack<W>(b + i);
    Pack<T, W> y;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      y.v[k] = FromF<T>((ToF(xp.v[k]) - m) * s * ToF(wp.v[k]) + ToF(bp.v[k]));
    }
    StorePack(o + i, y);
  }
  if (lane == 0) {
    if (mean) mean[row] = m;
    if (rstd) rstd[row] = s;
  }
}

template <typename T, int W>
__global__ void LayerNormBackwardInputKernel(T* dinp, const T* dout, const T* inp, const T* w,
                                             const float* mean, const float* rstd, int n, int c) {
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= n) return;
  const T* x = inp + int64_t{row} * c;
  const T* dy = dout + int64_t{row} * c;
  T* dx = dinp + int64_t{row} * c;
  const float m = mean[row];
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
  const float dnorm_mean = WarpReduce(dnorm_sum, SumOp{}) / c;
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
// order into partial_w/partial_b[chunk][col].
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
    const float m = mean[row];
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
    partial_b[int64_t{chunk} * c + col + k] = sum_b[k];
  }
}

}  // namespace

template <typename T>
void LayerNormForward(const CallSite& site, T* out, float* mean, float* rstd, const T* inp,
                      const T* w, const T* b, int n, int c) {
  if (n <= 0 || c <= 0) return;
  constexpr int V = kVec<T>;
  const int blocks = static_cast<int>(CeilDiv(n, kRowsPerBlock));
  if (c % V == 0 && Aligned(out, inp, w, b)) {
    LaunchKernel("LayerNormForwardKernel", LayerNormForwardKernel<T, V>, blocks, kThreads, 0,
                 site.stream(), out, mean, rstd, inp, w, b, n, c);
  } else {
    LaunchKernel("LayerNormForwardKernel", LayerNormForwardKernel<T, 1>, blocks, kThreads, 0,
                 site.stream(), out, mean, rstd, inp, w, b, n, c);
  }
  CheckLaunch("LayerNormForwardKernel", site);
}

template <typename T>
void LayerNormBackwardInput(const CallSite& site, T* dinp, const T* dout, const T* inp, const T* w,
                            const float* mean, const float* rstd, int n, int c) {
  if (n <= 0 || c <= 0) return;
  constexpr int V = kVec<T>;
  const int blocks = static_cast<int>(CeilDiv(n, kRowsPerBlock));
  if (c % V == 0 && Aligned(dinp, dout, inp, w)) {
    LaunchKernel("LayerNormBackwardInputKernel", LayerNormBackwardInputKernel<T, V>, blocks,
                 kThreads, 0, site.stream(), dinp, dout, inp, w, mean, rstd, n, c);
  } else {
    LaunchKernel("LayerNormBackwardInputKernel", LayerNormBackwardInputKernel<T, 1>, blocks,
                 kThreads, 0, site.stream(), dinp, dout, inp, w, mean, rstd, n, c);
  }
  CheckLaunch("LayerNormBackwardInputKernel", site);
}

template <typename T>
void LayerNormBackwardWeight(const CallSite& site, float* dw, float* db, const T* dout,
                             const T* inp, const float* mean, const float* rstd, int n, int c) {
  if (n <= 0 || c <= 0) return;
  constexpr int V = kVec<T>;
  const ColumnChunks chunks = ChunkRows(n, c, 2, "LayerNormBackwardWeight", site);
  float* partial_w = static_cast<float*>(site.context->reduce_scratch);
  float* partial_b = partial_w + int64_t{chunks.chunks} * c;
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
  AddChunkSums(db, partial_b, chunks.chunks, c, site);
}

#define BIGMAC_INSTANTIATE(T)                                                                   \
  template void LayerNormForward<T>(const CallSite&, T*, float*, float*, const T*, const T*,    \
                                    const T*, int, int);                                        \
  template void LayerNormBackwardInput<T>(const CallSite&, T*, const T*, const T*, const T*,    \
                                          const float*, const float*, int, int);                \
  template void LayerNormBackwardWeight<T>(const CallSite&, float*, float*, const T*, const T*, \
                                           const float*, const float*, int, int);

BIGMAC_INSTANTIATE(float)
BIGMAC_INSTANTIATE(__nv_bfloat16)
#undef BIGMAC_INSTANTIATE

}  // namespace bigmac::stages::cuda
