// CUDA kernels: GELU, SwiGLU, residual adds and the bias (forward, and its gradient as a two-stage
// column sum). The CPU twin: stages/cpu/kernels.cc: Gelu*, Swiglu*, Add*, the bias of
// MatmulForward/Backward (the contract: stages/cuda/kernels.h; the shared conventions:
// kernel_common.h).

#include "stages/cuda/kernel_common.h"

namespace bigmac::stages::cuda {
namespace {

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
// SwiGLU on fused rows [gate (width) | up (width)]: h = silu(gate) * up. Pack p of a row covers
// columns [p W, p W + W) of its gate, its up and its h (or dgate, dup and dh).

// Forward: out = h = silu(gate) * up. Backward (dh given): out = dgate_up, dgate = dh up sig
// (1 + gate (1 - sig)), dup = dh gate sig, sig = sigmoid(gate).
template <typename T, int W, bool kBackward>
__global__ void SwigluKernel(T* out, const T* dh, const T* gate_up, int64_t n, int width) {
  const int64_t packs_per_row = width / W;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t p = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; p < n * packs_per_row;
       p += stride) {
    const int64_t row = p / packs_per_row;
    const int64_t col = (p % packs_per_row) * W;
    const T* gate = gate_up + row * 2 * width + col;
    const Pack<T, W> g = LoadPack<W>(gate);
    const Pack<T, W> u = LoadPack<W>(gate + width);
    if constexpr (kBackward) {
      const Pack<T, W> d = LoadPack<W>(dh + row * width + col);
      Pack<T, W> dg, du;
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const float x = ToF(g.v[k]);
        const float sig = 1.0f / (1.0f + expf(-x));
        const float dy = ToF(d.v[k]);
        dg.v[k] = FromF<T>(dy * ToF(u.v[k]) * sig * (1.0f + x * (1.0f - sig)));
        du.v[k] = FromF<T>(dy * x * sig);
      }
      StorePack(out + row * 2 * width + col, dg);
      StorePack(out + row * 2 * width + width + col, du);
    } else {
      Pack<T, W> y;
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const float x = ToF(g.v[k]);
        y.v[k] = FromF<T>(x / (1.0f + expf(-x)) * ToF(u.v[k]));
      }
      StorePack(out + row * width + col, y);
    }
  }
}

// SwigluKernel<T, kVec> when every row's columns are whole 16-byte packs, else <T, 1>.
template <bool kBackward, typename T>
void Swiglu(const char* name, const CallSite& site, T* out, const T* dh, const T* gate_up,
            int64_t n, int width) {
  if (n <= 0 || width <= 0) return;
  constexpr int V = kVec<T>;
  if (width % V == 0 && Aligned(out, dh, gate_up)) {
    const int blocks = GridStrideBlocks(n * (width / V), kThreads, site);
    LaunchKernel(name, SwigluKernel<T, V, kBackward>, blocks, kThreads, 0, site.stream(), out, dh,
                 gate_up, n, width);
  } else {
    const int blocks = GridStrideBlocks(n * width, kThreads, site);
    LaunchKernel(name, SwigluKernel<T, 1, kBackward>, blocks, kThreads, 0, site.stream(), out, dh,
                 gate_up, n, width);
  }
  CheckLaunch(name, site);
}

// ---------------------------------------------------------------------------------------------
// Bias: out rows += bias; the gradient as a two-stage column sum.

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

}  // namespace

template <typename T>
void GeluForward(const CallSite& site, T* out, const T* inp, int64_t n) {
  Map1("GeluForward", site, out, inp, n, GeluOp{GeluK()});
}

template <typename T>
void GeluBackward(const CallSite& site, T* dinp, const T* inp, const T* dout, int64_t n) {
  Map2("GeluBackward", site, dinp, inp, dout, n, GeluBackwardOp{GeluK()});
}

template <typename T>
void SwigluForward(const CallSite& site, T* h, const T* gate_up, int n, int width) {
  Swiglu<false>("SwigluForwardKernel", site, h, static_cast<const T*>(nullptr), gate_up, n, width);
}

template <typename T>
void SwigluBackward(const CallSite& site, T* dgate_up, const T* dh, const T* gate_up, int n,
                    int width) {
  Swiglu<true>("SwigluBackwardKernel", site, dgate_up, dh, gate_up, n, width);
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

#define BIGMAC_INSTANTIATE(T)                                                         \
  template void GeluForward<T>(const CallSite&, T*, const T*, int64_t);               \
  template void GeluBackward<T>(const CallSite&, T*, const T*, const T*, int64_t);    \
  template void SwigluForward<T>(const CallSite&, T*, const T*, int, int);            \
  template void SwigluBackward<T>(const CallSite&, T*, const T*, const T*, int, int); \
  template void Add<T>(const CallSite&, T*, const T*, const T*, int64_t);             \
  template void AddInPlace<T>(const CallSite&, T*, const T*, int64_t);                \
  template void AddBias<T>(const CallSite&, T*, const T*, int, int, int64_t);         \
  template void BiasGradAccumulate<T>(const CallSite&, float*, const T*, int, int, int64_t);

BIGMAC_INSTANTIATE(float)
BIGMAC_INSTANTIATE(__nv_bfloat16)
#undef BIGMAC_INSTANTIATE

}  // namespace bigmac::stages::cuda
