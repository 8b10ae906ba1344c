// CudaDevice against CpuDevice: the engine's elementwise operations on seeded random data, the
// allocator's accounting and OOM over cudaMalloc, and errors that name the call, the rank and the
// device. Without a GPU every case reports as skipped.
#include "core/device/cuda/cuda_device.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <random>
#include <string>
#include <vector>

#include "core/comm/cuda/cuda_probe.h"
#include "core/memory/tensor.h"

namespace bigmac {
namespace {

using memory::DType;
using memory::Tensor;

#define REQUIRE_GPU() \
  if (comm::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine"

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(n);
  for (float& v : values) v = normal(rng);
  return values;
}

std::vector<float> Host(const Tensor& tensor) {
  std::vector<float> host(tensor.numel());
  tensor.CopyToHost(host.data());
  return host;
}

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    REQUIRE_GPU();
    cpu_ = device::MakeCpuDevice(0, int64_t{1} << 30);
    gpu_ = device::cuda::MakeCudaDevice(0, 0);
  }
  Tensor On(device::Device* device, const std::vector<float>& values) {
    Tensor t(device, {static_cast<int64_t>(values.size())}, DType::kF32);
    t.CopyFromHost(values.data());
    return t;
  }
  std::unique_ptr<device::Device> cpu_, gpu_;
};

// 1000003 elements: not a multiple of any block size.
constexpr int64_t kN = 1000003;

TEST_F(CudaDeviceTest, Bf16RoundingIsBitwiseTheCpus) {
  const std::vector<float> values = Random(kN, 1);
  Tensor a = On(cpu_.get(), values), b = On(gpu_.get(), values);
  Tensor a16(cpu_.get(), {kN}, DType::kBF16), b16(gpu_.get(), {kN}, DType::kBF16);
  a16.ConvertFrom(a);
  b16.ConvertFrom(b);
  std::vector<uint16_t> ha(kN), hb(kN);
  a16.CopyToHost(ha.data());
  b16.CopyToHost(hb.data());
  EXPECT_EQ(ha, hb);
  Tensor back(gpu_.get(), {kN}, DType::kF32);
  back.ConvertFrom(b16);
  Tensor cpu_back(cpu_.get(), {kN}, DType::kF32);
  cpu_back.ConvertFrom(a16);
  EXPECT_EQ(Host(back), Host(cpu_back));
}

TEST_F(CudaDeviceTest, AddScaleAndSumOfSquaresMatchTheCpu) {
  const std::vector<float> x = Random(kN, 2), y = Random(kN, 3);
  Tensor cx = On(cpu_.get(), x), cy = On(cpu_.get(), y);
  Tensor gx = On(gpu_.get(), x), gy = On(gpu_.get(), y);
  cpu_->AddInto(cx.raw(), cy.raw(), DType::kF32, kN);
  gpu_->AddInto(gx.raw(), gy.raw(), DType::kF32, kN);
  cpu_->Scale(cx.raw(), DType::kF32, kN, 0.37);
  gpu_->Scale(gx.raw(), DType::kF32, kN, 0.37);
  EXPECT_EQ(Host(gx), Host(cx));  // one rounding each: bitwise
  const double cpu_sum = cpu_->SumSquares(cx.raw(), DType::kF32, kN);
  const double gpu_sum = gpu_->SumSquares(gx.raw(), DType::kF32, kN);
  EXPECT_NEAR(gpu_sum, cpu_sum, 1e-12 * cpu_sum);  // double sums in another order
  // Deterministic: the same sum every time.
  EXPECT_EQ(gpu_->SumSquares(gx.raw(), DType::kF32, kN), gpu_sum);
}

TEST_F(CudaDeviceTest, AllFiniteFindsOneNan) {
  std::vector<float> x = Random(kN, 4);
  Tensor g = On(gpu_.get(), x);
  EXPECT_TRUE(gpu_->AllFinite(g.raw(), DType::kF32, kN));
  x[kN - 2] = std::nanf("");
  g.CopyFromHost(x.data());
  EXPECT_FALSE(gpu_->AllFinite(g.raw(), DType::kF32, kN));
  Tensor g16(gpu_.get(), {kN}, DType::kBF16);
  g16.ConvertFrom(g);
  EXPECT_FALSE(gpu_->AllFinite(g16.raw(), DType::kBF16, kN));
}

TEST_F(CudaDeviceTest, AdamWMatchesTheCpuAndWritesTheBf16Copy) {
  const std::vector<float> p = Random(kN, 5), g = Random(kN, 6);
  std::vector<float> m(kN, 0.0f), v(kN, 0.0f);
  for (int64_t i = 0; i < kN; ++i) {
    m[i] = 0.1f * g[(i + 7) % kN];
    v[i] = 0.01f * g[(i + 3) % kN] * g[(i + 3) % kN];
  }
  std::vector<float> results[2];
  std::vector<uint16_t> copies[2];
  int which = 0;
  for (device::Device* device : {cpu_.get(), gpu_.get()}) {
    Tensor tp = On(device, p), tg = On(device, g), tm = On(device, m), tv = On(device, v);
    Tensor copy(device, {kN}, DType::kBF16);
    device::AdamWArgs args;
    args.p = tp.raw();
    args.g = tg.raw();
    args.m = tm.raw();
    args.v = tv.raw();
    args.compute_bf16 = copy.raw();
    args.n = kN;
    args.lr = 1e-3;
    args.beta1 = 0.9;
    args.beta2 = 0.95;
    args.eps = 1e-8;
    args.weight_decay = 0.1;
    args.bias_correction1 = 1 - 0.9 * 0.9;
    args.bias_correction2 = 1 - 0.95 * 0.95;
    args.grad_scale = 0.37;  // the gradient clip's factor
    device->AdamWUpdate(args);
    results[which] = Host(tp);
    copies[which].resize(kN);
    copy.CopyToHost(copies[which].data());
    ++which;
  }
  double worst = 0;
  for (int64_t i = 0; i < kN; ++i)
    worst = std::max(worst, double(std::fabs(results[0][i] - results[1][i])));
  EXPECT_LE(worst, 1e-6);  // fp32; FMA contraction may differ by an ulp
  int64_t copy_mismatches = 0;
  for (int64_t i = 0; i < kN; ++i) {
    const uint16_t want = memory::ToBFloat16(results[1][i]).bits;
    copy_mismatches += copies[1][i] != want;
  }
  EXPECT_EQ(copy_mismatches, 0);
}

TEST_F(CudaDeviceTest, AnAllocationOverTheLimitIsAnOomInTheCpusWords) {
  std::unique_ptr<device::Device> small = device::cuda::MakeCudaDevice(0, 0, int64_t{64} << 20);
  Tensor fits(small.get(), {int64_t{8} << 20}, DType::kF32);  // 32 MiB
  EXPECT_EQ(small->allocator().current_bytes(), int64_t{32} << 20);
  try {
    Tensor too_big(small.get(), {int64_t{16} << 20}, DType::kF32);  // 64 MiB more
    FAIL() << "no OOM";
  } catch (const memory::OutOfMemoryError& error) {
    EXPECT_NE(std::string(error.what()).find("cuda:0: out of memory: tried to allocate 64.00 MiB"),
              std::string::npos)
        << error.what();
  }
  // Freed memory is cached and reused: no second cudaMalloc.
  const int64_t before = small->allocator().system_allocations();
  fits = Tensor();
  Tensor again(small.get(), {int64_t{8} << 20}, DType::kF32);
  EXPECT_EQ(small->allocator().system_allocations(), before);
}

// Returning the cache to the card near capacity must not wait for the device's other streams: a
// cudaFree would wait for NCCL's, whose sends may wait for a peer that is itself waiting in
// cudaFree (a hang). Another stream is held busy by a host function until the allocation returns.
TEST_F(CudaDeviceTest, ReleasingTheCacheNearCapacityDoesNotWaitForOtherStreams) {
  std::unique_ptr<device::Device> small = device::cuda::MakeCudaDevice(0, 0, int64_t{64} << 20);
  { Tensor cached(small.get(), {int64_t{10} << 20}, DType::kF32); }  // 40 MiB, then cached
  ASSERT_EQ(small->allocator().cached_bytes(), int64_t{40} << 20);
  cudaStream_t busy = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&busy, cudaStreamNonBlocking), cudaSuccess);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  const cudaHostFn_t hold = [](void* data) {
    static_cast<std::shared_future<void>*>(data)->wait();
  };
  ASSERT_EQ(cudaLaunchHostFunc(busy, hold, &released), cudaSuccess);
  auto allocation = std::async(std::launch::async, [&] {
    cudaSetDevice(0);
    return Tensor(small.get(), {int64_t{12} << 20}, DType::kF32);  // 48 MiB: the cache goes back
  });
  const bool returned = allocation.wait_for(std::chrono::seconds(20)) == std::future_status::ready;
  release.set_value();
  ASSERT_EQ(cudaStreamSynchronize(busy), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(busy), cudaSuccess);
  EXPECT_TRUE(returned) << "returning the cache waited for another stream";
  const Tensor got = allocation.get();
  EXPECT_EQ(small->allocator().cached_bytes(), 0);
  EXPECT_EQ(small->allocator().current_bytes(), int64_t{48} << 20);
}

// The checkpoint snapshot's path (core/checkpoint/saver.cc): copies queued on the copy stream
// after the compute stream's work, the compute stream made to wait for them before it writes the
// state again, and the host waiting for them from another thread. The copy stream is held shut,
// so the compute stream's overwrite would land first if any of these orders were missing.
TEST_F(CudaDeviceTest, ASnapshotOnTheCopyStreamReadsTheValuesBeforeTheNextWrite) {
  ASSERT_NE(gpu_->copy_stream().handle, gpu_->compute_stream().handle);
  const std::vector<float> values = Random(kN, 7);
  Tensor state = On(gpu_.get(), values);  // queued on the compute stream
  void* pinned = gpu_->AllocateHostStaging(state.bytes());
  std::promise<void> open;
  std::shared_future<void> opened = open.get_future().share();
  const cudaHostFn_t hold = [](void* data) {
    static_cast<std::shared_future<void>*>(data)->wait();
  };
  const device::Stream copies = gpu_->copy_stream();
  const device::Event ready = gpu_->RecordEvent(gpu_->compute_stream());
  gpu_->WaitEvent(copies, ready);
  gpu_->DestroyEvent(ready);
  ASSERT_EQ(cudaLaunchHostFunc(static_cast<cudaStream_t>(copies.handle), hold, &opened),
            cudaSuccess);
  gpu_->CopyDeviceToHostAsync(pinned, state.raw(), state.bytes(), copies);
  const device::Event copied = gpu_->RecordEvent(copies);
  gpu_->WaitEvent(gpu_->compute_stream(), copied);  // Saver::GuardState
  state.Zero();                                     // the next optimizer step's write
  auto landed = std::async(std::launch::async, [&] { gpu_->WaitEventOnHost(copied); });
  EXPECT_EQ(landed.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout)
      << "the host wait returned before the copy ran";
  open.set_value();
  landed.get();
  std::vector<float> snapshot(kN);
  std::memcpy(snapshot.data(), pinned, state.bytes());
  EXPECT_EQ(snapshot, values) << "the snapshot saw a later write";
  for (float v : Host(state)) ASSERT_EQ(v, 0.0f);  // and the write still happened after it
  gpu_->DestroyEvent(copied);
  gpu_->FreeHostStaging(pinned);
}

TEST_F(CudaDeviceTest, UnderEmulationABlockFromTheCacheReadsAsNanAgain) {
  if (!comm::cuda::Emulated()) GTEST_SKIP() << "the NaN fill is the emulated device's sanitizer";
  const std::vector<float> ones(1024, 1.0f);
  Tensor first = Tensor::ForOverwrite(gpu_.get(), {1024}, DType::kF32);
  first.CopyFromHost(ones.data());
  const int64_t system = gpu_->allocator().system_allocations();
  first = Tensor();
  const Tensor second = Tensor::ForOverwrite(gpu_.get(), {1024}, DType::kF32);
  EXPECT_EQ(gpu_->allocator().system_allocations(), system) << "the block was not reused";
  for (float v : Host(second)) ASSERT_TRUE(std::isnan(v)) << "a reused block kept " << v;
}

TEST_F(CudaDeviceTest, AFailedCallNamesTheCallTheRankAndTheDevice) {
  try {
    device::cuda::MakeCudaDevice(999, 3);
    FAIL() << "device 999 was accepted";
  } catch (const device::DeviceError& error) {
    const std::string text = error.what();
    EXPECT_NE(text.find("cudaSetDevice"), std::string::npos) << text;
    EXPECT_NE(text.find("rank 3 (cuda:999)"), std::string::npos) << text;
  }
  EXPECT_NE(device::cuda::Describe(gpu_.get()).find("sm_"), std::string::npos);
}

}  // namespace
}  // namespace bigmac
