#include "plugins/sdk/init.h"

#include <cmath>
#include <vector>

namespace bigmac::sdk {
namespace {

uint64_t SplitMix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

double Uniform01(uint64_t* state) {  // (0, 1]
  return (static_cast<double>(SplitMix64(state) >> 11) + 1.0) * 0x1.0p-53;
}

template <typename T>
void Fill(T* data, int64_t n, double std, uint64_t* state) {
  for (int64_t i = 0; i < n; i += 2) {
    const double radius = std::sqrt(-2.0 * std::log(Uniform01(state)));
    const double angle = 2.0 * M_PI * Uniform01(state);
    data[i] = static_cast<T>(std * radius * std::cos(angle));
    if (i + 1 < n) data[i + 1] = static_cast<T>(std * radius * std::sin(angle));
  }
}

// Writes `tensor`'s elements with write(T* host, n): in place on the CPU, else into a host buffer
// uploaded once (weights are initialised on the host, so every backend starts from the same ones).
template <typename T, typename Write>
void WriteElements(memory::Tensor* tensor, Write write) {
  if (tensor->device() == nullptr || tensor->device()->backend() == device::Backend::kCpu) {
    write(tensor->data<T>(), tensor->numel());
    return;
  }
  std::vector<T> host(tensor->numel());
  write(host.data(), tensor->numel());
  tensor->CopyFromHost(host.data());
}

template <typename T>
void FillConstantAs(memory::Tensor* tensor, double value) {
  WriteElements<T>(tensor, [value](T* data, int64_t n) {
    for (int64_t i = 0; i < n; ++i) data[i] = static_cast<T>(value);
  });
}

}  // namespace

void FillNormal(memory::Tensor* tensor, double std, uint64_t seed, int layer_id,
                const std::string& name) {
  uint64_t state =
      seed * 0x9e3779b97f4a7c15ULL + static_cast<uint64_t>(layer_id + 1) * 0xc2b2ae3d27d4eb4fULL;
  for (char ch : name) state = (state ^ static_cast<unsigned char>(ch)) * 0x100000001b3ULL;
  if (tensor->dtype() == memory::DType::kF64) {
    WriteElements<double>(tensor, [&](double* data, int64_t n) { Fill(data, n, std, &state); });
  } else {
    WriteElements<float>(tensor, [&](float* data, int64_t n) { Fill(data, n, std, &state); });
  }
}

void FillConstant(memory::Tensor* tensor, double value) {
  if (tensor->dtype() == memory::DType::kF64) {
    FillConstantAs<double>(tensor, value);
  } else {
    FillConstantAs<float>(tensor, value);
  }
}

}  // namespace bigmac::sdk
