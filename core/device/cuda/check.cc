#include "core/device/cuda/check.h"

#include "core/device/cuda/context.h"

namespace bigmac::device::cuda {
namespace {

[[noreturn]] void Fail(const char* call, const std::string& status, const std::string& where) {
  throw DeviceError(std::string(call) + " failed: " + status + ", in " + where);
}

}  // namespace

void Check(cudaError_t status, const char* call, const std::string& where) {
  if (status == cudaSuccess) return;
  cudaGetLastError();  // clear a non-sticky error so later calls report their own
  Fail(call, std::string(cudaGetErrorName(status)) + " (" + cudaGetErrorString(status) + ")",
       where);
}

void Check(cublasStatus_t status, const char* call, const std::string& where) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  Fail(call,
       std::string(cublasLtGetStatusName(status)) + " (" + cublasLtGetStatusString(status) + ")",
       where);
}

void Check(cudnnStatus_t status, const char* call, const std::string& where) {
  if (status == CUDNN_STATUS_SUCCESS) return;
  Fail(call, cudnnGetErrorString(status), where);
}

void CheckLaunch(const char* kernel, const CallSite& site) {
  Check(cudaGetLastError(), kernel, site.where);
}

}  // namespace bigmac::device::cuda
