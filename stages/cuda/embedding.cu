// CUDA kernels: the token (and position) embedding, forward and weight gradients. The CPU twin:
// stages/cpu/kernels.cc: EmbeddingForward/Backward (the contract: stages/cuda/kernels.h; the shared
// conventions: kernel_common.h).

#include "stages/cuda/kernel_common.h"

namespace bigmac::stages::cuda {
namespace {

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
    if (wpe == nullptr) {  // no position table (llama)
      StorePack(out + row * c + col, te);
      continue;
    }
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

}  // namespace

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
  if (dwpe == nullptr) return;  // no position table (llama)
  if (vector) {
    LaunchKernel("EmbeddingPositionGradKernel", EmbeddingPositionGradKernel<T, V>, t,
                 kColumnThreads, 0, site.stream(), dwpe, dout, b, t, c);
  } else {
    LaunchKernel("EmbeddingPositionGradKernel", EmbeddingPositionGradKernel<T, 1>, t,
                 kColumnThreads, 0, site.stream(), dwpe, dout, b, t, c);
  }
  CheckLaunch("EmbeddingPositionGradKernel", site);
}

#define BIGMAC_INSTANTIATE(T)                                                                     \
  template void EmbeddingForward<T>(const CallSite&, T*, const int32_t*, const T*, const T*, int, \
                                    int, int);                                                    \
  template void EmbeddingBackwardWeight<T>(const CallSite&, float*, float*, const T*,             \
                                           const int32_t*, const int32_t*, int, int, int, int);

BIGMAC_INSTANTIATE(float)
BIGMAC_INSTANTIATE(__nv_bfloat16)
#undef BIGMAC_INSTANTIATE

}  // namespace bigmac::stages::cuda
