#ifndef BIGMAC_CORE_DEVICE_CUDA_CUDA_DEVICE_H_
#define BIGMAC_CORE_DEVICE_CUDA_CUDA_DEVICE_H_

// CudaDevice: one GPU of a rank. It owns a compute stream, a cuBLASLt handle with its workspace
// (32 MiB, one per stream, as Hopper's cuBLASLt wants), a cuDNN handle bound to the stream, and
// the allocator's system memory: cudaMalloc/cudaFree under the caching DeviceAllocator, with the
// card's memory as its capacity (never managed memory). Every call is checked
// (core/device/cuda/check.h); errors name the rank and the device.
//
// Lifetime: created by the CLI after device selection, destroyed last (after every tensor). Only
// CUDA targets include this header; the rest of BigMac sees a device::Device.

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdint>
#include <memory>
#include <string>

#include "core/device/cuda/check.h"
#include "core/device/device.h"

namespace bigmac::device::cuda {

inline constexpr int64_t kBlasWorkspaceBytes = int64_t{32} << 20;

// What CUDA layers need from their device. Owned by the CudaDevice; valid while it lives.
struct CudaContext {
  int ordinal = 0;            // the CUDA device ordinal (among the visible devices)
  std::string label;          // "rank 2 (cuda:0)", the end of every error's text
  cudaStream_t stream = nullptr;
  cublasLtHandle_t blas_lt = nullptr;
  void* blas_workspace = nullptr;  // kBlasWorkspaceBytes, for cublasLtMatmul on `stream`
  cudnnHandle_t dnn = nullptr;     // cudnnSetStream(dnn, stream) already done
  int multiprocessors = 0;
  int compute_capability = 0;  // 90 for Hopper
  // For deterministic two-stage reductions (partial sums per fixed chunk, then an ordered sum):
  // kReduceScratchBytes of device memory, used by one kernel sequence at a time in stream order.
  void* reduce_scratch = nullptr;
  Device* device = nullptr;  // the owner, for tensors a kernel or library needs (cuDNN workspace)
};

inline constexpr int64_t kReduceScratchBytes = int64_t{16} << 20;

// Where CUDA work is issued: the device context (its stream), and the words that name it in an
// error ("gpt_block 3 forward, on rank 2 (cuda:0)"). Cheap to copy; holds no resources; the
// context outlives it.
struct CallSite {
  const CudaContext* context = nullptr;
  std::string where;
  cudaStream_t stream() const { return context->stream; }
  // The same place, with `what` in front: "fc GEMM, in gpt_block 3 forward, on rank 2 (cuda:0)".
  CallSite In(const std::string& what) const { return {context, what + ", in " + where}; }
};

// "<what>, on rank 2 (cuda:0)".
inline CallSite SiteOf(const CudaContext& context, const std::string& what) {
  return {&context, what + ", on " + context.label};
}

// After a kernel launch: a bad launch configuration (or an earlier asynchronous fault) is
// reported under the kernel's name. CUDA_LAUNCH_BLOCKING=1 attributes asynchronous faults to the
// kernel that caused them.
void CheckLaunch(const char* kernel, const CallSite& site);

// Visible CUDA devices; 0 when there is no driver or no device (never throws).
int VisibleDeviceCount();

// Selects device `ordinal` (cudaSetDevice) and creates its stream, handles and allocator.
// `world_rank` names the rank in errors. Throws DeviceError when the device cannot be used.
std::unique_ptr<Device> MakeCudaDevice(int ordinal, int world_rank);

// The CUDA context of `device`; throws std::logic_error if it is not a CUDA device.
const CudaContext& ContextOf(const Device* device);

// "NVIDIA H200, sm_90, 132 SMs, 139.8 GiB; driver 13000, runtime 13000, cuBLASLt 130100,
// cuDNN 91900" (for the [rank] line and device_check.sh).
std::string Describe(const Device* device);

}  // namespace bigmac::device::cuda

#endif  // BIGMAC_CORE_DEVICE_CUDA_CUDA_DEVICE_H_
