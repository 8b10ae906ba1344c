// NCCL: the library links and reports its version on every machine; the error text and the dtype
// mapping are host code; one-rank communicators run only where a GPU is (the two-rank transport
// is tests/nccl_pingpong under mpirun, run by launch/device_check.sh).
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "core/comm/cuda/cuda_probe.h"
#include "core/comm/nccl/nccl_check.h"
#include "core/device/device.h"
#include "core/memory/dtype.h"

namespace bigmac::comm::nccl {
namespace {

TEST(NcclLinks, VersionIsAtLeastTheHeaders) {
  // The build's headers are 2.28; the communicator config struct is its version's.
  EXPECT_GE(Version(), 22800);
  EXPECT_EQ(Version() / 10000, NCCL_MAJOR);
}

TEST(NcclCheck, ErrorNamesCallStatusPeerAndRank) {
  Check(ncclSuccess, "ncclSend", "unused");
  Check(ncclInProgress, "ncclGroupEnd", "unused", nullptr, /*in_progress_ok=*/true);
  try {
    Check(ncclInvalidArgument, "ncclSend",
          "SendAct(micro-batch 3, stage 0) to pp rank 1, on rank 0 (cuda:0)");
    FAIL() << "no error";
  } catch (const device::DeviceError& error) {
    const std::string text = error.what();
    EXPECT_EQ(text.rfind("ncclSend failed: ncclInvalidArgument (", 0), 0u) << text;
    EXPECT_NE(text.find("), in SendAct(micro-batch 3, stage 0) to pp rank 1, on rank 0 (cuda:0)"),
              std::string::npos)
        << text;
  }
  EXPECT_THROW(Check(ncclInProgress, "ncclGroupEnd", "x"), device::DeviceError);
  EXPECT_EQ(StatusName(ncclRemoteError), "ncclRemoteError");
}

TEST(NcclTypes, MatchTheTensorDtypes) {
  EXPECT_EQ(TypeOf(memory::DType::kBF16), ncclBfloat16);
  EXPECT_EQ(TypeOf(memory::DType::kF32), ncclFloat32);
  EXPECT_EQ(TypeOf(memory::DType::kF64), ncclFloat64);
  EXPECT_EQ(TypeOf(memory::DType::kI32), ncclInt32);
}

// One process, one GPU, a communicator of one rank: a grouped send to itself and its receive
// (bf16, counts in elements), and an all-reduce (the identity), on a stream of its own.
TEST(NcclGpu, OneRankGroupRoundTripAndAllReduce) {
  if (cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ncclComm_t comm = nullptr;
  int devices[] = {0};
  Check(ncclCommInitAll(&comm, 1, devices), "ncclCommInitAll", "the test");
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  constexpr int64_t kCount = (int64_t{1} << 20) + 3;
  std::vector<uint16_t> host(kCount), back(kCount);
  for (int64_t i = 0; i < kCount; ++i) host[i] = static_cast<uint16_t>((i * 40503u) & 0xff7f);
  void* send = nullptr;
  void* recv = nullptr;
  ASSERT_EQ(cudaMalloc(&send, kCount * 2), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&recv, kCount * 2), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(send, host.data(), kCount * 2, cudaMemcpyHostToDevice), cudaSuccess);
  // A pageable host-to-device cudaMemcpy may return before the bytes land, and `stream` is
  // non-blocking (unordered with the legacy stream): wait before NCCL reads them. The emulated
  // device found this race (the round trip read NaN fill).
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  Check(ncclGroupStart(), "ncclGroupStart", "the test");
  Check(ncclSend(send, kCount, ncclBfloat16, 0, comm, stream), "ncclSend", "the test");
  Check(ncclRecv(recv, kCount, ncclBfloat16, 0, comm, stream), "ncclRecv", "the test");
  Check(ncclGroupEnd(), "ncclGroupEnd", "the test");
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(back.data(), recv, kCount * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(std::memcmp(back.data(), host.data(), kCount * 2), 0);

  std::vector<float> values(4096), summed(4096);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.25f;
  float* data = nullptr;
  ASSERT_EQ(cudaMalloc(&data, values.size() * 4), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(data, values.data(), values.size() * 4, cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // as above
  Check(ncclAllReduce(data, data, values.size(), ncclFloat32, ncclSum, comm, stream),
        "ncclAllReduce", "the test");
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(summed.data(), data, values.size() * 4, cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(summed, values);
  cudaFree(data);
  cudaFree(send);
  cudaFree(recv);
  cudaStreamDestroy(stream);
  ncclCommDestroy(comm);
}

}  // namespace
}  // namespace bigmac::comm::nccl
