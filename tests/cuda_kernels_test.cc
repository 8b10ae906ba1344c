// The CUDA kernels (stages/cuda/kernels.h) against their CPU twins (plugins/sdk/cpu_kernels.h) on
// seeded random inputs, in fp32 and in bf16, on odd shapes (widths that are not multiples of the
// 128-bit vector, rows that are not multiples of a block, a padded vocabulary), plus bitwise
// determinism of every reduction. Without a GPU every test reports SKIPPED.
//
// bf16 runs round the inputs to bf16 first and give the CPU the same rounded values (as floats),
// so the only difference left is the rounding of the kernel's bf16 outputs.
//
// Tolerances: |got - want| <= rel * |want| + abs * max|want| (over the compared tensor) + floor.
//   kExact      0, 0        sums of two terms, embedding gradients (the CPU's order exactly)
//   kF32        1e-5, 1e-6  fp32 pointwise math (GELU: expf vs the CPU's polynomial exp)
//   kF32Sum     1e-5, 1e-5  fp32 results of reductions summed in another order
//   kBF16       1e-2, 1e-3  bf16 outputs vs the fp32 CPU result (one rounding, half an ulp is
//                           2^-9 relative)
//   RoPE, SwiGLU: kF32 (pointwise; SwiGLU's expf vs the CPU's exp); grouped-query attention
//   against the CPU's blocked attention: kF32Sum (the sums run in other orders).
//   cross-entropy dlogits in fp32: rel 1e-5, floor 1e-6 * scale (softmax - onehot cancels for a
//   peaked target; the onehot's size, scale, is the natural unit); the loss: rel 1e-5, floor
//   2e-6 * scale per row (the GPU sums exp in fp32, the CPU in double).
// fp32 outputs of bf16 runs (statistics, weight gradients, probabilities, the loss) keep the fp32
// tolerances, since both sides then compute in fp32 from the same values.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "core/comm/cuda/cuda_probe.h"
#include "core/device/cuda/check.h"
#include "core/device/cuda/context.h"
#include "core/memory/dtype.h"
#include "plugins/sdk/cpu_kernels.h"
#include "stages/cuda/kernels.h"

namespace bigmac::stages::cuda {
namespace {

namespace cpu = sdk::cpu;
using bf16 = __nv_bfloat16;
using device::DeviceError;
using device::cuda::CudaContext;
using device::cuda::kReduceScratchBytes;

constexpr const char* kWhere = "cuda_kernels_test";

#define CHECK_CUDA(call) BIGMAC_CUDA_CHECK(call, kWhere)

// The test's own minimal device context: device 0, one stream, the reduce scratch.
class Gpu {
 public:
  Gpu() {
    CHECK_CUDA(cudaSetDevice(0));
    context_.ordinal = 0;
    context_.label = "cuda_kernels_test (cuda:0)";
    CHECK_CUDA(
        cudaDeviceGetAttribute(&context_.multiprocessors, cudaDevAttrMultiProcessorCount, 0));
    int major = 0, minor = 0;
    CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    CHECK_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
    context_.compute_capability = 10 * major + minor;
    CHECK_CUDA(cudaStreamCreate(&context_.stream));
    CHECK_CUDA(cudaMalloc(&context_.reduce_scratch, kReduceScratchBytes));
  }
  ~Gpu() {
    cudaStreamSynchronize(context_.stream);
    cudaFree(context_.reduce_scratch);
    cudaStreamDestroy(context_.stream);
  }
  Gpu(const Gpu&) = delete;
  Gpu& operator=(const Gpu&) = delete;

  CallSite Site(const std::string& what) const { return device::cuda::SiteOf(context_, what); }

 private:
  CudaContext context_;
};

// Device memory holding a copy of a host vector; Download waits for all work.
template <typename E>
class Buffer {
 public:
  explicit Buffer(const std::vector<E>& host) : size_(host.size()) {
    CHECK_CUDA(cudaMalloc(&data_, std::max<size_t>(size_, 1) * sizeof(E)));
    CHECK_CUDA(cudaMemcpy(data_, host.data(), size_ * sizeof(E), cudaMemcpyHostToDevice));
  }
  ~Buffer() { cudaFree(data_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  E* get() { return data_; }
  std::vector<E> Download() const {
    CHECK_CUDA(cudaDeviceSynchronize());
    std::vector<E> host(size_);
    CHECK_CUDA(cudaMemcpy(host.data(), data_, size_ * sizeof(E), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  E* data_ = nullptr;
  size_t size_ = 0;
};

// Host values <-> the kernel's element type (bf16 rounds to nearest even, as the GPU does).
template <typename T>
std::vector<T> ToDevice(const std::vector<float>& x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    std::vector<T> y;
    y.reserve(x.size());
    for (float v : x) {
      __nv_bfloat16_raw raw;
      raw.x = memory::ToBFloat16(v).bits;
      y.emplace_back(raw);
    }
    return y;
  }
}

template <typename T>
std::vector<float> ToHost(const std::vector<T>& x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    std::vector<float> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      y[i] = memory::ToFloat(memory::BFloat16{static_cast<__nv_bfloat16_raw>(x[i]).x});
    }
    return y;
  }
}

// x as the kernel sees it: unchanged for float, rounded to bf16 for bf16.
template <typename T>
std::vector<float> Rounded(const std::vector<float>& x) {
  return ToHost<T>(ToDevice<T>(x));
}

template <typename T>
const char* TypeName() {
  return std::is_same_v<T, float> ? "fp32" : "bf16";
}

std::vector<float> Normal(size_t n, std::mt19937& gen, float mean = 0.0f, float stddev = 1.0f) {
  std::normal_distribution<float> dist(mean, stddev);
  std::vector<float> x(n);
  for (float& v : x) v = dist(gen);
  return x;
}

std::vector<float> Uniform(size_t n, std::mt19937& gen, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> x(n);
  for (float& v : x) v = dist(gen);
  return x;
}

std::vector<int32_t> Tokens(size_t n, int vocab, std::mt19937& gen) {
  std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
  std::vector<int32_t> x(n);
  for (int32_t& v : x) v = dist(gen);
  return x;
}

struct Tol {
  double rel = 0;
  double abs = 0;    // times max |want|
  double floor = 0;  // absolute
};
constexpr Tol kExact{0, 0};
constexpr Tol kF32{1e-5, 1e-6};
constexpr Tol kF32Sum{1e-5, 1e-5};
constexpr Tol kBF16{1e-2, 1e-3};

// The tolerance of a T output whose fp32 tolerance is `f32`.
template <typename T>
Tol OutTol(Tol f32) {
  return std::is_same_v<T, float> ? f32 : kBF16;
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, Tol tol,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double max_want = 0;
  for (float w : want) max_want = std::max(max_want, std::fabs(double(w)));
  int64_t bad = 0;
  int64_t worst = -1;
  double worst_excess = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double diff = std::fabs(double(got[i]) - double(want[i]));
    const double bound = tol.rel * std::fabs(double(want[i])) + tol.abs * max_want + tol.floor;
    if (!(diff <= bound)) {  // NaN counts as bad
      ++bad;
      const double excess = std::isnan(diff) ? INFINITY : diff - bound;
      if (worst < 0 || excess > worst_excess) {
        worst = static_cast<int64_t>(i);
        worst_excess = excess;
      }
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size()
                    << " elements out of tolerance (rel " << tol.rel << ", abs " << tol.abs
                    << " x max|want| " << max_want << ", floor " << tol.floor << "); worst at "
                    << worst << ": got " << (worst >= 0 ? got[worst] : 0.0f) << ", want "
                    << (worst >= 0 ? want[worst] : 0.0f);
}

template <typename E>
bool Bitwise(const std::vector<E>& a, const std::vector<E>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(E)) == 0;
}

// ---------------------------------------------------------------------------------------------

template <typename T>
void CheckLayerNorm(const Gpu& gpu, int n, int c, uint32_t seed) {
  SCOPED_TRACE(std::string(TypeName<T>()) + " n=" + std::to_string(n) + " c=" + std::to_string(c));
  std::mt19937 gen(seed);
  const size_t nc = size_t(n) * c;
  const std::vector<float> inp = Rounded<T>(Normal(nc, gen, 0.3f, 2.0f));
  std::vector<float> w = Normal(c, gen, 1.0f, 0.2f), b = Normal(c, gen, 0.0f, 0.2f);
  w = Rounded<T>(w);
  b = Rounded<T>(b);
  const std::vector<float> dout = Rounded<T>(Normal(nc, gen));
  const std::vector<float> dinp0 = Rounded<T>(Uniform(nc, gen));
  const std::vector<float> dw0 = Uniform(c, gen), db0 = Uniform(c, gen);

  std::vector<float> out(nc), mean(n), rstd(n);
  cpu::LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), n, c);
  std::vector<float> dinp = dinp0;
  cpu::LayerNormBackwardInput(dinp.data(), dout.data(), inp.data(), w.data(), mean.data(),
                              rstd.data(), n, c);
  std::vector<float> dw = dw0, db = db0;
  cpu::LayerNormBackwardWeight(dw.data(), db.data(), dout.data(), inp.data(), mean.data(),
                               rstd.data(), n, c);

  const CallSite site = gpu.Site("layernorm test");
  Buffer<T> g_inp(ToDevice<T>(inp)), g_w(ToDevice<T>(w)), g_b(ToDevice<T>(b));
  Buffer<T> g_dout(ToDevice<T>(dout));
  Buffer<T> g_out(ToDevice<T>(Uniform(nc, gen)));
  Buffer<float> g_mean(Uniform(n, gen)), g_rstd(Uniform(n, gen));
  LayerNormForward<T>(site, g_out.get(), g_mean.get(), g_rstd.get(), g_inp.get(), g_w.get(),
                      g_b.get(), n, c);
  ExpectClose(ToHost(g_out.Download()), out, OutTol<T>(kF32Sum), "LayerNormForward out");
  ExpectClose(g_mean.Download(), mean, kF32Sum, "LayerNormForward mean");
  ExpectClose(g_rstd.Download(), rstd, kF32Sum, "LayerNormForward rstd");

  // The backward kernels start from the CPU's statistics, so each is checked on its own.
  Buffer<float> c_mean(mean), c_rstd(rstd);
  Buffer<T> g_dinp(ToDevice<T>(dinp0));
  LayerNormBackwardInput<T>(site, g_dinp.get(), g_dout.get(), g_inp.get(), g_w.get(), c_mean.get(),
                            c_rstd.get(), n, c);
  ExpectClose(ToHost(g_dinp.Download()), dinp, OutTol<T>(kF32Sum), "LayerNormBackwardInput");

  std::vector<float> first_dw, first_db;
  for (int run = 0; run < 2; ++run) {
    Buffer<float> g_dw(dw0), g_db(db0);
    LayerNormBackwardWeight<T>(site, g_dw.get(), g_db.get(), g_dout.get(), g_inp.get(),
                               c_mean.get(), c_rstd.get(), n, c);
    const std::vector<float> got_dw = g_dw.Download(), got_db = g_db.Download();
    if (run == 0) {
      ExpectClose(got_dw, dw, kF32Sum, "LayerNormBackwardWeight dw");
      ExpectClose(got_db, db, kF32Sum, "LayerNormBackwardWeight db");
      first_dw = got_dw;
      first_db = got_db;
    } else {
      EXPECT_TRUE(Bitwise(got_dw, first_dw)) << "LayerNormBackwardWeight dw is not deterministic";
      EXPECT_TRUE(Bitwise(got_db, first_db)) << "LayerNormBackwardWeight db is not deterministic";
    }
  }
}

TEST(CudaKernels, LayerNormMatchesCpu) {
  if (bigmac::comm::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  Gpu gpu;
  const int shapes[][2] = {{1, 8}, {7, 50}, {37, 96}, {130, 771}, {1000, 256}, {3001, 64}};
  uint32_t seed = 1;
  for (const auto& s : shapes) {
    CheckLayerNorm<float>(gpu, s[0], s[1], seed);
    CheckLayerNorm<bf16>(gpu, s[0], s[1], seed);
    ++seed;
  }
}

// ---------------------------------------------------------------------------------------------

// `offset` elements into each buffer: offset 1 takes the scalar path.
template <typename T>
void CheckElementwise(const Gpu& gpu, int64_t n, int offset, uint32_t seed) {
  SCOPED_TRACE(std::string(TypeName<T>()) + " n=" + std::to_string(n) +
               " offset=" + std::to_string(offset));
  std::mt19937 gen(seed);
  const size_t total = size_t(n + offset);
  const std::vector<float> x = Rounded<T>(Uniform(total, gen, -4.0f, 4.0f));
  const std::vector<float> y = Rounded<T>(Normal(total, gen));
  const std::vector<float> init = Rounded<T>(Uniform(total, gen));
  const float* xs = x.data() + offset;
  const float* ys = y.data() + offset;

  // The CPU result over the compared range, with the untouched prefix from `init`.
  auto expected = [&](auto&& cpu_kernel) {
    std::vector<float> e = init;
    cpu_kernel(e.data() + offset);
    return e;
  };
  const std::vector<float> gelu = expected([&](float* o) { cpu::GeluForward(o, xs, n); });
  const std::vector<float> dgelu = expected([&](float* o) { cpu::GeluBackward(o, xs, ys, n); });
  const std::vector<float> sum = expected([&](float* o) { cpu::Add(o, xs, ys, n); });
  const std::vector<float> sum_in_place = expected([&](float* o) {
    std::copy(ys, ys + n, o);
    cpu::AddInPlace(o, xs, n);
  });

  const CallSite site = gpu.Site("elementwise test");
  Buffer<T> g_x(ToDevice<T>(x)), g_y(ToDevice<T>(y));
  {
    Buffer<T> out(ToDevice<T>(init));
    GeluForward<T>(site, out.get() + offset, g_x.get() + offset, n);
    ExpectClose(ToHost(out.Download()), gelu, OutTol<T>(kF32), "GeluForward");
  }
  {
    Buffer<T> out(ToDevice<T>(init));
    GeluBackward<T>(site, out.get() + offset, g_x.get() + offset, g_y.get() + offset, n);
    ExpectClose(ToHost(out.Download()), dgelu, OutTol<T>(kF32), "GeluBackward");
  }
  {
    Buffer<T> out(ToDevice<T>(init));
    Add<T>(site, out.get() + offset, g_x.get() + offset, g_y.get() + offset, n);
    ExpectClose(ToHost(out.Download()), Rounded<T>(sum), kExact, "Add");
  }
  {
    std::vector<float> start = init;
    std::copy(ys, ys + n, start.begin() + offset);
    Buffer<T> out(ToDevice<T>(start));
    AddInPlace<T>(site, out.get() + offset, g_x.get() + offset, n);
    ExpectClose(ToHost(out.Download()), Rounded<T>(sum_in_place), kExact, "AddInPlace");
  }
}

TEST(CudaKernels, ElementwiseMatchesCpu) {
  if (bigmac::comm::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  Gpu gpu;
  const int64_t sizes[] = {1, 7, 1000, 4099, 65539, 1 << 20};
  uint32_t seed = 100;
  for (int64_t n : sizes) {
    for (int offset : {0, 1}) {
      CheckElementwise<float>(gpu, n, offset, seed);
      CheckElementwise<bf16>(gpu, n, offset, seed);
      ++seed;
    }
  }
}

// ---------------------------------------------------------------------------------------------

template <typename T>
void CheckBias(const Gpu& gpu, int n, int oc, int ld, uint32_t seed) {
  SCOPED_TRACE(std::string(TypeName<T>()) + " n=" + std::to_string(n) +
               " oc=" + std::to_string(oc) + " ld=" + std::to_string(ld));
  std::mt19937 gen(seed);
  const size_t rows = size_t(n) * ld;
  const std::vector<float> out0 = Rounded<T>(Normal(rows, gen));
  const std::vector<float> bias = Rounded<T>(Normal(oc, gen));
  const std::vector<float> dout = Rounded<T>(Normal(rows, gen));
  const std::vector<float> dbias0 = Uniform(oc, gen);

  // AddBias: the CPU adds the bias inside MatmulForward (o[j] += bias[j]); columns past oc stay.
  std::vector<float> out = out0;
  for (int r = 0; r < n; ++r) {
    for (int j = 0; j < oc; ++j) out[size_t(r) * ld + j] += bias[j];
  }
  // BiasGradAccumulate: the CPU's dbias of MatmulBackwardWeight over the unpadded dout (with a
  // one-column input whose weight gradient is ignored).
  std::vector<float> packed(size_t(n) * oc);
  for (int r = 0; r < n; ++r) {
    std::copy_n(dout.begin() + size_t(r) * ld, oc, packed.begin() + size_t(r) * oc);
  }
  const std::vector<float> one_column = Uniform(n, gen);
  std::vector<float> ignored_dw(oc, 0.0f), dbias = dbias0;
  cpu::MatmulBackwardWeight(ignored_dw.data(), dbias.data(), packed.data(), one_column.data(), n, 1,
                            oc);

  const CallSite site = gpu.Site("bias test");
  Buffer<T> g_out(ToDevice<T>(out0)), g_bias(ToDevice<T>(bias)), g_dout(ToDevice<T>(dout));
  AddBias<T>(site, g_out.get(), g_bias.get(), n, oc, ld);
  ExpectClose(ToHost(g_out.Download()), Rounded<T>(out), kExact, "AddBias");

  std::vector<float> first;
  for (int run = 0; run < 2; ++run) {
    Buffer<float> g_dbias(dbias0);
    BiasGradAccumulate<T>(site, g_dbias.get(), g_dout.get(), n, oc, ld);
    const std::vector<float> got = g_dbias.Download();
    if (run == 0) {
      ExpectClose(got, dbias, kF32Sum, "BiasGradAccumulate");
      first = got;
    } else {
      EXPECT_TRUE(Bitwise(got, first)) << "BiasGradAccumulate is not deterministic";
    }
  }
}

TEST(CudaKernels, BiasMatchesCpu) {
  if (bigmac::comm::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  Gpu gpu;
  const int shapes[][3] = {{1, 1, 1},     {7, 5, 5},        {100, 64, 64},
                           {77, 96, 104}, {1000, 130, 133}, {513, 768, 768}};
  uint32_t seed = 200;
  for (const auto& s : shapes) {
    CheckBias<float>(gpu, s[0], s[1], s[2], seed);
    CheckBias<bf16>(gpu, s[0], s[1], s[2], seed);
    ++seed;
  }
}

TEST(CudaKernels, BiasGradRefusesPartialsLargerThanTheScratch) {
  if (bigmac::comm::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  Gpu gpu;
  const int oc = static_cast<int>(kReduceScratchBytes / sizeof(float)) + 8;
  std::mt19937 gen(250);
  Buffer<bf16> dout(ToDevice<bf16>(Uniform(oc, gen)));
  Buffer<float> dbias(Uniform(oc, gen));
  EXPECT_THROW(BiasGradAccumulate<bf16>(gpu.Site("bias test"), dbias.get(), dout.get(), 1, oc, oc),
               DeviceError);
}

// ---------------------------------------------------------------------------------------------

template <typename T>
void CheckEmbedding(const Gpu& gpu, int b, int t, int c, int vocab, uint32_t seed) {
  SCOPED_TRACE(std::string(TypeName<T>()) + " b=" + std::to_string(b) + " t=" + std::to_string(t) +
               " c=" + std::to_string(c) + " vocab=" + std::to_string(vocab));
  std::mt19937 gen(seed);
  const size_t rows = size_t(b) * t;
  const std::vector<int32_t> tokens = Tokens(rows, vocab, gen);
  const std::vector<float> wte = Rounded<T>(Normal(size_t(vocab) * c, gen));
  const std::vector<float> wpe = Rounded<T>(Normal(size_t(t) * c, gen));
  const std::vector<float> dout = Rounded<T>(Normal(rows * c, gen));
  const std::vector<float> dwte0 = Uniform(size_t(vocab) * c, gen);
  const std::vector<float> dwpe0 = Uniform(size_t(t) * c, gen);

  std::vector<float> out(rows * c);
  cpu::EmbeddingForward(out.data(), tokens.data(), wte.data(), wpe.data(), b, t, c);
  std::vector<float> dwte = dwte0, dwpe = dwpe0;
  cpu::EmbeddingBackwardWeight(dwte.data(), dwpe.data(), dout.data(), tokens.data(), b, t, c);

  const CallSite site = gpu.Site("embedding test");
  Buffer<int32_t> g_tokens(tokens);
  Buffer<T> g_wte(ToDevice<T>(wte)), g_wpe(ToDevice<T>(wpe)), g_dout(ToDevice<T>(dout));
  Buffer<T> g_out(ToDevice<T>(Uniform(rows * c, gen)));
  EmbeddingForward<T>(site, g_out.get(), g_tokens.get(), g_wte.get(), g_wpe.get(), b, t, c);
  ExpectClose(ToHost(g_out.Download()), Rounded<T>(out), kExact, "EmbeddingForward");

  // Each token's rows are added in row order onto the current gradient, as the CPU does, so
  // the results are bitwise the CPU's. The first run copies the tokens from the device; the
  // second is handed the host's copy (as the trainer does) and must give the same bits.
  std::vector<float> first_dwte, first_dwpe;
  for (int run = 0; run < 2; ++run) {
    Buffer<float> g_dwte(dwte0), g_dwpe(dwpe0);
    const int32_t* host_tokens = run == 0 ? nullptr : tokens.data();
    EmbeddingBackwardWeight<T>(site, g_dwte.get(), g_dwpe.get(), g_dout.get(), g_tokens.get(),
                               host_tokens, b, t, c, vocab);
    const std::vector<float> got_dwte = g_dwte.Download(), got_dwpe = g_dwpe.Download();
    if (run == 0) {
      ExpectClose(got_dwte, dwte, kExact, "EmbeddingBackwardWeight dwte");
      ExpectClose(got_dwpe, dwpe, kExact, "EmbeddingBackwardWeight dwpe");
      first_dwte = got_dwte;
      first_dwpe = got_dwpe;
    } else {
      EXPECT_TRUE(Bitwise(got_dwte, first_dwte)) << "dwte is not deterministic";
      EXPECT_TRUE(Bitwise(got_dwpe, first_dwpe)) << "dwpe is not deterministic";
    }
  }
}

TEST(CudaKernels, EmbeddingMatchesCpu) {
  if (bigmac::comm::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  Gpu gpu;
  const int shapes[][4] = {{1, 1, 8, 1},   {2, 5, 8, 7},      {3, 50, 100, 37},
                           {2, 33, 77, 5}, {4, 64, 768, 300}, {1, 200, 12, 2}};
  uint32_t seed = 300;
  for (const auto& s : shapes) {
    CheckEmbedding<float>(gpu, s[0], s[1], s[2], s[3], seed);
    CheckEmbedding<bf16>(gpu, s[0], s[1], s[2], s[3], seed);
    ++seed;
  }
}

TEST(CudaKernels, EmbeddingBackwardRefusesTokensOutsideTheVocabulary) {
  if (bigmac::comm::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  Gpu gpu;
  const int b = 1, t = 4, c = 8, vocab = 10;
  std::mt19937 gen(350);
  Buffer<int32_t> tokens(std::vector<int32_t>{1, 2, vocab, 3});
  Buffer<float> dout(Normal(size_t(b) * t * c, gen));
  Buffer<float> dwte(Uniform(size_t(vocab) * c, gen)), dwpe(Uniform(size_t(t) * c, gen));
  EXPECT_THROW(EmbeddingBackwardWeight<float>(gpu.Site("embedding test"), dwte.get(), dwpe.get(),
                                              dout.get(), tokens.get(), nullptr, b, t, c, vocab),
               DeviceError);
}

// ---------------------------------------------------------------------------------------------

template <typename T>
void CheckCrossEntropy(const Gpu& gpu, int n, int v, int ld, uint32_t seed) {
  SCOPED_TRACE(std::string(TypeName<T>()) + " n=" + std::to_string(n) + " v=" + std::to_string(v) +
               " ld=" + std::to_string(ld));
  std::mt19937 gen(seed);
  const double scale = 1.0 / (3.0 * n);
  const std::vector<int32_t> targets = Tokens(n, v, gen);
  // Padded rows; the padding holds garbage that the kernel must zero.
  const std::vector<float> padded = Rounded<T>(Normal(size_t(n) * ld, gen, 0.0f, 2.0f));
  std::vector<float> logits(size_t(n) * v);
  for (int r = 0; r < n; ++r) {
    std::copy_n(padded.begin() + size_t(r) * ld, v, logits.begin() + size_t(r) * v);
  }
  const double loss = scale * cpu::CrossEntropyLossSum(logits.data(), targets.data(), n, v);
  std::vector<float> dlogits(size_t(n) * v);
  cpu::CrossEntropyBackward(dlogits.data(), logits.data(), targets.data(), n, v, scale);

  const CallSite site = gpu.Site("cross-entropy test");
  Buffer<int32_t> g_targets(targets);
  std::vector<T> first_logits;
  std::vector<float> first_loss;
  for (int run = 0; run < 2; ++run) {
    Buffer<T> g_logits(ToDevice<T>(padded));
    Buffer<float> g_loss(std::vector<float>{-1.0f});
    CrossEntropyForwardBackward<T>(site, g_logits.get(), g_loss.get(), g_targets.get(), n, v, ld,
                                   scale);
    const std::vector<T> got_raw = g_logits.Download();
    const std::vector<float> got_loss = g_loss.Download();
    if (run == 0) {
      EXPECT_NEAR(got_loss[0], loss, 1e-5 * std::fabs(loss) + 2e-6 * scale * n)
          << "CrossEntropy loss";
      const std::vector<float> got = ToHost(got_raw);
      std::vector<float> got_d(size_t(n) * v);
      int64_t nonzero_padding = 0;
      for (int r = 0; r < n; ++r) {
        std::copy_n(got.begin() + size_t(r) * ld, v, got_d.begin() + size_t(r) * v);
        for (int j = v; j < ld; ++j) nonzero_padding += got[size_t(r) * ld + j] != 0.0f;
      }
      ExpectClose(got_d, dlogits, OutTol<T>(Tol{1e-5, 0, 1e-6 * scale}), "CrossEntropy dlogits");
      EXPECT_EQ(nonzero_padding, 0) << "padded columns [v, ld) must be zeroed";
      first_logits = got_raw;
      first_loss = got_loss;
    } else {
      EXPECT_TRUE(Bitwise(got_raw, first_logits)) << "dlogits are not deterministic";
      EXPECT_TRUE(Bitwise(got_loss, first_loss)) << "the loss is not deterministic";
    }
  }
}

TEST(CudaKernels, CrossEntropyMatchesCpu) {
  if (bigmac::comm::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  Gpu gpu;
  const int shapes[][3] = {{1, 2, 2},        {3, 5, 5},       {17, 257, 320},
                           {64, 1000, 1003}, {100, 300, 300}, {8, 50257, 50304}};
  uint32_t seed = 400;
  for (const auto& s : shapes) {
    CheckCrossEntropy<float>(gpu, s[0], s[1], s[2], seed);
    CheckCrossEntropy<bf16>(gpu, s[0], s[1], s[2], seed);
    ++seed;
  }
}

// ---------------------------------------------------------------------------------------------

template <typename T>
void CheckAttention(const Gpu& gpu, int b, int t, int c, int h, uint32_t seed) {
  SCOPED_TRACE(std::string(TypeName<T>()) + " b=" + std::to_string(b) + " t=" + std::to_string(t) +
               " c=" + std::to_string(c) + " h=" + std::to_string(h));
  std::mt19937 gen(seed);
  const size_t qkv_size = size_t(b) * t * 3 * c;
  const size_t out_size = size_t(b) * t * c;
  const size_t att_size = size_t(b) * h * t * t;
  const std::vector<float> qkv = Rounded<T>(Normal(qkv_size, gen, 0.0f, 1.5f));
  const std::vector<float> dout = Rounded<T>(Normal(out_size, gen));

  std::vector<float> out(out_size), att(att_size), dqkv(qkv_size);
  cpu::AttentionForward(out.data(), att.data(), qkv.data(), b, t, c, h);
  cpu::AttentionBackward(dqkv.data(), dout.data(), qkv.data(), att.data(), b, t, c, h);

  const CallSite site = gpu.Site("attention test");
  Buffer<T> g_qkv(ToDevice<T>(qkv)), g_dout(ToDevice<T>(dout));
  Buffer<T> g_out(ToDevice<T>(Uniform(out_size, gen)));
  Buffer<float> g_att(Uniform(att_size, gen));  // garbage the kernel must overwrite, zeros too
  AttentionForward<T>(site, g_out.get(), g_att.get(), g_qkv.get(), b, t, c, h);
  ExpectClose(ToHost(g_out.Download()), out, OutTol<T>(kF32Sum), "AttentionForward out");
  const std::vector<float> got_att = g_att.Download();
  ExpectClose(got_att, att, kF32Sum, "AttentionForward att");
  int64_t nonzero_upper = 0;
  for (size_t row = 0; row < size_t(b) * h * t; ++row) {
    const size_t ti = row % t;
    for (size_t t2 = ti + 1; t2 < size_t(t); ++t2) nonzero_upper += got_att[row * t + t2] != 0.0f;
  }
  EXPECT_EQ(nonzero_upper, 0) << "att must be zero above the diagonal";

  // The backward from the CPU's probabilities; dqkv starts as garbage (it is overwritten).
  Buffer<float> c_att(att);
  Buffer<T> g_dqkv(ToDevice<T>(Uniform(qkv_size, gen)));
  AttentionBackward<T>(site, g_dqkv.get(), g_dout.get(), g_qkv.get(), c_att.get(), b, t, c, h);
  ExpectClose(ToHost(g_dqkv.Download()), dqkv, OutTol<T>(kF32Sum), "AttentionBackward dqkv");
}

TEST(CudaKernels, AttentionMatchesCpu) {
  if (bigmac::comm::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  Gpu gpu;
  const int shapes[][4] = {{1, 1, 8, 2},    {2, 17, 24, 3}, {2, 64, 60, 4},
                           {1, 130, 96, 2}, {3, 33, 40, 5}, {1, 300, 12, 1}};
  uint32_t seed = 500;
  for (const auto& s : shapes) {
    CheckAttention<float>(gpu, s[0], s[1], s[2], s[3], seed);
    CheckAttention<bf16>(gpu, s[0], s[1], s[2], s[3], seed);
    ++seed;
  }
}

TEST(CudaKernels, AttentionRefusesChannelsNotDivisibleByHeads) {
  if (bigmac::comm::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  Gpu gpu;
  std::mt19937 gen(550);
  const int b = 1, t = 2, c = 10, h = 3;
  Buffer<float> qkv(Normal(size_t(b) * t * 3 * c, gen)), out(Normal(size_t(b) * t * c, gen));
  Buffer<float> att(Normal(size_t(b) * h * t * t, gen));
  EXPECT_THROW(AttentionForward<float>(gpu.Site("attention test"), out.get(), att.get(), qkv.get(),
                                       b, t, c, h),
               DeviceError);
}

// ---------------------------------------------------------------------------------------------

template <typename T>
void CheckRmsNorm(const Gpu& gpu, int n, int c, uint32_t seed) {
  SCOPED_TRACE(std::string(TypeName<T>()) + " n=" + std::to_string(n) + " c=" + std::to_string(c));
  std::mt19937 gen(seed);
  const size_t nc = size_t(n) * c;
  const double eps = 1e-6;
  const std::vector<float> inp = Rounded<T>(Normal(nc, gen, 0.3f, 2.0f));
  const std::vector<float> w = Rounded<T>(Normal(c, gen, 1.0f, 0.2f));
  const std::vector<float> dout = Rounded<T>(Normal(nc, gen));
  const std::vector<float> dinp0 = Rounded<T>(Uniform(nc, gen));
  const std::vector<float> dw0 = Uniform(c, gen);

  std::vector<float> out(nc), rstd(n);
  cpu::RmsNormForward(out.data(), rstd.data(), inp.data(), w.data(), n, c, eps);
  std::vector<float> dinp = dinp0;
  cpu::RmsNormBackwardInput(dinp.data(), dout.data(), inp.data(), w.data(), rstd.data(), n, c);
  std::vector<float> dw = dw0;
  cpu::RmsNormBackwardWeight(dw.data(), dout.data(), inp.data(), rstd.data(), n, c);

  const CallSite site = gpu.Site("rmsnorm test");
  Buffer<T> g_inp(ToDevice<T>(inp)), g_w(ToDevice<T>(w)), g_dout(ToDevice<T>(dout));
  Buffer<T> g_out(ToDevice<T>(Uniform(nc, gen)));
  Buffer<float> g_rstd(Uniform(n, gen));
  RmsNormForward<T>(site, g_out.get(), g_rstd.get(), g_inp.get(), g_w.get(), n, c, eps);
  ExpectClose(ToHost(g_out.Download()), out, OutTol<T>(kF32Sum), "RmsNormForward out");
  ExpectClose(g_rstd.Download(), rstd, kF32Sum, "RmsNormForward rstd");

  // The backward kernels start from the CPU's statistics, so each is checked on its own.
  Buffer<float> c_rstd(rstd);
  Buffer<T> g_dinp(ToDevice<T>(dinp0));
  RmsNormBackwardInput<T>(site, g_dinp.get(), g_dout.get(), g_inp.get(), g_w.get(), c_rstd.get(), n,
                          c);
  ExpectClose(ToHost(g_dinp.Download()), dinp, OutTol<T>(kF32Sum), "RmsNormBackwardInput");

  std::vector<float> first_dw;
  for (int run = 0; run < 2; ++run) {
    Buffer<float> g_dw(dw0);
    RmsNormBackwardWeight<T>(site, g_dw.get(), g_dout.get(), g_inp.get(), c_rstd.get(), n, c);
    const std::vector<float> got_dw = g_dw.Download();
    if (run == 0) {
      ExpectClose(got_dw, dw, kF32Sum, "RmsNormBackwardWeight dw");
      first_dw = got_dw;
    } else {
      EXPECT_TRUE(Bitwise(got_dw, first_dw)) << "RmsNormBackwardWeight dw is not deterministic";
    }
  }
}

TEST(CudaKernels, RmsNormMatchesCpu) {
  if (bigmac::comm::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  Gpu gpu;
  const int shapes[][2] = {{1, 8}, {7, 50}, {37, 96}, {130, 771}, {1000, 256}, {3001, 64}};
  uint32_t seed = 600;
  for (const auto& s : shapes) {
    CheckRmsNorm<float>(gpu, s[0], s[1], seed);
    CheckRmsNorm<bf16>(gpu, s[0], s[1], seed);
    ++seed;
  }
}

// ---------------------------------------------------------------------------------------------

// `offset` elements into each buffer: offset 1 takes the scalar path.
template <typename T>
void CheckSwiglu(const Gpu& gpu, int n, int width, int offset, uint32_t seed) {
  SCOPED_TRACE(std::string(TypeName<T>()) + " n=" + std::to_string(n) +
               " width=" + std::to_string(width) + " offset=" + std::to_string(offset));
  std::mt19937 gen(seed);
  const size_t rows = size_t(n) * width;
  const std::vector<float> gate_up = Rounded<T>(Uniform(2 * rows + offset, gen, -5.0f, 5.0f));
  const std::vector<float> dh = Rounded<T>(Normal(rows + offset, gen));
  std::vector<float> h(rows + offset), dgate_up(2 * rows + offset);
  cpu::SwigluForward(h.data() + offset, gate_up.data() + offset, n, width);
  cpu::SwigluBackward(dgate_up.data() + offset, dh.data() + offset, gate_up.data() + offset, n,
                      width);

  const CallSite site = gpu.Site("swiglu test");
  Buffer<T> g_gate_up(ToDevice<T>(gate_up)), g_dh(ToDevice<T>(dh));
  Buffer<T> g_h(ToDevice<T>(Uniform(rows + offset, gen)));
  Buffer<T> g_dgate_up(ToDevice<T>(Uniform(2 * rows + offset, gen)));
  SwigluForward<T>(site, g_h.get() + offset, g_gate_up.get() + offset, n, width);
  SwigluBackward<T>(site, g_dgate_up.get() + offset, g_dh.get() + offset, g_gate_up.get() + offset,
                    n, width);
  const std::vector<float> got_h = ToHost(g_h.Download());
  const std::vector<float> got_d = ToHost(g_dgate_up.Download());
  ExpectClose({got_h.begin() + offset, got_h.end()}, {h.begin() + offset, h.end()}, OutTol<T>(kF32),
              "SwigluForward");
  ExpectClose({got_d.begin() + offset, got_d.end()}, {dgate_up.begin() + offset, dgate_up.end()},
              OutTol<T>(kF32), "SwigluBackward");
}

TEST(CudaKernels, SwigluMatchesCpu) {
  if (bigmac::comm::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  Gpu gpu;
  const int shapes[][2] = {{1, 1}, {3, 7}, {17, 64}, {100, 172}, {257, 1000}};
  uint32_t seed = 700;
  for (const auto& s : shapes) {
    for (int offset : {0, 1}) {
      CheckSwiglu<float>(gpu, s[0], s[1], offset, seed);
      CheckSwiglu<bf16>(gpu, s[0], s[1], offset, seed);
      ++seed;
    }
  }
}

// ---------------------------------------------------------------------------------------------

// Rotates q and k (h + kv heads) of a qkv buffer in place, then turns a gradient back; the v heads
// must stay untouched. The GPU reads the CPU's fp32 table.
template <typename T>
void CheckRope(const Gpu& gpu, int b, int t, int h, int kv, int hs, uint32_t seed) {
  SCOPED_TRACE(std::string(TypeName<T>()) + " b=" + std::to_string(b) + " t=" + std::to_string(t) +
               " h=" + std::to_string(h) + " kv=" + std::to_string(kv) +
               " hs=" + std::to_string(hs));
  std::mt19937 gen(seed);
  const int64_t ld = int64_t{h + 2 * kv} * hs;
  const size_t size = size_t(b) * t * ld;
  std::vector<float> cos(size_t(t) * hs / 2), sin(cos.size());
  cpu::RopeTable(cos.data(), sin.data(), t, hs, 10000.0);
  const std::vector<float> x0 = Rounded<T>(Normal(size, gen));
  std::vector<float> x = x0, dx = x0;
  cpu::RopeForward(x.data(), cos.data(), sin.data(), b, t, h + kv, hs, ld);
  cpu::RopeBackward(dx.data(), cos.data(), sin.data(), b, t, h + kv, hs, ld);

  const CallSite site = gpu.Site("rope test");
  Buffer<float> g_cos(cos), g_sin(sin);
  Buffer<T> g_x(ToDevice<T>(x0)), g_dx(ToDevice<T>(x0));
  RopeForward<T>(site, g_x.get(), g_cos.get(), g_sin.get(), b, t, h + kv, hs, ld);
  RopeBackward<T>(site, g_dx.get(), g_cos.get(), g_sin.get(), b, t, h + kv, hs, ld);
  const Tol tol = std::is_same_v<T, float> ? kF32 : kBF16;
  ExpectClose(ToHost(g_x.Download()), x, tol, "RopeForward");
  ExpectClose(ToHost(g_dx.Download()), dx, tol, "RopeBackward");
  // The v heads are bitwise the input.
  const std::vector<float> got = ToHost(g_x.Download());
  int64_t changed = 0;
  for (size_t row = 0; row < size_t(b) * t; ++row) {
    for (int64_t j = int64_t{h + kv} * hs; j < ld; ++j)
      changed += got[row * ld + j] != x0[row * ld + j];
  }
  EXPECT_EQ(changed, 0) << "RopeForward wrote outside q and k";
}

TEST(CudaKernels, RopeMatchesCpu) {
  if (bigmac::comm::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  Gpu gpu;
  const int shapes[][5] = {{1, 1, 1, 1, 2}, {2, 9, 4, 2, 8}, {1, 130, 6, 1, 64}, {3, 17, 3, 3, 12}};
  uint32_t seed = 800;
  for (const auto& s : shapes) {
    CheckRope<float>(gpu, s[0], s[1], s[2], s[3], s[4], seed);
    CheckRope<bf16>(gpu, s[0], s[1], s[2], s[3], s[4], seed);
    ++seed;
  }
}

// ---------------------------------------------------------------------------------------------

// Grouped-query attention: the fallback kernels (probabilities kept) against the CPU's blocked
// attention (log-sum-exp kept), forward output and the whole dqkv, the backward from the GPU's own
// probabilities.
template <typename T>
void CheckGroupedAttention(const Gpu& gpu, int b, int t, int h, int kv, int hs, uint32_t seed) {
  SCOPED_TRACE(std::string(TypeName<T>()) + " b=" + std::to_string(b) + " t=" + std::to_string(t) +
               " h=" + std::to_string(h) + " kv=" + std::to_string(kv) +
               " hs=" + std::to_string(hs));
  std::mt19937 gen(seed);
  const int c = h * hs;
  const size_t qkv_size = size_t(b) * t * (h + 2 * kv) * hs;
  const size_t out_size = size_t(b) * t * c;
  const size_t att_size = size_t(b) * h * t * t;
  const std::vector<float> qkv = Rounded<T>(Normal(qkv_size, gen, 0.0f, 1.5f));
  const std::vector<float> dout = Rounded<T>(Normal(out_size, gen));
  std::vector<float> out(out_size), lse(size_t(b) * h * t), dqkv(qkv_size);
  cpu::FlashAttentionForward(out.data(), lse.data(), qkv.data(), b, t, c, h, kv);
  cpu::FlashAttentionBackward(dqkv.data(), dout.data(), qkv.data(), lse.data(), b, t, c, h, kv);

  const CallSite site = gpu.Site("grouped attention test");
  Buffer<T> g_qkv(ToDevice<T>(qkv)), g_dout(ToDevice<T>(dout));
  Buffer<T> g_out(ToDevice<T>(Uniform(out_size, gen)));
  Buffer<float> g_att(Uniform(att_size, gen));
  AttentionForward<T>(site, g_out.get(), g_att.get(), g_qkv.get(), b, t, c, h, kv);
  ExpectClose(ToHost(g_out.Download()), out, OutTol<T>(kF32Sum), "AttentionForward out (GQA)");
  std::vector<T> first;
  for (int run = 0; run < 2; ++run) {
    Buffer<T> g_dqkv(ToDevice<T>(Uniform(qkv_size, gen)));  // overwritten
    AttentionBackward<T>(site, g_dqkv.get(), g_dout.get(), g_qkv.get(), g_att.get(), b, t, c, h,
                         kv);
    const std::vector<T> got = g_dqkv.Download();
    if (run == 0) {
      ExpectClose(ToHost(got), dqkv, OutTol<T>(kF32Sum), "AttentionBackward dqkv (GQA)");
      first = got;
    } else {
      EXPECT_TRUE(Bitwise(got, first)) << "AttentionBackward (GQA) is not deterministic";
    }
  }
}

TEST(CudaKernels, GroupedQueryAttentionMatchesCpuFlashAttention) {
  if (bigmac::comm::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  Gpu gpu;
  // {b, t, h, kv, hs}: groups of 2, 3 and 4, multi-query (kv 1), and multi-head (kv = h).
  const int shapes[][5] = {{1, 1, 2, 1, 8},   {2, 17, 4, 2, 6},  {1, 33, 6, 2, 16},
                           {2, 20, 4, 1, 12}, {1, 64, 8, 2, 64}, {2, 9, 3, 3, 8}};
  uint32_t seed = 900;
  for (const auto& s : shapes) {
    CheckGroupedAttention<float>(gpu, s[0], s[1], s[2], s[3], s[4], seed);
    CheckGroupedAttention<bf16>(gpu, s[0], s[1], s[2], s[3], s[4], seed);
    ++seed;
  }
}

TEST(CudaKernels, AttentionRefusesHeadsNotDivisibleByKvHeads) {
  if (bigmac::comm::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  Gpu gpu;
  std::mt19937 gen(950);
  const int b = 1, t = 2, h = 3, kv = 2, hs = 4;
  Buffer<float> qkv(Normal(size_t(b) * t * (h + 2 * kv) * hs, gen));
  Buffer<float> out(Normal(size_t(b) * t * h * hs, gen)), att(Normal(size_t(b) * h * t * t, gen));
  EXPECT_THROW(AttentionForward<float>(gpu.Site("attention test"), out.get(), att.get(), qkv.get(),
                                       b, t, h * hs, h, kv),
               DeviceError);
}

// Llama's embedding has no position table: wpe and dwpe null.
TEST(CudaKernels, EmbeddingWithoutPositionsMatchesCpu) {
  if (bigmac::comm::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  Gpu gpu;
  const int b = 3, t = 11, c = 40, vocab = 13;
  std::mt19937 gen(960);
  const std::vector<int32_t> tokens = Tokens(size_t(b) * t, vocab, gen);
  const std::vector<float> wte = Normal(size_t(vocab) * c, gen);
  const std::vector<float> dout = Normal(size_t(b) * t * c, gen);
  const std::vector<float> dwte0 = Uniform(size_t(vocab) * c, gen);
  std::vector<float> out(size_t(b) * t * c), dwte = dwte0;
  cpu::EmbeddingForward(out.data(), tokens.data(), wte.data(), static_cast<const float*>(nullptr),
                        b, t, c);
  cpu::EmbeddingBackwardWeight(dwte.data(), static_cast<float*>(nullptr), dout.data(),
                               tokens.data(), b, t, c);
  const CallSite site = gpu.Site("embedding test");
  Buffer<int32_t> g_tokens(tokens);
  Buffer<float> g_wte(wte), g_dout(dout), g_out(Uniform(out.size(), gen)), g_dwte(dwte0);
  EmbeddingForward<float>(site, g_out.get(), g_tokens.get(), g_wte.get(), nullptr, b, t, c);
  EmbeddingBackwardWeight<float>(site, g_dwte.get(), nullptr, g_dout.get(), g_tokens.get(),
                                 tokens.data(), b, t, c, vocab);
  ExpectClose(g_out.Download(), out, kExact, "EmbeddingForward without wpe");
  ExpectClose(g_dwte.Download(), dwte, kExact, "EmbeddingBackwardWeight without dwpe");
}

}  // namespace
}  // namespace bigmac::stages::cuda
