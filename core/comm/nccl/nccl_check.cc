#include "core/comm/nccl/nccl_check.h"

namespace bigmac::comm::nccl {

std::string StatusName(ncclResult_t status) {
  switch (status) {
    case ncclSuccess:
      return "ncclSuccess";
    case ncclUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case ncclSystemError:
      return "ncclSystemError";
    case ncclInternalError:
      return "ncclInternalError";
    case ncclInvalidArgument:
      return "ncclInvalidArgument";
    case ncclInvalidUsage:
      return "ncclInvalidUsage";
    case ncclRemoteError:
      return "ncclRemoteError";
    case ncclInProgress:
      return "ncclInProgress";
    default:
      return "ncclResult " + std::to_string(static_cast<int>(status));
  }
}

void Check(ncclResult_t status, const char* call, const std::string& where, ncclComm_t comm,
           bool in_progress_ok) {
  if (status == ncclSuccess || (in_progress_ok && status == ncclInProgress)) return;
  std::string text = StatusName(status) + " (" + ncclGetErrorString(status);
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') text += std::string("; NCCL: ") + last;
  throw device::DeviceError(std::string(call) + " failed: " + text + "), in " + where);
}

ncclDataType_t TypeOf(memory::DType dtype) {
  switch (dtype) {
    case memory::DType::kBF16:
      return ncclBfloat16;
    case memory::DType::kF32:
      return ncclFloat32;
    case memory::DType::kF64:
      return ncclFloat64;
    case memory::DType::kI32:
      return ncclInt32;
  }
  throw device::DeviceError("no NCCL type for dtype " + std::to_string(static_cast<int>(dtype)));
}

int Version() {
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) return 0;
  return version;
}

}  // namespace bigmac::comm::nccl
