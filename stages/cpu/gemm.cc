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
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "core/util/constant_weights.h"
#include "core/util/host_memory.h"
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

namespace {

// The weights' packed copies for BigMac's GEMM while a util::ConstantWeightsScope lives: one per
// weight and orientation, packed at its first product of an epoch (a flush) and read by the
// rest, so that a stage's weights are packed once per flush instead of once per micro-batch and
// pass (bench/NOTES.md, lever 22). The buffers stay for the next epoch's packing, up to
// kMaxBytes in all: past it, the copies of buffers the scope no longer lists go, and a copy that
// still does not fit is not made (that product packs as before), so the kept set stays stable.
class WeightPacks {
 public:
  static constexpr int64_t kMaxBytes = int64_t{1} << 30;

  WeightPacks() = default;
  WeightPacks(const WeightPacks&) = delete;
  WeightPacks& operator=(const WeightPacks&) = delete;
  ~WeightPacks() {
    for (auto& [key, entry] : entries_) std::free(entry.data);
  }

  // op(B) = w (trans_b: w^T) k x n, w being `w_bytes` long, packed for `epoch`; null when it
  // cannot be kept. The pointer stays valid for the epoch (only copies of unlisted buffers are
  // freed).
  const float* Get(uint64_t epoch, bool trans_b, int k, int n, const float* w, int ldw,
                   int64_t w_bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    const Key key{w, trans_b, k, n, ldw};
    auto it = entries_.find(key);
    if (it == entries_.end()) {
      const int64_t bytes = BlockedPackedBFloats(k, n) * int64_t{sizeof(float)};
      if (bytes_ + bytes > kMaxBytes) EvictUnlisted();
      if (bytes_ + bytes > kMaxBytes) return nullptr;
      it = entries_.emplace(key, Entry{0, nullptr, bytes, w_bytes}).first;
      it->second.data = static_cast<float*>(::bigmac::util::AllocateHost(bytes));
      if (!it->second.data) {
        entries_.erase(it);
        return nullptr;
      }
      bytes_ += bytes;
    }
    Entry& entry = it->second;
    if (entry.epoch != epoch) {
      BlockedPackWholeB(trans_b, k, n, w, ldw, entry.data);
      entry.epoch = epoch;
    }
    return entry.data;
  }

 private:
  using Key = std::tuple<const float*, bool, int, int, int>;
  struct Entry {
    uint64_t epoch;  // the epoch its contents were packed in
    float* data;     // owned: AllocateHost, std::free
    int64_t bytes;
    int64_t w_bytes;  // the weight's, as the scope lists it
  };

  // Drops the copies of buffers the live scope does not list (an earlier model's weights, say).
  void EvictUnlisted() {
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (::bigmac::util::ConstantWeightEpoch(std::get<0>(it->first), it->second.w_bytes) != 0) {
        ++it;
        continue;
      }
      std::free(it->second.data);
      bytes_ -= it->second.bytes;
      it = entries_.erase(it);
    }
  }

  std::mutex mutex_;
  std::map<Key, Entry> entries_;
  int64_t bytes_ = 0;
};

// BIGMAC_CPU_WEIGHT_PACKS=off (or 0) packs at every product instead, as without a scope: the
// packs take up to the stage's weights twice over in host memory (at most 1 GiB). Read at each
// product by a listed weight, so that a test can compare both in one process.
bool WeightPacksOn() {
  const char* value = std::getenv("BIGMAC_CPU_WEIGHT_PACKS");
  return !value || (std::strcmp(value, "off") != 0 && std::strcmp(value, "0") != 0);
}

WeightPacks& Packs() {
  static WeightPacks* packs = new WeightPacks;  // never destroyed: kernels may run at exit
  return *packs;
}

}  // namespace

void SgemmWeight(bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                 const float* w, int ldw, float beta, float* c, int ldc,
                 const GemmEpilogue& epilogue) {
  if (Chosen().blocked && m > 0 && k > 0 && n > 0 && n <= kGemmNc && alpha != 0.0f) {
    const int64_t rows = trans_b ? n : k;
    const int64_t cols = trans_b ? k : n;
    if (ldw == cols) {  // a whole, dense weight: the scope lists weights by their bytes
      const int64_t w_bytes = rows * cols * int64_t{sizeof(float)};
      const uint64_t epoch = ::bigmac::util::ConstantWeightEpoch(w, w_bytes);
      // The switch is read only for a listed weight: outside a scope no product pays for it.
      const float* packed =
          epoch && WeightPacksOn() ? Packs().Get(epoch, trans_b, k, n, w, ldw, w_bytes) : nullptr;
      if (packed) {
        BlockedSgemmPackedWholeB(Chosen().kernel, m, n, k, alpha, a, lda, packed, beta, c, ldc,
                                 epilogue);
        return;
      }
    }
  }
  SgemmRowMajor(false, trans_b, m, n, k, alpha, a, lda, w, ldw, beta, c, ldc, epilogue);
}

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
