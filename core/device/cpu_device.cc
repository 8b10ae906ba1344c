// CpuDevice: host memory, and the engine's elementwise operations as OpenMP loops (static
// schedules, no cross-thread reductions: bitwise reproducible run to run).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "core/device/device.h"
#include "core/util/simd.h"

namespace bigmac::device {
namespace {

using memory::BFloat16;

// The arithmetic is in T (float for training, as PyTorch's AdamW; double for the checks), with
// the step's scalars rounded to T once, so the loop vectorises fully.
template <typename T>
BIGMAC_SIMD_CLONES void AdamWTyped(T* p, const T* g, T* m, T* v, int64_t n, double lr, double b1,
                                   double b2, double eps, double wd, double bias1, double bias2,
                                   double grad_scale) {
  const T beta1 = static_cast<T>(b1), one_minus_beta1 = static_cast<T>(1 - b1);
  const T beta2 = static_cast<T>(b2), one_minus_beta2 = static_cast<T>(1 - b2);
  const T inv_bias1 = static_cast<T>(1 / bias1), inv_bias2 = static_cast<T>(1 / bias2);
  const T step = static_cast<T>(lr), decay = static_cast<T>(wd), epsilon = static_cast<T>(eps);
  const T scale = static_cast<T>(grad_scale);
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const T grad = g[i] * scale;  // exact when scale is 1
    m[i] = beta1 * m[i] + one_minus_beta1 * grad;
    v[i] = beta2 * v[i] + one_minus_beta2 * grad * grad;
    const T m_hat = m[i] * inv_bias1;
    const T v_hat = v[i] * inv_bias2;
    p[i] = p[i] - step * (m_hat / (std::sqrt(v_hat) + epsilon) + decay * p[i]);
  }
}

template <typename T>
double SumSquaresTyped(const T* g, int64_t n) {
  // Element i goes to lane i % 8 and the lanes are added in order at the end: a fixed order, so
  // the bits depend on nothing but the data, with eight independent chains of additions where
  // one chain's latency made this 1.1% of the llama_20m step (on one thread, the others idle).
  constexpr int kLanes = 8;
  double lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
#pragma GCC unroll 8
    for (int j = 0; j < kLanes; ++j) lane[j] += double(g[i + j]) * g[i + j];
  }
  for (int j = 0; i < n; ++i, ++j) lane[j] += double(g[i]) * g[i];
  double sum = 0;
  for (double part : lane) sum += part;
  return sum;
}

template <typename T>
bool AllFiniteTyped(const T* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(v[i])) return false;
  }
  return true;
}

BIGMAC_SIMD_CLONES void RoundToBf16(BFloat16* to, const float* from, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) to[i] = memory::ToBFloat16(from[i]);
}

BIGMAC_SIMD_CLONES void WidenBf16(float* to, const BFloat16* from, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) to[i] = memory::ToFloat(from[i]);
}

template <typename To, typename From>
void Cast(To* to, const From* from, int64_t n) {
  for (int64_t i = 0; i < n; ++i) to[i] = static_cast<To>(from[i]);
}

[[noreturn]] void Unsupported(const std::string& what, DType dtype) {
  throw std::logic_error("cpu device: " + what + " of " + memory::DTypeName(dtype) +
                         " is not supported");
}

// Calls `f(T{})` with T = float for f32 and double for f64: the engine's operations are the same
// loop in either precision.
template <typename F>
auto ForFloat(DType dtype, const char* what, F f) {
  if (dtype == DType::kF64) return f(double{});
  if (dtype == DType::kF32) return f(float{});
  Unsupported(what, dtype);
}

// f(offset, bytes) over [0, bytes), split among the OpenMP threads from 1 MiB up. A large copy or
// fill on one thread left the others idle (the gradients' zeroing, the blocks' residual copies:
// bench/NOTES.md, lever 18). Inside a parallel region, or with one thread, f runs once. Called
// from the rank's thread, whose OpenMP thread count the trainer set (from another std::thread
// the team would take OpenMP's default size).
template <typename F>
void SplitBytes(int64_t bytes, const F& f) {
  constexpr int64_t kMinBytes = int64_t{1} << 20;
  if (bytes < kMinBytes || omp_in_parallel() || omp_get_max_threads() == 1) {
    f(0, bytes);
    return;
  }
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads();
    const int64_t per = (bytes / threads + 63) / 64 * 64;  // whole cache lines
    const int64_t begin = std::min(bytes, per * omp_get_thread_num());
    const int64_t end = omp_get_thread_num() == threads - 1 ? bytes : std::min(bytes, begin + per);
    if (begin < end) f(begin, end - begin);
  }
}

void Fill0(void* data, int64_t bytes) {
  SplitBytes(bytes,
             [data](int64_t at, int64_t n) { std::memset(static_cast<char*>(data) + at, 0, n); });
}

void CopyBytes(void* to, const void* from, int64_t bytes) {
  SplitBytes(bytes, [to, from](int64_t at, int64_t n) {
    std::memcpy(static_cast<char*>(to) + at, static_cast<const char*>(from) + at, n);
  });
}

class CpuDevice : public Device {
 public:
  CpuDevice(int index, int64_t capacity) : Device("cpu:" + std::to_string(index), capacity) {}

  Backend backend() const override { return Backend::kCpu; }

  void Memset(void* data, int64_t bytes) override { Fill0(data, bytes); }
  void CopyHostToDevice(void* data, const void* host, int64_t bytes) override {
    CopyBytes(data, host, bytes);
  }
  void CopyDeviceToHost(void* host, const void* data, int64_t bytes) override {
    CopyBytes(host, data, bytes);
  }
  void CopyDeviceToDevice(void* to, const void* from, int64_t bytes) override {
    CopyBytes(to, from, bytes);
  }

  Stream compute_stream() override { return {}; }
  Event RecordEvent(Stream) override { return {}; }
  void WaitEvent(Stream, Event) override {}
  void DestroyEvent(Event) override {}
  void Synchronize() override {}

  void Convert(void* to, DType to_dtype, const void* from, DType from_dtype, int64_t n) override {
    if (to_dtype == from_dtype) {
      CopyBytes(to, from, n * memory::DTypeSize(to_dtype));
    } else if (to_dtype == DType::kBF16 && from_dtype == DType::kF32) {
      RoundToBf16(static_cast<BFloat16*>(to), static_cast<const float*>(from), n);
    } else if (to_dtype == DType::kF32 && from_dtype == DType::kBF16) {
      WidenBf16(static_cast<float*>(to), static_cast<const BFloat16*>(from), n);
    } else if (to_dtype == DType::kF64 && from_dtype == DType::kF32) {
      Cast(static_cast<double*>(to), static_cast<const float*>(from), n);
    } else if (to_dtype == DType::kF32 && from_dtype == DType::kF64) {
      Cast(static_cast<float*>(to), static_cast<const double*>(from), n);
    } else {
      Unsupported("conversion to " + memory::DTypeName(to_dtype), from_dtype);
    }
  }

  void AddInto(void* into, const void* from, DType dtype, int64_t n) override {
    ForFloat(dtype, "AddInto", [&](auto zero) {
      using T = decltype(zero);
      T* a = static_cast<T*>(into);
      const T* b = static_cast<const T*>(from);
      for (int64_t i = 0; i < n; ++i) a[i] += b[i];
    });
  }

  void Scale(void* data, DType dtype, int64_t n, double factor) override {
    ForFloat(dtype, "Scale", [&](auto zero) {
      using T = decltype(zero);
      T* g = static_cast<T*>(data);
      const T f = static_cast<T>(factor);
      for (int64_t i = 0; i < n; ++i) g[i] *= f;
    });
  }

  double SumSquares(const void* data, DType dtype, int64_t n) override {
    return ForFloat(dtype, "SumSquares", [&](auto zero) {
      return SumSquaresTyped(static_cast<const decltype(zero)*>(data), n);
    });
  }

  // Each region summed on one thread as SumSquares sums it (the same bits), the regions shared
  // out to the OpenMP threads, largest first: on one thread the gradient norm left the others
  // idle (bench/NOTES.md, lever 24).
  std::vector<double> SumSquaresEach(const std::vector<Region>& regions) override {
    const int count = static_cast<int>(regions.size());
    const bool floats = std::all_of(regions.begin(), regions.end(), [](const Region& r) {
      return r.dtype == DType::kF32 || r.dtype == DType::kF64;
    });
    if (!floats || count < 2 || omp_in_parallel() || omp_get_max_threads() == 1) {
      return Device::SumSquaresEach(regions);  // one thread (and its errors, outside OpenMP)
    }
    std::vector<int> order(count);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int x, int y) { return regions[x].n > regions[y].n; });
    std::vector<double> sums(count);
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < count; ++i) {
      const Region& r = regions[order[i]];
      sums[order[i]] = SumSquares(r.data, r.dtype, r.n);  // f32 or f64: does not throw
    }
    return sums;
  }

  bool AllFinite(const void* data, DType dtype, int64_t n) override {
    if (dtype == DType::kBF16) {
      const BFloat16* v = static_cast<const BFloat16*>(data);
      for (int64_t i = 0; i < n; ++i) {
        if ((v[i].bits & 0x7f80u) == 0x7f80u) return false;  // all-ones exponent: Inf or NaN
      }
      return true;
    }
    return ForFloat(dtype, "AllFinite", [&](auto zero) {
      return AllFiniteTyped(static_cast<const decltype(zero)*>(data), n);
    });
  }

  void AdamWUpdate(const AdamWArgs& a) override {
    ForFloat(a.dtype, "AdamW", [&](auto zero) {
      using T = decltype(zero);
      AdamWTyped(static_cast<T*>(a.p), static_cast<const T*>(a.g), static_cast<T*>(a.m),
                 static_cast<T*>(a.v), a.n, a.lr, a.beta1, a.beta2, a.eps, a.weight_decay,
                 a.bias_correction1, a.bias_correction2, a.grad_scale);
    });
    if (a.compute_bf16) Convert(a.compute_bf16, DType::kBF16, a.p, a.dtype, a.n);
  }
};

}  // namespace

void* Device::AllocateHostStaging(int64_t bytes) {
  // 64-byte aligned, as the allocator's blocks are.
  const size_t size = (static_cast<size_t>(std::max<int64_t>(bytes, 1)) + 63) / 64 * 64;
  void* host = std::aligned_alloc(64, size);
  if (host == nullptr) {
    throw DeviceError("cannot allocate " + std::to_string(bytes) +
                      " bytes of host memory for staging, for " + name());
  }
  return host;
}

void Device::FreeHostStaging(void* host) { std::free(host); }

void Device::CopyDeviceToHostAsync(void* host, const void* data, int64_t bytes, Stream /*stream*/) {
  CopyDeviceToHost(host, data, bytes);
}

std::vector<double> Device::SumSquaresEach(const std::vector<Region>& regions) {
  std::vector<double> sums;
  sums.reserve(regions.size());
  for (const Region& r : regions) sums.push_back(SumSquares(r.data, r.dtype, r.n));
  return sums;
}

std::string BackendName(Backend backend) { return backend == Backend::kCuda ? "cuda" : "cpu"; }

bool ParseBackend(const std::string& name, Backend* backend) {
  if (name == "cpu") {
    *backend = Backend::kCpu;
  } else if (name == "cuda") {
    *backend = Backend::kCuda;
  } else {
    return false;
  }
  return true;
}

std::unique_ptr<Device> MakeCpuDevice(int index, int64_t capacity_bytes) {
  return std::make_unique<CpuDevice>(index, capacity_bytes);
}

}  // namespace bigmac::device
