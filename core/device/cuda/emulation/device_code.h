#ifndef BIGMAC_CORE_DEVICE_CUDA_EMULATION_DEVICE_CODE_H_
#define BIGMAC_CORE_DEVICE_CUDA_EMULATION_DEVICE_CODE_H_

// Force-included (g++ -include) before every .cu file that the emulated build compiles as C++:
// the CUDA language's device-side names, mapped onto the execution model in grid.h. The kernel
// sources themselves are the ones nvcc compiles; nothing here is a second copy of a kernel.
// Test-only.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>

#include "core/device/cuda/emulation/grid.h"

// Function and variable qualifiers. cuda_runtime.h defines them as nothing for a host compiler,
// except __shared__: a block's threads share one OS thread, so a function-local static
// thread_local is one copy per block (grid.h).
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __shared__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static thread_local

#define threadIdx (::bigmac::device::cuda::emulation::CurrentThread().thread_idx)
#define blockIdx (::bigmac::device::cuda::emulation::CurrentThread().block_idx)
#define blockDim (::bigmac::device::cuda::emulation::CurrentThread().block_dim)
#define gridDim (::bigmac::device::cuda::emulation::CurrentThread().grid_dim)
inline constexpr int warpSize = 32;

inline void __syncthreads() { ::bigmac::device::cuda::emulation::SyncThreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::bigmac::device::cuda::emulation::SyncWarp(mask);
}

namespace bigmac::device::cuda::emulation {
inline int LaneId() { return static_cast<int>(CurrentThread().thread_idx.x % 32); }
// The lane `lane` of the caller's `width`-lane segment, as the shuffles define it.
inline int SegmentLane(int lane, int width) { return (LaneId() & ~(width - 1)) | (lane % width); }
}  // namespace bigmac::device::cuda::emulation

template <typename T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
  namespace e = ::bigmac::device::cuda::emulation;
  return e::FromBits<T>(
      e::WarpExchange(mask, e::ToBits(var), e::SegmentLane(src_lane, width), "__shfl_sync"));
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
  namespace e = ::bigmac::device::cuda::emulation;
  const int lane = e::LaneId();
  const int source = lane ^ lane_mask;
  // A source outside the caller's segment gives the caller its own value.
  const bool outside = (source & ~(width - 1)) != (lane & ~(width - 1));
  return e::FromBits<T>(
      e::WarpExchange(mask, e::ToBits(var), outside ? lane : source, "__shfl_xor_sync"));
}
template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  namespace e = ::bigmac::device::cuda::emulation;
  const int lane = e::LaneId();
  const int source = lane + static_cast<int>(delta);
  const bool outside = (source & ~(width - 1)) != (lane & ~(width - 1));
  return e::FromBits<T>(
      e::WarpExchange(mask, e::ToBits(var), outside ? lane : source, "__shfl_down_sync"));
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return ::bigmac::device::cuda::emulation::WarpBallot(mask, predicate != 0, "__ballot_sync");
}
inline int __any_sync(unsigned mask, int predicate) {
  return ::bigmac::device::cuda::emulation::WarpBallot(mask, predicate != 0, "__any_sync") != 0;
}
inline int __all_sync(unsigned mask, int predicate) {
  return (::bigmac::device::cuda::emulation::WarpBallot(mask, predicate != 0, "__all_sync") &
          mask) == mask;
}

// Atomics: the blocks of a launch run on several OS threads, so these are real atomics.
template <typename T>
T atomicAdd(T* address, T value) {
  return std::atomic_ref<T>(*address).fetch_add(value, std::memory_order_relaxed);
}
template <typename T>
T atomicMax(T* address, T value) {
  std::atomic_ref<T> ref(*address);
  T old = ref.load(std::memory_order_relaxed);
  while (old < value && !ref.compare_exchange_weak(old, value, std::memory_order_relaxed)) {
  }
  return old;
}
template <typename T>
T atomicExch(T* address, T value) {
  return std::atomic_ref<T>(*address).exchange(value, std::memory_order_relaxed);
}
template <typename T>
T atomicCAS(T* address, T compare, T value) {
  std::atomic_ref<T>(*address).compare_exchange_strong(compare, value, std::memory_order_relaxed);
  return compare;
}

// cuda_runtime.h declares this template overload for nvcc only.
template <typename R, typename... A>
cudaError_t cudaFuncSetAttribute(R (*entry)(A...), cudaFuncAttribute attr, int value) {
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(entry), attr, value);
}

// Device math the host library lacks.
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
using std::isfinite;
using std::max;
using std::min;

#endif  // BIGMAC_CORE_DEVICE_CUDA_EMULATION_DEVICE_CODE_H_
