// The CUDA twins of stages/cpu/kernels.cc (see kernels.h for the contract).
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

// ---------------------------------------------------------------------------------------------
// Elementwise maps: out[i] = op(in[i]) or op(a[i], b[i]), W elements per thread, then the tail.

template <typename T, int W, typename Op>
__global__ void Map1Kernel(T* out, const T* in, int64_t n, Op op) {
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t packs = n / W;
  for (int64_t p = first; p < packs; p += stride) {
    const Pack<T, W> x = LoadPack<W>(in + p * W);
    Pack<T, W> y;
#pragma unroll
    for (int k = 0; k < W; ++k) y.v[k] = FromF<T>(op(ToF(x.v[k])));
    StorePack(out + p * W, y);
  }
  if (first < n - packs * W) {
    const int64_t i = packs * W + first;
    out[i] = FromF<T>(op(ToF(in[i])));
  }
}

template <typename T, int W, typename Op>
__global__ void Map2Kernel(T* out, const T* a, const T* b, int64_t n, Op op) {
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t packs = n / W;
  for (int64_t p = first; p < packs; p += stride) {
    const Pack<T, W> x = LoadPack<W>(a + p * W);
    const Pack<T, W> y = LoadPack<W>(b + p * W);
    Pack<T, W> z;
#pragma unroll
    for (int k = 0; k < W; ++k) z.v[k] = FromF<T>(op(ToF(x.v[k]), ToF(y.v[k])));
    StorePack(out + p * W, z);
  }
  if (first < n - packs * W) {
    const int64_t i = packs * W + first;
    out[i] = FromF<T>(op(ToF(a[i]), ToF(b[i])));
  }
}

template <typename T, typename Op>
void Map1(const char* name, const CallSite& site, T* out, const T* in, int64_t n, Op op) {
  if (n <= 0) return;
  constexpr int V = kVec<T>;
  if (Aligned(out, in)) {
    const int blocks = GridStrideBlocks(std::max<int64_t>(n / V, 1), kThreads, site);
    LaunchKernel(name, Map1Kernel<T, V, Op>, blocks, kThreads, 0, site.stream(), out, in, n, op);
  } else {
    const int blocks = GridStrideBlocks(n, kThreads, site);
    LaunchKernel(name, Map1Kernel<T, 1, Op>, blocks, kThreads, 0, site.stream(), out, in, n, op);
  }
  CheckLaunch(name, site);
}

template <typename T, typename Op>
void Map2(const char* name, const CallSite& site, T* out, const T* a, const T* b, int64_t n,
          Op op) {
  if (n <= 0) return;
  constexpr int V = kVec<T>;
  if (Aligned(out, a, b)) {
    const int blocks = GridStrideBlocks(std::max<int64_t>(n / V, 1), kThreads, site);
    LaunchKernel(name, Map2Kernel<T, V, Op>, blocks, kThreads, 0, site.stream(), out, a, b, n, op);
  } else {
    const int blocks = GridStrideBlocks(n, kThreads, site);
    LaunchKernel(name, Map2Kernel<T, 1, Op>, blocks, kThreads, 0, site.stream(), out, a, b, n, op);
  }
  CheckLaunch(name, site);
}

// GELU as the CPU computes it: x * sigmoid(2u), u = k (x + 0.044715 x^3), k = sqrt(2/pi).
struct GeluOp {
  float k;
  __device__ float operator()(float x) const {
    const float u = k * (x + kGeluCubic * x * x * x);
    return x / (1.0f + expf(-2.0f * u));
  }
};

// (d/dx gelu) * dout: s + 2 x s (1 - s) k (1 + 3 * 0.044715 x^2), s = sigmoid(2u).
struct GeluBackwardOp {
  float k;
  __device__ float operator()(float x, float dout) const {
    const float u = k * (x + kGeluCubic * x * x * x);
    const float s = 1.0f / (1.0f + expf(-2.0f * u));
    constexpr float k3 = static_cast<float>(3 * ::bigmac::stages::kGeluCubic);
    const float grad = s + 2.0f * x * s * (1.0f - s) * k * (1.0f + k3 * x * x);
    return grad * dout;
  }
};

float GeluK() { return std::sqrt(2.0f / static_cast<float>(M_PI)); }  // the CPU's T(2)/T(M_PI)

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

// ---------------------------------------------------------------------------------------------
// Bias: out rows += bias; the gradient as a two-stage column sum.

constexpr int kColumnThreads = 128;

template <typename T, int W>
__global__ void AddBiasKernel(T* out, const T* bias, int n, int oc, int64_t ld) {
  const int col = (blockIdx.x * blockDim.x + threadIdx.x) * W;
  if (col >= oc) return;
  const Pack<T, W> bp = LoadPack<W>(bias + col);
  for (int row = blockIdx.y; row < n; row += gridDim.y) {
    T* o = out + row * ld + col;
    Pack<T, W> y = LoadPack<W>(o);
#pragma unroll
    for (int k = 0; k < W; ++k) y.v[k] = FromF<T>(ToF(y.v[k]) + ToF(bp.v[k]));
    StorePack(o, y);
  }
}

template <typename T, int W>
__global__ void BiasGradPartialsKernel(float* partial, const T* dout, int n, int oc, int64_t ld,
                                       int rows_per_chunk) {
  const int col = (blockIdx.x * blockDim.x + threadIdx.x) * W;
  if (col >= oc) return;
  const int chunk = blockIdx.y;
  const int begin = chunk * rows_per_chunk;
  const int end = min(n, begin + rows_per_chunk);
  float sum[W] = {};
  for (int row = begin; row < end; ++row) {
    const Pack<T, W> dp = LoadPack<W>(dout + row * ld + col);
#pragma unroll
    for (int k = 0; k < W; ++k) sum[k] += ToF(dp.v[k]);
  }
#pragma unroll
  for (int k = 0; k < W; ++k) partial[int64_t{chunk} * oc + col + k] = sum[k];
}

// ---------------------------------------------------------------------------------------------
// Embedding.

template <typename T, int W>
__global__ void EmbeddingForwardKernel(T* out, const int32_t* tokens, const T* wte, const T* wpe,
                                       int64_t rows, int t, int c) {
  const int64_t packs_per_row = c / W;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t p = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; p < rows * packs_per_row;
       p += stride) {
    const int64_t row = p / packs_per_row;
    const int col = static_cast<int>(p % packs_per_row) * W;
    const Pack<T, W> te = LoadPack<W>(wte + int64_t{tokens[row]} * c + col);
    const Pack<T, W> pe = LoadPack<W>(wpe + (row % t) * c + col);
    Pack<T, W> y;
#pragma unroll
    for (int k = 0; k < W; ++k) y.v[k] = FromF<T>(ToF(te.v[k]) + ToF(pe.v[k]));
    StorePack(out + row * c + col, y);
  }
}

// One block per distinct token: dwte[token] += its rows of dout, in row order, starting from the
// current value (the CPU's order exactly).
template <typename T, int W>
__global__ void EmbeddingTokenGradKernel(float* dwte, const T* dout, const int32_t* bucket_token,
                                         const int32_t* bucket_start, const int32_t* rows, int c) {
  const int bucket = blockIdx.x;
  const int begin = bucket_start[bucket];
  const int end = bucket_start[bucket + 1];
  float* g = dwte + int64_t{bucket_token[bucket]} * c;
  for (int col = threadIdx.x * W; col < c; col += blockDim.x * W) {
    float acc[W];
#pragma unroll
    for (int k = 0; k < W; ++k) acc[k] = g[col + k];
    for (int i = begin; i < end; ++i) {
      const Pack<T, W> dp = LoadPack<W>(dout + int64_t{rows[i]} * c + col);
#pragma unroll
      for (int k = 0; k < W; ++k) acc[k] += ToF(dp.v[k]);
    }
#pragma unroll
    for (int k = 0; k < W; ++k) g[col + k] = acc[k];
  }
}

// One block per position: dwpe[pos] += dout rows (bi, pos) for bi in order.
template <typename T, int W>
__global__ void EmbeddingPositionGradKernel(float* dwpe, const T* dout, int b, int t, int c) {
  const int pos = blockIdx.x;
  float* g = dwpe + int64_t{pos} * c;
  for (int col = threadIdx.x * W; col < c; col += blockDim.x * W) {
    float acc[W];
#pragma unroll
    for (int k = 0; k < W; ++k) acc[k] = g[col + k];
    for (int bi = 0; bi < b; ++bi) {
      const Pack<T, W> dp = LoadPack<W>(dout + (int64_t{bi} * t + pos) * c + col);
#pragma unroll
      for (int k = 0; k < W; ++k) acc[k] += ToF(dp.v[k]);
    }
#pragma unroll
    for (int k = 0; k < W; ++k) g[col + k] = acc[k];
  }
}

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

// ---------------------------------------------------------------------------------------------
// Fallback causal attention: one block per (b, h, row), the CPU kernel's algorithm.

constexpr int kAttentionThreads = 128;

// sum over d of a[d] * b[d], in d order (shared-memory a, global b).
template <typename T>
__device__ __forceinline__ float Dot(const float* a, const T* b, int hs) {
  float sum = 0.0f;
  for (int d = 0; d < hs; ++d) sum += a[d] * ToF(b[d]);
  return sum;
}

struct AttentionShape {
  int t, c, h, hs;
  float scale;
};

// Block (bi, hi, ti): P[ti, :] = causal softmax(scale * q_ti . k_t2) into att; out_ti = P v.
// Dynamic shared memory: q_ti (hs floats), then the row of P (t floats).
template <typename T>
__global__ void AttentionForwardKernel(T* out, float* att, const T* qkv, AttentionShape s) {
  BIGMAC_DYNAMIC_SHARED(float, smem);
  float* q = smem;
  float* p = smem + s.hs;
  const int ti = blockIdx.x % s.t;
  const int bh = blockIdx.x / s.t;
  const int hi = bh % s.h;
  const int bi = bh / s.h;
  const int64_t c3 = 3 * int64_t{s.c};
  const T* base = qkv + int64_t{bi} * s.t * c3 + hi * s.hs;  // q of row 0 of this (b, h)
  for (int d = threadIdx.x; d < s.hs; d += blockDim.x) q[d] = ToF(base[ti * c3 + d]);
  __syncthreads();
  float m = -INFINITY;
  for (int t2 = threadIdx.x; t2 <= ti; t2 += blockDim.x) {
    p[t2] = s.scale * Dot(q, base + t2 * c3 + s.c, s.hs);
    m = fmaxf(m, p[t2]);
  }
  m = BlockMax(m);
  float sum = 0.0f;
  for (int t2 = threadIdx.x; t2 <= ti; t2 += blockDim.x) {
    p[t2] = expf(p[t2] - m);
    sum += p[t2];
  }
  const float inv = 1.0f / BlockSum(sum);
  float* arow = att + (int64_t{bh} * s.t + ti) * s.t;
  for (int t2 = threadIdx.x; t2 < s.t; t2 += blockDim.x) {
    float prob = 0.0f;
    if (t2 <= ti) {
      prob = p[t2] * inv;
      p[t2] = prob;
    }
    arow[t2] = prob;
  }
  __syncthreads();
  T* o = out + (int64_t{bi} * s.t + ti) * s.c + hi * s.hs;
  for (int d = threadIdx.x; d < s.hs; d += blockDim.x) {
    float acc = 0.0f;
    for (int t2 = 0; t2 <= ti; ++t2) acc += p[t2] * ToF(base[t2 * c3 + 2 * s.c + d]);
    o[d] = FromF<T>(acc);
  }
}

// Backward, query rows. Block (bi, hi, ti): dP[ti, t2] = dO_ti . v_t2; D[ti] = sum dP * P (kept
// in dsum for the key kernel); dS = P (dP - D) scale; dq_ti = dS k.
// Dynamic shared memory: dO_ti (hs floats), then the row of dS (t floats).
template <typename T>
__global__ void AttentionBackwardQueryKernel(T* dqkv, float* dsum, const T* dout, const T* qkv,
                                             const float* att, AttentionShape s) {
  BIGMAC_DYNAMIC_SHARED(float, smem);
  float* dy = smem;
  float* ds = smem + s.hs;
  const int ti = blockIdx.x % s.t;
  const int bh = blockIdx.x / s.t;
  const int hi = bh % s.h;
  const int bi = bh / s.h;
  const int64_t c3 = 3 * int64_t{s.c};
  const T* base = qkv + int64_t{bi} * s.t * c3 + hi * s.hs;
  const float* prow = att + (int64_t{bh} * s.t + ti) * s.t;
  const T* dy_row = dout + (int64_t{bi} * s.t + ti) * s.c + hi * s.hs;
  for (int d = threadIdx.x; d < s.hs; d += blockDim.x) dy[d] = ToF(dy_row[d]);
  __syncthreads();
  float local = 0.0f;
  for (int t2 = threadIdx.x; t2 <= ti; t2 += blockDim.x) {
    ds[t2] = Dot(dy, base + t2 * c3 + 2 * s.c, s.hs);
    local += ds[t2] * prow[t2];
  }
  const float dot = BlockSum(local);
  for (int t2 = threadIdx.x; t2 <= ti; t2 += blockDim.x) {
    ds[t2] = prow[t2] * (ds[t2] - dot) * s.scale;
  }
  if (threadIdx.x == 0) dsum[int64_t{bh} * s.t + ti] = dot;
  __syncthreads();
  T* dq = dqkv + (int64_t{bi} * s.t + ti) * c3 + hi * s.hs;
  for (int d = threadIdx.x; d < s.hs; d += blockDim.x) {
    float acc = 0.0f;
    for (int t2 = 0; t2 <= ti; ++t2) acc += ds[t2] * ToF(base[t2 * c3 + s.c + d]);
    dq[d] = FromF<T>(acc);
  }
}

// Backward, key rows. Block (bi, hi, t2): for ti >= t2, dS[ti, t2] recomputed from dO_ti . v_t2
// and D[ti]; dk_t2 = sum_ti dS[ti, t2] q_ti; dv_t2 = sum_ti P[ti, t2] dO_ti (ti in order).
// Dynamic shared memory: v_t2 (hs floats), the column of dS (t floats), the column of P (t).
template <typename T>
__global__ void AttentionBackwardKeyKernel(T* dqkv, const float* dsum, const T* dout, const T* qkv,
                                           const float* att, AttentionShape s) {
  BIGMAC_DYNAMIC_SHARED(float, smem);
  float* vrow = smem;
  float* ds = smem + s.hs;
  float* pcol = ds + s.t;
  const int t2 = blockIdx.x % s.t;
  const int bh = blockIdx.x / s.t;
  const int hi = bh % s.h;
  const int bi = bh / s.h;
  const int64_t c3 = 3 * int64_t{s.c};
  const T* base = qkv + int64_t{bi} * s.t * c3 + hi * s.hs;
  const T* dy = dout + int64_t{bi} * s.t * s.c + hi * s.hs;  // dO of row 0 of this (b, h)
  for (int d = threadIdx.x; d < s.hs; d += blockDim.x) {
    vrow[d] = ToF(base[t2 * c3 + 2 * s.c + d]);
  }
  __syncthreads();
  for (int ti = t2 + threadIdx.x; ti < s.t; ti += blockDim.x) {
    const float prob = att[(int64_t{bh} * s.t + ti) * s.t + t2];
    const float dp = Dot(vrow, dy + ti * int64_t{s.c}, s.hs);
    pcol[ti] = prob;
    ds[ti] = prob * (dp - dsum[int64_t{bh} * s.t + ti]) * s.scale;
  }
  __syncthreads();
  T* dk = dqkv + (int64_t{bi} * s.t + t2) * c3 + s.c + hi * s.hs;
  T* dv = dk + s.c;
  for (int d = threadIdx.x; d < s.hs; d += blockDim.x) {
    float acc_k = 0.0f;
    float acc_v = 0.0f;
    for (int ti = t2; ti < s.t; ++ti) {
      acc_k += ds[ti] * ToF(base[ti * c3 + d]);
      acc_v += pcol[ti] * ToF(dy[ti * int64_t{s.c} + d]);
    }
    dk[d] = FromF<T>(acc_k);
    dv[d] = FromF<T>(acc_v);
  }
}

AttentionShape CheckAttentionShape(int b, int t, int c, int h, const char* name,
                                   const CallSite& site) {
  if (h <= 0 || c % h != 0) {
    throw DeviceError(std::string(name) + ": channels " + std::to_string(c) +
                      " are not a multiple of heads " + std::to_string(h) + ", in " + site.where);
  }
  if (int64_t{b} * h * t >= int64_t{1} << 31) {  // gridDim.x <= 2^31 - 1
    throw DeviceError(std::string(name) + ": b*h*t = " + std::to_string(int64_t{b} * h * t) +
                      " blocks is more than one grid holds, in " + site.where);
  }
  const int hs = c / h;
  return {t, c, h, hs, 1.0f / std::sqrt(static_cast<float>(hs))};  // the CPU's T(1)/sqrt(T(hs))
}

}  // namespace

// =============================================================================================
// The launchers.

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

template <typename T>
void GeluForward(const CallSite& site, T* out, const T* inp, int64_t n) {
  Map1("GeluForward", site, out, inp, n, GeluOp{GeluK()});
}

template <typename T>
void GeluBackward(const CallSite& site, T* dinp, const T* inp, const T* dout, int64_t n) {
  Map2("GeluBackward", site, dinp, inp, dout, n, GeluBackwardOp{GeluK()});
}

template <typename T>
void Add(const CallSite& site, T* out, const T* a, const T* b, int64_t n) {
  Map2("Add", site, out, a, b, n, SumOp{});
}

template <typename T>
void AddInPlace(const CallSite& site, T* out, const T* a, int64_t n) {
  Map2("AddInPlace", site, out, static_cast<const T*>(out), a, n, SumOp{});
}

template <typename T>
void AddBias(const CallSite& site, T* out, const T* bias, int n, int oc, int64_t ld_out) {
  if (n <= 0 || oc <= 0) return;
  constexpr int V = kVec<T>;
  const bool vector = oc % V == 0 && ld_out % V == 0 && Aligned(out, bias);
  const int w = vector ? V : 1;
  const dim3 grid(static_cast<unsigned>(CeilDiv(CeilDiv(oc, w), kColumnThreads)),
                  std::min(n, 4096));
  if (vector) {
    LaunchKernel("AddBiasKernel", AddBiasKernel<T, V>, grid, kColumnThreads, 0, site.stream(), out,
                 bias, n, oc, ld_out);
  } else {
    LaunchKernel("AddBiasKernel", AddBiasKernel<T, 1>, grid, kColumnThreads, 0, site.stream(), out,
                 bias, n, oc, ld_out);
  }
  CheckLaunch("AddBiasKernel", site);
}

template <typename T>
void BiasGradAccumulate(const CallSite& site, float* dbias, const T* dout, int n, int oc,
                        int64_t ld_dout) {
  if (n <= 0 || oc <= 0) return;
  constexpr int V = kVec<T>;
  const ColumnChunks chunks = ChunkRows(n, oc, 1, "BiasGradAccumulate", site);
  float* partial = static_cast<float*>(site.context->reduce_scratch);
  const bool vector = oc % V == 0 && ld_dout % V == 0 && Aligned(dout);
  const int w = vector ? V : 1;
  const dim3 grid(static_cast<unsigned>(CeilDiv(CeilDiv(oc, w), kColumnThreads)), chunks.chunks);
  if (vector) {
    LaunchKernel("BiasGradPartialsKernel", BiasGradPartialsKernel<T, V>, grid, kColumnThreads, 0,
                 site.stream(), partial, dout, n, oc, ld_dout, chunks.rows_per_chunk);
  } else {
    LaunchKernel("BiasGradPartialsKernel", BiasGradPartialsKernel<T, 1>, grid, kColumnThreads, 0,
                 site.stream(), partial, dout, n, oc, ld_dout, chunks.rows_per_chunk);
  }
  CheckLaunch("BiasGradPartialsKernel", site);
  AddChunkSums(dbias, partial, chunks.chunks, oc, site);
}

template <typename T>
void EmbeddingForward(const CallSite& site, T* out, const int32_t* tokens, const T* wte,
                      const T* wpe, int b, int t, int c) {
  const int64_t rows = int64_t{b} * t;
  if (rows <= 0 || c <= 0) return;
  constexpr int V = kVec<T>;
  if (c % V == 0 && Aligned(out, wte, wpe)) {
    const int blocks = GridStrideBlocks(rows * (c / V), kThreads, site);
    LaunchKernel("EmbeddingForwardKernel", EmbeddingForwardKernel<T, V>, blocks, kThreads, 0,
                 site.stream(), out, tokens, wte, wpe, rows, t, c);
  } else {
    const int blocks = GridStrideBlocks(rows * c, kThreads, site);
    LaunchKernel("EmbeddingForwardKernel", EmbeddingForwardKernel<T, 1>, blocks, kThreads, 0,
                 site.stream(), out, tokens, wte, wpe, rows, t, c);
  }
  CheckLaunch("EmbeddingForwardKernel", site);
}

template <typename T>
void EmbeddingBackwardWeight(const CallSite& site, float* dwte, float* dwpe, const T* dout,
                             const int32_t* tokens, const int32_t* host_tokens, int b, int t, int c,
                             int vocab) {
  const int rows = b * t;
  if (rows <= 0 || c <= 0) return;
  constexpr int V = kVec<T>;
  const bool vector = c % V == 0 && Aligned(dout);

  // The tokens on the host, bucketed by token with each bucket's rows in row order (a counting
  // sort). Laid out as [bucket_token (k)] [bucket_start (k + 1)] [rows (b*t)].
  std::vector<int32_t> copied;
  if (host_tokens == nullptr) {
    copied.resize(rows);
    BIGMAC_CUDA_CHECK(cudaMemcpyAsync(copied.data(), tokens, rows * sizeof(int32_t),
                                      cudaMemcpyDeviceToHost, site.stream()),
                      site.where);
    BIGMAC_CUDA_CHECK(cudaStreamSynchronize(site.stream()), site.where);
    host_tokens = copied.data();
  }
  std::vector<int32_t> start(int64_t{vocab} + 1, 0);
  for (int row = 0; row < rows; ++row) {
    const int32_t token = host_tokens[row];
    if (token < 0 || token >= vocab) {
      throw DeviceError("EmbeddingBackwardWeight: token " + std::to_string(token) + " at row " +
                        std::to_string(row) + " is outside the vocabulary [0, " +
                        std::to_string(vocab) + "), in " + site.where);
    }
    ++start[token + 1];
  }
  int buckets = 0;
  for (int token = 0; token < vocab; ++token) {
    buckets += start[token + 1] > 0;
    start[token + 1] += start[token];
  }
  std::vector<int32_t> layout(2 * int64_t{buckets} + 1 + rows);
  int32_t* bucket_token = layout.data();
  int32_t* bucket_start = bucket_token + buckets;
  int32_t* bucket_rows = bucket_start + buckets + 1;
  std::vector<int32_t> cursor(start.begin(), start.end() - 1);
  for (int row = 0; row < rows; ++row) bucket_rows[cursor[host_tokens[row]]++] = row;
  for (int token = 0, k = 0; token < vocab; ++token) {
    if (start[token + 1] == start[token]) continue;
    bucket_token[k] = token;
    bucket_start[k] = start[token];
    ++k;
  }
  bucket_start[buckets] = rows;

  // Upload into reduce_scratch. From pageable memory the copy returns once `layout` is staged,
  // so the vector may go away when this function returns.
  const int64_t bytes = static_cast<int64_t>(layout.size() * sizeof(int32_t));
  int32_t* device_layout =
      static_cast<int32_t*>(Scratch(site, bytes, "EmbeddingBackwardWeight", "the token buckets"));
  BIGMAC_CUDA_CHECK(
      cudaMemcpyAsync(device_layout, layout.data(), bytes, cudaMemcpyHostToDevice, site.stream()),
      site.where);
  const int32_t* d_token = device_layout;
  const int32_t* d_start = d_token + buckets;
  const int32_t* d_rows = d_start + buckets + 1;
  if (vector) {
    LaunchKernel("EmbeddingTokenGradKernel", EmbeddingTokenGradKernel<T, V>, buckets,
                 kColumnThreads, 0, site.stream(), dwte, dout, d_token, d_start, d_rows, c);
  } else {
    LaunchKernel("EmbeddingTokenGradKernel", EmbeddingTokenGradKernel<T, 1>, buckets,
                 kColumnThreads, 0, site.stream(), dwte, dout, d_token, d_start, d_rows, c);
  }
  CheckLaunch("EmbeddingTokenGradKernel", site);
  if (vector) {
    LaunchKernel("EmbeddingPositionGradKernel", EmbeddingPositionGradKernel<T, V>, t,
                 kColumnThreads, 0, site.stream(), dwpe, dout, b, t, c);
  } else {
    LaunchKernel("EmbeddingPositionGradKernel", EmbeddingPositionGradKernel<T, 1>, t,
                 kColumnThreads, 0, site.stream(), dwpe, dout, b, t, c);
  }
  CheckLaunch("EmbeddingPositionGradKernel", site);
}

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

template <typename T>
void AttentionForward(const CallSite& site, T* out, float* att, const T* qkv, int b, int t, int c,
                      int h) {
  if (b <= 0 || t <= 0 || c <= 0) return;
  const AttentionShape s = CheckAttentionShape(b, t, c, h, "AttentionForward", site);
  const int64_t smem = (int64_t{s.hs} + t) * sizeof(float);
  AllowSharedMemory(AttentionForwardKernel<T>, smem, "AttentionForwardKernel", site);
  LaunchKernel("AttentionForwardKernel", AttentionForwardKernel<T>, b * h * t, kAttentionThreads,
               smem, site.stream(), out, att, qkv, s);
  CheckLaunch("AttentionForwardKernel", site);
}

template <typename T>
void AttentionBackward(const CallSite& site, T* dqkv, const T* dout, const T* qkv, const float* att,
                       int b, int t, int c, int h) {
  if (b <= 0 || t <= 0 || c <= 0) return;
  const AttentionShape s = CheckAttentionShape(b, t, c, h, "AttentionBackward", site);
  float* dsum = static_cast<float*>(Scratch(site, int64_t{b} * h * t * sizeof(float),
                                            "AttentionBackward", "the softmax row dots"));
  const int64_t query_smem = (int64_t{s.hs} + t) * sizeof(float);
  AllowSharedMemory(AttentionBackwardQueryKernel<T>, query_smem, "AttentionBackwardQueryKernel",
                    site);
  LaunchKernel("AttentionBackwardQueryKernel", AttentionBackwardQueryKernel<T>, b * h * t,
               kAttentionThreads, query_smem, site.stream(), dqkv, dsum, dout, qkv, att, s);
  CheckLaunch("AttentionBackwardQueryKernel", site);
  const int64_t key_smem = (int64_t{s.hs} + 2 * int64_t{t}) * sizeof(float);
  AllowSharedMemory(AttentionBackwardKeyKernel<T>, key_smem, "AttentionBackwardKeyKernel", site);
  LaunchKernel("AttentionBackwardKeyKernel", AttentionBackwardKeyKernel<T>, b * h * t,
               kAttentionThreads, key_smem, site.stream(), dqkv, dsum, dout, qkv, att, s);
  CheckLaunch("AttentionBackwardKeyKernel", site);
}

#define BIGMAC_INSTANTIATE(T)                                                                     \
  template void LayerNormForward<T>(const CallSite&, T*, float*, float*, const T*, const T*,      \
                                    const T*, int, int);                                          \
  template void LayerNormBackwardInput<T>(const CallSite&, T*, const T*, const T*, const T*,      \
                                          const float*, const float*, int, int);                  \
  template void LayerNormBackwardWeight<T>(const CallSite&, float*, float*, const T*, const T*,   \
                                           const float*, const float*, int, int);                 \
  template void GeluForward<T>(const CallSite&, T*, const T*, int64_t);                           \
  template void GeluBackward<T>(const CallSite&, T*, const T*, const T*, int64_t);                \
  template void Add<T>(const CallSite&, T*, const T*, const T*, int64_t);                         \
  template void AddInPlace<T>(const CallSite&, T*, const T*, int64_t);                            \
  template void AddBias<T>(const CallSite&, T*, const T*, int, int, int64_t);                     \
  template void BiasGradAccumulate<T>(const CallSite&, float*, const T*, int, int, int64_t);      \
  template void EmbeddingForward<T>(const CallSite&, T*, const int32_t*, const T*, const T*, int, \
                                    int, int);                                                    \
  template void EmbeddingBackwardWeight<T>(const CallSite&, float*, float*, const T*,             \
                                           const int32_t*, const int32_t*, int, int, int, int);   \
  template void CrossEntropyForwardBackward<T>(const CallSite&, T*, float*, const int32_t*, int,  \
                                               int, int64_t, double);                             \
  template void AttentionForward<T>(const CallSite&, T*, float*, const T*, int, int, int, int);   \
  template void AttentionBackward<T>(const CallSite&, T*, const T*, const T*, const float*, int,  \
                                     int, int, int);

BIGMAC_INSTANTIATE(float)
BIGMAC_INSTANTIATE(__nv_bfloat16)
#undef BIGMAC_INSTANTIATE

}  // namespace bigmac::stages::cuda
