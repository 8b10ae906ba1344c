#ifndef BIGMAC_CORE_DEVICE_CUDA_CUDA_DEVICE_H_
#define BIGMAC_CORE_DEVICE_CUDA_CUDA_DEVICE_H_

// CudaDevice: one GPU of a rank. It owns a compute stream, a cuBLASLt handle with its workspace
// (32 MiB, one per stream, as Hopper's cuBLASLt wants), a cuDNN handle bound to the stream, and
// the allocator's system memory: the stream-ordered pool (cudaMallocAsync/cudaFreeAsync on the
// compute stream, so that returning the cache never synchronizes the device; cudaMalloc where the
// card has no pool) under the caching DeviceAllocator, with the card's memory as its capacity
// (never managed memory). Every call is checked
// (core/device/cuda/check.h); errors name the rank and the device.
//
// Lifetime: created by the CLI after device selection, destroyed last (after every tensor). Only
// CUDA targets include this header; the rest of BigMac sees a device::Device.

#include <memory>
#include <string>

#include "core/device/cuda/context.h"
#include "core/device/device.h"

namespace bigmac::device::cuda {

// Selects device `ordinal` (cudaSetDevice) and creates its stream, handles and allocator.
// `world_rank` names the rank in errors. The capacity is the card's free memory at creation,
// less what the context's buffers take, capped by `memory_limit_bytes` when it is > 0 (so
// tune-mbs and OOM tests can bound it). Throws DeviceError when the device cannot be used.
std::unique_ptr<Device> MakeCudaDevice(int ordinal, int world_rank, int64_t memory_limit_bytes = 0);

// The CUDA context of `device`; throws std::logic_error if it is not a CUDA device.
const CudaContext& ContextOf(const Device* device);

// "NVIDIA H200, sm_90, 132 SMs, 139.8 GiB; driver 13000, runtime 13000, cuBLASLt 130100,
// cuDNN 91900" (for the [rank] line and device_check.sh).
std::string Describe(const Device* device);

}  // namespace bigmac::device::cuda

#endif  // BIGMAC_CORE_DEVICE_CUDA_CUDA_DEVICE_H_
