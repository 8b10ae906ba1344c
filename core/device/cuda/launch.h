#ifndef BIGMAC_CORE_DEVICE_CUDA_LAUNCH_H_
#define BIGMAC_CORE_DEVICE_CUDA_LAUNCH_H_

// Kernel launches and dynamic shared memory: the one place where the nvcc build and the emulated
// device (core/device/cuda/emulation/, which compiles the same .cu files as C++) differ. Only .cu
// files include this.

#include <cuda_runtime.h>

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include "core/device/cuda/context.h"

#ifdef BIGMAC_CUDA_EMULATION
#include "core/device/cuda/emulation/grid.h"
// A kernel's dynamic shared memory: BIGMAC_DYNAMIC_SHARED(float, smem); declares `smem`.
#define BIGMAC_DYNAMIC_SHARED(type, name) \
  type* const name = static_cast<type*>(::bigmac::device::cuda::emulation::DynamicSharedMemory())
#else
#define BIGMAC_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

namespace bigmac::device::cuda {

// kernel<<<grid, block, shared_bytes, stream>>>(args...). The arguments are converted to the
// kernel's parameter types and copied at the call, as CUDA does. Errors are left for
// cudaGetLastError (Launch below checks them).
template <typename... Params, typename... Args>
void LaunchKernel(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block,
                  size_t shared_bytes, cudaStream_t stream, Args&&... args) {
#ifdef BIGMAC_CUDA_EMULATION
  emulation::LaunchGrid(
      name, reinterpret_cast<const void*>(kernel), grid, block, shared_bytes, stream,
      [kernel, values = std::tuple<std::decay_t<Params>...>(std::forward<Args>(args)...)]() {
        std::apply(kernel, values);
      });
#else
  (void)name;
  // clang-format would split the launch brackets.
  // clang-format off
  kernel<<<grid, block, shared_bytes, stream>>>(std::forward<Args>(args)...);
  // clang-format on
#endif
}

// The same on `site`'s stream, then CheckLaunch(name, site): a bad configuration throws
// DeviceError naming the kernel and the site.
template <typename... Params, typename... Args>
void Launch(const char* name, void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
            const CallSite& site, Args&&... args) {
  LaunchKernel(name, kernel, grid, block, shared_bytes, site.stream(), std::forward<Args>(args)...);
  CheckLaunch(name, site);
}

}  // namespace bigmac::device::cuda

#endif  // BIGMAC_CORE_DEVICE_CUDA_LAUNCH_H_
