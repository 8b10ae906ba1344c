// CudaDevice: a stream, cuBLASLt and cuDNN handles, a GEMM workspace, reduction scratch, the
// caching allocator over cudaMalloc, and the engine's elementwise operations as kernels.
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "core/device/cuda/cuda_device.h"

#ifdef BIGMAC_CUDA_EMULATION
#include "core/device/cuda/emulation/runtime.h"
#endif
#include "core/device/cuda/launch.h"

namespace bigmac::device::cuda {
namespace {

constexpr int kThreads = 256;
// The two-stage reductions use a grid fixed by the element count, so the partial each element
// lands in, and the order partials are combined in, never depend on timing: the result is
// bitwise reproducible. At most kReduceBlocks, and no more blocks than the data fills (a bias of
// 768 elements is one block, not 1024).
constexpr int kReduceBlocks = 1024;

int ReduceBlocks(int64_t n) {
  return static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kReduceBlocks));
}

int GridFor(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 * 16 ? (blocks > 0 ? blocks : 1) : 65535 * 16);
}

template <typename To, typename From>
__device__ To CastTo(From x) {
  return static_cast<To>(x);
}
template <>
__device__ __nv_bfloat16 CastTo<__nv_bfloat16, float>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ float CastTo<float, __nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename To, typename From>
__global__ void ConvertKernel(To* to, const From* from, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    to[i] = CastTo<To>(from[i]);
  }
}

template <typename T>
__global__ void AddIntoKernel(T* into, const T* from, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    into[i] += from[i];
  }
}

template <typename T>
__global__ void ScaleKernel(T* data, int64_t n, T factor) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    data[i] *= factor;
  }
}

// Stage one: block b sums the squares of elements b*blockDim+t, then every gridDim*blockDim-th,
// in double, and reduces its threads in a fixed tree into partial[b].
template <typename T>
__global__ void SumSquaresPartial(const T* data, int64_t n, double* partial) {
  __shared__ double shared[kThreads];
  double sum = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const double x = static_cast<double>(data[i]);
    sum += x * x;
  }
  shared[threadIdx.x] = sum;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = shared[0];
}

// Stage two: one thread adds the partials in block order.
__global__ void SumPartials(const double* partial, int count, double* total) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  double sum = 0;
  for (int i = 0; i < count; ++i) sum += partial[i];
  *total = sum;
}

__device__ double Widen(float x) { return x; }
__device__ double Widen(double x) { return x; }
__device__ double Widen(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__global__ void NonFiniteKernel(const T* data, int64_t n, int* flag) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    if (!isfinite(Widen(data[i]))) {
      *flag = 1;  // every writer writes 1: the result does not depend on order
      return;
    }
  }
}

// The CPU's AdamW (core/device/cpu_device.cc) in T, with the step's scalars rounded to T once;
// the bf16 compute copy, when given, is written from the new master in the same pass.
template <typename T>
__global__ void AdamWKernel(T* p, const T* g, T* m, T* v, __nv_bfloat16* compute, int64_t n,
                            T beta1, T one_minus_beta1, T beta2, T one_minus_beta2, T inv_bias1,
                            T inv_bias2, T step, T decay, T epsilon, T grad_scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const T grad = g[i] * grad_scale;  // exact when grad_scale is 1
    const T m_new = beta1 * m[i] + one_minus_beta1 * grad;
    const T v_new = beta2 * v[i] + one_minus_beta2 * grad * grad;
    m[i] = m_new;
    v[i] = v_new;
    const T m_hat = m_new * inv_bias1;
    const T v_hat = v_new * inv_bias2;
    const T p_new = p[i] - step * (m_hat / (sqrt(v_hat) + epsilon) + decay * p[i]);
    p[i] = p_new;
    if (compute) compute[i] = __float2bfloat16_rn(static_cast<float>(p_new));
  }
}

[[noreturn]] void Unsupported(const std::string& what, DType dtype) {
  throw std::logic_error("cuda device: " + what + " of " + memory::DTypeName(dtype) +
                         " is not supported");
}

// Calls `f(T{})` with T = float for f32 and double for f64.
template <typename F>
auto ForFloat(DType dtype, const char* what, F f) {
  if (dtype == DType::kF64) return f(double{});
  if (dtype == DType::kF32) return f(float{});
  Unsupported(what, dtype);
}

std::string Label(int ordinal, int world_rank) {
  return "rank " + std::to_string(world_rank) + " (cuda:" + std::to_string(ordinal) + ")";
}

// The card's free memory, after the CUDA context exists.
int64_t CardFreeMemory(int ordinal, int world_rank) {
  size_t free_bytes = 0, total_bytes = 0;
  Check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo",
        "device capacity, on " + Label(ordinal, world_rank));
  return static_cast<int64_t>(free_bytes);
}

// The allocator's system memory. Where the card has a stream-ordered pool (cudaMallocAsync), blocks
// come from it on the compute stream and return to it with cudaFreeAsync on that stream, so that
// returning the cache near capacity synchronizes nothing. A plain cudaFree waits for every stream
// of the device, NCCL's included: a send waiting for a peer that is itself waiting in cudaFree
// never completes, and the ranks hang. Shared by the allocator's callbacks, which outlive the
// stream: after Detach (the device's teardown, the stream drained) blocks return with cudaFree,
// which does not synchronize for pool memory. Attach precedes the first allocation.
class SystemBlocks {
 public:
  void Attach(cudaStream_t stream, bool pools) {
    stream_ = stream;
    pools_ = pools;
  }
  void Detach() { stream_ = nullptr; }

  // Null when the card is out of memory (the allocator's business: it reports OOM in the CPU's
  // words); any other failure is a device error.
  void* Allocate(int64_t bytes) {
    void* pointer = nullptr;
    const cudaError_t status = pools_
                                   ? cudaMallocAsync(&pointer, static_cast<size_t>(bytes), stream_)
                                   : cudaMalloc(&pointer, static_cast<size_t>(bytes));
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return nullptr;
    }
    Check(status, pools_ ? "cudaMallocAsync" : "cudaMalloc", "the allocator");
    return pointer;
  }
  // Best effort: a failing free has nowhere to go (the allocator frees in destructors).
  void Free(void* pointer) {
    if (pools_ && stream_ != nullptr) {
      cudaFreeAsync(pointer, stream_);
    } else {
      cudaFree(pointer);
    }
  }

#ifdef BIGMAC_CUDA_EMULATION
  // In stream order: after every earlier use of the block on the compute stream.
  void Poison(void* pointer, int64_t bytes) {
    emulation::Enqueue(stream_, "NaN fill of a reused block", [pointer, bytes] {
      std::memset(pointer, 0xff, static_cast<size_t>(bytes));
    });
  }
#endif

 private:
  cudaStream_t stream_ = nullptr;
  bool pools_ = false;
};

memory::SystemMemory SystemMemoryOf(const std::shared_ptr<SystemBlocks>& blocks) {
  memory::SystemMemory system{[blocks](int64_t bytes) { return blocks->Allocate(bytes); },
                              [blocks](void* pointer) { blocks->Free(pointer); }};
#ifdef BIGMAC_CUDA_EMULATION
  // A block from the cache reads as NaN again, as new device memory does under emulation.
  system.reused = [blocks](void* pointer, int64_t bytes) { blocks->Poison(pointer, bytes); };
#endif
  return system;
}

class CudaDevice : public Device {
 public:
  CudaDevice(int ordinal, int world_rank, int64_t capacity,
             std::shared_ptr<SystemBlocks> blocks = std::make_shared<SystemBlocks>())
      : Device("cuda:" + std::to_string(ordinal), capacity, SystemMemoryOf(blocks)),
        blocks_(std::move(blocks)) {
    context_.ordinal = ordinal;
    context_.label = Label(ordinal, world_rank);
    context_.device = this;
    static std::atomic<uint64_t> devices{0};
    context_.generation = ++devices;
    const std::string where = "device set-up, on " + context_.label;
    cudaDeviceProp props{};
    BIGMAC_CUDA_CHECK(cudaGetDeviceProperties(&props, ordinal), where);
    context_.multiprocessors = props.multiProcessorCount;
    context_.compute_capability = props.major * 10 + props.minor;
    gpu_name_ = props.name;
    total_memory_ = static_cast<int64_t>(props.totalGlobalMem);
    BIGMAC_CUDA_CHECK(cudaStreamCreateWithFlags(&context_.stream, cudaStreamNonBlocking), where);
    BIGMAC_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking), where);
    int pools = 0;
    BIGMAC_CUDA_CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, ordinal),
                      where);
    blocks_->Attach(context_.stream, pools != 0);
    BIGMAC_CUDA_CHECK(cublasLtCreate(&context_.blas_lt), where);
    BIGMAC_CUDA_CHECK(cudnnCreate(&context_.dnn), where);
    BIGMAC_CUDA_CHECK(cudnnSetStream(context_.dnn, context_.stream), where);
    // The workspace and scratch are the context's, outside the allocator's accounting; the
    // capacity was measured after they were taken.
    BIGMAC_CUDA_CHECK(cudaMalloc(&context_.blas_workspace, kBlasWorkspaceBytes), where);
    BIGMAC_CUDA_CHECK(cudaMalloc(&context_.reduce_scratch, kReduceScratchBytes), where);
    BIGMAC_CUDA_CHECK(cudaMallocHost(&host_flag_, sizeof(int)), where);
  }

  ~CudaDevice() override {
    // Best effort: a failing teardown must not hide the error that ended the run.
    cudaStreamSynchronize(context_.stream);
    if (copy_stream_) cudaStreamSynchronize(copy_stream_);
    blocks_->Detach();  // the blocks still cached or alive return after this, with cudaFree
    cudaFreeHost(host_flag_);
    if (host_sums_) cudaFreeHost(host_sums_);
    cudaFree(context_.reduce_scratch);
    cudaFree(context_.blas_workspace);
    if (context_.dnn) cudnnDestroy(context_.dnn);
    if (context_.blas_lt) cublasLtDestroy(context_.blas_lt);
    if (context_.stream) cudaStreamDestroy(context_.stream);
    if (copy_stream_) cudaStreamDestroy(copy_stream_);
  }

  Backend backend() const override { return Backend::kCuda; }
  const CudaContext& context() const { return context_; }
  const std::string& gpu_name() const { return gpu_name_; }
  int64_t total_memory() const { return total_memory_; }

  void Memset(void* data, int64_t bytes) override {
    BIGMAC_CUDA_CHECK(cudaMemsetAsync(data, 0, bytes, context_.stream), Where("memset"));
  }
  void CopyHostToDevice(void* data, const void* host, int64_t bytes) override {
    // From pageable memory this returns once the bytes are staged: the caller may reuse `host`.
    BIGMAC_CUDA_CHECK(cudaMemcpyAsync(data, host, bytes, cudaMemcpyHostToDevice, context_.stream),
                      Where("host-to-device copy"));
  }
  void CopyDeviceToHost(void* host, const void* data, int64_t bytes) override {
    BIGMAC_CUDA_CHECK(cudaMemcpyAsync(host, data, bytes, cudaMemcpyDeviceToHost, context_.stream),
                      Where("device-to-host copy"));
    BIGMAC_CUDA_CHECK(cudaStreamSynchronize(context_.stream), Where("device-to-host copy"));
  }
  void CopyDeviceToDevice(void* to, const void* from, int64_t bytes) override {
    BIGMAC_CUDA_CHECK(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, context_.stream),
                      Where("device-to-device copy"));
  }

  Stream compute_stream() override { return {context_.stream}; }
  Stream copy_stream() override { return {copy_stream_}; }
  void CopyDeviceToHostAsync(void* host, const void* data, int64_t bytes, Stream stream) override {
    BIGMAC_CUDA_CHECK(cudaMemcpyAsync(host, data, bytes, cudaMemcpyDeviceToHost,
                                      static_cast<cudaStream_t>(stream.handle)),
                      Where("device-to-host copy (asynchronous)"));
  }
  void WaitEventOnHost(Event event) override {
    // Possibly another thread than the one that made the device: bind it to this GPU first.
    BIGMAC_CUDA_CHECK(cudaSetDevice(context_.ordinal), Where("event wait on the host"));
    BIGMAC_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event.handle)),
                      Where("event wait on the host"));
  }
  Event RecordEvent(Stream stream) override {
    cudaEvent_t event = nullptr;
    BIGMAC_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), Where("event"));
    BIGMAC_CUDA_CHECK(cudaEventRecord(event, static_cast<cudaStream_t>(stream.handle)),
                      Where("event"));
    return {event};
  }
  void WaitEvent(Stream stream, Event event) override {
    BIGMAC_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream.handle),
                                          static_cast<cudaEvent_t>(event.handle), 0),
                      Where("event wait"));
  }
  void DestroyEvent(Event event) override {
    BIGMAC_CUDA_CHECK(cudaEventDestroy(static_cast<cudaEvent_t>(event.handle)), Where("event"));
  }
  void Synchronize() override {
    BIGMAC_CUDA_CHECK(cudaStreamSynchronize(context_.stream), Where("synchronize"));
  }
  bool has_timed_events() const override { return true; }
  Event RecordTimedEvent(Stream stream) override {
    cudaEvent_t event = nullptr;
    BIGMAC_CUDA_CHECK(cudaEventCreate(&event), Where("timed event"));
    BIGMAC_CUDA_CHECK(cudaEventRecord(event, static_cast<cudaStream_t>(stream.handle)),
                      Where("timed event"));
    return {event};
  }
  double ElapsedMs(Event start, Event end) override {
    // Events of other streams (a transport's) are waited for here: the span is over by then.
    BIGMAC_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(end.handle)),
                      Where("timed event"));
    float ms = 0;
    BIGMAC_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.handle),
                                           static_cast<cudaEvent_t>(end.handle)),
                      Where("timed event"));
    return ms;
  }

  void* AllocateHostStaging(int64_t bytes) override {
    void* host = nullptr;
    BIGMAC_CUDA_CHECK(cudaHostAlloc(&host, static_cast<size_t>(std::max<int64_t>(bytes, 1)),
                                    cudaHostAllocDefault),
                      Where("pinned host staging of " + std::to_string(bytes) + " bytes"));
    return host;
  }
  void FreeHostStaging(void* host) override { cudaFreeHost(host); }
  bool host_staging_pinned() const override { return true; }

  void* blas_handle() override { return context_.blas_lt; }
  void* dnn_handle() override { return context_.dnn; }

  void Convert(void* to, DType to_dtype, const void* from, DType from_dtype, int64_t n) override {
    if (n == 0) return;
    const CallSite site = SiteOf(context_, "convert " + memory::DTypeName(from_dtype) + " to " +
                                               memory::DTypeName(to_dtype));
    if (to_dtype == from_dtype) {
      CopyDeviceToDevice(to, from, n * memory::DTypeSize(to_dtype));
      return;
    }
    auto launch = [&](auto* out, const auto* in) {
      LaunchKernel("ConvertKernel",
                   ConvertKernel<std::remove_pointer_t<decltype(out)>,
                                 std::remove_cv_t<std::remove_pointer_t<decltype(in)>>>,
                   GridFor(n), kThreads, 0, context_.stream, out, in, n);
      CheckLaunch("ConvertKernel", site);
    };
    using BF16 = __nv_bfloat16;
    if (to_dtype == DType::kBF16 && from_dtype == DType::kF32) {
      launch(static_cast<BF16*>(to), static_cast<const float*>(from));
    } else if (to_dtype == DType::kF32 && from_dtype == DType::kBF16) {
      launch(static_cast<float*>(to), static_cast<const BF16*>(from));
    } else if (to_dtype == DType::kF64 && from_dtype == DType::kF32) {
      launch(static_cast<double*>(to), static_cast<const float*>(from));
    } else if (to_dtype == DType::kF32 && from_dtype == DType::kF64) {
      launch(static_cast<float*>(to), static_cast<const double*>(from));
    } else {
      Unsupported("conversion to " + memory::DTypeName(to_dtype), from_dtype);
    }
  }

  void AddInto(void* into, const void* from, DType dtype, int64_t n) override {
    if (n == 0) return;
    ForFloat(dtype, "AddInto", [&](auto zero) {
      using T = decltype(zero);
      LaunchKernel("AddIntoKernel", AddIntoKernel<T>, GridFor(n), kThreads, 0, context_.stream,
                   static_cast<T*>(into), static_cast<const T*>(from), n);
      CheckLaunch("AddIntoKernel", SiteOf(context_, "add"));
    });
  }

  void Scale(void* data, DType dtype, int64_t n, double factor) override {
    if (n == 0) return;
    ForFloat(dtype, "Scale", [&](auto zero) {
      using T = decltype(zero);
      LaunchKernel("ScaleKernel", ScaleKernel<T>, GridFor(n), kThreads, 0, context_.stream,
                   static_cast<T*>(data), n, static_cast<T>(factor));
      CheckLaunch("ScaleKernel", SiteOf(context_, "scale"));
    });
  }

  double SumSquares(const void* data, DType dtype, int64_t n) override {
    return SumSquaresEach({{data, dtype, n}}).front();
  }

  // Each region's two-stage sum (partials, then an ordered sum into its total) is enqueued; the
  // totals come back in one copy and one wait per batch of regions that fits reduce_scratch.
  std::vector<double> SumSquaresEach(const std::vector<Region>& regions) override {
    const CallSite site = SiteOf(context_, "sum of squares");
    std::vector<double> sums(regions.size(), 0.0);
    auto* scratch = static_cast<double*>(context_.reduce_scratch);
    const int64_t capacity = kReduceScratchBytes / static_cast<int64_t>(sizeof(double));
    size_t first = 0;
    while (first < regions.size()) {
      // Regions [first, last): their totals at the start of the scratch, partials after.
      size_t last = first;
      int64_t partials = 0;
      while (last < regions.size() &&
             int64_t(last - first + 1) + partials + ReduceBlocks(regions[last].n) <= capacity) {
        partials += ReduceBlocks(regions[last].n);
        ++last;
      }
      const int64_t count = static_cast<int64_t>(last - first);
      double* totals = scratch;
      double* partial = scratch + count;
      for (size_t i = first; i < last; ++i) {
        const Region& r = regions[i];
        const int blocks = ReduceBlocks(r.n);
        ForFloat(r.dtype, "SumSquares", [&](auto zero) {
          using T = decltype(zero);
          LaunchKernel("SumSquaresPartial", SumSquaresPartial<T>, blocks, kThreads, 0,
                       context_.stream, static_cast<const T*>(r.data), r.n, partial);
          CheckLaunch("SumSquaresPartial", site);
        });
        LaunchKernel("SumPartials", SumPartials, 1, 1, 0, context_.stream, partial, blocks,
                     totals + (i - first));
        CheckLaunch("SumPartials", site);
        partial += blocks;
      }
      double* host = HostSums(count);
      BIGMAC_CUDA_CHECK(cudaMemcpyAsync(host, totals, count * sizeof(double),
                                        cudaMemcpyDeviceToHost, context_.stream),
                        site.where);
      BIGMAC_CUDA_CHECK(cudaStreamSynchronize(context_.stream), site.where);
      std::copy(host, host + count, sums.begin() + static_cast<int64_t>(first));
      first = last;
    }
    return sums;
  }

  bool AllFinite(const void* data, DType dtype, int64_t n) override {
    if (n == 0) return true;
    const CallSite site = SiteOf(context_, "finite check");
    int* flag = static_cast<int*>(context_.reduce_scratch);
    BIGMAC_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), context_.stream), site.where);
    auto launch = [&](const auto* values) {
      LaunchKernel("NonFiniteKernel",
                   NonFiniteKernel<std::remove_cv_t<std::remove_pointer_t<decltype(values)>>>,
                   GridFor(n), kThreads, 0, context_.stream, values, n, flag);
      CheckLaunch("NonFiniteKernel", site);
    };
    if (dtype == DType::kBF16) {
      launch(static_cast<const __nv_bfloat16*>(data));
    } else {
      ForFloat(dtype, "AllFinite", [&](auto zero) {
        using T = decltype(zero);
        launch(static_cast<const T*>(data));
      });
    }
    int* host = static_cast<int*>(host_flag_);
    BIGMAC_CUDA_CHECK(
        cudaMemcpyAsync(host, flag, sizeof(int), cudaMemcpyDeviceToHost, context_.stream),
        site.where);
    BIGMAC_CUDA_CHECK(cudaStreamSynchronize(context_.stream), site.where);
    return *host == 0;
  }

  void AdamWUpdate(const AdamWArgs& a) override {
    if (a.n == 0) return;
    ForFloat(a.dtype, "AdamWUpdate", [&](auto zero) {
      using T = decltype(zero);
      LaunchKernel("AdamWKernel", AdamWKernel<T>, GridFor(a.n), kThreads, 0, context_.stream,
                   static_cast<T*>(a.p), static_cast<const T*>(a.g), static_cast<T*>(a.m),
                   static_cast<T*>(a.v), static_cast<__nv_bfloat16*>(a.compute_bf16), a.n,
                   static_cast<T>(a.beta1), static_cast<T>(1 - a.beta1), static_cast<T>(a.beta2),
                   static_cast<T>(1 - a.beta2), static_cast<T>(1 / a.bias_correction1),
                   static_cast<T>(1 / a.bias_correction2), static_cast<T>(a.lr),
                   static_cast<T>(a.weight_decay), static_cast<T>(a.eps),
                   static_cast<T>(a.grad_scale));
      CheckLaunch("AdamWKernel", SiteOf(context_, "AdamW update"));
    });
  }

 private:
  std::string Where(const std::string& what) const { return what + ", on " + context_.label; }

  // Pinned room for `count` doubles (grown, never shrunk), for SumSquaresEach's totals.
  double* HostSums(int64_t count) {
    if (count > host_sums_capacity_) {
      if (host_sums_) cudaFreeHost(host_sums_);
      host_sums_ = nullptr;
      host_sums_capacity_ = 0;
      BIGMAC_CUDA_CHECK(cudaMallocHost(&host_sums_, count * sizeof(double)),
                        Where("pinned sums of squares"));
      host_sums_capacity_ = count;
    }
    return static_cast<double*>(host_sums_);
  }

  std::shared_ptr<SystemBlocks> blocks_;
  CudaContext context_;
  std::string gpu_name_;
  int64_t total_memory_ = 0;
  cudaStream_t copy_stream_ = nullptr;  // copy_stream(): the snapshot's device-to-host copies
  void* host_flag_ = nullptr;           // pinned: AllFinite's int flag
  void* host_sums_ = nullptr;           // pinned: SumSquaresEach's totals
  int64_t host_sums_capacity_ = 0;
};

}  // namespace

std::unique_ptr<Device> MakeCudaDevice(int ordinal, int world_rank, int64_t memory_limit_bytes) {
  const std::string where = "device set-up, on " + Label(ordinal, world_rank);
  BIGMAC_CUDA_CHECK(cudaSetDevice(ordinal), where);
  BIGMAC_CUDA_CHECK(cudaFree(nullptr), where);  // creates the context before memory is measured
  // The context's own buffers (workspace, scratch, library handles) come out of what is free;
  // device.memory_limit, when set, caps what is left.
  constexpr int64_t kContextReserve =
      kBlasWorkspaceBytes + kReduceScratchBytes + (int64_t{512} << 20);
  int64_t capacity = CardFreeMemory(ordinal, world_rank) - kContextReserve;
  if (memory_limit_bytes > 0 && memory_limit_bytes < capacity) capacity = memory_limit_bytes;
  if (capacity <= 0) {
    throw DeviceError("no free memory on " + Label(ordinal, world_rank) +
                      " (another process holds it?)");
  }
  return std::make_unique<CudaDevice>(ordinal, world_rank, capacity);
}

const CudaContext& ContextOf(const Device* device) {
  const auto* cuda = dynamic_cast<const CudaDevice*>(device);
  if (cuda == nullptr) {
    throw std::logic_error("a CUDA layer or kernel was given the non-CUDA device " +
                           (device ? device->name() : std::string("(null)")));
  }
  return cuda->context();
}

std::string Describe(const Device* device) {
  const auto* cuda = dynamic_cast<const CudaDevice*>(device);
  if (cuda == nullptr) return device ? device->name() : "(no device)";
  const CudaContext& context = cuda->context();
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  char memory[32];
  std::snprintf(memory, sizeof(memory), "%.1f GiB",
                static_cast<double>(cuda->total_memory()) / (1 << 30));
  return cuda->gpu_name() + ", sm_" + std::to_string(context.compute_capability) + ", " +
         std::to_string(context.multiprocessors) + " SMs, " + memory + "; driver " +
         std::to_string(driver) + ", runtime " + std::to_string(runtime) + ", cuBLASLt " +
         std::to_string(cublasLtGetVersion()) + ", cuDNN " + std::to_string(cudnnGetVersion());
}

}  // namespace bigmac::device::cuda
