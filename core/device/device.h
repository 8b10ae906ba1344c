#ifndef BIGMAC_CORE_DEVICE_DEVICE_H_
#define BIGMAC_CORE_DEVICE_DEVICE_H_

// The one object that knows where a rank's memory lives. Everything above core/device reaches
// memory through it: tensors allocate, zero and copy through their Device, the optimizer and the
// engine's reductions call its operations, layers get it in their LayerSpec. CpuDevice is host
// memory with work done when it is called; CudaDevice (core/device/cuda) implements the same
// interface over a stream, cuBLASLt/cuDNN handles and a caching cudaMalloc allocator. No CUDA
// header is included here, so every CPU-only target builds without the toolkit.
//
// Lifetime: a Device outlives every tensor, layer, optimizer and transport that uses it (the
// trainer creates it first and destroys it last). Not copyable.

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/memory/allocator.h"
#include "core/memory/dtype.h"

namespace bigmac::device {

using memory::DType;

// A call into a device's runtime or libraries failed (CUDA, cuBLAS, cuDNN, NCCL). The message
// names the call, its status, the layer or operation, the rank and the device. The CLI maps it
// to kExitDevice.
class DeviceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Backend { kCpu, kCuda };
std::string BackendName(Backend backend);  // "cpu", "cuda"
// "cpu" or "cuda"; false for anything else.
bool ParseBackend(const std::string& name, Backend* backend);

// Opaque handles: cudaStream_t and cudaEvent_t on CUDA, null on the CPU (where work is done when
// it is called, so ordering is trivially kept).
struct Stream {
  void* handle = nullptr;
};
struct Event {
  void* handle = nullptr;
};

// The arguments of one AdamW update of `n` elements (see optim::AdamW for the formula). p, g, m
// and v are device pointers of `dtype` (f32, or f64 in the gradient checks).
struct AdamWArgs {
  void* p = nullptr;
  const void* g = nullptr;
  void* m = nullptr;
  void* v = nullptr;
  int64_t n = 0;
  DType dtype = DType::kF32;
  // The parameter's bf16 compute copy, rewritten from the new p in the same pass (f32 only), or
  // null. Rounded to nearest even, exactly as Convert would.
  void* compute_bf16 = nullptr;
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  double bias_correction1 = 1, bias_correction2 = 1;
  // g is read as g * grad_scale, rounded to dtype (grad_scale rounded to dtype once): the bits a
  // separate scaling pass would leave in g (the gradient clip, without a pass over g of its own).
  double grad_scale = 1;
};

class Device {
 public:
  virtual ~Device() = default;
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  virtual Backend backend() const = 0;
  // "cpu:0", "cuda:3": the words of every error about this device.
  const std::string& name() const { return allocator_.device(); }
  // Capacity, peak and OOM accounting; every byte of a tensor comes from here.
  memory::DeviceAllocator& allocator() { return allocator_; }
  const memory::DeviceAllocator& allocator() const { return allocator_; }

  // Memory, in order on the compute stream. Pointers are this device's unless named host.
  virtual void Memset(void* data, int64_t bytes) = 0;  // zeroes
  virtual void CopyHostToDevice(void* data, const void* host, int64_t bytes) = 0;
  // Returns when the bytes are in `host` (it waits for the stream).
  virtual void CopyDeviceToHost(void* host, const void* data, int64_t bytes) = 0;
  virtual void CopyDeviceToDevice(void* to, const void* from, int64_t bytes) = 0;

  // Streams and events. The compute stream runs every layer and every operation below; a
  // transport orders its own stream against it with events.
  virtual Stream compute_stream() = 0;
  virtual Event RecordEvent(Stream stream) = 0;  // the caller destroys it
  virtual void WaitEvent(Stream stream, Event event) = 0;
  virtual void DestroyEvent(Event event) = 0;
  virtual void Synchronize() = 0;  // all work issued so far has finished
  // Timed events, for the trace's device tracks (core/device/device_spans.h): where work is
  // asynchronous (CUDA) the host's clock times only its enqueueing, so spans are timed on the
  // streams themselves. RecordTimedEvent records an event that keeps the time the stream reached
  // it (the caller destroys it); ElapsedMs waits for `end` and returns the milliseconds from
  // `start` to it. Devices without them (the CPU: work is done when its call returns) say so.
  virtual bool has_timed_events() const { return false; }
  virtual Event RecordTimedEvent(Stream stream) { return RecordEvent(stream); }
  virtual double ElapsedMs(Event /*start*/, Event /*end*/) { return 0; }

  // A second stream for copies that should overlap the compute stream's work (the checkpoint
  // snapshot's device-to-host copies; core/checkpoint/saver.h). Ordered against the compute
  // stream only by events. Null on the CPU, where a copy is done when its call returns.
  virtual Stream copy_stream() { return compute_stream(); }
  // Enqueues a copy of `bytes` from device memory into `host` on `stream` and returns: on CUDA
  // before it runs when `host` is AllocateHostStaging memory (pinned), so the bytes are there only
  // once an event recorded on `stream` after it is complete. On the CPU it copies at the call.
  virtual void CopyDeviceToHostAsync(void* host, const void* data, int64_t bytes, Stream stream);
  // Blocks the calling thread until `event` is complete. Any thread may call it (the saver's
  // writer does), as long as the event is not destroyed meanwhile.
  virtual void WaitEventOnHost(Event /*event*/) {}

  // Host memory for staging transfers (the MPI transport's buffers for device tensors):
  // page-locked on CUDA (cudaHostAlloc), so copies run at the bus's speed; ordinary memory on the
  // CPU. Outside the allocator's capacity. A copy from it into device memory may still be running
  // when CopyHostToDevice returns: Synchronize before writing it again. Throws DeviceError when
  // none can be had.
  virtual void* AllocateHostStaging(int64_t bytes);
  virtual void FreeHostStaging(void* host);
  // Whether AllocateHostStaging's memory is page-locked.
  virtual bool host_staging_pinned() const { return false; }

  // Library handles for layers (cublasLtHandle_t, cudnnHandle_t) and a GEMM workspace; null on
  // the CPU. Plugins get them as opaque pointers.
  virtual void* blas_handle() { return nullptr; }
  virtual void* dnn_handle() { return nullptr; }

  // The engine's elementwise operations on device memory (the layers' kernels are the backend's
  // own). `n` counts elements.
  // to = from converted (f32 <-> bf16 with round-to-nearest-even, f32 <-> f64, same dtype: copy).
  virtual void Convert(void* to, DType to_dtype, const void* from, DType from_dtype, int64_t n) = 0;
  // into += from, elementwise (f32 or f64).
  virtual void AddInto(void* into, const void* from, DType dtype, int64_t n) = 0;
  // data *= factor (factor rounded to dtype once). The trainer's clip no longer calls it (AdamW
  // applies the factor: AdamWArgs::grad_scale); kept for plugins, in its place in the interface.
  virtual void Scale(void* data, DType dtype, int64_t n, double factor) = 0;
  // sum of squares, accumulated in double in element order (deterministic); returns to the host.
  virtual double SumSquares(const void* data, DType dtype, int64_t n) = 0;
  // SumSquares of every region, the same values, with one wait for the device for all of them
  // (a step's gradient norm is one host synchronization on a GPU, not one per tensor).
  struct Region {
    const void* data;
    DType dtype;
    int64_t n;
  };
  virtual std::vector<double> SumSquaresEach(const std::vector<Region>& regions);
  virtual bool AllFinite(const void* data, DType dtype, int64_t n) = 0;
  virtual void AdamWUpdate(const AdamWArgs& args) = 0;

 protected:
  Device(std::string name, int64_t capacity_bytes,
         memory::SystemMemory system = memory::SystemMemory::Host())
      : allocator_(std::move(name), capacity_bytes, std::move(system)) {}

 private:
  memory::DeviceAllocator allocator_;
};

// Host memory; `index` names it ("cpu:<index>", the local rank), `capacity_bytes` is its limit.
std::unique_ptr<Device> MakeCpuDevice(int index, int64_t capacity_bytes);

}  // namespace bigmac::device

#endif  // BIGMAC_CORE_DEVICE_DEVICE_H_
