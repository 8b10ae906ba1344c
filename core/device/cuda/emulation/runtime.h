#ifndef BIGMAC_CORE_DEVICE_CUDA_EMULATION_RUNTIME_H_
#define BIGMAC_CORE_DEVICE_CUDA_EMULATION_RUNTIME_H_

// The emulated CUDA device's internals, shared by the stand-ins for the CUDA runtime
// (cuda_runtime.cc), cuBLASLt (cublaslt.cc) and NCCL (nccl.cc). Test-only: nothing here is linked
// into a shipping binary.
//
// Device memory is host memory (every pointer is dereferenceable on the host). Each stream is an
// ordered queue of operations run by its own worker thread, as on the hardware: work enqueued on
// a stream runs later, and a caller that reads results without waiting reads stale data.

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace bigmac::device::cuda::emulation {

// Appends `op` to `stream`'s queue (nullptr or cudaStreamLegacy: the legacy default stream, which
// also waits for every blocking stream). Ops of one stream run in order on its worker thread.
// `name` ("cublasLtMatmul", "ncclSend") names the op in errors. Returns at once.
void Enqueue(cudaStream_t stream, std::string name, std::function<void()> op);

// Blocks the calling host thread until everything enqueued on `stream` so far has run.
void WaitStream(cudaStream_t stream);

// Records an asynchronous fault (sticky, as a device fault is): every later runtime call that
// reports errors returns `error`, and `message` is printed once to stderr. Safe from any thread.
void Fault(cudaError_t error, const std::string& message);

// A failed launch (bad configuration): the next cudaGetLastError returns `error` and clears it,
// as the hardware's launch errors do. `message` goes to stderr.
void SetLaunchError(cudaError_t error, const std::string& message);

// Called on the stream worker after each kernel: checks the guard bytes around every live
// allocation, faulting with the kernel named when one was written.
void AfterKernel(const std::string& kernel);

// True when [pointer, pointer + bytes) lies inside one live cudaMalloc allocation.
bool IsDeviceRange(const void* pointer, size_t bytes);

// What the emulated device did, since the process started (or since Reset). Read by tests and
// bench/emulated_costs: the GPU costs that can be counted without a GPU.
struct Counters {
  // cudaEventSynchronize, and cudaStreamSynchronize or a copy to pageable memory on a stream
  // with work enqueued since the host last waited for it.
  std::atomic<int64_t> host_synchronizations{0};
  std::atomic<int64_t> device_synchronizations{0};  // cudaDeviceSynchronize, cudaFree
  std::atomic<int64_t> memset_bytes{0};
  std::atomic<int64_t> host_to_device_bytes{0};
  std::atomic<int64_t> device_to_host_bytes{0};
  std::atomic<int64_t> kernel_launches{0};
  std::atomic<int64_t> gemm_calls{0};  // cublasLtMatmul
};
Counters& GetCounters();

// The device memory cudaMalloc may hand out (BIGMAC_EMULATED_DEVICE_MEMORY at start-up, bytes,
// K/M/G suffixes; 8 GiB by default): tests bound it to reach the out-of-memory paths.
void SetMemoryCapacity(int64_t bytes);

}  // namespace bigmac::device::cuda::emulation

#endif  // BIGMAC_CORE_DEVICE_CUDA_EMULATION_RUNTIME_H_
