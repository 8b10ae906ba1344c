#include "stages/cuda/gemm_descriptors.h"

#include <utility>

#include "core/device/cuda/check.h"
#include "core/device/device.h"

namespace bigmac::stages::cuda {
namespace {

using memory::DType;

template <typename T>
void SetDesc(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute, const T& value,
             const std::string& where) {
  BIGMAC_CUDA_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)), where);
}

template <typename T>
void SetPref(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attribute,
             const T& value, const std::string& where) {
  BIGMAC_CUDA_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attribute, &value, sizeof(value)),
                    where);
}

// An epilogue may drop parts of what the plan asked for, never add any.
bool Within(Epilogue epilogue, Epilogue asked) {
  return (!HasBias(epilogue) || HasBias(asked)) && (!HasGelu(epilogue) || HasGelu(asked));
}

void Destroy(MatmulDescriptors& d) {
  // Destroy calls only fail on a null handle, which is skipped.
  if (d.c) cublasLtMatrixLayoutDestroy(d.c);
  if (d.b) cublasLtMatrixLayoutDestroy(d.b);
  if (d.a) cublasLtMatrixLayoutDestroy(d.a);
  if (d.op) cublasLtMatmulDescDestroy(d.op);
  d.op = nullptr;
  d.a = d.b = d.c = nullptr;
}

}  // namespace

cudaDataType_t CudaDataType(DType dtype, const std::string& where) {
  switch (dtype) {
    case DType::kF32:
      return CUDA_R_32F;
    case DType::kBF16:
      return CUDA_R_16BF;
    default:
      throw device::DeviceError("cuBLASLt GEMM: unsupported dtype " + memory::DTypeName(dtype) +
                                " (f32 or bf16), in " + where);
  }
}

std::string GemmKindName(GemmKind kind) {
  switch (kind) {
    case GemmKind::kForward:
      return "MatmulForward";
    case GemmKind::kBackwardInput:
      return "MatmulBackwardInput";
    case GemmKind::kBackwardWeight:
      return "MatmulBackwardWeight";
  }
  return "?";
}

GemmTypes TypesFor(GemmKind kind, DType dtype) {
  return {dtype, kind == GemmKind::kBackwardWeight ? DType::kF32 : dtype};
}

cublasLtEpilogue_t LtEpilogue(Epilogue epilogue) {
  switch (epilogue) {
    case Epilogue::kNone:
      return CUBLASLT_EPILOGUE_DEFAULT;
    case Epilogue::kBias:
      return CUBLASLT_EPILOGUE_BIAS;
    case Epilogue::kGeluAux:
      return CUBLASLT_EPILOGUE_GELU_AUX;
    case Epilogue::kGeluAuxBias:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

MatmulDescriptors::MatmulDescriptors(MatmulDescriptors&& other) noexcept
    : op(other.op), a(other.a), b(other.b), c(other.c) {
  other.op = nullptr;
  other.a = other.b = other.c = nullptr;
}

MatmulDescriptors& MatmulDescriptors::operator=(MatmulDescriptors&& other) noexcept {
  if (this != &other) {
    Destroy(*this);
    std::swap(op, other.op);
    std::swap(a, other.a);
    std::swap(b, other.b);
    std::swap(c, other.c);
  }
  return *this;
}

MatmulDescriptors::~MatmulDescriptors() { Destroy(*this); }

MatmulDescriptors BuildDescriptors(const LayerGemm& plan, Epilogue epilogue, GemmTypes types,
                                   const std::string& where) {
  if (!Within(epilogue, plan.epilogue) || (HasGelu(epilogue) && !plan.gelu_aux_ld_ok)) {
    throw device::DeviceError("cuBLASLt GEMM: epilogue " + EpilogueName(epilogue) +
                              " does not fit a plan that asks for " + EpilogueName(plan.epilogue) +
                              " (aux_ld " + std::to_string(plan.aux_ld) + "), in " + where);
  }
  const cudaDataType_t ab = CudaDataType(types.ab, where);
  const cudaDataType_t cd = CudaDataType(types.cd, where);
  const ColumnMajorGemm& g = plan.gemm;

  MatmulDescriptors d;
  BIGMAC_CUDA_CHECK(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), where);
  SetDesc(d.op, CUBLASLT_MATMUL_DESC_TRANSA,
          static_cast<int32_t>(g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N), where);
  SetDesc(d.op, CUBLASLT_MATMUL_DESC_TRANSB,
          static_cast<int32_t>(g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N), where);
  SetDesc(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, static_cast<uint32_t>(LtEpilogue(epilogue)), where);
  if (HasBias(epilogue)) {
    SetDesc(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(cd), where);
  }
  if (HasGelu(epilogue)) {
    SetDesc(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t{plan.aux_ld}, where);
    // The aux type is left at its default, D's type: cuBLASLt documents setting it for
    // narrow-precision (fp8) matmuls only, and a set value may empty the heuristic's answer.
  }
  BIGMAC_CUDA_CHECK(cublasLtMatrixLayoutCreate(&d.a, ab, g.a_rows, g.a_cols, g.lda), where);
  BIGMAC_CUDA_CHECK(cublasLtMatrixLayoutCreate(&d.b, ab, g.b_rows, g.b_cols, g.ldb), where);
  BIGMAC_CUDA_CHECK(cublasLtMatrixLayoutCreate(&d.c, cd, g.m, g.n, g.ldc), where);
  return d;
}

void SetEpiloguePointers(const MatmulDescriptors& d, Epilogue epilogue, const void* bias, void* aux,
                         const std::string& where) {
  if (HasBias(epilogue)) SetDesc(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias, where);
  if (HasGelu(epilogue)) SetDesc(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux, where);
}

MatmulPreference::MatmulPreference(MatmulPreference&& other) noexcept : pref(other.pref) {
  other.pref = nullptr;
}

MatmulPreference& MatmulPreference::operator=(MatmulPreference&& other) noexcept {
  std::swap(pref, other.pref);
  return *this;
}

MatmulPreference::~MatmulPreference() {
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
}

MatmulPreference BuildPreference(const Alignments& alignments, GemmTypes types,
                                 uint64_t workspace_bytes, const std::string& where) {
  MatmulPreference p;
  BIGMAC_CUDA_CHECK(cublasLtMatmulPreferenceCreate(&p.pref), where);
  SetPref(p.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace_bytes, where);
  SetPref(p.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignments.a, where);
  SetPref(p.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignments.b, where);
  SetPref(p.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignments.c, where);
  SetPref(p.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignments.c, where);
  if (types.ab == memory::DType::kF32) {
    SetPref(p.pref, CUBLASLT_MATMUL_PREF_IMPL_MASK, kFp32ImplMask, where);
  }
  return p;
}

}  // namespace bigmac::stages::cuda
