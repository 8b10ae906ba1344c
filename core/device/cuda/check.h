#ifndef BIGMAC_CORE_DEVICE_CUDA_CHECK_H_
#define BIGMAC_CORE_DEVICE_CUDA_CHECK_H_

// Status checks for every CUDA runtime, cuBLAS(Lt) and cuDNN call. Only CUDA targets include this
// (it includes the CUDA headers).
//
// A failure throws device::DeviceError:
//   "cublasLtMatmul failed: CUBLAS_STATUS_NOT_SUPPORTED (the functionality requested is not
//    supported), in gpt_block 3 forward, on rank 2 (cuda:0)"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <string>

#include "core/device/device.h"

namespace bigmac::device::cuda {

// Each throws DeviceError("<call> failed: <status name> (<description>), in <where>") unless the
// status is success.
void Check(cudaError_t status, const char* call, const std::string& where);
void Check(cublasStatus_t status, const char* call, const std::string& where);
void Check(cudnnStatus_t status, const char* call, const std::string& where);

}  // namespace bigmac::device::cuda

// BIGMAC_CUDA_CHECK(cudaMemcpyAsync(...), site.where): the call's text names it in the error.
#define BIGMAC_CUDA_CHECK(call, where) ::bigmac::device::cuda::Check((call), #call, (where))

#endif  // BIGMAC_CORE_DEVICE_CUDA_CHECK_H_
