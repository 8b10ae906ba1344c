// The machine's sgemm throughput through the OpenBLAS build BigMac links (same kernels, same
// thread count): the ceiling bench/vs_pytorch.py sets achieved GFLOP/s against.
// Usage: sgemm_peak [threads] [size]   prints "sgemm_gflops <best of 7>".
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/cli/blas_core.h"

int main(int argc, char** argv) {
  bigmac::cli::EnsureFastBlasKernels(argv);  // the kernels bigmac itself runs with
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const int n = argc > 2 ? std::atoi(argv[2]) : 1024;
  openblas_set_num_threads(threads);
  std::vector<float> a(size_t(n) * n), b(a.size()), c(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    a[i] = float(i % 97) / 97.0f - 0.5f;
    b[i] = float(i % 89) / 89.0f - 0.5f;
  }
  double best = 0;
  for (int rep = 0; rep < 7; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, 2.0 * n * n * n / seconds / 1e9);
  }
  std::printf("sgemm_gflops %.2f (n=%d, threads=%d, core %s)\n", best, n, threads,
              openblas_get_corename());
  return 0;
}
