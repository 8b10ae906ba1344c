// The float GEMM of the CPU kernels. The default is BigMac's own (blocked_gemm.h) on CPUs with
// AVX2 and FMA: its bits do not depend on the thread count, so pp/dp layouts that give ranks
// different thread counts stay bitwise equal at any size (bench/NOTES.md, lever 13, has its
// speed). BIGMAC_CPU_GEMM=openblas or onednn choose a library instead: OpenBLAS's bits change
// with the thread count at the bench models' sizes (bench/gemm_libraries), and oneDNN's fail the
// pipeline equivalence suite (docs/build.md). oneDNN is loaded with dlopen only when chosen:
// nothing else needs it, and the GPU bundle stays without it.
#include <cblas.h>
#include <dlfcn.h>
#include <dnnl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "plugins/sdk/cpu_kernels.h"
#include "stages/cpu/blocked_gemm.h"
#include "stages/cpu/math.h"

namespace bigmac::sdk::cpu {
namespace {

using DnnlSgemm = decltype(&dnnl_sgemm);

struct Choice {
  const char* name = nullptr;  // null: the environment asked for something unusable
  bool blocked = false;        // BigMac's own GEMM
  internal::GemmKernel kernel = internal::GemmKernel::kAvx2;  // its micro-kernel
  DnnlSgemm dnnl_sgemm = nullptr;
  std::string problem;
};

// BigMac's GEMM with the given micro-kernel (`value`: what BIGMAC_CPU_GEMM said), or why this
// CPU cannot run it.
void ChooseBlocked(const char* value, internal::GemmKernel kernel, Choice& choice) {
  if (!internal::BlockedSgemmSupported(kernel)) {
    choice.problem =
        std::string("BIGMAC_CPU_GEMM=") + value +
        (internal::BlockedSgemmSupported()
             ? " needs a CPU with AVX-512F, and this one lacks it: use bigmac"
             : " needs a CPU with AVX2 and FMA, and this one lacks them: use openblas");
    return;
  }
  choice.name = kernel == internal::GemmKernel::kAvx512 ? "bigmac-avx512" : "bigmac-avx2";
  choice.blocked = true;
  choice.kernel = kernel;
}

Choice Choose() {
  Choice choice;
  const char* value = std::getenv("BIGMAC_CPU_GEMM");
  if (!value || !*value) value = internal::BlockedSgemmSupported() ? "bigmac" : "openblas";
  if (std::strcmp(value, "bigmac") == 0 || std::strcmp(value, "bigmac-avx2") == 0) {
    // AVX2 unless asked: on Zen 4 the AVX-512 kernel is no faster, and on CPUs with one 512-bit
    // FMA unit it may lower the clock for nothing (bench/NOTES.md, issue 34).
    ChooseBlocked(value, internal::GemmKernel::kAvx2, choice);
  } else if (std::strcmp(value, "bigmac-avx512") == 0) {
    ChooseBlocked(value, internal::GemmKernel::kAvx512, choice);
  } else if (std::strcmp(value, "openblas") == 0) {
    choice.name = "openblas";
  } else if (std::strcmp(value, "onednn") == 0) {
    void* library = dlopen("libdnnl.so.2", RTLD_NOW | RTLD_LOCAL);  // kept for the process
    void* symbol = library ? dlsym(library, "dnnl_sgemm") : nullptr;
    if (symbol) {
      choice.name = "onednn";
      choice.dnnl_sgemm = reinterpret_cast<DnnlSgemm>(symbol);
    } else {
      const char* error = dlerror();
      choice.problem = std::string(
                           "BIGMAC_CPU_GEMM=onednn needs oneDNN's libdnnl.so.2 (Debian's "
                           "libdnnl2): ") +
                       (error ? error : "dnnl_sgemm not found");
    }
  } else {
    choice.problem =
        std::string("environment variable BIGMAC_CPU_GEMM='") + value +
        "' names no GEMM library: it must be bigmac (the default on CPUs with AVX2 and FMA; the "
        "same as bigmac-avx2), bigmac-avx512, openblas or onednn";
  }
  return choice;
}

const Choice& Chosen() {
  static const Choice choice = Choose();
  return choice;
}

}  // namespace

const char* FloatGemmLibrary(std::string* problem) {
  if (!Chosen().name && problem) *problem = Chosen().problem;
  return Chosen().name;
}

namespace internal {

bool CanPackBOnce(int k) { return Chosen().blocked && k > 0 && k <= kGemmKc; }

void SgemmPackedB(int m, int n, int k, float alpha, const float* a, int lda, const float* packed_b,
                  float beta, float* c, int ldc, int packed_k) {
  BlockedSgemmPackedB(Chosen().kernel, false, m, n, k, alpha, a, lda, packed_b, beta, c, ldc,
                      packed_k);
}

namespace {

// Another library's float GEMM (OpenBLAS or oneDNN), as FloatGemmLibrary() names it.
void LibrarySgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                  int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  const DnnlSgemm dnnl = Chosen().dnnl_sgemm;
  if (!dnnl) {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  // dnnl_sgemm is row-major. It runs on the calling OpenMP pool (one thread inside a parallel
  // region, as the attention kernels call it); at a fixed thread count its results are the same
  // run to run.
  const dnnl_status_t status =
      dnnl(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (status != dnnl_success) {
    // Only malformed arguments fail, which would be a kernel bug: stop before using garbage.
    std::fprintf(stderr,
                 "bigmac: dnnl_sgemm(%c, %c, m=%d, n=%d, k=%d, lda=%d, ldb=%d, ldc=%d) failed: "
                 "status %d\n",
                 trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, lda, ldb, ldc,
                 static_cast<int>(status));
    std::abort();
  }
}

}  // namespace

bool GemmFusesEpilogue() { return Chosen().blocked; }

void SgemmRowMajor(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                   int lda, const float* b, int ldb, float beta, float* c, int ldc,
                   const GemmEpilogue& epilogue) {
  if (Chosen().blocked) {
    BlockedSgemm(Chosen().kernel, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
                 epilogue);
    return;
  }
  if (epilogue.apply) {  // a kernel bug: the fused kernels check GemmFusesEpilogue() first
    std::fprintf(stderr, "bigmac: a GEMM epilogue with %s, which cannot run one\n",
                 Chosen().name ? Chosen().name : "no float GEMM library");
    std::abort();
  }
  LibrarySgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace internal
}  // namespace bigmac::sdk::cpu
