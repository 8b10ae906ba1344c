#include "stages/cuda/gemm.h"

#include <cuda_bf16.h>

#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/device/cuda/check.h"
#include "stages/cuda/gemm_descriptors.h"
#include "stages/cuda/gemm_plan.h"
#include "stages/cuda/gemm_stats.h"
#include "stages/cuda/kernels.h"

namespace bigmac::stages::cuda {
namespace {

using device::DeviceError;
using device::cuda::kBlasWorkspaceBytes;

// One cached GEMM form: everything the descriptors and the heuristic's choice depend on.
struct Key {
  uintptr_t handle = 0;  // the algorithm is chosen for the handle's device
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  int64_t lda = 0, ldb = 0, ldc = 0, aux_ld = 0;
  DType ab = DType::kF32, cd = DType::kF32;
  Epilogue epilogue = Epilogue::kNone;
  bool accumulate = false;
  uint32_t align_a = 0, align_b = 0, align_c = 0, align_bias = 0, align_aux = 0;
  auto operator<=>(const Key&) const = default;
};

struct Entry {
  MatmulDescriptors descriptors;
  bool has_algo = false;
  cublasLtMatmulAlgo_t algo{};
  std::string why_none;  // without an algorithm: what the heuristic said
};

// Per process. A call holds the mutex from the lookup to the enqueue of cublasLtMatmul, since it
// points the cached descriptor's epilogue at its own bias and aux.
struct Cache {
  std::mutex mutex;
  std::map<Key, std::unique_ptr<Entry>> entries;
  GemmStats stats;
  bool fusion = true;
};

Cache& TheCache() {
  static Cache* cache = new Cache;  // never destroyed: no teardown order against cuBLASLt
  return *cache;
}

// One layer GEMM as issued: the plan, its types, the row-major buffers, epilogue pointers.
struct Call {
  GemmKind kind;
  std::string shape;  // the row-major layer shape, for errors
  LayerGemm plan;
  GemmTypes types;
  const void* row_a = nullptr;
  const void* row_b = nullptr;
  void* c = nullptr;
  const void* bias = nullptr;
  void* aux = nullptr;
};

std::string TypesText(GemmTypes types) {
  return "A/B " + memory::DTypeName(types.ab) + ", C/D " + memory::DTypeName(types.cd) +
         ", compute f32";
}

Entry& FindOrCreate(Cache& cache, const CallSite& site, const std::string& where, const Key& key,
                    const Call& call, Epilogue epilogue, const Alignments& alignments) {
  auto found = cache.entries.find(key);
  if (found != cache.entries.end()) return *found->second;

  auto entry = std::make_unique<Entry>();
  entry->descriptors = BuildDescriptors(call.plan, epilogue, call.types, where);
  // The heuristic reads the epilogue pointers' alignment: point them at this call's buffers.
  SetEpiloguePointers(entry->descriptors, epilogue, call.bias, call.aux, where);
  const MatmulPreference pref =
      BuildPreference(alignments, call.types, uint64_t(kBlasWorkspaceBytes), where);
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  const MatmulDescriptors& d = entry->descriptors;
  const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
      site.context->blas_lt, d.op, d.a, d.b, d.c, d.c, pref.pref, 1, &result, &returned);
  ++cache.stats.heuristic_queries;
  if (status != CUBLAS_STATUS_SUCCESS) {
    entry->why_none = std::string("cublasLtMatmulAlgoGetHeuristic failed: ") +
                      cublasLtGetStatusName(status) + " (" + cublasLtGetStatusString(status) + ")";
  } else if (returned == 0) {
    entry->why_none = "cublasLtMatmulAlgoGetHeuristic returned no algorithm";
  } else if (result.state != CUBLAS_STATUS_SUCCESS) {
    entry->why_none = std::string("the heuristic's algorithm is not usable: ") +
                      cublasLtGetStatusName(result.state);
  } else {
    entry->has_algo = true;
    entry->algo = result.algo;
  }
  if (!entry->has_algo) ++cache.stats.heuristic_misses;
  Entry& kept = *entry;
  cache.entries.emplace(key, std::move(entry));
  return kept;
}

// Runs the GEMM with the first of `candidates` (ending with kNone) that the alignment allows and
// an algorithm serves, and returns it; the caller does in kernels what that epilogue did not.
Epilogue Issue(const CallSite& site, const Call& call, const std::vector<Epilogue>& candidates) {
  const ColumnMajorGemm& g = call.plan.gemm;
  const void* a = Select(g.a, call.row_a, call.row_b);
  const void* b = Select(g.b, call.row_a, call.row_b);
  GemmPointers pointers;
  pointers.a = reinterpret_cast<uintptr_t>(a);
  pointers.b = reinterpret_cast<uintptr_t>(b);
  pointers.c = reinterpret_cast<uintptr_t>(call.c);
  pointers.bias = reinterpret_cast<uintptr_t>(call.bias);
  pointers.aux = reinterpret_cast<uintptr_t>(call.aux);
  pointers.ab_size = memory::DTypeSize(call.types.ab);
  pointers.cd_size = memory::DTypeSize(call.types.cd);
  const AllowedForms forms = CheckAlignment(call.plan, pointers);
  const std::string where = GemmKindName(call.kind) + " GEMM (" + call.shape + "; " + Describe(g) +
                            "; " + TypesText(call.types) + "), in " + site.where;

  Cache& cache = TheCache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  for (const Epilogue epilogue : candidates) {
    if (HasGelu(epilogue) && !(cache.fusion && forms.gelu_aux)) continue;
    if (epilogue == Epilogue::kBias && !(cache.fusion && forms.bias)) continue;
    Key key;
    key.handle = reinterpret_cast<uintptr_t>(site.context->blas_lt);
    key.m = g.m;
    key.n = g.n;
    key.k = g.k;
    key.trans_a = g.trans_a;
    key.trans_b = g.trans_b;
    key.lda = g.lda;
    key.ldb = g.ldb;
    key.ldc = g.ldc;
    key.aux_ld = HasGelu(epilogue) ? call.plan.aux_ld : 0;
    key.ab = call.types.ab;
    key.cd = call.types.cd;
    key.epilogue = epilogue;
    key.accumulate = g.beta != 0.0f;
    key.align_a = forms.alignments.a;
    key.align_b = forms.alignments.b;
    key.align_c = forms.alignments.c;
    key.align_bias = HasBias(epilogue) ? forms.alignments.bias : 0;
    key.align_aux = HasGelu(epilogue) ? forms.alignments.aux : 0;
    Entry& entry = FindOrCreate(cache, site, where, key, call, epilogue, forms.alignments);
    if (!entry.has_algo) {
      if (epilogue != Epilogue::kNone) continue;  // fall back to a plainer form
      throw DeviceError("cuBLASLt has no algorithm for the " + GemmKindName(call.kind) + " GEMM " +
                        call.shape + " (column-major " + Describe(g) + "; " +
                        TypesText(call.types) + "; epilogue none): " + entry.why_none + ", in " +
                        site.where);
    }
    const MatmulDescriptors& d = entry.descriptors;
    SetEpiloguePointers(d, epilogue, call.bias, call.aux, where);
    const float alpha = g.alpha;
    const float beta = g.beta;
    BIGMAC_CUDA_CHECK(
        cublasLtMatmul(site.context->blas_lt, d.op, &alpha, a, d.a, b, d.b, &beta, call.c, d.c,
                       call.c, d.c, &entry.algo, site.context->blas_workspace,
                       size_t(kBlasWorkspaceBytes), site.stream()),
        where);
    ++cache.stats.calls_by_epilogue[static_cast<int>(epilogue)];
    return epilogue;
  }
  throw std::logic_error("gemm.cc: the candidate list must end with Epilogue::kNone");
}

// A bad shape from the plan becomes a DeviceError naming the call site.
template <typename F>
LayerGemm PlanAt(const CallSite& site, F make_plan) {
  try {
    return make_plan();
  } catch (const std::invalid_argument& error) {
    throw DeviceError(std::string(error.what()) + ", in " + site.where);
  }
}

std::string LayerShape(const char* text, int n, int c, int oc, int64_t ld) {
  return std::string(text) + " with n=" + std::to_string(n) + " c=" + std::to_string(c) +
         " oc=" + std::to_string(oc) + " ld=" + std::to_string(ld);
}

// The forward's remaining work after the GEMM ran with `done`: the bias, then the GELU with its
// input kept in gelu_pre.
template <typename T>
void FinishForward(const CallSite& site, Epilogue done, void* out_raw, const void* bias_raw, int n,
                   int oc, int64_t ld_out, void* gelu_pre_raw) {
  T* out = static_cast<T*>(out_raw);
  const T* bias = static_cast<const T*>(bias_raw);
  T* gelu_pre = static_cast<T*>(gelu_pre_raw);
  if (bias && !HasBias(done)) AddBias<T>(site, out, bias, n, oc, ld_out);
  if (gelu_pre && !HasGelu(done)) {
    BIGMAC_CUDA_CHECK(cudaMemcpy2DAsync(gelu_pre, size_t(oc) * sizeof(T), out,
                                        size_t(ld_out) * sizeof(T), size_t(oc) * sizeof(T),
                                        size_t(n), cudaMemcpyDeviceToDevice, site.stream()),
                      site.where);
    if (ld_out == oc) {
      GeluForward<T>(site, out, gelu_pre, int64_t{n} * oc);
    } else {
      // GELU on a padded output is not a GPT shape; row by row keeps the padding untouched.
      for (int row = 0; row < n; ++row) {
        GeluForward<T>(site, out + row * ld_out, gelu_pre + int64_t{row} * oc, oc);
      }
    }
  }
}

}  // namespace

GemmStats GetGemmStats() {
  Cache& cache = TheCache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  return cache.stats;
}

void SetEpilogueFusion(bool enabled) {
  Cache& cache = TheCache();
  std::lock_guard<std::mutex> lock(cache.mutex);
  cache.fusion = enabled;
}

void MatmulForward(const CallSite& site, DType dtype, void* out, const void* inp, const void* w,
                   const void* bias, int n, int c, int oc, int64_t ld_out, void* gelu_pre) {
  CudaDataType(dtype, site.where);  // f32 or bf16, before anything runs
  if (n == 0) return;
  if (ld_out == 0) ld_out = oc;
  Call call{
      GemmKind::kForward,
      LayerShape("out(N,OC) = inp(N,C) @ w(OC,C)^T", n, c, oc, ld_out),
      PlanAt(site,
             [&] { return ForwardPlan(n, c, oc, ld_out, bias != nullptr, gelu_pre != nullptr); }),
      TypesFor(GemmKind::kForward, dtype),
      inp,
      w,
      out,
      bias,
      gelu_pre};
  std::vector<Epilogue> candidates;
  if (HasGelu(call.plan.epilogue)) candidates.push_back(call.plan.epilogue);
  if (bias) candidates.push_back(Epilogue::kBias);
  candidates.push_back(Epilogue::kNone);
  const Epilogue done = Issue(site, call, candidates);
  if (dtype == DType::kBF16) {
    FinishForward<__nv_bfloat16>(site, done, out, bias, n, oc, ld_out, gelu_pre);
  } else {
    FinishForward<float>(site, done, out, bias, n, oc, ld_out, gelu_pre);
  }
}

void MatmulBackwardInput(const CallSite& site, DType dtype, void* dinp, const void* dout,
                         const void* w, int n, int c, int oc, int64_t ld_dout) {
  CudaDataType(dtype, site.where);
  if (n == 0) return;
  if (ld_dout == 0) ld_dout = oc;
  const Call call{GemmKind::kBackwardInput,
                  LayerShape("dinp(N,C) = dout(N,OC) @ w(OC,C)", n, c, oc, ld_dout),
                  PlanAt(site, [&] { return BackwardInputPlan(n, c, oc, ld_dout); }),
                  TypesFor(GemmKind::kBackwardInput, dtype),
                  dout,
                  w,
                  dinp};
  Issue(site, call, {Epilogue::kNone});
}

void MatmulBackwardWeight(const CallSite& site, DType dtype, float* dw, float* dbias,
                          const void* dout, const void* inp, int n, int c, int oc,
                          int64_t ld_dout) {
  CudaDataType(dtype, site.where);
  if (n == 0) return;
  if (ld_dout == 0) ld_dout = oc;
  const Call call{GemmKind::kBackwardWeight,
                  LayerShape("dw(OC,C) += dout(N,OC)^T @ inp(N,C)", n, c, oc, ld_dout),
                  PlanAt(site, [&] { return BackwardWeightPlan(n, c, oc, ld_dout); }),
                  TypesFor(GemmKind::kBackwardWeight, dtype),
                  dout,
                  inp,
                  dw};
  Issue(site, call, {Epilogue::kNone});
  if (!dbias) return;
  // Accumulated (+=) by a kernel: cuBLASLt's BGRADB epilogue would overwrite dbias.
  if (dtype == DType::kBF16) {
    BiasGradAccumulate<__nv_bfloat16>(site, dbias, static_cast<const __nv_bfloat16*>(dout), n, oc,
                                      ld_dout);
  } else {
    BiasGradAccumulate<float>(site, dbias, static_cast<const float*>(dout), n, oc, ld_dout);
  }
}

}  // namespace bigmac::stages::cuda
