// The CPU GEMM libraries on the model's own GEMM shapes (bench/NOTES.md, levers 11 and 13):
// OpenBLAS (the build bigmac links), BigMac's own blocked GEMM (stages/cpu/blocked_gemm.h), oneDNN,
// BLIS and MKL, each loaded with dlopen where it is installed. For hidden size C and N = batch *
// seq rows it times the forward, backward-input and backward-weight GEMMs of the block's four
// linear layers and of the head (vocab 256), in alternating rounds, and prints each library's
// median GFLOP/s per shape, the time of one pass over all shapes, and whether its results at 1 and
// at `threads` threads are the same bits (what pp/dp equivalence needs when ranks get different
// thread counts).
//
// Usage: gemm_libraries N C [threads] [rounds]
// Libraries: OpenBLAS always; oneDNN from libdnnl.so.2; BLIS from $BIGMAC_BLIS (default Debian's
// blis-openmp); MKL from $BIGMAC_MKL (default the bench venv's libmkl_rt.so.3, which
// `launch/setup.sh --bench` installs), with MKL_THREADING_LAYER=GNU so it shares the OpenMP pool.
#include <cblas.h>
#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/cli/blas_core.h"
#include "stages/cpu/blocked_gemm.h"

namespace {

// Row-major C = A op B with beta, as the CPU kernels call it.
using Gemm = std::function<void(bool ta, bool tb, int m, int n, int k, const float* a, int lda,
                                const float* b, int ldb, float beta, float* c, int ldc)>;

struct Library {
  std::string name;
  Gemm gemm;
};

using CblasSgemm = void (*)(CBLAS_ORDER, CBLAS_TRANSPOSE, CBLAS_TRANSPOSE, int, int, int, float,
                            const float*, int, const float*, int, float, float*, int);
using DnnlSgemm = int (*)(char, char, int64_t, int64_t, int64_t, float, const float*, int64_t,
                          const float*, int64_t, float, float*, int64_t);

Gemm FromCblas(CblasSgemm f) {
  return [f](bool ta, bool tb, int m, int n, int k, const float* a, int lda, const float* b,
             int ldb, float beta, float* c, int ldc) {
    f(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f,
      a, lda, b, ldb, beta, c, ldc);
  };
}

void* Symbol(const std::string& path, const char* name) {
  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!library) {
    std::printf("# %s: not loaded (%s)\n", path.c_str(), dlerror());
    return nullptr;
  }
  return dlsym(library, name);
}

std::vector<Library> Libraries() {
  std::vector<Library> libraries = {{"openblas", FromCblas(cblas_sgemm)}};
  namespace gemm = bigmac::sdk::cpu::internal;
  for (const gemm::GemmKernel kernel : {gemm::GemmKernel::kAvx2, gemm::GemmKernel::kAvx512}) {
    if (!gemm::BlockedSgemmSupported(kernel)) continue;
    libraries.push_back({std::string("bigmac-") + gemm::GemmKernelName(kernel),
                         [kernel](bool ta, bool tb, int m, int n, int k, const float* a, int lda,
                                  const float* b, int ldb, float beta, float* c, int ldc) {
                           gemm::BlockedSgemm(kernel, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, beta,
                                              c, ldc);
                         }});
  }
  if (void* f = Symbol("libdnnl.so.2", "dnnl_sgemm")) {
    const auto dnnl = reinterpret_cast<DnnlSgemm>(f);
    libraries.push_back(
        {"onednn", [dnnl](bool ta, bool tb, int m, int n, int k, const float* a, int lda,
                          const float* b, int ldb, float beta, float* c, int ldc) {
           dnnl(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
         }});
  }
  const char* blis = std::getenv("BIGMAC_BLIS");
  if (void* f = Symbol(blis ? blis : "/usr/lib/x86_64-linux-gnu/blis-openmp/libblis.so.4",
                       "cblas_sgemm")) {
    libraries.push_back({"blis", FromCblas(reinterpret_cast<CblasSgemm>(f))});
  }
  const char* mkl = std::getenv("BIGMAC_MKL");
  const char* home = std::getenv("HOME");
  const std::string mkl_path =
      mkl ? mkl : std::string(home ? home : "") + "/.cache/bigmac/bench-venv/lib/libmkl_rt.so.3";
  setenv("MKL_THREADING_LAYER", "GNU", 0);
  setenv("MKL_DYNAMIC", "FALSE", 0);
  if (void* f = Symbol(mkl_path, "cblas_sgemm")) {
    libraries.push_back({"mkl", FromCblas(reinterpret_cast<CblasSgemm>(f))});
  }
  return libraries;
}

struct Shape {
  std::string name;
  bool ta, tb;
  int m, n, k;
  float beta;
};

std::vector<Shape> ModelShapes(int rows, int c) {
  const char* layers[] = {"qkv", "attn.proj", "fc", "fc2", "head"};
  const int outs[] = {3 * c, c, 4 * c, c, 256};
  const int ins[] = {c, c, c, 4 * c, c};
  std::vector<Shape> shapes;
  for (int i = 0; i < 5; ++i) {
    shapes.push_back({std::string(layers[i]) + " fwd", false, true, rows, outs[i], ins[i], 0});
    shapes.push_back({std::string(layers[i]) + " bwd-in", false, false, rows, ins[i], outs[i], 0});
    shapes.push_back({std::string(layers[i]) + " bwd-w", true, false, outs[i], ins[i], rows, 1});
  }
  return shapes;
}

double Seconds(const std::function<void()>& f) {
  const auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  bigmac::cli::EnsureFastBlasKernels(argv);  // the OpenBLAS kernels bigmac itself runs
  if (argc < 3) {
    std::fprintf(stderr, "usage: gemm_libraries N C [threads] [rounds]\n");
    return 2;
  }
  const int rows = std::atoi(argv[1]);
  const int c = std::atoi(argv[2]);
  const int threads = argc > 3 ? std::atoi(argv[3]) : 2;
  const int rounds = argc > 4 ? std::atoi(argv[4]) : 5;
  if (rows <= 0 || c <= 0 || threads <= 0 || rounds <= 0) {
    std::fprintf(stderr, "gemm_libraries: N, C, threads and rounds must be positive\n");
    return 2;
  }
  const std::vector<Library> libraries = Libraries();
  const std::vector<Shape> shapes = ModelShapes(rows, c);
  const size_t big = size_t(std::max(rows, 4 * c)) * 4 * c;
  std::vector<float> a(big), b(big), out(big), other(big);
  for (size_t i = 0; i < big; ++i) {
    a[i] = float(i * 7919 % 1000) / 1000.0f - 0.5f;
    b[i] = float(i * 104729 % 997) / 997.0f - 0.5f;
  }
  // seconds[library][shape]: one sample per round (median of 3 calls), libraries alternating.
  std::vector<std::vector<std::vector<double>>> seconds(
      libraries.size(), std::vector<std::vector<double>>(shapes.size()));
  std::vector<bool> thread_invariant(libraries.size(), true);
  for (int round = 0; round < rounds; ++round) {
    for (size_t l = 0; l < libraries.size(); ++l) {
      const size_t lib = round % 2 ? libraries.size() - 1 - l : l;
      for (size_t s = 0; s < shapes.size(); ++s) {
        const Shape& sh = shapes[s];
        const int lda = sh.ta ? sh.m : sh.k, ldb = sh.tb ? sh.k : sh.n;
        const auto call = [&](float* into) {
          libraries[lib].gemm(sh.ta, sh.tb, sh.m, sh.n, sh.k, a.data(), lda, b.data(), ldb, 0.0f,
                              into, sh.n);
        };
        omp_set_num_threads(threads);
        call(out.data());  // warm: packing buffers, JIT kernels
        std::vector<double> t;
        for (int rep = 0; rep < 3; ++rep) t.push_back(Seconds([&] { call(out.data()); }));
        seconds[lib][s].push_back(Median(t));
        if (round == 0 && threads > 1) {
          omp_set_num_threads(1);
          call(other.data());
          omp_set_num_threads(threads);
          if (std::memcmp(out.data(), other.data(), sizeof(float) * sh.m * sh.n) != 0) {
            thread_invariant[lib] = false;
            std::printf("# %s: %s differs at 1 thread\n", libraries[lib].name.c_str(),
                        sh.name.c_str());
          }
        }
      }
    }
  }
  std::printf("GEMM GFLOP/s (median of %d rounds), rows N=%d, hidden C=%d, %d threads\n", rounds,
              rows, c, threads);
  std::printf("%-16s %16s", "shape", "m x n x k");
  for (const Library& l : libraries) std::printf(" %13s", l.name.c_str());
  std::printf("\n");
  std::vector<double> total(libraries.size(), 0);
  for (size_t s = 0; s < shapes.size(); ++s) {
    const Shape& sh = shapes[s];
    const double flops = 2.0 * sh.m * sh.n * sh.k;
    char dims[32];
    std::snprintf(dims, sizeof(dims), "%dx%dx%d", sh.m, sh.n, sh.k);
    std::printf("%-16s %16s", sh.name.c_str(), dims);
    for (size_t l = 0; l < libraries.size(); ++l) {
      const double t = Median(seconds[l][s]);
      total[l] += t;
      std::printf(" %13.1f", flops / t / 1e9);
    }
    std::printf("\n");
  }
  std::printf("%-33s", "all shapes, ms");
  for (double t : total) std::printf(" %9.2f", t * 1e3);
  std::printf("\n%-33s", "same bits at 1 thread");
  for (size_t l = 0; l < libraries.size(); ++l)
    std::printf(" %13s", threads == 1 ? "-" : thread_invariant[l] ? "yes" : "NO");
  std::printf("\n");
  return 0;
}
