// CUDA kernels: the fused softmax cross-entropy (loss and logit gradients in one pass). The CPU
// twin: stages/cpu/kernels.cc: CrossEntropy (the contract: stages/cuda/kernels.h; the shared
// conventions: kernel_common.h).

#include "stages/cuda/kernel_common.h"

namespace bigmac::stages::cuda {
namespace {

// ---------------------------------------------------------------------------------------------
// Fused softmax cross-entropy: one block per row.

constexpr int kCrossEntropyThreads = 512;

template <typename T, int W>
__global__ void CrossEntropyKernel(T* logits, double* row_loss, const int32_t* targets, int v,
                                   int64_t ld, float scale) {
  const int row = blockIdx.x;
  T* l = logits + row * ld;
  const int target = targets[row];
  const bool valid = 0 <= target && target < v;
  // Read before the row is overwritten (the writes come after the barriers below).
  const float target_logit = valid ? ToF(l[target]) : NAN;
  const int step = blockDim.x * W;
  float m = -INFINITY;
  for (int j = threadIdx.x * W; j < v; j += step) {
    const Pack<T, W> p = LoadPack<W>(l + j);  // j + W <= ld when W > 1 (ld % W == 0)
#pragma unroll
    for (int k = 0; k < W; ++k) {
      if (j + k < v) m = fmaxf(m, ToF(p.v[k]));
    }
  }
  m = BlockMax(m);
  float sum = 0.0f;
  for (int j = threadIdx.x * W; j < v; j += step) {
    const Pack<T, W> p = LoadPack<W>(l + j);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      if (j + k < v) sum += expf(ToF(p.v[k]) - m);
    }
  }
  sum = BlockSum(sum);
  const float inv = 1.0f / sum;
  for (int j = threadIdx.x * W; j < ld; j += step) {
    Pack<T, W> p = LoadPack<W>(l + j);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const int col = j + k;
      const float onehot = col == target ? 1.0f : 0.0f;
      const float d = col < v ? scale * (expf(ToF(p.v[k]) - m) * inv - onehot) : 0.0f;
      p.v[k] = FromF<T>(d);
    }
    StorePack(l + j, p);
  }
  if (threadIdx.x == 0) {
    row_loss[row] =
        static_cast<double>(m) + log(static_cast<double>(sum)) - static_cast<double>(target_logit);
  }
}

// One warp: *loss = scale * the sum of the row losses, added in double in row order (each
// 32-row slice is loaded coalesced, then every lane adds the slice's values in lane order).
__global__ void SumRowLossesKernel(float* loss, const double* row_loss, int n, double scale) {
  const int lane = threadIdx.x;
  double total = 0.0;
  for (int base = 0; base < n; base += kWarp) {
    const double mine = base + lane < n ? row_loss[base + lane] : 0.0;
    const int count = min(kWarp, n - base);
    for (int k = 0; k < count; ++k) total += __shfl_sync(0xffffffffu, mine, k);
  }
  if (lane == 0) *loss = static_cast<float>(scale * total);
}

}  // namespace

template <typename T>
void CrossEntropyForwardBackward(const CallSite& site, T* logits, float* loss,
                                 const int32_t* targets, int n, int v, int64_t ld, double scale) {
  if (v <= 0 || ld < v) {
    throw DeviceError("CrossEntropyForwardBackward: vocabulary " + std::to_string(v) +
                      " with row stride " + std::to_string(ld) + ", in " + site.where);
  }
  if (n <= 0) {
    BIGMAC_CUDA_CHECK(cudaMemsetAsync(loss, 0, sizeof(float), site.stream()), site.where);
    return;
  }
  constexpr int V = kVec<T>;
  double* row_loss = static_cast<double*>(
      Scratch(site, int64_t{n} * sizeof(double), "CrossEntropyForwardBackward", "the row losses"));
  const float scale_f = static_cast<float>(scale);  // the CPU's T(scale)
  if (ld % V == 0 && Aligned(logits)) {
    LaunchKernel("CrossEntropyKernel", CrossEntropyKernel<T, V>, n, kCrossEntropyThreads, 0,
                 site.stream(), logits, row_loss, targets, v, ld, scale_f);
  } else {
    LaunchKernel("CrossEntropyKernel", CrossEntropyKernel<T, 1>, n, kCrossEntropyThreads, 0,
                 site.stream(), logits, row_loss, targets, v, ld, scale_f);
  }
  CheckLaunch("CrossEntropyKernel", site);
  LaunchKernel("SumRowLossesKernel", SumRowLossesKernel, 1, kWarp, 0, site.stream(), loss, row_loss,
               n, scale);
  CheckLaunch("SumRowLossesKernel", site);
}

#define BIGMAC_INSTANTIATE(T)                                                                    \
  template void CrossEntropyForwardBackward<T>(const CallSite&, T*, float*, const int32_t*, int, \
                                               int, int64_t, double);

BIGMAC_INSTANTIATE(float)
BIGMAC_INSTANTIATE(__nv_bfloat16)
#undef BIGMAC_INSTANTIATE

}  // namespace bigmac::stages::cuda
