#ifndef BIGMAC_CORE_DEVICE_CUDA_CONTEXT_H_
#define BIGMAC_CORE_DEVICE_CUDA_CONTEXT_H_

// What CUDA layers and kernels need from their device (its stream, library handles, scratch), and
// the call site that names where a failure happened. Only CUDA targets include this.

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdint>
#include <string>

#include "core/device/cuda/check.h"
#include "core/device/device.h"

namespace bigmac::device::cuda {

inline constexpr int64_t kBlasWorkspaceBytes = int64_t{32} << 20;

// Owned by the CudaDevice (core/device/cuda/cuda_device.h); valid while it lives.
struct CudaContext {
  int ordinal = 0;    // the CUDA device ordinal (among the visible devices)
  std::string label;  // "rank 2 (cuda:0)", the end of every error's text
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
  // Unique per CudaDevice in the process (1, 2, ...; 0 for a bare test context): caches keyed by
  // it never hand a plan built on a destroyed handle to a new device at the same address.
  uint64_t generation = 0;
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

}  // namespace bigmac::device::cuda

#endif  // BIGMAC_CORE_DEVICE_CUDA_CONTEXT_H_
