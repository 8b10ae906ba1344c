// What the kernel files of stages/cuda share (included by .cu files only): element packs,
// deterministic warp and block reductions, and the launchers' host-side helpers.
//
// Conventions used throughout:
// - Every kernel computes in fp32; T is only the storage type (float or __nv_bfloat16).
// - W is the number of elements one thread loads at once: kVec<T> (16 bytes: 4 floats, 8 bf16)
//   when the sizes and pointers allow 128-bit accesses, else 1 (the scalar path). One kernel
//   template serves both.
// - Reductions are deterministic: each thread sums a fixed set of elements in a fixed order,
//   warps combine with xor butterflies (every lane ends with the same bits, since float addition
//   is commutative), blocks combine warp results in warp order, and sums across blocks go
//   through reduce_scratch in two stages. No float atomics anywhere.

#ifndef BIGMAC_STAGES_CUDA_KERNEL_COMMON_H_
#define BIGMAC_STAGES_CUDA_KERNEL_COMMON_H_

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "core/device/cuda/check.h"
#include "core/device/cuda/context.h"
#include "core/device/cuda/launch.h"
#include "stages/cuda/kernels.h"
#include "stages/numerics.h"

namespace bigmac::stages::cuda {
namespace {

using device::DeviceError;
using device::cuda::CheckLaunch;
using device::cuda::kReduceScratchBytes;
using device::cuda::LaunchKernel;

constexpr float kLayerNormEps = static_cast<float>(::bigmac::stages::kLayerNormEpsilon);
constexpr float kGeluCubic = static_cast<float>(::bigmac::stages::kGeluCubic);
constexpr int kWarp = 32;

// ---------------------------------------------------------------------------------------------
// Element access.

template <typename T>
constexpr int kVec = 16 / static_cast<int>(sizeof(T));

template <typename T, int W>
struct alignas(sizeof(T) * W) Pack {
  T v[W];
};

template <int W, typename T>
__device__ __forceinline__ Pack<T, W> LoadPack(const T* p) {
  return *reinterpret_cast<const Pack<T, W>*>(p);
}

template <int W, typename T>
__device__ __forceinline__ void StorePack(T* p, const Pack<T, W>& x) {
  *reinterpret_cast<Pack<T, W>*>(p) = x;
}

__device__ __forceinline__ float ToF(float x) { return x; }
__device__ __forceinline__ float ToF(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T FromF(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return __float2bfloat16_rn(x);
  }
}

// True when every pointer is 16-byte aligned (null pointers count as aligned).
template <typename... P>
bool Aligned(const P*... p) {
  return ((reinterpret_cast<uintptr_t>(p) % 16 == 0) && ...);
}

// ---------------------------------------------------------------------------------------------
// Deterministic warp and block reductions. Block sizes are multiples of 32.

struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <typename Op>
__device__ __forceinline__ float WarpReduce(float v, Op op) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// Every thread of the block gets the result. Contains barriers: call from all threads.
template <typename Op>
__device__ float BlockReduce(float v, Op op, float identity) {
  __shared__ float warp_results[kWarp];
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  v = WarpReduce(v, op);
  __syncthreads();  // a previous call's readers are done with warp_results
  if (lane == 0) warp_results[warp] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x / kWarp) ? warp_results[lane] : identity;
  return WarpReduce(v, op);
}

__device__ float BlockSum(float v) { return BlockReduce(v, SumOp{}, 0.0f); }
__device__ float BlockMax(float v) { return BlockReduce(v, MaxOp{}, -INFINITY); }

// ---------------------------------------------------------------------------------------------
// Host-side helpers.

constexpr int kThreads = 256;
// Threads per block of the column kernels (the bias and embedding gradients).
constexpr int kColumnThreads = 128;

// Blocks for a grid-stride loop over `work` items.
int GridStrideBlocks(int64_t work, int threads, const CallSite& site) {
  const int64_t cap = int64_t{std::max(1, site.context->multiprocessors)} * 32;
  return static_cast<int>(std::clamp<int64_t>((work + threads - 1) / threads, 1, cap));
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// reduce_scratch, checked to hold `bytes`.
void* Scratch(const CallSite& site, int64_t bytes, const char* kernel, const std::string& what) {
  if (site.context->reduce_scratch == nullptr) {
    throw DeviceError(std::string(kernel) + ": the device context has no reduce_scratch, in " +
                      site.where);
  }
  if (bytes > kReduceScratchBytes) {
    throw DeviceError(std::string(kernel) + ": " + what + " need " + std::to_string(bytes) +
                      " bytes of reduce_scratch, more than its " +
                      std::to_string(kReduceScratchBytes) + ", in " + site.where);
  }
  return site.context->reduce_scratch;
}

// Lets `kernel` use `bytes` of dynamic shared memory (above the default 48 KiB it must opt in).
template <typename Kernel>
void AllowSharedMemory(Kernel kernel, int64_t bytes, const char* name, const CallSite& site) {
  constexpr int64_t kDefault = 48 * 1024;
  constexpr int64_t kStatic = 256;  // BlockReduce's warp_results
  if (bytes + kStatic <= kDefault) return;
  int limit = 0;
  BIGMAC_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                           site.context->ordinal),
                    site.where);
  if (bytes + kStatic > limit) {
    throw DeviceError(std::string(name) + ": needs " + std::to_string(bytes) +
                      " bytes of shared memory per block (sequence length too long for the "
                      "fallback attention), the device allows " +
                      std::to_string(limit) + ", in " + site.where);
  }
  BIGMAC_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(bytes)),
                    site.where);
}

// Row chunks of a two-stage column sum over n rows of c columns with `arrays` float outputs:
// a pure function of (n, c, arrays), so the summation order is fixed for a shape.
struct ColumnChunks {
  int chunks = 0;
  int rows_per_chunk = 0;
};

ColumnChunks ChunkRows(int n, int c, int arrays, const char* kernel, const CallSite& site) {
  constexpr int kRowsPerChunk = 32;
  constexpr int kMaxChunks = 65535;  // gridDim.y
  const int64_t per_chunk_bytes = int64_t{arrays} * c * sizeof(float);
  Scratch(site, per_chunk_bytes, kernel, "the column partial sums of one row chunk");
  const int64_t fit = kReduceScratchBytes / per_chunk_bytes;
  const int64_t wanted = CeilDiv(n, kRowsPerChunk);
  const int64_t chunks = std::min<int64_t>({wanted, fit, kMaxChunks});
  ColumnChunks result;
  result.rows_per_chunk = static_cast<int>(CeilDiv(n, chunks));
  result.chunks = static_cast<int>(CeilDiv(n, result.rows_per_chunk));
  Scratch(site, int64_t{result.chunks} * per_chunk_bytes, kernel, "the column partial sums");
  return result;
}

// The second stage of a column sum: into[col] += sum over chunks, in chunk order.
__global__ void AddChunkSumsKernel(float* into, const float* partial, int chunks, int c) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= c) return;
  float sum = 0.0f;
  for (int chunk = 0; chunk < chunks; ++chunk) sum += partial[int64_t{chunk} * c + col];
  into[col] += sum;
}

void AddChunkSums(float* into, const float* partial, int chunks, int c, const CallSite& site) {
  const int blocks = static_cast<int>(CeilDiv(c, kThreads));
  LaunchKernel("AddChunkSumsKernel", AddChunkSumsKernel, blocks, kThreads, 0, site.stream(), into,
               partial, chunks, c);
  CheckLaunch("AddChunkSumsKernel", site);
}

}  // namespace
}  // namespace bigmac::stages::cuda

#endif  // BIGMAC_STAGES_CUDA_KERNEL_COMMON_H_
