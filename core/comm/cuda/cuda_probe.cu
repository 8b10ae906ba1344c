#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/comm/cuda/cuda_probe.h"
#include "core/device/cuda/launch.h"

namespace bigmac::comm::cuda {
namespace {

__global__ void Saxpy(int n, float a, const float* x, float* y) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

std::string Describe(const char* what, cudaError_t status) {
  return std::string(what) + ": " + cudaGetErrorString(status);
}

}  // namespace

int DeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

bool Emulated() {
#ifdef BIGMAC_CUDA_EMULATION
  return true;
#else
  return false;
#endif
}

int RuntimeVersion() {
  int version = 0;
  cudaRuntimeGetVersion(&version);
  return version;
}

std::string SaxpySelfTest(int device) {
  constexpr int kN = 1 << 20;
  constexpr float kA = 1.5f;
  std::vector<float> x(kN), y(kN), expected(kN);
  for (int i = 0; i < kN; ++i) {
    x[i] = static_cast<float>((int64_t{i} * 7919) % 1000) / 997.0f;
    y[i] = static_cast<float>((int64_t{i} * 104729) % 1000) / 991.0f;
    expected[i] = kA * x[i] + y[i];
  }
  if (cudaError_t s = cudaSetDevice(device); s != cudaSuccess) return Describe("cudaSetDevice", s);
  float* dx = nullptr;
  float* dy = nullptr;
  std::string error;
  if (cudaError_t s = cudaMalloc(&dx, kN * sizeof(float)); s != cudaSuccess)
    return Describe("cudaMalloc", s);
  if (cudaError_t s = cudaMalloc(&dy, kN * sizeof(float)); s != cudaSuccess) {
    cudaFree(dx);
    return Describe("cudaMalloc", s);
  }
  cudaMemcpy(dx, x.data(), kN * sizeof(float), cudaMemcpyHostToDevice);
  cudaMemcpy(dy, y.data(), kN * sizeof(float), cudaMemcpyHostToDevice);
  device::cuda::LaunchKernel("Saxpy", Saxpy, (kN + 255) / 256, 256, 0, nullptr, kN, kA, dx, dy);
  if (cudaError_t s = cudaDeviceSynchronize(); s != cudaSuccess) error = Describe("Saxpy", s);
  if (error.empty()) {
    cudaMemcpy(y.data(), dy, kN * sizeof(float), cudaMemcpyDeviceToHost);
    for (int i = 0; i < kN && error.empty(); ++i) {
      if (std::fabs(y[i] - expected[i]) > 1e-6f * (1.0f + std::fabs(expected[i]))) {
        error = "element " + std::to_string(i) + ": got " + std::to_string(y[i]) + ", expected " +
                std::to_string(expected[i]);
      }
    }
  }
  cudaFree(dx);
  cudaFree(dy);
  return error;
}

}  // namespace bigmac::comm::cuda
