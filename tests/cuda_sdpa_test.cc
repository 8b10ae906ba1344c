// cuDNN's fused SDPA (stages/cuda/sdpa.h) against the CPU attention, on the GPU. Without a CUDA
// device every case is skipped (reported as skipped, never as passed).
//
// Inputs are random and rounded to bf16; the CPU side computes in float from the same rounded
// values. Tolerances: out and each of dq, dk, dv within 2e-2 of the CPU result's max |value|
// (bf16 outputs carry 2^-9 relative rounding, and the backward reads the bf16 O); stats (fp32)
// within 1e-3 of max(1, max |lse|) of the strided CPU reference's log-sum-exp. Two runs of the
// same call are bitwise equal (the backward asks for cuDNN's deterministic algorithm).
#include <cuda_runtime.h>
#include <cudnn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/comm/cuda/cuda_probe.h"
#include "core/device/cuda/check.h"
#include "core/device/cuda/context.h"
#include "core/memory/dtype.h"
#include "plugins/sdk/cpu_kernels.h"
#include "stages/cuda/sdpa.h"
#include "stages/cuda/sdpa_internal.h"
#include "stages/cuda/sdpa_layout.h"
#include "tests/testing/expect.h"
#include "tests/testing/sdpa_reference.h"

namespace bigmac::stages::cuda {
namespace {

namespace cpu = sdk::cpu;
using device::cuda::CudaContext;
using memory::BFloat16;

constexpr const char* kWhere = "cuda_sdpa_test";

// A bare context on device 0 (no CudaDevice: sdpa.cc then takes its workspace with
// cudaMallocAsync). Created once, kept for the process (cached graphs hold its cuDNN handle).
const CudaContext& TestContext() {
  static const CudaContext* context = [] {
    auto* c = new CudaContext;
    c->ordinal = 0;
    c->label = "cuda_sdpa_test (cuda:0)";
    BIGMAC_CUDA_CHECK(cudaSetDevice(0), kWhere);
    BIGMAC_CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), kWhere);
    BIGMAC_CUDA_CHECK(cudnnCreate(&c->dnn), kWhere);
    BIGMAC_CUDA_CHECK(cudnnSetStream(c->dnn, c->stream), kWhere);
    BIGMAC_CUDA_CHECK(cudaMalloc(&c->reduce_scratch, device::cuda::kReduceScratchBytes), kWhere);
    int major = 0, minor = 0;
    BIGMAC_CUDA_CHECK(
        cudaDeviceGetAttribute(&c->multiprocessors, cudaDevAttrMultiProcessorCount, 0), kWhere);
    BIGMAC_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), kWhere);
    BIGMAC_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0), kWhere);
    c->compute_capability = 10 * major + minor;
    return c;
  }();
  BIGMAC_CUDA_CHECK(cudaSetDevice(0), kWhere);  // this thread's current device
  return *context;
}

device::cuda::CallSite Site() { return device::cuda::SiteOf(TestContext(), "sdpa test"); }

// Device memory of `bytes`, filled with 0xff bytes (bf16 and fp32 NaNs), so an element a kernel
// never writes shows up as NaN.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(int64_t bytes) : bytes_(bytes) {
    BIGMAC_CUDA_CHECK(cudaMalloc(&data_, static_cast<size_t>(bytes)), kWhere);
    BIGMAC_CUDA_CHECK(cudaMemset(data_, 0xff, static_cast<size_t>(bytes)), kWhere);
  }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return data_; }
  template <typename T>
  void Upload(const std::vector<T>& host) {
    ASSERT_EQ(static_cast<int64_t>(host.size() * sizeof(T)), bytes_);
    BIGMAC_CUDA_CHECK(cudaMemcpy(data_, host.data(), bytes_, cudaMemcpyHostToDevice), kWhere);
  }
  template <typename T>
  std::vector<T> Download() const {
    BIGMAC_CUDA_CHECK(cudaStreamSynchronize(TestContext().stream), kWhere);
    std::vector<T> host(bytes_ / sizeof(T));
    BIGMAC_CUDA_CHECK(cudaMemcpy(host.data(), data_, bytes_, cudaMemcpyDeviceToHost), kWhere);
    return host;
  }

 private:
  void* data_ = nullptr;
  int64_t bytes_ = 0;
};

struct Shape {
  int b, t, h, d;
  int64_t c() const { return int64_t{h} * d; }
  int64_t qkv() const { return int64_t{b} * t * 3 * c(); }
  int64_t out() const { return int64_t{b} * t * c(); }
  int64_t stats() const { return int64_t{b} * h * t; }
  std::string Name() const {
    return "b=" + std::to_string(b) + " t=" + std::to_string(t) + " h=" + std::to_string(h) +
           " d=" + std::to_string(d);
  }
};

// Uniform in [-scale, scale], rounded to bf16: `bits` for the GPU, `values` for the CPU.
struct Bf16Data {
  std::vector<BFloat16> bits;
  std::vector<float> values;
};
Bf16Data RandomBf16(int64_t n, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-scale, scale);
  Bf16Data data;
  data.bits.resize(n);
  data.values.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    data.bits[i] = memory::ToBFloat16(uniform(rng));
    data.values[i] = memory::ToFloat(data.bits[i]);
  }
  return data;
}

std::vector<float> ToFloats(const std::vector<BFloat16>& bits) {
  std::vector<float> values(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) values[i] = memory::ToFloat(bits[i]);
  return values;
}

// max |a - b| over the elements where `select(i)`, divided by max(floor, max |b| there); infinite
// if a has a NaN there.
template <typename Select>
double Error(const std::vector<float>& a, const std::vector<float>& b, Select select,
             double floor = 0) {
  double err = 0, scale = floor;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!select(static_cast<int64_t>(i))) continue;
    if (!std::isfinite(a[i])) return INFINITY;
    err = std::max(err, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return err / scale;
}
bool All(int64_t) { return true; }

// One shape's inputs on both sides, and the CPU results.
struct Case {
  Shape s;
  Bf16Data qkv, dout;
  std::vector<float> cpu_out, cpu_att, cpu_dqkv, ref_stats;
  DeviceBuffer d_qkv, d_dout;

  explicit Case(Shape shape)
      : s(shape),
        qkv(RandomBf16(shape.qkv(), 1000 + shape.t + shape.d, 2.0f)),
        dout(RandomBf16(shape.out(), 2000 + shape.t + shape.d, 1.0f)),
        d_qkv(shape.qkv() * 2),
        d_dout(shape.out() * 2) {
    d_qkv.Upload(qkv.bits);
    d_dout.Upload(dout.bits);
    cpu_out.assign(s.out(), 0.0f);
    cpu_att.assign(int64_t{s.b} * s.h * s.t * s.t, 0.0f);
    cpu_dqkv.assign(s.qkv(), 0.0f);
    const int c = static_cast<int>(s.c());
    cpu::AttentionForward(cpu_out.data(), cpu_att.data(), qkv.values.data(), s.b, s.t, c, s.h);
    cpu::AttentionBackward(cpu_dqkv.data(), dout.values.data(), qkv.values.data(), cpu_att.data(),
                           s.b, s.t, c, s.h);
    std::vector<float> ref_out(s.out());
    ref_stats.assign(s.stats(), 0.0f);
    testutil::StridedAttentionForward(ref_out.data(), s.out(), ref_stats.data(), s.stats(),
                                      qkv.values.data(), s.qkv(),
                                      InterleavedQkvLayout(s.b, s.t, s.h, s.d));
  }

  void Forward(const DeviceBuffer& out, const DeviceBuffer& stats) const {
    CudnnAttentionForward(Site(), out.get(), static_cast<float*>(stats.get()), d_qkv.get(), s.b,
                          s.t, s.h, s.d);
  }
  void Backward(const DeviceBuffer& dqkv, const DeviceBuffer& out,
                const DeviceBuffer& stats) const {
    CudnnAttentionBackward(Site(), dqkv.get(), d_dout.get(), d_qkv.get(), out.get(),
                           static_cast<const float*>(stats.get()), s.b, s.t, s.h, s.d);
  }
};

// Every case runs cuDNN's own engines: skipped without a GPU, and on the emulated device (which
// does not emulate cuDNN; the fallback attention is tested in cuda_kernels_test).
#define SKIP_WITHOUT_CUDNN_ENGINES()                                                         \
  do {                                                                                       \
    if (bigmac::comm::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";            \
    if (bigmac::comm::cuda::Emulated()) {                                                    \
      GTEST_SKIP() << "needs cuDNN's engines, which the emulated CUDA device does not have"; \
    }                                                                                        \
  } while (false)

const Shape kShapes[] = {{2, 64, 4, 64}, {2, 128, 2, 128}};

TEST(CudnnSdpa, ForwardMatchesCpuAttention) {
  SKIP_WITHOUT_CUDNN_ENGINES();
  for (const Shape& s : kShapes) {
    Case c(s);
    DeviceBuffer out(s.out() * 2), stats(s.stats() * 4);
    c.Forward(out, stats);
    const std::vector<float> gpu_out = ToFloats(out.Download<BFloat16>());
    const std::vector<float> gpu_stats = stats.Download<float>();
    EXPECT_LE(Error(gpu_out, c.cpu_out, All), 2e-2) << s.Name();
    EXPECT_LE(Error(gpu_stats, c.ref_stats, All, 1.0), 1e-3) << s.Name();
  }
}

TEST(CudnnSdpa, BackwardMatchesCpuAttentionBackward) {
  SKIP_WITHOUT_CUDNN_ENGINES();
  for (const Shape& s : kShapes) {
    Case c(s);
    DeviceBuffer out(s.out() * 2), stats(s.stats() * 4), dqkv(s.qkv() * 2);
    c.Forward(out, stats);
    c.Backward(dqkv, out, stats);
    const std::vector<float> gpu = ToFloats(dqkv.Download<BFloat16>());
    // dq, dk and dv separately (each third of a token's 3C row), so a swapped or missing part
    // cannot hide behind a larger one; NaN-filled dqkv proves every element was written.
    const char* names[] = {"dq", "dk", "dv"};
    for (int part = 0; part < 3; ++part) {
      const int64_t c3 = 3 * s.c();
      auto in_part = [&](int64_t i) { return (i % c3) / s.c() == part; };
      EXPECT_LE(Error(gpu, c.cpu_dqkv, in_part), 2e-2) << names[part] << ", " << s.Name();
    }
  }
}

// Grouped-query attention (llama's layout: h query heads, then kv key and kv value heads per
// row) against the CPU's blocked grouped-query attention, forward and backward, same tolerances.
TEST(CudnnSdpa, GroupedQueryMatchesCpuFlashAttention) {
  SKIP_WITHOUT_CUDNN_ENGINES();
  struct Grouped {
    int b, t, h, kv, d;
  };
  for (const Grouped& s : {Grouped{2, 64, 4, 2, 64}, Grouped{1, 96, 6, 1, 128}}) {
    const std::string name = "b=" + std::to_string(s.b) + " t=" + std::to_string(s.t) +
                             " h=" + std::to_string(s.h) + " kv=" + std::to_string(s.kv) +
                             " d=" + std::to_string(s.d);
    const int c = s.h * s.d;
    const int64_t row = int64_t{s.h + 2 * s.kv} * s.d;
    const int64_t qkv_size = int64_t{s.b} * s.t * row;
    const int64_t out_size = int64_t{s.b} * s.t * c;
    const int64_t stats_size = int64_t{s.b} * s.h * s.t;
    const Bf16Data qkv = RandomBf16(qkv_size, 3000 + s.t, 2.0f);
    const Bf16Data dout = RandomBf16(out_size, 4000 + s.t, 1.0f);
    std::vector<float> cpu_out(out_size), cpu_lse(stats_size), cpu_dqkv(qkv_size);
    cpu::FlashAttentionForward(cpu_out.data(), cpu_lse.data(), qkv.values.data(), s.b, s.t, c, s.h,
                               s.kv);
    cpu::FlashAttentionBackward(cpu_dqkv.data(), dout.values.data(), qkv.values.data(),
                                cpu_lse.data(), s.b, s.t, c, s.h, s.kv);
    DeviceBuffer d_qkv(qkv_size * 2), d_dout(out_size * 2);
    d_qkv.Upload(qkv.bits);
    d_dout.Upload(dout.bits);
    DeviceBuffer out(out_size * 2), stats(stats_size * 4), dqkv(qkv_size * 2);
    CudnnAttentionForward(Site(), out.get(), static_cast<float*>(stats.get()), d_qkv.get(), s.b,
                          s.t, s.h, s.d, s.kv);
    CudnnAttentionBackward(Site(), dqkv.get(), d_dout.get(), d_qkv.get(), out.get(),
                           static_cast<const float*>(stats.get()), s.b, s.t, s.h, s.d, s.kv);
    EXPECT_LE(Error(ToFloats(out.Download<BFloat16>()), cpu_out, All), 2e-2) << name;
    EXPECT_LE(Error(stats.Download<float>(), cpu_lse, All, 1.0), 1e-3) << name;
    const std::vector<float> gpu = ToFloats(dqkv.Download<BFloat16>());
    // dq (h heads), dk (kv heads), dv (kv heads) of each row separately.
    const int64_t bounds[] = {0, c, c + int64_t{s.kv} * s.d, row};
    const char* names[] = {"dq", "dk", "dv"};
    for (int part = 0; part < 3; ++part) {
      auto in_part = [&](int64_t i) {
        return i % row >= bounds[part] && i % row < bounds[part + 1];
      };
      EXPECT_LE(Error(gpu, cpu_dqkv, in_part), 2e-2) << names[part] << ", " << name;
    }
  }
}

TEST(CudnnSdpa, TwoRunsAreBitwiseEqual) {
  SKIP_WITHOUT_CUDNN_ENGINES();
  const Shape s{4, 256, 4, 64};
  Case c(s);
  DeviceBuffer out1(s.out() * 2), stats1(s.stats() * 4), dqkv1(s.qkv() * 2);
  DeviceBuffer out2(s.out() * 2), stats2(s.stats() * 4), dqkv2(s.qkv() * 2);
  c.Forward(out1, stats1);
  c.Backward(dqkv1, out1, stats1);
  c.Forward(out2, stats2);
  c.Backward(dqkv2, out2, stats2);
  auto same = [](const DeviceBuffer& a, const DeviceBuffer& b) {
    const std::vector<uint8_t> x = a.Download<uint8_t>(), y = b.Download<uint8_t>();
    return x == y;
  };
  EXPECT_TRUE(same(out1, out2)) << "forward out differs between runs";
  EXPECT_TRUE(same(stats1, stats2)) << "forward stats differ between runs";
  EXPECT_TRUE(same(dqkv1, dqkv2)) << "backward dqkv differs between runs";
}

TEST(CudnnSdpa, SecondCallReusesTheCachedGraph) {
  SKIP_WITHOUT_CUDNN_ENGINES();
  const Shape s{1, 32, 2, 64};  // used by no other test
  Case c(s);
  DeviceBuffer out(s.out() * 2), stats(s.stats() * 4), dqkv(s.qkv() * 2);
  const int64_t builds = internal::SdpaGraphBuilds();
  const int64_t cached = internal::SdpaCachedGraphs();
  c.Forward(out, stats);
  EXPECT_EQ(internal::SdpaGraphBuilds(), builds + 1);
  c.Forward(out, stats);
  EXPECT_EQ(internal::SdpaGraphBuilds(), builds + 1);
  c.Backward(dqkv, out, stats);
  EXPECT_EQ(internal::SdpaGraphBuilds(), builds + 2);
  c.Backward(dqkv, out, stats);
  EXPECT_EQ(internal::SdpaGraphBuilds(), builds + 2);
  EXPECT_EQ(internal::SdpaCachedGraphs(), cached + 2);
  EXPECT_LE(Error(ToFloats(out.Download<BFloat16>()), c.cpu_out, All), 2e-2);
}

// Head dim 4, which the frontend's validate() refuses (not a multiple of 8; sdpa_graph_test shows
// the same on the CPU): the error names the shape and the step, nothing is cached, and a retry
// fails the same way.
TEST(CudnnSdpa, UnsupportedShapeFailsClearlyAndIsNotCached) {
  SKIP_WITHOUT_CUDNN_ENGINES();
  const Shape s{1, 16, 2, 4};
  DeviceBuffer qkv(s.qkv() * 2), out(s.out() * 2), stats(s.stats() * 4);
  const int64_t builds = internal::SdpaGraphBuilds();
  const int64_t cached = internal::SdpaCachedGraphs();
  for (int attempt = 0; attempt < 2; ++attempt) {
    try {
      CudnnAttentionForward(Site(), out.get(), static_cast<float*>(stats.get()), qkv.get(), s.b,
                            s.t, s.h, s.d);
      ADD_FAILURE() << "head dim 4 built a cuDNN SDPA graph";
    } catch (const device::DeviceError& error) {
      const std::string text = error.what();
      testutil::ExpectContains(text, "cuDNN SDPA forward graph for b=1,t=16,h=2,d=4: ");
      testutil::ExpectContains(text, ": validate failed: GRAPH_NOT_SUPPORTED (");
      testutil::ExpectContains(text, ", in sdpa test, on cuda_sdpa_test (cuda:0)");
    }
  }
  EXPECT_EQ(internal::SdpaGraphBuilds(), builds);
  EXPECT_EQ(internal::SdpaCachedGraphs(), cached);
}

}  // namespace
}  // namespace bigmac::stages::cuda
