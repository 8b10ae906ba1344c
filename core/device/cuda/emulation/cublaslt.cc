// The emulated cuBLASLt: definitions of the cuBLASLt functions BigMac calls, against the real
// <cublasLt.h>, linked instead of libcublasLt for the emulated CUDA device (runtime.h). Test-only.
//
// Emulated, exactly the subset stages/cuda/gemm*.cc, core/device/cuda and tests/cuda_gemm_test.cc
// use:
//   - handles, version, status names and strings;
//   - matrix layouts (create, destroy, read back): CUDA_R_32F or CUDA_R_16BF, column-major, one
//     matrix (no batch);
//   - matmul descriptors: compute CUBLAS_COMPUTE_32F, scale CUDA_R_32F, host pointer mode,
//     transposes N or T, epilogues DEFAULT, BIAS, GELU_AUX and GELU_AUX_BIAS, the bias pointer and
//     type, the aux pointer, leading dimension and type;
//   - heuristic preferences: workspace limit, minimum alignments of A, B, C and D, the numerical
//     implementation mask;
//   - cublasLtMatmulAlgoGetHeuristic, which offers one algorithm (no workspace), and
//     cublasLtMatmul, which checks its arguments at once and runs the GEMM later, in stream order,
//     on the stream's worker thread: A/B f32 with C/D f32, or A/B bf16 with C/D bf16 or f32,
//     accumulated in f32 (OpenBLAS sgemm), the epilogue in f32, stored rounded to nearest even.
// Everything else (other types, orders, batches, epilogues, bias gradients, device pointer modes,
// fp8 scales, matrix transforms, an implicit heuristic from a null algo, ...) is refused with
// CUBLAS_STATUS_NOT_SUPPORTED, or CUBLAS_STATUS_INVALID_VALUE where cuBLASLt documents the
// request as invalid; a function outside the subset is not defined, so using one fails to link.
// Nothing refused computes anything.
//
// As on the GPU, a call that passes the checks returns CUBLAS_STATUS_SUCCESS, and a bad pointer
// faults the stream asynchronously (emulation::Fault) instead of computing: a pointer outside the
// live cudaMalloc allocations (illegal address), or one less aligned than the preferences the
// algorithm was chosen with promised (misaligned address; on the GPU the chosen kernel may
// assume that alignment).
//
// CUBLASLT_LOG_LEVEL >= 1 in the environment (cuBLASLt's own switch) prints why a call was
// refused to stderr.

#include <cblas.h>
#include <cublasLt.h>
#include <cublas_api.h>
#include <cuda_bf16.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/device/cuda/emulation/cublaslt_switch.h"
#include "core/device/cuda/emulation/runtime.h"

// Declared (incomplete) by cublasLt.h; the handle only proves cublasLtCreate ran.
struct cublasLtContext {
  uint64_t magic = 0;
};

namespace bigmac::device::cuda::emulation {
namespace {

// Marks each live object, so a garbage or destroyed one is refused instead of read.
constexpr uint64_t kHandleMagic = 0x4269674d61634c74;  // "BigMacLt"
constexpr uint64_t kLayoutMagic = 0x4c61796f75744c74;
constexpr uint64_t kDescMagic = 0x446573634d61744c;
constexpr uint64_t kPrefMagic = 0x507265664d61744c;
constexpr uint64_t kAlgoMagic = 0x416c676f4d61744c;

// cuBLASLt's own default alignment assumption, and the cap of what a pointer is credited with.
constexpr uint32_t kMaxAlignment = 256;

// The contents of the semi-opaque structs cublasLt.h sizes (copied in and out with memcpy).
struct Layout {
  uint64_t magic;
  uint32_t type;  // cudaDataType, as CUBLASLT_MATRIX_LAYOUT_TYPE stores it
  uint64_t rows, cols;
  int64_t ld;
};

struct Desc {
  uint64_t magic;
  int32_t compute_type, scale_type, pointer_mode, trans_a, trans_b;
  uint32_t epilogue;
  int32_t bias_type, aux_type;  // -1: D's type (cuBLASLt's default)
  int64_t aux_ld;
  const void* bias;
  void* aux;
};

struct Pref {
  uint64_t magic;
  uint64_t max_workspace;
  uint64_t impl_mask;
  uint32_t align_a, align_b, align_c, align_d;
};

// What the heuristic's algorithm was chosen for: cublasLtMatmul refuses it for another
// configuration and faults on pointers less aligned than promised.
enum Operand { kA, kB, kC, kD, kBias, kAux, kOperands };
constexpr const char* kOperandNames[kOperands] = {"A", "B", "C", "D", "bias", "aux"};

struct Algo {
  uint64_t magic;
  uint32_t epilogue;
  uint32_t ab_type, cd_type;
  uint32_t alignment[kOperands];
};

template <typename T, typename Opaque>
T Load(const Opaque* opaque) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= sizeof(Opaque));
  T value;
  std::memcpy(&value, opaque, sizeof(T));
  return value;
}

template <typename T, typename Opaque>
void Store(const T& value, Opaque* opaque) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= sizeof(Opaque));
  std::memcpy(opaque, &value, sizeof(T));
}

int LogLevel() {
  static const int level = [] {
    const char* text = std::getenv("CUBLASLT_LOG_LEVEL");
    return text ? std::atoi(text) : 0;
  }();
  return level;
}

// Returns `status`; says why on stderr when logging is on.
cublasStatus_t Refuse(cublasStatus_t status, const char* function, const std::string& why) {
  if (LogLevel() >= 1) {
    std::fprintf(stderr, "[emulated cuBLASLt] %s: %s: %s\n", function,
                 cublasLtGetStatusName(status), why.c_str());
  }
  return status;
}

std::atomic<int> fused_epilogues{-1};  // -1: not decided yet (read the environment)

// ---------------------------------------------------------------- attributes

// Copies `size` bytes from `buf` into a field of `field_size` bytes, as cuBLASLt's setters do.
cublasStatus_t SetField(void* field, size_t field_size, const void* buf, size_t size) {
  if (buf == nullptr || size != field_size) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(field, buf, size);
  return CUBLAS_STATUS_SUCCESS;
}

// cuBLASLt's getter contract: sizeInBytes 0 asks for the size (into sizeWritten); otherwise the
// buffer must be exactly the attribute's size.
cublasStatus_t GetField(const void* field, size_t field_size, void* buf, size_t size,
                        size_t* written) {
  if (size == 0) {
    if (written == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
    *written = field_size;
    return CUBLAS_STATUS_SUCCESS;
  }
  if (buf == nullptr || size != field_size) return CUBLAS_STATUS_INVALID_VALUE;
  std::memcpy(buf, field, size);
  if (written) *written = size;
  return CUBLAS_STATUS_SUCCESS;
}

// The field behind an emulated descriptor attribute and its documented size; nullptr otherwise.
void* DescField(Desc& d, cublasLtMatmulDescAttributes_t attr, size_t* size) {
  switch (attr) {
    case CUBLASLT_MATMUL_DESC_COMPUTE_TYPE:
      *size = sizeof(int32_t);
      return &d.compute_type;
    case CUBLASLT_MATMUL_DESC_SCALE_TYPE:
      *size = sizeof(int32_t);
      return &d.scale_type;
    case CUBLASLT_MATMUL_DESC_POINTER_MODE:
      *size = sizeof(int32_t);
      return &d.pointer_mode;
    case CUBLASLT_MATMUL_DESC_TRANSA:
      *size = sizeof(int32_t);
      return &d.trans_a;
    case CUBLASLT_MATMUL_DESC_TRANSB:
      *size = sizeof(int32_t);
      return &d.trans_b;
    case CUBLASLT_MATMUL_DESC_EPILOGUE:
      *size = sizeof(uint32_t);
      return &d.epilogue;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER:
      *size = sizeof(void*);
      return &d.bias;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER:
      *size = sizeof(void*);
      return &d.aux;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD:
      *size = sizeof(int64_t);
      return &d.aux_ld;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE:
      *size = sizeof(int32_t);
      return &d.aux_type;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE:
      *size = sizeof(int32_t);
      return &d.bias_type;
    default:
      return nullptr;
  }
}

void* PrefField(Pref& p, cublasLtMatmulPreferenceAttributes_t attr, size_t* size) {
  switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES:
      *size = sizeof(uint64_t);
      return &p.max_workspace;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES:
      *size = sizeof(uint32_t);
      return &p.align_a;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES:
      *size = sizeof(uint32_t);
      return &p.align_b;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES:
      *size = sizeof(uint32_t);
      return &p.align_c;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES:
      *size = sizeof(uint32_t);
      return &p.align_d;
    case CUBLASLT_MATMUL_PREF_IMPL_MASK:
      *size = sizeof(uint64_t);
      return &p.impl_mask;
    default:
      return nullptr;
  }
}

// ---------------------------------------------------------------- the problem

bool HasBias(uint32_t epilogue) {
  return epilogue == CUBLASLT_EPILOGUE_BIAS || epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool HasGeluAux(uint32_t epilogue) {
  return epilogue == CUBLASLT_EPILOGUE_GELU_AUX || epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}

size_t TypeSize(int64_t type) { return type == CUDA_R_16BF ? 2 : 4; }

// A checked GEMM: D(m, n) = epilogue(alpha * op(A)(m, k) * op(B)(k, n) + beta * C).
struct Problem {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  cudaDataType_t ab = CUDA_R_32F, cd = CUDA_R_32F;
  int64_t a_rows = 0, a_cols = 0, b_rows = 0, b_cols = 0;
  int64_t lda = 0, ldb = 0, ldc = 0, ldd = 0, aux_ld = 0;
  uint32_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
};

// Checks everything the descriptors say (not the pointers). Returns SUCCESS and fills `problem`,
// or the refusal with `why`.
cublasStatus_t CheckProblem(const Desc& d, const Layout& a, const Layout& b, const Layout& c,
                            const Layout& dl, Problem* problem, std::string* why) {
  auto refuse = [why](cublasStatus_t status, std::string text) {
    *why = std::move(text);
    return status;
  };
  if (d.compute_type != CUBLAS_COMPUTE_32F) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                  "compute type " + std::to_string(d.compute_type) + " (only CUBLAS_COMPUTE_32F)");
  }
  if (d.scale_type != CUDA_R_32F) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                  "scale type " + std::to_string(d.scale_type) + " (only CUDA_R_32F)");
  }
  if (d.pointer_mode != CUBLASLT_POINTER_MODE_HOST) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "pointer mode " + std::to_string(d.pointer_mode) +
                                                   " (only CUBLASLT_POINTER_MODE_HOST)");
  }
  for (const int32_t trans : {d.trans_a, d.trans_b}) {
    if (trans == CUBLAS_OP_N || trans == CUBLAS_OP_T) continue;
    return refuse(trans == CUBLAS_OP_C ? CUBLAS_STATUS_NOT_SUPPORTED : CUBLAS_STATUS_INVALID_VALUE,
                  "transpose " + std::to_string(trans) + " (only CUBLAS_OP_N or CUBLAS_OP_T)");
  }
  const bool ab_ok = a.type == b.type && (a.type == CUDA_R_32F || a.type == CUDA_R_16BF);
  const bool cd_ok = c.type == dl.type && (c.type == CUDA_R_32F || c.type == CUDA_R_16BF);
  // cuBLASLt's table for compute 32F / scale 32F has these; f32 inputs into bf16 it has not.
  if (!ab_ok || !cd_ok || (a.type == CUDA_R_32F && c.type != CUDA_R_32F)) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                  "types A " + std::to_string(a.type) + " B " + std::to_string(b.type) + " C " +
                      std::to_string(c.type) + " D " + std::to_string(dl.type) +
                      " (A = B f32 with C = D f32, or A = B bf16 with C = D bf16 or f32)");
  }
  constexpr uint64_t kMaxDim = std::numeric_limits<int32_t>::max();  // sgemm takes int
  for (const Layout* l : {&a, &b, &c, &dl}) {
    if (l->rows == 0 || l->cols == 0 || l->rows > kMaxDim || l->cols > kMaxDim) {
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "a matrix of " + std::to_string(l->rows) + " x " +
                                                     std::to_string(l->cols) +
                                                     " (each between 1 and 2^31 - 1)");
    }
    // Documented: ld >= rows for column-major, so that columns do not overlap.
    if (l->ld < 0 || uint64_t(l->ld) < l->rows) {
      return refuse(CUBLAS_STATUS_INVALID_VALUE,
                    "ld " + std::to_string(l->ld) + " < rows " + std::to_string(l->rows));
    }
    if (uint64_t(l->ld) > kMaxDim) {
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "ld " + std::to_string(l->ld) + " >= 2^31");
    }
  }
  Problem p;
  p.trans_a = d.trans_a == CUBLAS_OP_T;
  p.trans_b = d.trans_b == CUBLAS_OP_T;
  p.ab = cudaDataType_t(a.type);
  p.cd = cudaDataType_t(c.type);
  p.a_rows = int64_t(a.rows);
  p.a_cols = int64_t(a.cols);
  p.b_rows = int64_t(b.rows);
  p.b_cols = int64_t(b.cols);
  p.m = int64_t(dl.rows);
  p.n = int64_t(dl.cols);
  p.k = p.trans_a ? p.a_rows : p.a_cols;
  const int64_t a_m = p.trans_a ? p.a_cols : p.a_rows;
  const int64_t b_k = p.trans_b ? p.b_cols : p.b_rows;
  const int64_t b_n = p.trans_b ? p.b_rows : p.b_cols;
  if (a_m != p.m || b_k != p.k || b_n != p.n || c.rows != dl.rows || c.cols != dl.cols) {
    return refuse(CUBLAS_STATUS_INVALID_VALUE,
                  "shapes do not chain: op(A) " + std::to_string(a_m) + " x " +
                      std::to_string(p.k) + ", op(B) " + std::to_string(b_k) + " x " +
                      std::to_string(b_n) + ", C " + std::to_string(c.rows) + " x " +
                      std::to_string(c.cols) + ", D " + std::to_string(dl.rows) + " x " +
                      std::to_string(dl.cols));
  }
  p.lda = a.ld;
  p.ldb = b.ld;
  p.ldc = c.ld;
  p.ldd = dl.ld;
  p.epilogue = d.epilogue;
  if (d.epilogue != CUBLASLT_EPILOGUE_DEFAULT && !HasBias(d.epilogue) && !HasGeluAux(d.epilogue)) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED,
                  "epilogue " + std::to_string(d.epilogue) +
                      " (only DEFAULT, BIAS, GELU_AUX, GELU_AUX_BIAS)");
  }
  // Documented default (-1): D's type. Other bias types are documented for IMMA and fp8 only.
  if (HasBias(d.epilogue) && d.bias_type != -1 && d.bias_type != int32_t(dl.type)) {
    return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "bias type " + std::to_string(d.bias_type) +
                                                   " (only D's type " + std::to_string(dl.type) +
                                                   ")");
  }
  if (HasGeluAux(d.epilogue)) {
    if (d.aux_type != -1 && d.aux_type != int32_t(dl.type)) {
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "aux type " + std::to_string(d.aux_type) +
                                                     " (only D's type " + std::to_string(dl.type) +
                                                     ")");
    }
    // Documented: divisible by 8 and no less than D's rows.
    if (d.aux_ld < p.m || d.aux_ld % 8 != 0) {
      return refuse(CUBLAS_STATUS_INVALID_VALUE,
                    "aux ld " + std::to_string(d.aux_ld) +
                        " (a multiple of 8, >= m = " + std::to_string(p.m) + ")");
    }
    if (uint64_t(d.aux_ld) > kMaxDim) {
      return refuse(CUBLAS_STATUS_NOT_SUPPORTED, "aux ld " + std::to_string(d.aux_ld));
    }
    p.aux_ld = d.aux_ld;
  }
  *problem = p;
  return CUBLAS_STATUS_SUCCESS;
}

// The one emulated algorithm's numerical implementation: f32 FMA, f32 accumulator, inputs of
// A's type (bf16 is widened, not rounded further).
uint64_t ImplFlags(cudaDataType_t ab) {
  return CUBLASLT_NUMERICAL_IMPL_FLAGS_FMA | CUBLASLT_NUMERICAL_IMPL_FLAGS_ACCUMULATOR_32F |
         (ab == CUDA_R_16BF ? CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_16BF
                            : CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_32F);
}

// The largest power of two dividing `pointer`, capped at 256 (256 for null: nothing to align).
uint32_t AlignmentOf(const void* pointer) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(pointer);
  if (address == 0) return kMaxAlignment;
  const uintptr_t low = address & (~address + 1);
  return low >= kMaxAlignment ? kMaxAlignment : uint32_t(low);
}

// Bytes spanned by a column-major (rows, cols, ld) matrix of `element` bytes.
size_t Extent(int64_t rows, int64_t cols, int64_t ld, size_t element) {
  return (size_t(ld) * size_t(cols - 1) + size_t(rows)) * element;
}

// ---------------------------------------------------------------- the computation

float LoadElement(const void* base, cudaDataType_t type, int64_t index) {
  if (type == CUDA_R_16BF) return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[index]);
  return static_cast<const float*>(base)[index];
}

void StoreElement(void* base, cudaDataType_t type, int64_t index, float value) {
  if (type == CUDA_R_16BF) {
    static_cast<__nv_bfloat16*>(base)[index] = __float2bfloat16_rn(value);
  } else {
    static_cast<float*>(base)[index] = value;
  }
}

// GELU's tanh approximation, in f32: what cuBLASLt's GELU epilogues and BigMac's kernels compute.
float Gelu(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * (x + 0.044715f * x * x * x)));
}

// One enqueued matmul: the checked problem and everything read at call time (host scalars,
// pointers, the descriptor's epilogue pointers), so later descriptor changes do not leak in.
struct Job {
  Problem p;
  float alpha = 1.0f, beta = 0.0f;
  const void* a = nullptr;
  const void* b = nullptr;
  const void* c = nullptr;
  void* d = nullptr;
  const void* bias = nullptr;
  void* aux = nullptr;
  std::string misaligned;  // non-empty: fault instead of computing
};

// A (rows, cols, ld) matrix as f32 with leading dimension *ld_out: f32 in place, bf16 widened.
const float* AsFloat(const void* data, cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld,
                     std::vector<float>& scratch, int64_t* ld_out) {
  if (type == CUDA_R_32F) {
    *ld_out = ld;
    return static_cast<const float*>(data);
  }
  scratch.resize(size_t(rows) * size_t(cols));
  for (int64_t j = 0; j < cols; ++j) {
    for (int64_t i = 0; i < rows; ++i) scratch[i + j * rows] = LoadElement(data, type, i + j * ld);
  }
  *ld_out = rows;
  return scratch.data();
}

// The device side of cublasLtMatmul, on the stream's worker thread.
void RunJob(const Job& job) {
  const Problem& p = job.p;
  if (!job.misaligned.empty()) {
    Fault(cudaErrorMisalignedAddress, "cublasLtMatmul: " + job.misaligned);
    return;
  }
  const size_t ab = TypeSize(p.ab), cd = TypeSize(p.cd);
  struct Range {
    const char* name;
    const void* pointer;
    size_t bytes;
  };
  std::vector<Range> ranges = {
      {"A", job.a, Extent(p.a_rows, p.a_cols, p.lda, ab)},
      {"B", job.b, Extent(p.b_rows, p.b_cols, p.ldb, ab)},
      {"D", job.d, Extent(p.m, p.n, p.ldd, cd)},
  };
  if (job.beta != 0.0f) ranges.push_back({"C", job.c, Extent(p.m, p.n, p.ldc, cd)});
  if (HasBias(p.epilogue)) ranges.push_back({"bias", job.bias, size_t(p.m) * cd});
  if (HasGeluAux(p.epilogue)) ranges.push_back({"aux", job.aux, Extent(p.m, p.n, p.aux_ld, cd)});
  for (const Range& r : ranges) {
    if (!IsDeviceRange(r.pointer, r.bytes)) {
      char text[160];
      std::snprintf(text, sizeof(text), "%s [%p, +%zu bytes) is not inside one live cudaMalloc",
                    r.name, r.pointer, r.bytes);
      Fault(cudaErrorIllegalAddress, std::string("cublasLtMatmul: ") + text);
      return;
    }
  }

  std::vector<float> a_scratch, b_scratch;
  int64_t lda = 0, ldb = 0;
  const float* a = AsFloat(job.a, p.ab, p.a_rows, p.a_cols, p.lda, a_scratch, &lda);
  const float* b = AsFloat(job.b, p.ab, p.b_rows, p.b_cols, p.ldb, b_scratch, &ldb);
  std::vector<float> product(size_t(p.m) * size_t(p.n));
  cblas_sgemm(CblasColMajor, p.trans_a ? CblasTrans : CblasNoTrans,
              p.trans_b ? CblasTrans : CblasNoTrans, int(p.m), int(p.n), int(p.k), 1.0f, a,
              int(lda), b, int(ldb), 0.0f, product.data(), int(p.m));

  const bool bias = HasBias(p.epilogue), gelu = HasGeluAux(p.epilogue);
  for (int64_t j = 0; j < p.n; ++j) {
    for (int64_t i = 0; i < p.m; ++i) {
      float v = job.alpha * product[i + j * p.m];
      // BLAS convention: C is not read when beta is 0 (it may hold garbage, even NaN).
      if (job.beta != 0.0f) v += job.beta * LoadElement(job.c, p.cd, i + j * p.ldc);
      if (bias) v += LoadElement(job.bias, p.cd, i);
      if (gelu) {
        StoreElement(job.aux, p.cd, i + j * p.aux_ld, v);
        v = Gelu(v);
      }
      StoreElement(job.d, p.cd, i + j * p.ldd, v);
    }
  }
}

// Loads a descriptor, checking its mark. False for null or not one of ours.
template <typename T, typename Opaque>
bool LoadChecked(const Opaque* opaque, uint64_t magic, T* out) {
  if (opaque == nullptr) return false;
  *out = Load<T>(opaque);
  return out->magic == magic;
}

bool ValidHandle(cublasLtHandle_t handle) {
  return handle != nullptr && handle->magic == kHandleMagic;
}

}  // namespace

void SetFusedEpilogues(bool offered) { fused_epilogues.store(offered ? 1 : 0); }

bool FusedEpiloguesOffered() {
  int value = fused_epilogues.load();
  if (value < 0) {
    const char* text = std::getenv("BIGMAC_EMULATED_FUSED_EPILOGUES");
    const int from_env = (text != nullptr && std::strcmp(text, "0") == 0) ? 0 : 1;
    fused_epilogues.compare_exchange_strong(value, from_env);  // a concurrent Set wins
    value = fused_epilogues.load();
  }
  return value == 1;
}

}  // namespace bigmac::device::cuda::emulation

namespace emu = ::bigmac::device::cuda::emulation;

// ---------------------------------------------------------------- library

cublasStatus_t cublasLtCreate(cublasLtHandle_t* lightHandle) {
  if (lightHandle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *lightHandle = new cublasLtContext{emu::kHandleMagic};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t lightHandle) {
  if (!emu::ValidHandle(lightHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  lightHandle->magic = 0;
  delete lightHandle;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasLtGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "<unknown>";
}

const char* cublasLtGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "error detected trying to check the license";
  }
  return "unknown error";
}

// cublasLt.h has no CUBLASLT_VERSION; cuBLASLt reports the cuBLAS version it ships with.
size_t cublasLtGetVersion(void) { return CUBLAS_VERSION; }

// ---------------------------------------------------------------- matrix layouts

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* matLayout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  if (matLayout == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  // Values are checked where they are used (heuristic, matmul), as cuBLASLt does.
  auto* opaque = new cublasLtMatrixLayoutOpaque_t{};
  emu::Store(emu::Layout{emu::kLayoutMagic, uint32_t(type), rows, cols, ld}, opaque);
  *matLayout = opaque;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t matLayout) {
  if (matLayout == nullptr) return CUBLAS_STATUS_SUCCESS;
  std::memset(matLayout, 0, sizeof(*matLayout));  // a use after destroy fails the mark
  delete matLayout;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t matLayout,
                                                cublasLtMatrixLayoutAttribute_t attr, void* buf,
                                                size_t sizeInBytes, size_t* sizeWritten) {
  emu::Layout l;
  if (!emu::LoadChecked(matLayout, emu::kLayoutMagic, &l)) return CUBLAS_STATUS_INVALID_VALUE;
  // No setter is emulated, so the order and batch count are always their defaults.
  const int32_t order = CUBLASLT_ORDER_COL;
  const int32_t batch_count = 1;
  switch (attr) {
    case CUBLASLT_MATRIX_LAYOUT_TYPE:
      return emu::GetField(&l.type, sizeof(l.type), buf, sizeInBytes, sizeWritten);
    case CUBLASLT_MATRIX_LAYOUT_ORDER:
      return emu::GetField(&order, sizeof(order), buf, sizeInBytes, sizeWritten);
    case CUBLASLT_MATRIX_LAYOUT_ROWS:
      return emu::GetField(&l.rows, sizeof(l.rows), buf, sizeInBytes, sizeWritten);
    case CUBLASLT_MATRIX_LAYOUT_COLS:
      return emu::GetField(&l.cols, sizeof(l.cols), buf, sizeInBytes, sizeWritten);
    case CUBLASLT_MATRIX_LAYOUT_LD:
      return emu::GetField(&l.ld, sizeof(l.ld), buf, sizeInBytes, sizeWritten);
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT:
      return emu::GetField(&batch_count, sizeof(batch_count), buf, sizeInBytes, sizeWritten);
    default:
      return emu::Refuse(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatrixLayoutGetAttribute",
                         "attribute " + std::to_string(attr) + " is not emulated");
  }
}

// ---------------------------------------------------------------- matmul descriptors

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* matmulDesc,
                                        cublasComputeType_t computeType, cudaDataType_t scaleType) {
  if (matmulDesc == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  emu::Desc d{};
  d.magic = emu::kDescMagic;
  d.compute_type = computeType;
  d.scale_type = scaleType;
  d.pointer_mode = CUBLASLT_POINTER_MODE_HOST;
  d.trans_a = CUBLAS_OP_N;
  d.trans_b = CUBLAS_OP_N;
  d.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  d.bias_type = -1;
  d.aux_type = -1;
  auto* opaque = new cublasLtMatmulDescOpaque_t{};
  emu::Store(d, opaque);
  *matmulDesc = opaque;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t matmulDesc) {
  if (matmulDesc == nullptr) return CUBLAS_STATUS_SUCCESS;
  std::memset(matmulDesc, 0, sizeof(*matmulDesc));
  delete matmulDesc;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t sizeInBytes) {
  emu::Desc d;
  if (!emu::LoadChecked(matmulDesc, emu::kDescMagic, &d)) return CUBLAS_STATUS_INVALID_VALUE;
  size_t size = 0;
  void* field = emu::DescField(d, attr, &size);
  if (field == nullptr) {
    return emu::Refuse(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulDescSetAttribute",
                       "attribute " + std::to_string(attr) + " is not emulated");
  }
  // Any value is stored; the heuristic and the matmul refuse what is not emulated.
  const cublasStatus_t status = emu::SetField(field, size, buf, sizeInBytes);
  if (status == CUBLAS_STATUS_SUCCESS) emu::Store(d, matmulDesc);
  return status;
}

cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t matmulDesc,
                                              cublasLtMatmulDescAttributes_t attr, void* buf,
                                              size_t sizeInBytes, size_t* sizeWritten) {
  emu::Desc d;
  if (!emu::LoadChecked(matmulDesc, emu::kDescMagic, &d)) return CUBLAS_STATUS_INVALID_VALUE;
  size_t size = 0;
  const void* field = emu::DescField(d, attr, &size);
  if (field == nullptr) {
    return emu::Refuse(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulDescGetAttribute",
                       "attribute " + std::to_string(attr) + " is not emulated");
  }
  return emu::GetField(field, size, buf, sizeInBytes, sizeWritten);
}

// ---------------------------------------------------------------- heuristic preferences

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  if (pref == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  // Documented defaults: no workspace, every implementation, 256-byte alignment.
  const emu::Pref p{emu::kPrefMagic, 0, ~uint64_t{0}, 256, 256, 256, 256};
  auto* opaque = new cublasLtMatmulPreferenceOpaque_t{};
  emu::Store(p, opaque);
  *pref = opaque;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  if (pref == nullptr) return CUBLAS_STATUS_SUCCESS;
  std::memset(pref, 0, sizeof(*pref));
  delete pref;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t sizeInBytes) {
  emu::Pref p;
  if (!emu::LoadChecked(pref, emu::kPrefMagic, &p)) return CUBLAS_STATUS_INVALID_VALUE;
  size_t size = 0;
  void* field = emu::PrefField(p, attr, &size);
  if (field == nullptr) {
    return emu::Refuse(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulPreferenceSetAttribute",
                       "attribute " + std::to_string(attr) + " is not emulated");
  }
  const cublasStatus_t status = emu::SetField(field, size, buf, sizeInBytes);
  if (status == CUBLAS_STATUS_SUCCESS) emu::Store(p, pref);
  return status;
}

cublasStatus_t cublasLtMatmulPreferenceGetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    void* buf, size_t sizeInBytes,
                                                    size_t* sizeWritten) {
  emu::Pref p;
  if (!emu::LoadChecked(pref, emu::kPrefMagic, &p)) return CUBLAS_STATUS_INVALID_VALUE;
  size_t size = 0;
  const void* field = emu::PrefField(p, attr, &size);
  if (field == nullptr) {
    return emu::Refuse(CUBLAS_STATUS_NOT_SUPPORTED, "cublasLtMatmulPreferenceGetAttribute",
                       "attribute " + std::to_string(attr) + " is not emulated");
  }
  return emu::GetField(field, size, buf, sizeInBytes, sizeWritten);
}

// ---------------------------------------------------------------- heuristic and matmul

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t preference, int requestedAlgoCount,
    cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount) {
  constexpr const char* kWhere = "cublasLtMatmulAlgoGetHeuristic";
  if (!emu::ValidHandle(lightHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (returnAlgoCount == nullptr || heuristicResultsArray == nullptr || requestedAlgoCount <= 0) {
    return emu::Refuse(CUBLAS_STATUS_INVALID_VALUE, kWhere,
                       "no result array, or requestedAlgoCount <= 0");
  }
  *returnAlgoCount = 0;
  emu::Desc d;
  emu::Layout a, b, c, dl;
  emu::Pref p;
  if (!emu::LoadChecked(operationDesc, emu::kDescMagic, &d) ||
      !emu::LoadChecked(Adesc, emu::kLayoutMagic, &a) ||
      !emu::LoadChecked(Bdesc, emu::kLayoutMagic, &b) ||
      !emu::LoadChecked(Cdesc, emu::kLayoutMagic, &c) ||
      !emu::LoadChecked(Ddesc, emu::kLayoutMagic, &dl) ||
      !emu::LoadChecked(preference, emu::kPrefMagic, &p)) {
    return emu::Refuse(CUBLAS_STATUS_INVALID_VALUE, kWhere, "a null or invalid descriptor");
  }
  emu::Problem problem;
  std::string why;
  const cublasStatus_t status = emu::CheckProblem(d, a, b, c, dl, &problem, &why);
  if (status != CUBLAS_STATUS_SUCCESS) return emu::Refuse(status, kWhere, why);

  // The filters below leave no algorithm: cuBLASLt then answers NOT_SUPPORTED with none.
  if (problem.epilogue != CUBLASLT_EPILOGUE_DEFAULT && !emu::FusedEpiloguesOffered()) {
    return emu::Refuse(CUBLAS_STATUS_NOT_SUPPORTED, kWhere,
                       "fused epilogues are switched off (emulation::SetFusedEpilogues, "
                       "BIGMAC_EMULATED_FUSED_EPILOGUES)");
  }
  const uint64_t flags = emu::ImplFlags(problem.ab);
  if ((flags & ~p.impl_mask) != 0) {
    return emu::Refuse(CUBLAS_STATUS_NOT_SUPPORTED, kWhere,
                       "CUBLASLT_MATMUL_PREF_IMPL_MASK excludes the implementation");
  }
  // The algorithm needs whole elements; it is chosen for the alignments the caller promises
  // (preferences for A..D, the descriptor's pointers for bias and aux, as cuBLASLt reads them).
  const size_t ab = emu::TypeSize(problem.ab), cd = emu::TypeSize(problem.cd);
  emu::Algo algo{};
  algo.magic = emu::kAlgoMagic;
  algo.epilogue = problem.epilogue;
  algo.ab_type = problem.ab;
  algo.cd_type = problem.cd;
  algo.alignment[emu::kA] = p.align_a;
  algo.alignment[emu::kB] = p.align_b;
  algo.alignment[emu::kC] = p.align_c;
  algo.alignment[emu::kD] = p.align_d;
  algo.alignment[emu::kBias] = emu::HasBias(problem.epilogue) ? emu::AlignmentOf(d.bias) : 0;
  algo.alignment[emu::kAux] = emu::HasGeluAux(problem.epilogue) ? emu::AlignmentOf(d.aux) : 0;
  const size_t element[emu::kOperands] = {ab, ab, cd, cd, cd, cd};
  for (int i = 0; i < emu::kOperands; ++i) {
    if (i >= emu::kBias && algo.alignment[i] == 0) continue;  // no such operand
    if (algo.alignment[i] == 0 || algo.alignment[i] % element[i] != 0) {
      return emu::Refuse(CUBLAS_STATUS_NOT_SUPPORTED, kWhere,
                         std::string(emu::kOperandNames[i]) + " alignment " +
                             std::to_string(algo.alignment[i]) + " is not a multiple of " +
                             std::to_string(element[i]) + " bytes");
    }
  }
  // The workspace limit cannot exclude it: it needs none.
  cublasLtMatmulHeuristicResult_t& result = heuristicResultsArray[0];
  result = cublasLtMatmulHeuristicResult_t{};
  emu::Store(algo, &result.algo);
  result.workspaceSize = 0;
  result.state = CUBLAS_STATUS_SUCCESS;
  result.wavesCount = 1.0f;
  *returnAlgoCount = 1;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                              const void* alpha, const void* A, cublasLtMatrixLayout_t Adesc,
                              const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta,
                              const void* C, cublasLtMatrixLayout_t Cdesc, void* D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo,
                              void* workspace, size_t workspaceSizeInBytes, cudaStream_t stream) {
  constexpr const char* kWhere = "cublasLtMatmul";
  (void)workspace;  // the emulated algorithm needs none, so any size is enough
  (void)workspaceSizeInBytes;
  if (!emu::ValidHandle(lightHandle)) return CUBLAS_STATUS_NOT_INITIALIZED;
  emu::Desc d;
  emu::Layout a, b, c, dl;
  if (!emu::LoadChecked(computeDesc, emu::kDescMagic, &d) ||
      !emu::LoadChecked(Adesc, emu::kLayoutMagic, &a) ||
      !emu::LoadChecked(Bdesc, emu::kLayoutMagic, &b) ||
      !emu::LoadChecked(Cdesc, emu::kLayoutMagic, &c) ||
      !emu::LoadChecked(Ddesc, emu::kLayoutMagic, &dl)) {
    return emu::Refuse(CUBLAS_STATUS_INVALID_VALUE, kWhere, "a null or invalid descriptor");
  }
  emu::Problem problem;
  std::string why;
  const cublasStatus_t status = emu::CheckProblem(d, a, b, c, dl, &problem, &why);
  if (status != CUBLAS_STATUS_SUCCESS) return emu::Refuse(status, kWhere, why);

  const bool bias = emu::HasBias(problem.epilogue), gelu = emu::HasGeluAux(problem.epilogue);
  if (alpha == nullptr || beta == nullptr || A == nullptr || B == nullptr || C == nullptr ||
      D == nullptr || (bias && d.bias == nullptr) || (gelu && d.aux == nullptr)) {
    return emu::Refuse(CUBLAS_STATUS_INVALID_VALUE, kWhere,
                       "a null alpha, beta, A, B, C, D, or epilogue bias or aux pointer");
  }
  // In place needs C and D to be one matrix.
  if (C == D && problem.ldc != problem.ldd) {
    return emu::Refuse(CUBLAS_STATUS_INVALID_VALUE, kWhere, "C == D with different layouts");
  }
  if (algo == nullptr) {
    return emu::Refuse(CUBLAS_STATUS_NOT_SUPPORTED, kWhere,
                       "a null algo (cuBLASLt's implicit heuristic) is not emulated");
  }
  const emu::Algo chosen = emu::Load<emu::Algo>(algo);
  if (chosen.magic != emu::kAlgoMagic) {
    return emu::Refuse(CUBLAS_STATUS_INVALID_VALUE, kWhere,
                       "the algo was not returned by cublasLtMatmulAlgoGetHeuristic");
  }
  if (chosen.epilogue != problem.epilogue || chosen.ab_type != uint32_t(problem.ab) ||
      chosen.cd_type != uint32_t(problem.cd)) {
    return emu::Refuse(CUBLAS_STATUS_NOT_SUPPORTED, kWhere,
                       "the algo was chosen for another epilogue or other types");
  }

  emu::Job job;
  job.p = problem;
  job.alpha = *static_cast<const float*>(alpha);  // host pointer mode: read at call time
  job.beta = *static_cast<const float*>(beta);
  job.a = A;
  job.b = B;
  job.c = C;
  job.d = D;
  job.bias = bias ? d.bias : nullptr;
  job.aux = gelu ? d.aux : nullptr;
  const void* pointers[emu::kOperands] = {A, B, C, D, job.bias, job.aux};
  for (int i = 0; i < emu::kOperands; ++i) {
    if (pointers[i] == nullptr || chosen.alignment[i] == 0) continue;
    const uint32_t have = emu::AlignmentOf(pointers[i]);
    if (have < chosen.alignment[i]) {
      job.misaligned = std::string(emu::kOperandNames[i]) + " is " + std::to_string(have) +
                       "-byte aligned, the algo was chosen for " +
                       std::to_string(chosen.alignment[i]) + " (heuristic preferences)";
      break;
    }
  }
  emu::GetCounters().gemm_calls.fetch_add(1);
  emu::Enqueue(stream, kWhere, [job = std::move(job)] { emu::RunJob(job); });
  return CUBLAS_STATUS_SUCCESS;
}

// cuBLAS's version query (tests/cuda_test.cc): the toolkit's numbers.
cublasStatus_t cublasGetProperty(libraryPropertyType type, int* value) {
  switch (type) {
    case MAJOR_VERSION:
      *value = CUBLAS_VER_MAJOR;
      return CUBLAS_STATUS_SUCCESS;
    case MINOR_VERSION:
      *value = CUBLAS_VER_MINOR;
      return CUBLAS_STATUS_SUCCESS;
    case PATCH_LEVEL:
      *value = CUBLAS_VER_PATCH;
      return CUBLAS_STATUS_SUCCESS;
    default:
      return CUBLAS_STATUS_INVALID_VALUE;
  }
}
