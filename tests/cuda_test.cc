// The CUDA path: the libraries link and load on every machine; kernels run only where a GPU is.
#include <cublas_v2.h>
#include <cudnn.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include "core/comm/cuda/cuda_probe.h"

namespace bigmac::comm::cuda {
namespace {

TEST(CudaLibraries, LinkAndReportVersions) {
  EXPECT_GE(RuntimeVersion(), 13000);
  EXPECT_GE(cudnnGetVersion(), 90000u);
  int nccl = 0;
  ASSERT_EQ(ncclGetVersion(&nccl), ncclSuccess);
  EXPECT_GE(nccl, 22800);
  int cublas_major = 0;
  ASSERT_EQ(cublasGetProperty(MAJOR_VERSION, &cublas_major), CUBLAS_STATUS_SUCCESS);
  EXPECT_GE(cublas_major, 13);
}

TEST(CudaKernel, SaxpyMatchesHost) {
  if (DeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  EXPECT_EQ(SaxpySelfTest(0), "");
}

}  // namespace
}  // namespace bigmac::comm::cuda
