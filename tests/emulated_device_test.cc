// The emulated CUDA device itself (core/device/cuda/emulation/): the execution model (barriers,
// warp exchanges, shared memory), the runtime's asynchrony and its sanitizer checks. Compiled
// like an emulated .cu file (device_code.h force-included), so the kernels below are CUDA code.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "core/device/cuda/emulation/runtime.h"
#include "core/device/cuda/launch.h"

namespace bigmac::device::cuda {
namespace {

namespace emu = emulation;

// Fails the test on any CUDA error.
#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

// A stream op that holds the stream until Open(): lets a test look at the host side while work
// is queued, deterministically.
class Gate {
 public:
  void Hold(cudaStream_t stream) {
    std::shared_future<void> opened = promise_.get_future().share();
    emu::Enqueue(stream, "gate", [opened] { opened.wait(); });
  }
  void Open() { promise_.set_value(); }

 private:
  std::promise<void> promise_;
};

__global__ void BlockSumKernel(const float* in, float* out) {
  __shared__ float partial[256];
  partial[threadIdx.x] = in[blockIdx.x * blockDim.x + threadIdx.x];
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = partial[0];
}

TEST(EmulatedDevice, SyncThreadsOrdersSharedMemoryPerBlock) {
  constexpr int kBlocks = 16, kThreads = 256;
  std::vector<float> host(kBlocks * kThreads);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>((i * 37) % 101) - 50.0f;
  float *in = nullptr, *out = nullptr;
  ASSERT_CUDA(cudaMalloc(&in, host.size() * sizeof(float)));
  ASSERT_CUDA(cudaMalloc(&out, kBlocks * sizeof(float)));
  ASSERT_CUDA(cudaMemcpy(in, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  LaunchKernel("BlockSumKernel", BlockSumKernel, kBlocks, kThreads, 0, nullptr, in, out);
  ASSERT_CUDA(cudaGetLastError());
  std::vector<float> sums(kBlocks);
  ASSERT_CUDA(cudaMemcpy(sums.data(), out, kBlocks * sizeof(float), cudaMemcpyDeviceToHost));
  for (int b = 0; b < kBlocks; ++b) {
    float expected = 0;
    for (int t = 0; t < kThreads; ++t) expected += host[b * kThreads + t];
    EXPECT_EQ(sums[b], expected) << "block " << b;  // small integers: exact in any order
  }
  ASSERT_CUDA(cudaFree(in));
  ASSERT_CUDA(cudaFree(out));
}

// Lane l writes: the xor-butterfly sum (every lane), lane 7's value (broadcast), the ballot of
// odd lanes, and whether all lanes are positive.
__global__ void WarpOpsKernel(const int* in, int* sum, int* broadcast, unsigned* ballot,
                              int* all_positive, int lanes_in_mask) {
  const unsigned mask = lanes_in_mask == 32 ? 0xffffffffu : (1u << lanes_in_mask) - 1;
  const int lane = threadIdx.x % 32;
  int v = in[threadIdx.x];
  for (int offset = lanes_in_mask / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(mask, v, offset);
  }
  sum[threadIdx.x] = v;
  broadcast[threadIdx.x] = __shfl_sync(mask, in[threadIdx.x], 7);
  ballot[threadIdx.x] = __ballot_sync(mask, lane % 2 == 1);
  all_positive[threadIdx.x] = __all_sync(mask, in[threadIdx.x] > 0);
}

void RunWarpOps(int threads) {
  std::vector<int> host(threads);
  for (int i = 0; i < threads; ++i) host[i] = 3 * i + 1;
  int *in, *sum, *broadcast, *all_positive;
  unsigned* ballot;
  const size_t bytes = threads * sizeof(int);
  ASSERT_CUDA(cudaMalloc(&in, bytes));
  ASSERT_CUDA(cudaMalloc(&sum, bytes));
  ASSERT_CUDA(cudaMalloc(&broadcast, bytes));
  ASSERT_CUDA(cudaMalloc(&ballot, bytes));
  ASSERT_CUDA(cudaMalloc(&all_positive, bytes));
  ASSERT_CUDA(cudaMemcpy(in, host.data(), bytes, cudaMemcpyHostToDevice));
  const int lanes = std::min(threads, 32);
  LaunchKernel("WarpOpsKernel", WarpOpsKernel, 1, threads, 0, nullptr, in, sum, broadcast, ballot,
               all_positive, lanes);
  ASSERT_CUDA(cudaGetLastError());
  std::vector<int> got_sum(threads), got_broadcast(threads), got_all(threads);
  std::vector<unsigned> got_ballot(threads);
  ASSERT_CUDA(cudaMemcpy(got_sum.data(), sum, bytes, cudaMemcpyDeviceToHost));
  ASSERT_CUDA(cudaMemcpy(got_broadcast.data(), broadcast, bytes, cudaMemcpyDeviceToHost));
  ASSERT_CUDA(cudaMemcpy(got_ballot.data(), ballot, bytes, cudaMemcpyDeviceToHost));
  ASSERT_CUDA(cudaMemcpy(got_all.data(), all_positive, bytes, cudaMemcpyDeviceToHost));
  for (int t = 0; t < threads; ++t) {
    const int warp = t / 32;
    int expected = 0;
    for (int l = 0; l < lanes; ++l) expected += host[warp * 32 + l];
    EXPECT_EQ(got_sum[t], expected) << "thread " << t;
    EXPECT_EQ(got_broadcast[t], host[warp * 32 + 7]) << "thread " << t;
    EXPECT_EQ(got_ballot[t], 0xaaaaaaaau & (lanes == 32 ? 0xffffffffu : (1u << lanes) - 1));
    EXPECT_EQ(got_all[t], 1);
  }
  for (void* p : {(void*)in, (void*)sum, (void*)broadcast, (void*)ballot, (void*)all_positive}) {
    ASSERT_CUDA(cudaFree(p));
  }
}

TEST(EmulatedDevice, WarpShufflesBallotAndAllFollowTheLaneMask) {
  RunWarpOps(64);  // two full warps
  RunWarpOps(16);  // one partial warp, mask of its 16 lanes
}

// The low half-warp does an exchange of its own first (a sub-mask), then the whole warp rotates
// its values by one lane, twice in a row: each lane must read what its neighbour posted for that
// very exchange, however many warp operations each lane did before.
__global__ void DivergentWarpOpsKernel(int* first, int* second) {
  const int lane = threadIdx.x % 32;
  int v = lane * 10;
  if (lane < 16) v += __shfl_xor_sync(0x0000ffffu, 1000, 1);
  first[threadIdx.x] = __shfl_sync(0xffffffffu, v, (lane + 1) % 32);
  second[threadIdx.x] = __shfl_sync(0xffffffffu, v + 1, (lane + 31) % 32);
}

TEST(EmulatedDevice, WarpExchangesAfterSubMaskOperationsReadTheirOwnRound) {
  int *first = nullptr, *second = nullptr;
  ASSERT_CUDA(cudaMalloc(&first, 32 * sizeof(int)));
  ASSERT_CUDA(cudaMalloc(&second, 32 * sizeof(int)));
  LaunchKernel("DivergentWarpOpsKernel", DivergentWarpOpsKernel, 1, 32, 0, nullptr, first, second);
  ASSERT_CUDA(cudaGetLastError());
  std::vector<int> got_first(32), got_second(32);
  ASSERT_CUDA(cudaMemcpy(got_first.data(), first, sizeof(int) * 32, cudaMemcpyDeviceToHost));
  ASSERT_CUDA(cudaMemcpy(got_second.data(), second, sizeof(int) * 32, cudaMemcpyDeviceToHost));
  auto posted = [](int lane) { return lane * 10 + (lane < 16 ? 1000 : 0); };
  for (int lane = 0; lane < 32; ++lane) {
    EXPECT_EQ(got_first[lane], posted((lane + 1) % 32)) << "lane " << lane;
    EXPECT_EQ(got_second[lane], posted((lane + 31) % 32) + 1) << "lane " << lane;
  }
  ASSERT_CUDA(cudaFree(first));
  ASSERT_CUDA(cudaFree(second));
}

__global__ void DynamicSharedKernel(float* out, int n) {
  BIGMAC_DYNAMIC_SHARED(float, buffer);
  for (int i = threadIdx.x; i < n; i += blockDim.x) buffer[i] = static_cast<float>(i);
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = buffer[n - 1 - i];
}

TEST(EmulatedDevice, DynamicSharedMemoryNeedsTheOptInAboveTheDefault) {
  constexpr int kN = 16384;  // 64 KiB of floats, above the 48 KiB default
  float* out = nullptr;
  ASSERT_CUDA(cudaMalloc(&out, kN * sizeof(float)));
  LaunchKernel("DynamicSharedKernel", DynamicSharedKernel, 1, 128, kN * sizeof(float), nullptr, out,
               kN);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess) << "launch errors are not sticky";
  ASSERT_CUDA(cudaFuncSetAttribute(DynamicSharedKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   kN * sizeof(float)));
  LaunchKernel("DynamicSharedKernel", DynamicSharedKernel, 1, 128, kN * sizeof(float), nullptr, out,
               kN);
  ASSERT_CUDA(cudaGetLastError());
  std::vector<float> host(kN);
  ASSERT_CUDA(cudaMemcpy(host.data(), out, kN * sizeof(float), cudaMemcpyDeviceToHost));
  for (int i = 0; i < kN; ++i) ASSERT_EQ(host[i], static_cast<float>(kN - 1 - i));
  ASSERT_CUDA(cudaFree(out));
}

TEST(EmulatedDevice, BadLaunchConfigurationsAreLaunchErrors) {
  float* out = nullptr;
  ASSERT_CUDA(cudaMalloc(&out, 4));
  LaunchKernel("DynamicSharedKernel", DynamicSharedKernel, 1, 2048, 0, nullptr, out, 1);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  LaunchKernel("DynamicSharedKernel", DynamicSharedKernel, dim3(1, 70000), 32, 0, nullptr, out, 1);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  ASSERT_CUDA(cudaFree(out));
}

TEST(EmulatedDevice, NewAllocationsReadAsNaN) {
  float* data = nullptr;
  ASSERT_CUDA(cudaMalloc(&data, 1000 * sizeof(float)));
  std::vector<float> host(1000, 0.0f);
  ASSERT_CUDA(cudaMemcpy(host.data(), data, 1000 * sizeof(float), cudaMemcpyDeviceToHost));
  for (float x : host) ASSERT_TRUE(std::isnan(x));
  ASSERT_CUDA(cudaFree(data));
}

TEST(EmulatedDevice, WorkOnAStreamRunsLaterAndInOrder) {
  cudaStream_t stream;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int* device = nullptr;
  int* pinned = nullptr;
  ASSERT_CUDA(cudaMalloc(&device, sizeof(int)));
  ASSERT_CUDA(cudaMallocHost(&pinned, sizeof(int)));
  *pinned = 7;
  Gate gate;
  gate.Hold(stream);
  ASSERT_CUDA(cudaMemsetAsync(device, 0, sizeof(int), stream));
  ASSERT_CUDA(cudaMemcpyAsync(pinned, device, sizeof(int), cudaMemcpyDeviceToHost, stream));
  EXPECT_EQ(*pinned, 7) << "a pinned copy returns before it runs";
  EXPECT_EQ(cudaStreamQuery(stream), cudaErrorNotReady);
  gate.Open();
  ASSERT_CUDA(cudaStreamSynchronize(stream));
  EXPECT_EQ(*pinned, 0);
  ASSERT_CUDA(cudaFreeHost(pinned));
  ASSERT_CUDA(cudaFree(device));
  ASSERT_CUDA(cudaStreamDestroy(stream));
}

TEST(EmulatedDevice, PageableHostToDeviceCopiesAreStagedAtTheCall) {
  cudaStream_t stream;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  int* device = nullptr;
  ASSERT_CUDA(cudaMalloc(&device, sizeof(int)));
  Gate gate;
  gate.Hold(stream);
  int pageable = 11;
  ASSERT_CUDA(cudaMemcpyAsync(device, &pageable, sizeof(int), cudaMemcpyHostToDevice, stream));
  pageable = 12;  // allowed: the bytes were staged
  gate.Open();
  int back = 0;  // pageable: this copy returns once done
  ASSERT_CUDA(cudaMemcpyAsync(&back, device, sizeof(int), cudaMemcpyDeviceToHost, stream));
  EXPECT_EQ(back, 11);
  ASSERT_CUDA(cudaFree(device));
  ASSERT_CUDA(cudaStreamDestroy(stream));
}

TEST(EmulatedDevice, EventsOrderOneStreamAfterAnother) {
  cudaStream_t producer, consumer;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking));
  ASSERT_CUDA(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking));
  int *a, *b;
  ASSERT_CUDA(cudaMalloc(&a, sizeof(int)));
  ASSERT_CUDA(cudaMalloc(&b, sizeof(int)));
  Gate gate;
  gate.Hold(producer);
  ASSERT_CUDA(cudaMemsetAsync(a, 0x01, sizeof(int), producer));
  cudaEvent_t written;
  ASSERT_CUDA(cudaEventCreateWithFlags(&written, cudaEventDisableTiming));
  ASSERT_CUDA(cudaEventRecord(written, producer));
  EXPECT_EQ(cudaEventQuery(written), cudaErrorNotReady);
  ASSERT_CUDA(cudaStreamWaitEvent(consumer, written, 0));
  ASSERT_CUDA(cudaMemcpyAsync(b, a, sizeof(int), cudaMemcpyDeviceToDevice, consumer));
  ASSERT_CUDA(cudaEventDestroy(written));  // legal while pending
  gate.Open();
  ASSERT_CUDA(cudaStreamSynchronize(consumer));
  int host = 0;
  ASSERT_CUDA(cudaMemcpy(&host, b, sizeof(int), cudaMemcpyDeviceToHost));
  EXPECT_EQ(host, 0x01010101);
  ASSERT_CUDA(cudaFree(a));
  ASSERT_CUDA(cudaFree(b));
  ASSERT_CUDA(cudaStreamDestroy(producer));
  ASSERT_CUDA(cudaStreamDestroy(consumer));
}

TEST(EmulatedDevice, CudaFreeWaitsForTheWholeDevice) {
  cudaStream_t stream;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  void* other = nullptr;
  ASSERT_CUDA(cudaMalloc(&other, 64));
  Gate gate;
  gate.Hold(stream);
  std::atomic<bool> opened{false};
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    opened = true;
    gate.Open();
  });
  const int64_t before = emu::GetCounters().device_synchronizations;
  ASSERT_CUDA(cudaFree(other));  // an unrelated allocation, still behind the held stream
  EXPECT_TRUE(opened) << "cudaFree returned while the device had queued work";
  EXPECT_EQ(emu::GetCounters().device_synchronizations, before + 1);
  opener.join();
  ASSERT_CUDA(cudaStreamDestroy(stream));
}

TEST(EmulatedDevice, CapacityBoundsCudaMallocAndMemGetInfo) {
  size_t free_before = 0, total = 0;
  ASSERT_CUDA(cudaMemGetInfo(&free_before, &total));
  emu::SetMemoryCapacity(int64_t{1} << 20);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 2 << 20), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  ASSERT_CUDA(cudaMalloc(&p, 512 << 10));
  size_t free_bytes = 0;
  ASSERT_CUDA(cudaMemGetInfo(&free_bytes, &total));
  EXPECT_EQ(total, size_t{1} << 20);
  EXPECT_EQ(free_bytes, size_t{512} << 10);
  ASSERT_CUDA(cudaFree(p));
  emu::SetMemoryCapacity(int64_t{8} << 30);
}

TEST(EmulatedDevice, CopiesMustNameDeviceMemoryOnTheDeviceSide) {
  int host_a = 1, host_b = 2;
  EXPECT_EQ(cudaMemcpy(&host_a, &host_b, sizeof(int), cudaMemcpyHostToDevice),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemsetAsync(&host_a, 0, sizeof(int), nullptr), cudaErrorInvalidValue);
  cudaGetLastError();
}

TEST(EmulatedDevice, CountersCountCopiesSynchronizationsAndLaunches) {
  emu::Counters& c = emu::GetCounters();
  float* data = nullptr;
  float* pinned = nullptr;
  ASSERT_CUDA(cudaMalloc(&data, 1024));
  ASSERT_CUDA(cudaMallocHost(&pinned, 1024));
  const int64_t h2d = c.host_to_device_bytes, d2h = c.device_to_host_bytes;
  const int64_t memset = c.memset_bytes, launches = c.kernel_launches;
  const int64_t syncs = c.host_synchronizations;
  ASSERT_CUDA(cudaMemcpyAsync(data, pinned, 1024, cudaMemcpyHostToDevice, nullptr));
  ASSERT_CUDA(cudaMemsetAsync(data, 0, 512, nullptr));
  LaunchKernel("BlockSumKernel", BlockSumKernel, 1, 256, 0, nullptr, data, data);
  ASSERT_CUDA(cudaMemcpyAsync(pinned, data, 256, cudaMemcpyDeviceToHost, nullptr));
  ASSERT_CUDA(cudaStreamSynchronize(nullptr));
  EXPECT_EQ(c.host_to_device_bytes - h2d, 1024);
  EXPECT_EQ(c.device_to_host_bytes - d2h, 256);
  EXPECT_EQ(c.memset_bytes - memset, 512);
  EXPECT_EQ(c.kernel_launches - launches, 1);
  EXPECT_EQ(c.host_synchronizations - syncs, 1) << "the pinned copy itself does not wait";
  // A second wait with nothing enqueued since costs nothing; a copy into pageable memory waits.
  ASSERT_CUDA(cudaStreamSynchronize(nullptr));
  EXPECT_EQ(c.host_synchronizations - syncs, 1) << "a wait on an idle stream is not counted";
  float pageable[4];
  ASSERT_CUDA(cudaMemcpyAsync(pageable, data, sizeof(pageable), cudaMemcpyDeviceToHost, nullptr));
  ASSERT_CUDA(cudaStreamSynchronize(nullptr));
  EXPECT_EQ(c.host_synchronizations - syncs, 2) << "a pageable copy and its stream wait are one";
  ASSERT_CUDA(cudaFree(data));
  ASSERT_CUDA(cudaFreeHost(pinned));
}

// --- Sanitizer checks: each faults the (sticky) device, so each runs in a child process. -----

__global__ void EarlyExitBarrierKernel(float* out) {
  if (threadIdx.x >= 40) return;
  __syncthreads();
  out[threadIdx.x] = 1.0f;
}

__global__ void OutOfBoundsWriteKernel(float* out, int n) { out[n + threadIdx.x] = 1.0f; }

__global__ void OutOfBoundsReadKernel(const float* in, float* out, int n) {
  out[0] = in[n + 1024 * threadIdx.x];  // far past the end: the guard page
}

__global__ void ExitedLaneShuffleKernel(float* out) {
  if (threadIdx.x == 5) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.0f, 1);
}

class EmulatedDeviceDeathTest : public testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

TEST_F(EmulatedDeviceDeathTest, ABarrierNotEveryThreadReachesFailsTheLaunch) {
  EXPECT_EXIT(
      {
        float* out = nullptr;
        cudaMalloc(&out, 64 * sizeof(float));
        LaunchKernel("EarlyExitBarrierKernel", EarlyExitBarrierKernel, dim3(3), 64, 0, nullptr,
                     out);
        std::exit(cudaDeviceSynchronize() == cudaErrorLaunchFailure ? 0 : 1);
      },
      testing::ExitedWithCode(0),
      "kernel EarlyExitBarrierKernel, block \\([0-9],0,0\\).*a barrier not every thread reaches.*"
      "have exited");
}

TEST_F(EmulatedDeviceDeathTest, AWarpOperationWithAnExitedLaneFailsTheLaunch) {
  EXPECT_EXIT(
      {
        float* out = nullptr;
        cudaMalloc(&out, 32 * sizeof(float));
        LaunchKernel("ExitedLaneShuffleKernel", ExitedLaneShuffleKernel, 1, 32, 0, nullptr, out);
        std::exit(cudaDeviceSynchronize() == cudaErrorLaunchFailure ? 0 : 1);
      },
      testing::ExitedWithCode(0),
      "kernel ExitedLaneShuffleKernel, block \\(0,0,0\\), thread \\([0-9]+,0,0\\): "
      "__shfl_xor_sync with mask 0xffffffff: lane 5 has exited");
}

TEST_F(EmulatedDeviceDeathTest, AnOutOfBoundsWriteIsReportedAfterTheKernel) {
  EXPECT_EXIT(
      {
        float* out = nullptr;
        cudaMalloc(&out, 100 * sizeof(float));  // 400 bytes: guard bytes follow up to 512
        LaunchKernel("OutOfBoundsWriteKernel", OutOfBoundsWriteKernel, 1, 1, 0, nullptr, out, 100);
        std::exit(cudaDeviceSynchronize() == cudaErrorIllegalAddress ? 0 : 1);
      },
      testing::ExitedWithCode(0),
      "out-of-bounds write 0 bytes past the end of the 400-byte allocation.*after kernel "
      "OutOfBoundsWriteKernel");
}

TEST_F(EmulatedDeviceDeathTest, AnOutOfBoundsReadFaultsNamingKernelBlockAndThread) {
  EXPECT_DEATH(
      {
        float* in = nullptr;
        float* out = nullptr;
        cudaMalloc(&in, 4096);
        cudaMalloc(&out, 4);
        LaunchKernel("OutOfBoundsReadKernel", OutOfBoundsReadKernel, 1, 4, 0, nullptr, in, out,
                     1024);
        cudaDeviceSynchronize();
      },
      "invalid device memory access at 0x[0-9a-f]+ in kernel OutOfBoundsReadKernel, block "
      "\\(0,0,0\\), thread \\(0,0,0\\)");
}

}  // namespace
}  // namespace bigmac::device::cuda
