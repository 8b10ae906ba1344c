// The words of a failed CUDA, cuBLASLt, cuDNN or NCCL call: each names the call, the status and
// the place, since on a cluster that line is often all a user sends. Needs no GPU (nothing
// runs on a device); on the emulated device the libraries' status strings are the stand-ins'.
#include <gtest/gtest.h>

#include <string>

#include "core/comm/nccl/nccl_check.h"
#include "core/device/cuda/check.h"
#include "core/device/device.h"

namespace bigmac {
namespace {

template <typename F>
std::string ErrorOf(F call) {
  try {
    call();
  } catch (const device::DeviceError& error) {
    return error.what();
  }
  return "(no error)";
}

void ExpectWords(const std::string& text, const std::vector<std::string>& words) {
  for (const std::string& word : words) EXPECT_NE(text.find(word), std::string::npos) << text;
}

TEST(CudaCheck, EachLibrarysFailureNamesTheCallTheStatusAndThePlace) {
  EXPECT_EQ(ErrorOf([] { device::cuda::Check(cudaSuccess, "cudaMalloc", "here"); }), "(no error)");
  ExpectWords(ErrorOf([] {
                device::cuda::Check(cudaErrorMemoryAllocation, "cudaMalloc", "the allocator");
              }),
              {"cudaMalloc failed", "cudaErrorMemoryAllocation", "in the allocator"});
  ExpectWords(ErrorOf([] {
                device::cuda::Check(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmul", "fc GEMM");
              }),
              {"cublasLtMatmul failed", "CUBLAS_STATUS_NOT_SUPPORTED", "in fc GEMM"});
  ExpectWords(ErrorOf([] {
                device::cuda::Check(CUDNN_STATUS_NOT_SUPPORTED, "cudnnBackendFinalize", "sdpa");
              }),
              {"cudnnBackendFinalize failed", "in sdpa"});
  EXPECT_EQ(ErrorOf([] { device::cuda::Check(CUBLAS_STATUS_SUCCESS, "x", "y"); }), "(no error)");
  EXPECT_EQ(ErrorOf([] { device::cuda::Check(CUDNN_STATUS_SUCCESS, "x", "y"); }), "(no error)");
}

TEST(NcclCheck, StatusesHaveTheirNamesAndFailuresNameTheCall) {
  using comm::nccl::StatusName;
  EXPECT_EQ(StatusName(ncclSuccess), "ncclSuccess");
  EXPECT_EQ(StatusName(ncclUnhandledCudaError), "ncclUnhandledCudaError");
  EXPECT_EQ(StatusName(ncclSystemError), "ncclSystemError");
  EXPECT_EQ(StatusName(ncclInternalError), "ncclInternalError");
  EXPECT_EQ(StatusName(ncclInvalidArgument), "ncclInvalidArgument");
  EXPECT_EQ(StatusName(ncclInvalidUsage), "ncclInvalidUsage");
  EXPECT_EQ(StatusName(ncclRemoteError), "ncclRemoteError");
  EXPECT_EQ(StatusName(ncclInProgress), "ncclInProgress");
  EXPECT_EQ(StatusName(static_cast<ncclResult_t>(99)), "ncclResult 99");
  EXPECT_EQ(ErrorOf([] { comm::nccl::Check(ncclInProgress, "ncclSend", "x", nullptr, true); }),
            "(no error)");
  ExpectWords(ErrorOf([] {
                comm::nccl::Check(ncclInProgress, "ncclSend", "activation to pp rank 1", nullptr);
              }),
              {"ncclSend failed", "ncclInProgress", "in activation to pp rank 1"});
  ExpectWords(
      ErrorOf([] { comm::nccl::Check(ncclRemoteError, "ncclAllReduce", "dp gradients", nullptr); }),
      {"ncclAllReduce failed", "ncclRemoteError", "in dp gradients"});
}

TEST(NcclCheck, EachDTypeHasItsNcclType) {
  EXPECT_EQ(comm::nccl::TypeOf(memory::DType::kBF16), ncclBfloat16);
  EXPECT_EQ(comm::nccl::TypeOf(memory::DType::kF32), ncclFloat32);
  EXPECT_EQ(comm::nccl::TypeOf(memory::DType::kF64), ncclFloat64);
  EXPECT_EQ(comm::nccl::TypeOf(memory::DType::kI32), ncclInt32);
  ExpectWords(ErrorOf([] { comm::nccl::TypeOf(static_cast<memory::DType>(77)); }),
              {"no NCCL type for dtype 77"});
}

}  // namespace
}  // namespace bigmac
