// The GPU's bf16 GEMM throughput through cuBLASLt: the peak MFU is reported against, measured in
// the same run. Self-contained (its own handle, stream and workspace).
// Usage: cuda_gemm_peak [size]   (default 8192: one size^3 bf16 GEMM, fp32 accumulation, TN).
// Prints exactly one machine line "bf16_gemm_tflops=<value>" and one human line; exits 2 when
// there is no CUDA device, 1 on a CUDA or cuBLASLt failure.

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

void Fail(const char* call, const char* status) {
  std::fprintf(stderr, "cuda_gemm_peak: %s failed: %s\n", call, status);
  std::exit(1);
}

void Check(cudaError_t status, const char* call) {
  if (status != cudaSuccess) Fail(call, cudaGetErrorString(status));
}

void Check(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS) Fail(call, cublasLtGetStatusString(status));
}

#define CHECK(call) Check((call), #call)

// Uniform in [-1, 1) from a fixed-seed 64-bit LCG, rounded to bf16.
std::vector<__nv_bfloat16> RandomBf16(size_t count, uint64_t seed) {
  std::vector<__nv_bfloat16> values(count);
  uint64_t state = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (size_t i = 0; i < count; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const float u = float(state >> 40) * (1.0f / float(1ull << 24));
    values[i] = __float2bfloat16(2.0f * u - 1.0f);
  }
  return values;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 8192;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "cuda_gemm_peak: no CUDA device on this machine\n");
    return 2;
  }
  CHECK(cudaSetDevice(0));
  cudaDeviceProp prop{};
  CHECK(cudaGetDeviceProperties(&prop, 0));

  cudaStream_t stream = nullptr;
  CHECK(cudaStreamCreate(&stream));
  cublasLtHandle_t handle = nullptr;
  CHECK(cublasLtCreate(&handle));
  const size_t workspace_bytes = size_t{32} << 20;
  void* workspace = nullptr;
  CHECK(cudaMalloc(&workspace, workspace_bytes));

  const size_t elements = size_t(n) * size_t(n);
  void *a = nullptr, *b = nullptr, *d = nullptr;
  CHECK(cudaMalloc(&a, elements * sizeof(__nv_bfloat16)));
  CHECK(cudaMalloc(&b, elements * sizeof(__nv_bfloat16)));
  CHECK(cudaMalloc(&d, elements * sizeof(__nv_bfloat16)));
  {
    const std::vector<__nv_bfloat16> host_a = RandomBf16(elements, 1);
    const std::vector<__nv_bfloat16> host_b = RandomBf16(elements, 2);
    CHECK(cudaMemcpy(a, host_a.data(), elements * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(b, host_b.data(), elements * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
  }

  // Column-major D(n, n) = A^T B with A stored (k, m): the layout the forward GEMMs use.
  cublasLtMatmulDesc_t op = nullptr;
  CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const int32_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
  CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
  cublasLtMatrixLayout_t layout_a = nullptr, layout_b = nullptr, layout_d = nullptr;
  CHECK(cublasLtMatrixLayoutCreate(&layout_a, CUDA_R_16BF, n, n, n));
  CHECK(cublasLtMatrixLayoutCreate(&layout_b, CUDA_R_16BF, n, n, n));
  CHECK(cublasLtMatrixLayoutCreate(&layout_d, CUDA_R_16BF, n, n, n));
  cublasLtMatmulPreference_t pref = nullptr;
  CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t max_workspace = workspace_bytes;
  CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &max_workspace, sizeof(max_workspace)));
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  CHECK(cublasLtMatmulAlgoGetHeuristic(handle, op, layout_a, layout_b, layout_d, layout_d, pref, 1,
                                       &result, &returned));
  if (returned == 0) Fail("cublasLtMatmulAlgoGetHeuristic", "no algorithm for the bf16 GEMM");

  const float alpha = 1.0f, beta = 0.0f;
  auto run = [&] {
    CHECK(cublasLtMatmul(handle, op, &alpha, a, layout_a, b, layout_b, &beta, d, layout_d, d,
                         layout_d, &result.algo, workspace, workspace_bytes, stream));
  };
  for (int i = 0; i < 3; ++i) run();  // warm-up
  cudaEvent_t start = nullptr, stop = nullptr;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  constexpr int kTimed = 10;
  CHECK(cudaEventRecord(start, stream));
  for (int i = 0; i < kTimed; ++i) run();
  CHECK(cudaEventRecord(stop, stream));
  CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  const double tflops = 2.0 * double(n) * double(n) * double(n) * kTimed / (ms * 1e-3) / 1e12;

  std::printf("bf16_gemm_tflops=%.1f\n", tflops);
  std::printf(
      "cuBLASLt bf16 %lldx%lldx%lld GEMM (TN, fp32 accumulate): %d runs in %.3f ms, "
      "%.1f TFLOP/s on %s (sm_%d%d)\n",
      static_cast<long long>(n), static_cast<long long>(n), static_cast<long long>(n), kTimed, ms,
      tflops, prop.name, prop.major, prop.minor);

  cudaEventDestroy(stop);
  cudaEventDestroy(start);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(layout_d);
  cublasLtMatrixLayoutDestroy(layout_b);
  cublasLtMatrixLayoutDestroy(layout_a);
  cublasLtMatmulDescDestroy(op);
  cudaFree(d);
  cudaFree(b);
  cudaFree(a);
  cudaFree(workspace);
  cublasLtDestroy(handle);
  cudaStreamDestroy(stream);
  return 0;
}
