// CUDA kernels: rotary position embeddings (Hugging Face's half-rotation), in place. The CPU twin:
// stages/cpu/kernels.cc: RopeForward/RopeBackward (the contract: stages/cuda/kernels.h; the shared
// conventions: kernel_common.h).

#include "stages/cuda/kernel_common.h"

namespace bigmac::stages::cuda {
namespace {

// One thread per (row, head, i < hs/2): the pair (lo, hi) = (x[i], x[i + hs/2]) of the head turns
// by the angle of (row % t, i); sign -1 turns it back (the transpose, for the gradient).
template <typename T>
__global__ void RopeKernel(T* x, const float* cos, const float* sin, int64_t rows, int t, int heads,
                           int hs, int64_t ld, float sign) {
  const int half = hs / 2;
  const int64_t per_row = int64_t{heads} * half;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t p = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; p < rows * per_row;
       p += stride) {
    const int64_t row = p / per_row;
    const int head = static_cast<int>((p % per_row) / half);
    const int i = static_cast<int>(p % half);
    const int64_t angle = (row % t) * half + i;
    const float c = cos[angle];
    const float s = sin[angle];
    T* lo = x + row * ld + int64_t{head} * hs + i;
    T* hi = lo + half;
    const float a = ToF(*lo);
    const float z = ToF(*hi);
    *lo = FromF<T>(a * c - sign * z * s);
    *hi = FromF<T>(z * c + sign * a * s);
  }
}

template <typename T>
void Rope(const char* name, const CallSite& site, T* x, const float* cos, const float* sin, int b,
          int t, int heads, int hs, int64_t ld, float sign) {
  const int64_t rows = int64_t{b} * t;
  if (rows <= 0 || heads <= 0 || hs <= 0) return;
  if (hs % 2 != 0 || ld < int64_t{heads} * hs) {
    throw DeviceError(std::string(name) + ": head dim " + std::to_string(hs) +
                      " must be even and " + std::to_string(heads) +
                      " heads must fit in a row of " + std::to_string(ld) + ", in " + site.where);
  }
  const int blocks = GridStrideBlocks(rows * heads * (hs / 2), kThreads, site);
  LaunchKernel(name, RopeKernel<T>, blocks, kThreads, 0, site.stream(), x, cos, sin, rows, t, heads,
               hs, ld, sign);
  CheckLaunch(name, site);
}

}  // namespace

template <typename T>
void RopeForward(const CallSite& site, T* x, const float* cos, const float* sin, int b, int t,
                 int heads, int hs, int64_t ld) {
  Rope("RopeForward", site, x, cos, sin, b, t, heads, hs, ld, 1.0f);
}

template <typename T>
void RopeBackward(const CallSite& site, T* dx, const float* cos, const float* sin, int b, int t,
                  int heads, int hs, int64_t ld) {
  Rope("RopeBackward", site, dx, cos, sin, b, t, heads, hs, ld, -1.0f);
}

#define BIGMAC_INSTANTIATE(T)                                                                   \
  template void RopeForward<T>(const CallSite&, T*, const float*, const float*, int, int, int,  \
                               int, int64_t);                                                   \
  template void RopeBackward<T>(const CallSite&, T*, const float*, const float*, int, int, int, \
                                int, int64_t);

BIGMAC_INSTANTIATE(float)
BIGMAC_INSTANTIATE(__nv_bfloat16)
#undef BIGMAC_INSTANTIATE

}  // namespace bigmac::stages::cuda
