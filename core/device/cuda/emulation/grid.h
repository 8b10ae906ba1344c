#ifndef BIGMAC_CORE_DEVICE_CUDA_EMULATION_GRID_H_
#define BIGMAC_CORE_DEVICE_CUDA_EMULATION_GRID_H_

// The emulated device's execution model: a kernel's grid of blocks, each block's threads as
// fibers on one OS thread, with block barriers, warp exchanges and shared memory. Kernel code
// reaches it through device_code.h (threadIdx, __syncthreads, __shfl_xor_sync, ...); launches go
// through core/device/cuda/launch.h. Test-only.
//
// Blocks of one launch may run at the same time on several OS threads (as on several SMs); the
// threads of one block always share one OS thread, so `static thread_local` is per-block storage
// (device_code.h defines __shared__ that way).

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>

namespace bigmac::device::cuda::emulation {

// What one emulated GPU thread sees. Valid inside a kernel only.
struct ThreadCoordinates {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
};

namespace internal {
// The running GPU thread's coordinates (null outside a kernel), set by the scheduler on every
// switch. Read on every threadIdx: initial-exec TLS makes that one load, no call.
extern __thread const ThreadCoordinates* current_thread __attribute__((tls_model("initial-exec")));
[[noreturn]] void OutsideKernel(const char* what);
}  // namespace internal

// The calling GPU thread's coordinates; aborts with a message outside a kernel.
inline const ThreadCoordinates& CurrentThread() {
  const ThreadCoordinates* current = internal::current_thread;
  if (current == nullptr) [[unlikely]] {
    internal::OutsideKernel("threadIdx/blockIdx/blockDim/gridDim");
  }
  return *current;
}

// __syncthreads(): every thread of the block must reach it (the sanitizer fails the launch,
// naming the kernel, block and threads, when one has exited or waits at a warp operation).
void SyncThreads();

// __syncwarp(mask) and the exchange behind the warp operations: every lane in `mask` deposits
// `value` and gets the value deposited by `source_lane` (its own when the source is outside the
// mask). Every lane named in `mask` must exist and take part.
uint64_t WarpExchange(unsigned mask, uint64_t value, int source_lane, const char* operation);
void SyncWarp(unsigned mask);
// The lanes of `mask` whose `predicate` is true (the lanes of __ballot_sync).
unsigned WarpBallot(unsigned mask, bool predicate, const char* operation);

// The block's dynamic shared memory (the launch's shared-memory bytes), filled with a NaN pattern
// when the block starts: shared memory is uninitialised on the hardware.
void* DynamicSharedMemory();

// Enqueues a launch of `thread_body` (the kernel bound to its arguments, called once by every GPU
// thread) on `stream`. An invalid configuration is reported by the next cudaGetLastError, as
// with the hardware's <<<>>>, and nothing runs. `kernel` identifies the function for
// cudaFuncSetAttribute's shared-memory opt-in.
void LaunchGrid(const char* name, const void* kernel, dim3 grid, dim3 block, size_t shared_bytes,
                cudaStream_t stream, std::function<void()> thread_body);

// Shared-memory opt-in (cudaFuncSetAttribute's cudaFuncAttributeMaxDynamicSharedMemorySize).
void SetMaxDynamicSharedMemory(const void* kernel, int bytes);

template <typename T>
uint64_t ToBits(T value) {
  static_assert(sizeof(T) <= sizeof(uint64_t) && std::is_trivially_copyable_v<T>);
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  return bits;
}

template <typename T>
T FromBits(uint64_t bits) {
  T value;
  std::memcpy(&value, &bits, sizeof(T));
  return value;
}

}  // namespace bigmac::device::cuda::emulation

#endif  // BIGMAC_CORE_DEVICE_CUDA_EMULATION_GRID_H_
