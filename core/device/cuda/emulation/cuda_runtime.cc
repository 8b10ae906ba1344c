// The CUDA runtime stand-in: the ~45 runtime calls BigMac makes, with device memory in host
// memory and every stream an ordered queue run by its own worker thread (runtime.h).
//
// What is faithful: stream order and asynchrony (a missing wait reads stale or NaN data), events
// across streams, the legacy default stream's implicit synchronization with blocking streams,
// pageable vs pinned copies (pageable host-to-device copies are staged at the call; pageable
// device-to-host copies return when done), cudaFree synchronizing the device, a bounded memory
// capacity (BIGMAC_EMULATED_DEVICE_MEMORY, bytes; default 8 GiB), sticky faults, and launch errors
// reported by cudaGetLastError. Sanitizer checks: allocations sit between PROT_NONE guard pages
// (an access past either end faults, naming the kernel: grid.cc), the bytes between an
// allocation's end and its guard page are checked after every kernel, new allocations are filled
// with 0xff (NaN in every float type), and copies and memsets must name device memory on their
// device side. What is not: unified addressing tricks, graphs, peer access, multiple contexts.
#include <cuda_runtime.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/device/cuda/emulation/grid.h"
#include "core/device/cuda/emulation/runtime.h"

namespace emu = ::bigmac::device::cuda::emulation;

// The runtime's opaque handle types (driver_types.h declares them).
struct CUstream_st {
  explicit CUstream_st(bool is_blocking) : blocking(is_blocking) {}
  const bool blocking;  // takes part in the legacy stream's implicit synchronization
  std::mutex mutex;
  std::condition_variable cv;
  std::deque<std::pair<std::string, std::function<void()>>> queue;
  uint64_t enqueued = 0;     // tickets handed out
  uint64_t completed = 0;    // ops run, in order
  uint64_t host_waited = 0;  // `enqueued` when the host last waited for this stream
  bool stopping = false;
};

namespace {

struct EventState {
  std::mutex mutex;
  std::condition_variable cv;
  uint64_t recorded = 0;  // cudaEventRecord calls
  std::set<uint64_t>
      done;  // records that ran (records on different streams may finish out of order)
  bool Done(uint64_t generation) const { return generation == 0 || done.count(generation) > 0; }
  std::chrono::steady_clock::time_point when;
};

}  // namespace

struct CUevent_st {
  bool timing = true;
  std::shared_ptr<EventState> state = std::make_shared<EventState>();
};

namespace bigmac::device::cuda::emulation {
namespace {

constexpr size_t kAlignment = 256;  // cudaMalloc's guarantee
constexpr unsigned char kGuardByte = 0xcd;
constexpr int kDevices = 8;

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}
size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// --- Errors ----------------------------------------------------------------------------------

thread_local cudaError_t t_last_error = cudaSuccess;
std::mutex g_fault_mutex;
cudaError_t g_fault = cudaSuccess;  // sticky

cudaError_t StickyFault() {
  std::lock_guard<std::mutex> lock(g_fault_mutex);
  return g_fault;
}

// Every failing call records its error for cudaGetLastError, as the runtime does.
cudaError_t Fail(cudaError_t error, const std::string& message = "") {
  if (!message.empty()) std::fprintf(stderr, "emulated CUDA: %s\n", message.c_str());
  t_last_error = error;
  return error;
}

cudaError_t Ok() {
  const cudaError_t fault = StickyFault();
  return fault == cudaSuccess ? cudaSuccess : Fail(fault);
}

// --- Memory ----------------------------------------------------------------------------------

// True when [p, p + bytes) lies inside one entry of `live` (start -> entry; `size` of an entry).
template <typename Entry, typename Size>
bool InsideOne(const std::map<uintptr_t, Entry>& live, uintptr_t p, size_t bytes, Size size) {
  auto it = live.upper_bound(p);
  if (it == live.begin()) return false;
  --it;
  return p + bytes <= it->first + size(it->second);
}

struct Allocation {
  size_t bytes = 0;
  char* map = nullptr;  // guard page, data pages, guard page
  size_t map_bytes = 0;
  bool stream_ordered = false;  // from cudaMallocAsync: cudaFree of it does not synchronize
};

int64_t ParseBytes(const char* text) {
  char* end = nullptr;
  double value = std::strtod(text, &end);
  const std::string unit = end ? end : "";
  if (unit == "K" || unit == "KiB") value *= 1 << 10;
  if (unit == "M" || unit == "MiB") value *= 1 << 20;
  if (unit == "G" || unit == "GiB") value *= 1 << 30;
  return static_cast<int64_t>(value);
}

class Memory {
 public:
  static Memory& Get() {
    static Memory* memory = new Memory();  // workers may run after main returns
    return *memory;
  }

  cudaError_t Allocate(void** pointer, size_t bytes, bool stream_ordered = false) {
    *pointer = nullptr;
    if (bytes == 0) return cudaSuccess;
    std::lock_guard<std::mutex> lock(mutex_);
    if (used_ + static_cast<int64_t>(bytes) > capacity_) {
      return Fail(cudaErrorMemoryAllocation);
    }
    const size_t page = PageSize();
    const size_t body = RoundUp(bytes, kAlignment);
    const size_t data_pages = RoundUp(body, page);
    Allocation a;
    a.bytes = bytes;
    a.stream_ordered = stream_ordered;
    a.map_bytes = data_pages + 2 * page;
    void* map =
        mmap(nullptr, a.map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED) return Fail(cudaErrorMemoryAllocation);
    a.map = static_cast<char*>(map);
    mprotect(a.map, page, PROT_NONE);
    mprotect(a.map + page + data_pages, page, PROT_NONE);
    char* start = a.map + page + data_pages - body;  // the end meets the upper guard page
    std::memset(a.map + page, kGuardByte, static_cast<size_t>(start - (a.map + page)));
    std::memset(start, 0xff, bytes);  // uninitialised device memory reads as NaN
    std::memset(start + bytes, kGuardByte, body - bytes);
    used_ += static_cast<int64_t>(bytes);
    live_[reinterpret_cast<uintptr_t>(start)] = a;
    *pointer = start;
    return cudaSuccess;
  }

  cudaError_t Release(void* pointer, const std::string& where) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(reinterpret_cast<uintptr_t>(pointer));
    if (it == live_.end()) {
      return Fail(cudaErrorInvalidValue,
                  where + ": " + Hex(pointer) + " is not a live device allocation");
    }
    const std::string damage = GuardDamage(it->first, it->second);
    if (!damage.empty()) emu::Fault(cudaErrorIllegalAddress, damage + ", found at " + where);
    munmap(it->second.map, it->second.map_bytes);
    used_ -= static_cast<int64_t>(it->second.bytes);
    live_.erase(it);
    return cudaSuccess;
  }

  // The guard bytes of every allocation, after a kernel.
  void CheckGuards(const std::string& kernel) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [start, a] : live_) {
      const std::string damage = GuardDamage(start, a);
      if (!damage.empty()) {
        emu::Fault(cudaErrorIllegalAddress, damage + ", after kernel " + kernel);
        return;
      }
    }
  }

  bool Contains(const void* pointer, size_t bytes) {
    const auto p = reinterpret_cast<uintptr_t>(pointer);
    std::lock_guard<std::mutex> lock(mutex_);
    return InsideOne(live_, p, bytes, [](const Allocation& a) { return a.bytes; });
  }

  // Whether `pointer` starts a live allocation from cudaMallocAsync.
  bool StreamOrdered(const void* pointer) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.find(reinterpret_cast<uintptr_t>(pointer));
    return it != live_.end() && it->second.stream_ordered;
  }

  int64_t capacity() const { return capacity_; }
  int64_t used() {
    std::lock_guard<std::mutex> lock(mutex_);
    return used_;
  }
  void set_capacity(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    capacity_ = bytes;
  }

  static std::string Hex(const void* p) {
    char text[32];
    std::snprintf(text, sizeof(text), "%p", p);
    return text;
  }

 private:
  Memory() {
    const char* env = std::getenv("BIGMAC_EMULATED_DEVICE_MEMORY");
    capacity_ = env ? ParseBytes(env) : (int64_t{8} << 30);
  }

  static std::string GuardDamage(uintptr_t start, const Allocation& a) {
    const auto* end = reinterpret_cast<const unsigned char*>(start + a.bytes);
    const size_t tail = RoundUp(a.bytes, kAlignment) - a.bytes;
    for (size_t i = 0; i < tail; ++i) {
      if (end[i] != kGuardByte) {
        return "out-of-bounds write " + std::to_string(i) + " bytes past the end of the " +
               std::to_string(a.bytes) + "-byte allocation at " +
               Hex(reinterpret_cast<void*>(start));
      }
    }
    const auto* front = reinterpret_cast<const unsigned char*>(start);
    const size_t head =
        std::min<size_t>(64, start - reinterpret_cast<uintptr_t>(a.map) - PageSize());
    for (size_t i = 1; i <= head; ++i) {
      if (front[-static_cast<ptrdiff_t>(i)] != kGuardByte) {
        return "out-of-bounds write " + std::to_string(i) + " bytes before the " +
               std::to_string(a.bytes) + "-byte allocation at " +
               Hex(reinterpret_cast<void*>(start));
      }
    }
    return "";
  }

  std::mutex mutex_;
  std::map<uintptr_t, Allocation> live_;
  int64_t used_ = 0;
  int64_t capacity_ = 0;
};

class PinnedHost {
 public:
  static PinnedHost& Get() {
    static PinnedHost* pinned = new PinnedHost();
    return *pinned;
  }
  void* Allocate(size_t bytes) {
    void* p = std::malloc(std::max<size_t>(bytes, 1));
    if (p == nullptr) return nullptr;
    std::lock_guard<std::mutex> lock(mutex_);
    live_[reinterpret_cast<uintptr_t>(p)] = bytes;
    return p;
  }
  bool Release(void* p) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (live_.erase(reinterpret_cast<uintptr_t>(p)) == 0) return false;
    std::free(p);
    return true;
  }
  bool Contains(const void* pointer, size_t bytes) {
    const auto p = reinterpret_cast<uintptr_t>(pointer);
    std::lock_guard<std::mutex> lock(mutex_);
    return InsideOne(live_, p, bytes, [](size_t size) { return size; });
  }

 private:
  std::mutex mutex_;
  std::map<uintptr_t, size_t> live_;
};

// --- Streams ---------------------------------------------------------------------------------

void Serve(CUstream_st* stream) {
  for (;;) {
    std::pair<std::string, std::function<void()>> op;
    {
      std::unique_lock<std::mutex> lock(stream->mutex);
      stream->cv.wait(lock, [&] { return !stream->queue.empty() || stream->stopping; });
      if (stream->queue.empty()) break;
      op = std::move(stream->queue.front());
      stream->queue.pop_front();
    }
    op.second();
    {
      std::lock_guard<std::mutex> lock(stream->mutex);
      ++stream->completed;
    }
    stream->cv.notify_all();
  }
  // Destroyed by cudaStreamDestroy and drained; never freed, since a host wait or another
  // stream's legacy-order wait may still hold a ticket on it (a few hundred bytes per stream).
}

class Streams {
 public:
  static Streams& Get() {
    static Streams* streams = new Streams();
    return *streams;
  }

  CUstream_st* Create(bool blocking) {
    auto* stream = new CUstream_st(blocking);
    std::thread(Serve, stream).detach();
    std::lock_guard<std::mutex> lock(mutex_);
    live_.insert(stream);
    return stream;
  }

  void Destroy(CUstream_st* stream) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      live_.erase(stream);
    }
    {
      std::lock_guard<std::mutex> lock(stream->mutex);
      stream->stopping = true;
    }
    stream->cv.notify_all();
  }

  bool IsLive(cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    return Resolve(stream) == legacy_ || live_.count(stream) > 0;
  }

  CUstream_st* Resolve(cudaStream_t stream) {
    if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) {
      return legacy_;
    }
    return stream;
  }

  // The legacy stream waits for every blocking stream's earlier work; a blocking stream waits
  // for the legacy stream's.
  void Enqueue(cudaStream_t handle, std::string name, std::function<void()> op) {
    CUstream_st* stream = Resolve(handle);
    std::vector<std::pair<CUstream_st*, uint64_t>> waits;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stream == legacy_) {
        for (CUstream_st* other : live_) {
          if (other->blocking) waits.emplace_back(other, Ticket(other));
        }
      } else if (stream->blocking) {
        waits.emplace_back(legacy_, Ticket(legacy_));
      }
    }
    std::function<void()> body = std::move(op);
    if (!waits.empty()) {
      body = [waits, inner = std::move(body)] {
        for (const auto& [other, ticket] : waits) WaitTicket(other, ticket);
        inner();
      };
    }
    {
      std::lock_guard<std::mutex> lock(stream->mutex);
      ++stream->enqueued;
      stream->queue.emplace_back(std::move(name), std::move(body));
    }
    stream->cv.notify_all();
  }

  // Waits for the stream's work so far. Returns whether that was a synchronization: work was
  // enqueued since the host last waited for this stream (deterministic, unlike asking whether
  // the work was still running; a second wait on an idle stream costs nothing).
  bool Wait(cudaStream_t handle) {
    CUstream_st* stream = Resolve(handle);
    uint64_t ticket = 0;
    bool fresh = false;
    {
      std::lock_guard<std::mutex> lock(stream->mutex);
      ticket = stream->enqueued;
      fresh = ticket > stream->host_waited;
      stream->host_waited = ticket;
    }
    WaitTicket(stream, ticket);
    return fresh;
  }

  // Waits for the stream's work so far on the runtime's behalf (not a host synchronization).
  void Drain(cudaStream_t handle) {
    CUstream_st* stream = Resolve(handle);
    WaitTicket(stream, Ticket(stream));
  }

  void WaitAll() {
    std::vector<std::pair<CUstream_st*, uint64_t>> waits;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      waits.emplace_back(legacy_, Ticket(legacy_));
      for (CUstream_st* other : live_) waits.emplace_back(other, Ticket(other));
    }
    for (const auto& [other, ticket] : waits) WaitTicket(other, ticket);
  }

  bool Idle(cudaStream_t handle) {
    CUstream_st* stream = Resolve(handle);
    std::lock_guard<std::mutex> lock(stream->mutex);
    return stream->completed == stream->enqueued;
  }

 private:
  Streams() : legacy_(new CUstream_st(true)) { std::thread(Serve, legacy_).detach(); }

  static uint64_t Ticket(CUstream_st* stream) {
    std::lock_guard<std::mutex> lock(stream->mutex);
    return stream->enqueued;
  }
  static void WaitTicket(CUstream_st* stream, uint64_t ticket) {
    std::unique_lock<std::mutex> lock(stream->mutex);
    stream->cv.wait(lock, [&] { return stream->completed >= ticket; });
  }

  std::mutex mutex_;
  std::set<CUstream_st*> live_;
  CUstream_st* const legacy_;
};

thread_local int t_device = 0;

bool IsPinned(const void* p, size_t bytes) { return PinnedHost::Get().Contains(p, bytes); }

const char* KindName(cudaMemcpyKind kind) {
  switch (kind) {
    case cudaMemcpyHostToDevice:
      return "host-to-device";
    case cudaMemcpyDeviceToHost:
      return "device-to-host";
    case cudaMemcpyDeviceToDevice:
      return "device-to-device";
    case cudaMemcpyHostToHost:
      return "host-to-host";
    default:
      return "default";
  }
}

// A copy of `height` rows of `width` bytes, `src_pitch` and `dst_pitch` apart (one row for the
// 1-D copies).
struct Rows {
  size_t width = 0, height = 1, src_pitch = 0, dst_pitch = 0;
  size_t src_span() const { return height == 0 ? 0 : src_pitch * (height - 1) + width; }
  size_t dst_span() const { return height == 0 ? 0 : dst_pitch * (height - 1) + width; }
  size_t bytes() const { return width * height; }
  void CopyNow(void* dst, const void* src) const {
    for (size_t r = 0; r < height; ++r) {
      std::memcpy(static_cast<char*>(dst) + r * dst_pitch,
                  static_cast<const char*>(src) + r * src_pitch, width);
    }
  }
};

// Every copy: checked, counted, and queued on `stream`; `synchronous` (cudaMemcpy) waits.
cudaError_t Copy(const char* call, void* dst, const void* src, Rows rows, cudaMemcpyKind kind,
                 cudaStream_t stream, bool synchronous) {
  if (cudaError_t e = Ok(); e != cudaSuccess) return e;
  if (rows.bytes() == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) {
    return Fail(cudaErrorInvalidValue, std::string(call) + ": null pointer");
  }
  if (rows.width > rows.src_pitch || rows.width > rows.dst_pitch) {
    return Fail(cudaErrorInvalidPitchValue, std::string(call) + ": width above a pitch");
  }
  Memory& memory = Memory::Get();
  if (kind == cudaMemcpyDefault) {
    const bool from_device = memory.Contains(src, rows.src_span());
    const bool to_device = memory.Contains(dst, rows.dst_span());
    kind = from_device ? (to_device ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost)
                       : (to_device ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost);
  }
  const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  if (src_device && !memory.Contains(src, rows.src_span())) {
    return Fail(cudaErrorInvalidValue,
                std::string(call) + " " + KindName(kind) + ": source " + Memory::Hex(src) + " + " +
                    std::to_string(rows.src_span()) + " bytes is not device memory");
  }
  if (dst_device && !memory.Contains(dst, rows.dst_span())) {
    return Fail(cudaErrorInvalidValue,
                std::string(call) + " " + KindName(kind) + ": destination " + Memory::Hex(dst) +
                    " + " + std::to_string(rows.dst_span()) + " bytes is not device memory");
  }
  if (stream != nullptr && !Streams::Get().IsLive(stream)) {
    return Fail(cudaErrorInvalidResourceHandle, std::string(call) + ": not a live stream");
  }
  Counters& counters = GetCounters();
  const auto bytes = static_cast<int64_t>(rows.bytes());
  if (kind == cudaMemcpyHostToDevice) counters.host_to_device_bytes += bytes;
  if (kind == cudaMemcpyDeviceToHost) counters.device_to_host_bytes += bytes;
  if (kind == cudaMemcpyHostToHost) {
    rows.CopyNow(dst, src);
    return cudaSuccess;
  }
  if (kind == cudaMemcpyHostToDevice && (synchronous || !IsPinned(src, rows.src_span()))) {
    // Pageable (or synchronous) sources are staged now: the caller may reuse them at once.
    auto staged = std::make_shared<std::vector<char>>(
        static_cast<const char*>(src), static_cast<const char*>(src) + rows.src_span());
    Streams::Get().Enqueue(stream, call,
                           [dst, staged, rows] { rows.CopyNow(dst, staged->data()); });
  } else {
    Streams::Get().Enqueue(stream, call, [dst, src, rows] { rows.CopyNow(dst, src); });
  }
  // A device-to-host copy into pageable memory returns when it is done, as the runtime's does.
  if (kind == cudaMemcpyDeviceToHost && (synchronous || !IsPinned(dst, rows.dst_span()))) {
    if (Streams::Get().Wait(stream)) counters.host_synchronizations++;
  }
  return Ok();
}

Rows Linear(size_t bytes) { return {bytes, 1, bytes, bytes}; }

cudaError_t Memset(const char* call, void* dst, int value, size_t bytes, cudaStream_t stream) {
  if (cudaError_t e = Ok(); e != cudaSuccess) return e;
  if (bytes == 0) return cudaSuccess;
  if (!Memory::Get().Contains(dst, bytes)) {
    return Fail(cudaErrorInvalidValue, std::string(call) + ": " + Memory::Hex(dst) + " + " +
                                           std::to_string(bytes) + " bytes is not device memory");
  }
  GetCounters().memset_bytes += static_cast<int64_t>(bytes);
  Streams::Get().Enqueue(stream, call, [dst, value, bytes] { std::memset(dst, value, bytes); });
  return cudaSuccess;
}

}  // namespace

// --- runtime.h -------------------------------------------------------------------------------

void Enqueue(cudaStream_t stream, std::string name, std::function<void()> op) {
  Streams::Get().Enqueue(stream, std::move(name), std::move(op));
}

void WaitStream(cudaStream_t stream) { Streams::Get().Wait(stream); }

void Fault(cudaError_t error, const std::string& message) {
  std::lock_guard<std::mutex> lock(g_fault_mutex);
  if (g_fault != cudaSuccess) return;
  g_fault = error;
  std::fprintf(stderr, "emulated CUDA: %s\n", message.c_str());
}

void SetLaunchError(cudaError_t error, const std::string& message) { Fail(error, message); }

void AfterKernel(const std::string& kernel) { Memory::Get().CheckGuards(kernel); }

bool IsDeviceRange(const void* pointer, size_t bytes) {
  return Memory::Get().Contains(pointer, bytes);
}

namespace {
// BIGMAC_EMULATED_COUNTERS=FILE: the process's totals as one JSON line at exit (the benchmark
// bench/emulated_costs.sh differences runs of different lengths to get per-step costs).
void WriteCountersAtExit() {
  const char* path = std::getenv("BIGMAC_EMULATED_COUNTERS");
  if (path == nullptr) return;
  const Counters& c = GetCounters();
  if (FILE* out = std::fopen(path, "w")) {
    std::fprintf(out,
                 "{\"host_synchronizations\": %lld, \"device_synchronizations\": %lld, "
                 "\"memset_bytes\": %lld, \"host_to_device_bytes\": %lld, "
                 "\"device_to_host_bytes\": %lld, \"kernel_launches\": %lld, "
                 "\"gemm_calls\": %lld}\n",
                 static_cast<long long>(c.host_synchronizations.load()),
                 static_cast<long long>(c.device_synchronizations.load()),
                 static_cast<long long>(c.memset_bytes.load()),
                 static_cast<long long>(c.host_to_device_bytes.load()),
                 static_cast<long long>(c.device_to_host_bytes.load()),
                 static_cast<long long>(c.kernel_launches.load()),
                 static_cast<long long>(c.gemm_calls.load()));
    std::fclose(out);
  }
}
}  // namespace

Counters& GetCounters() {
  static Counters* counters = [] {
    std::atexit(WriteCountersAtExit);
    return new Counters();
  }();
  return *counters;
}

void SetMemoryCapacity(int64_t bytes) { Memory::Get().set_capacity(bytes); }

}  // namespace bigmac::device::cuda::emulation

// --- The CUDA runtime API (cuda_runtime_api.h's declarations give these C linkage) -----------

using emu::Fail;
using emu::Ok;

cudaError_t cudaGetLastError() {
  const cudaError_t fault = emu::StickyFault();
  if (fault != cudaSuccess) return fault;
  const cudaError_t error = emu::t_last_error;
  emu::t_last_error = cudaSuccess;
  return error;
}

cudaError_t cudaPeekAtLastError() {
  const cudaError_t fault = emu::StickyFault();
  return fault != cudaSuccess ? fault : emu::t_last_error;
}

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorIllegalAddress:
      return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorLaunchOutOfResources:
      return "cudaErrorLaunchOutOfResources";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    default:
      return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorIllegalAddress:
      return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    case cudaErrorLaunchOutOfResources:
      return "too many resources requested for launch";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    default:
      return "unknown error";
  }
}

cudaError_t cudaDriverGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int* count) {
  *count = emu::kDevices;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= emu::kDevices) return Fail(cudaErrorInvalidDevice);
  emu::t_device = device;
  return Ok();
}
cudaError_t cudaGetDevice(int* device) {
  *device = emu::t_device;
  return Ok();
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device < 0 || device >= emu::kDevices) return Fail(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "BigMac emulated CUDA device (CPU)");
  prop->totalGlobalMem = static_cast<size_t>(emu::Memory::Get().capacity());
  prop->sharedMemPerBlock = 48 << 10;
  prop->sharedMemPerBlockOptin = 227 << 10;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 4;  // few blocks per grid-stride launch: fast on the CPU
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->unifiedAddressing = 1;
  return Ok();
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  cudaDeviceProp prop;
  if (cudaError_t e = cudaGetDeviceProperties(&prop, device); e != cudaSuccess) return e;
  switch (attr) {
    case cudaDevAttrMultiProcessorCount:
      *value = prop.multiProcessorCount;
      break;
    case cudaDevAttrComputeCapabilityMajor:
      *value = prop.major;
      break;
    case cudaDevAttrComputeCapabilityMinor:
      *value = prop.minor;
      break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = static_cast<int>(prop.sharedMemPerBlockOptin);
      break;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = static_cast<int>(prop.sharedMemPerBlock);
      break;
    case cudaDevAttrMaxThreadsPerBlock:
      *value = prop.maxThreadsPerBlock;
      break;
    case cudaDevAttrWarpSize:
      *value = prop.warpSize;
      break;
    case cudaDevAttrMemoryPoolsSupported:
      *value = 1;
      break;
    default:
      return Fail(cudaErrorInvalidValue,
                  "cudaDeviceGetAttribute: attribute " + std::to_string(attr) + " is not emulated");
  }
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  emu::Memory& memory = emu::Memory::Get();
  *total_bytes = static_cast<size_t>(memory.capacity());
  *free_bytes = static_cast<size_t>(std::max<int64_t>(0, memory.capacity() - memory.used()));
  return Ok();
}

cudaError_t cudaMalloc(void** pointer, size_t bytes) {
  if (cudaError_t e = Ok(); e != cudaSuccess) return e;
  return emu::Memory::Get().Allocate(pointer, bytes);
}

cudaError_t cudaFree(void* pointer) {
  if (pointer == nullptr) return Ok();  // creates the context; no synchronization needed
  // As the real one: the whole device finishes its work first, except for memory from
  // cudaMallocAsync, whose caller has ensured that its uses are over.
  if (!emu::Memory::Get().StreamOrdered(pointer)) {
    emu::GetCounters().device_synchronizations++;
    emu::Streams::Get().WaitAll();
  }
  if (cudaError_t e = emu::Memory::Get().Release(pointer, "cudaFree"); e != cudaSuccess) return e;
  return Ok();
}

// The stream-ordered pool: memory freed on `stream` by cudaFreeAsync is reusable by a later
// cudaMallocAsync on the same stream without any host or device synchronization. Emulated: when
// the capacity is reached, the stream's queued work (its frees) runs first.
cudaError_t cudaMallocAsync(void** pointer, size_t bytes, cudaStream_t stream) {
  if (cudaError_t e = Ok(); e != cudaSuccess) return e;
  if (!emu::Streams::Get().IsLive(stream)) return Fail(cudaErrorInvalidResourceHandle);
  if (emu::Memory::Get().Allocate(pointer, bytes, true) == cudaSuccess) return cudaSuccess;
  cudaGetLastError();
  emu::Streams::Get().Drain(stream);
  return emu::Memory::Get().Allocate(pointer, bytes, true);
}

cudaError_t cudaFreeAsync(void* pointer, cudaStream_t stream) {
  if (pointer == nullptr) return Ok();
  if (!emu::Streams::Get().IsLive(stream)) return Fail(cudaErrorInvalidResourceHandle);
  if (!emu::Memory::Get().StreamOrdered(pointer)) {
    return Fail(cudaErrorInvalidValue,
                "cudaFreeAsync: " + emu::Memory::Hex(pointer) +
                    " is not a live allocation from cudaMallocAsync (BigMac frees cudaMalloc "
                    "memory with cudaFree only)");
  }
  emu::Streams::Get().Enqueue(stream, "cudaFreeAsync",
                              [pointer] { emu::Memory::Get().Release(pointer, "cudaFreeAsync"); });
  return Ok();
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
  if (cudaError_t e = Ok(); e != cudaSuccess) return e;
  if (fn == nullptr || !emu::Streams::Get().IsLive(stream)) return Fail(cudaErrorInvalidValue);
  emu::Streams::Get().Enqueue(stream, "cudaLaunchHostFunc", [fn, user_data] { fn(user_data); });
  return Ok();
}

cudaError_t cudaMallocHost(void** pointer, size_t bytes) {
  *pointer = emu::PinnedHost::Get().Allocate(bytes);
  return *pointer ? Ok() : Fail(cudaErrorMemoryAllocation);
}
cudaError_t cudaHostAlloc(void** pointer, size_t bytes, unsigned int flags) {
  (void)flags;
  return cudaMallocHost(pointer, bytes);
}
cudaError_t cudaFreeHost(void* pointer) {
  if (pointer == nullptr) return Ok();
  if (!emu::PinnedHost::Get().Release(pointer)) {
    return Fail(cudaErrorInvalidValue, "cudaFreeHost: not pinned host memory");
  }
  return Ok();
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  return emu::Copy("cudaMemcpy", dst, src, emu::Linear(bytes), kind, nullptr, true);
}
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  return emu::Copy("cudaMemcpyAsync", dst, src, emu::Linear(bytes), kind, stream, false);
}
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind,
                              cudaStream_t stream) {
  return emu::Copy("cudaMemcpy2DAsync", dst, src, {width, height, spitch, dpitch}, kind, stream,
                   false);
}
cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  return emu::Memset("cudaMemset", dst, value, bytes, nullptr);
}
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  return emu::Memset("cudaMemsetAsync", dst, value, bytes, stream);
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  *stream = emu::Streams::Get().Create(true);
  return Ok();
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  *stream = emu::Streams::Get().Create((flags & cudaStreamNonBlocking) == 0);
  return Ok();
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (stream == nullptr || !emu::Streams::Get().IsLive(stream) ||
      emu::Streams::Get().Resolve(stream) != stream) {
    return Fail(cudaErrorInvalidResourceHandle);
  }
  emu::Streams::Get().Destroy(stream);  // its queued work still runs, as on the hardware
  return Ok();
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (!emu::Streams::Get().IsLive(stream)) return Fail(cudaErrorInvalidResourceHandle);
  if (emu::Streams::Get().Wait(stream)) emu::GetCounters().host_synchronizations++;
  return Ok();
}
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  if (cudaError_t e = Ok(); e != cudaSuccess) return e;
  return emu::Streams::Get().Idle(stream) ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaDeviceSynchronize() {
  emu::GetCounters().device_synchronizations++;
  emu::Streams::Get().WaitAll();
  return Ok();
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  *event = new CUevent_st();
  return Ok();
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  *event = new CUevent_st();
  (*event)->timing = (flags & cudaEventDisableTiming) == 0;
  return Ok();
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (event == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  delete event;  // a pending record still completes: it holds the state
  return Ok();
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (event == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  if (!emu::Streams::Get().IsLive(stream)) return Fail(cudaErrorInvalidResourceHandle);
  std::shared_ptr<EventState> state = event->state;
  uint64_t generation;
  {
    std::lock_guard<std::mutex> lock(state->mutex);
    generation = ++state->recorded;
  }
  emu::Streams::Get().Enqueue(stream, "cudaEventRecord", [state, generation] {
    {
      std::lock_guard<std::mutex> lock(state->mutex);
      state->done.insert(generation);
      if (generation == state->recorded) {
        state->when = std::chrono::steady_clock::now();  // the time of the most recent record
      }
    }
    state->cv.notify_all();
  });
  return Ok();
}
cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (event == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  if (cudaError_t e = Ok(); e != cudaSuccess) return e;
  std::lock_guard<std::mutex> lock(event->state->mutex);
  return event->state->Done(event->state->recorded) ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (event == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  emu::GetCounters().host_synchronizations++;
  EventState& state = *event->state;
  std::unique_lock<std::mutex> lock(state.mutex);
  const uint64_t target = state.recorded;
  state.cv.wait(lock, [&] { return state.Done(target); });
  return Ok();
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  (void)flags;
  if (event == nullptr || !emu::Streams::Get().IsLive(stream)) {
    return Fail(cudaErrorInvalidResourceHandle);
  }
  std::shared_ptr<EventState> state = event->state;
  uint64_t target;
  {
    std::lock_guard<std::mutex> lock(state->mutex);
    target = state->recorded;  // the most recent record at the call, as CUDA specifies
  }
  emu::Streams::Get().Enqueue(stream, "cudaStreamWaitEvent", [state, target] {
    std::unique_lock<std::mutex> lock(state->mutex);
    state->cv.wait(lock, [&] { return state->Done(target); });
  });
  return Ok();
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (start == nullptr || end == nullptr || !start->timing || !end->timing) {
    return Fail(cudaErrorInvalidResourceHandle);
  }
  for (cudaEvent_t e : {start, end}) {
    std::lock_guard<std::mutex> lock(e->state->mutex);
    if (e->state->recorded == 0 || !e->state->Done(e->state->recorded)) {
      return Fail(cudaErrorNotReady);
    }
  }
  *ms = std::chrono::duration<float, std::milli>(end->state->when - start->state->when).count();
  return Ok();
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) {
    return Fail(cudaErrorInvalidValue,
                "cudaFuncSetAttribute: attribute " + std::to_string(attr) + " is not emulated");
  }
  if (value < 0 || value > (227 << 10)) return Fail(cudaErrorInvalidValue);
  emu::SetMaxDynamicSharedMemory(func, value);
  return Ok();
}
