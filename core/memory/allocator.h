#ifndef BIGMAC_CORE_MEMORY_ALLOCATOR_H_
#define BIGMAC_CORE_MEMORY_ALLOCATOR_H_

#include <cstdint>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace bigmac::memory {

// Raised when an allocation would exceed the device's capacity. Worded like CUDA's message so that
// tools (tune-mbs, the seeds' bisection) recognise it; the CLI maps it to kExitOutOfMemory.
class OutOfMemoryError : public std::runtime_error {
 public:
  OutOfMemoryError(const std::string& device, int64_t requested, int64_t capacity, int64_t in_use);
  int64_t requested() const { return requested_; }

 private:
  int64_t requested_;
};

// Where a device's memory comes from when the cache cannot serve a request: aligned host memory on
// the CPU (the default), cudaMalloc/cudaFree on CUDA. `allocate` returns null when the system has
// no memory left; it must return at least 64-byte-aligned memory.
struct SystemMemory {
  std::function<void*(int64_t bytes)> allocate;
  std::function<void(void* pointer)> free;
  // Optional: called when a cached block is handed out again (the emulated CUDA device fills it
  // with NaN, as it does new memory, so that a read of memory nobody wrote shows).
  std::function<void(void* pointer, int64_t bytes)> reused;
  static SystemMemory Host();
};

// The one allocator of a device (owned by its device::Device): every tensor's memory comes from
// here. It tracks current and peak bytes and enforces a capacity (the card's memory on CUDA;
// device.memory_limit on CPU), which makes out-of-memory behaviour, and the micro-batch search
// built on it, testable on a CPU. Thread-safe.
class DeviceAllocator {
 public:
  DeviceAllocator(std::string device, int64_t capacity_bytes,
                  SystemMemory system = SystemMemory::Host());
  ~DeviceAllocator();
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;

  // Returns 64-byte-aligned memory of `bytes` (> 0), or throws OutOfMemoryError.
  void* Allocate(int64_t bytes);
  // Frees memory from Allocate; a pointer this allocator did not hand out is a logic error.
  void Free(void* pointer);

  const std::string& device() const { return device_; }
  int64_t capacity_bytes() const { return capacity_; }
  // Bytes held by live tensors now, and at most since the start or ResetPeak.
  int64_t current_bytes() const;
  int64_t peak_bytes() const;
  void ResetPeak();
  // Freed blocks kept for reuse (like CUDA's caching allocator): a training step allocates the
  // same sizes every time, so after the first step no memory comes from the system (no page
  // faults, no malloc). Cached bytes count against the capacity; an allocation that does not fit
  // first returns the cache to the system.
  int64_t cached_bytes() const;
  // Allocations the cache could not serve (memory from the system), since the start.
  int64_t system_allocations() const;

 private:
  void ReleaseCacheLocked();

  const std::string device_;
  const int64_t capacity_;
  const SystemMemory system_;
  mutable std::mutex mutex_;
  int64_t current_ = 0;
  int64_t peak_ = 0;
  int64_t cached_ = 0;
  int64_t system_allocations_ = 0;
  struct Block {
    int64_t bytes;    // requested
    int64_t rounded;  // size class (a multiple of the alignment)
  };
  std::unordered_map<void*, Block> live_;
  std::unordered_map<int64_t, std::vector<void*>> free_by_size_;  // rounded size -> blocks
};

// "512MiB", "2 GiB", "1.5GiB", "1048576" (bytes), also KB/MB/GB (powers of 1000). Returns false and
// sets `error` for anything else, or a value <= 0.
bool ParseByteSize(const std::string& text, int64_t* bytes, std::string* error);

// The capacity a CPU rank gets: `limit_bytes` when it is set (> 0), otherwise the host's physical
// memory divided among the `ranks_on_node`.
int64_t CpuCapacity(int64_t limit_bytes, int ranks_on_node);

// "1.50 MiB".
std::string FormatMiB(int64_t bytes);

}  // namespace bigmac::memory

#endif  // BIGMAC_CORE_MEMORY_ALLOCATOR_H_
