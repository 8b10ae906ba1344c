#ifndef BIGMAC_CORE_COMM_NCCL_NCCL_CHECK_H_
#define BIGMAC_CORE_COMM_NCCL_NCCL_CHECK_H_

// Status checks for NCCL calls, beside core/device/cuda/check.h's for CUDA. Only CUDA targets
// include this (it includes nccl.h).
//
// A failure throws device::DeviceError naming the call, NCCL's status and its last error, the
// operation and the peer, the rank and the device:
//   "ncclGroupEnd failed: ncclRemoteError (remote process exited or there was a network error;
//    NCCL: ...), in SendAct(micro-batch 3, stage 0) to pp rank 1, on rank 0 (cuda:0)"

#include <nccl.h>

#include <string>

#include "core/device/device.h"
#include "core/memory/dtype.h"

namespace bigmac::comm::nccl {

// Throws device::DeviceError("<call> failed: <status> (<description>[; NCCL: <last error>]), in
// <where>") unless `status` is ncclSuccess, or ncclInProgress when `in_progress_ok` (a
// non-blocking communicator's call that is still being carried out). `comm` (may be null) gives
// NCCL's last error text.
void Check(ncclResult_t status, const char* call, const std::string& where,
           ncclComm_t comm = nullptr, bool in_progress_ok = false);

// "ncclRemoteError".
std::string StatusName(ncclResult_t status);

// The NCCL type of a tensor dtype (counts are in elements of it): bf16 -> ncclBfloat16,
// f32 -> ncclFloat32, f64 -> ncclFloat64, i32 -> ncclInt32.
ncclDataType_t TypeOf(memory::DType dtype);

// ncclGetVersion (a host call: no GPU needed), e.g. 22809 for 2.28.9; 0 if it fails.
int Version();

}  // namespace bigmac::comm::nccl

#define BIGMAC_NCCL_CHECK(call, where) ::bigmac::comm::nccl::Check((call), #call, (where))

#endif  // BIGMAC_CORE_COMM_NCCL_NCCL_CHECK_H_
