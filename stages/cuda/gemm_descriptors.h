#ifndef BIGMAC_STAGES_CUDA_GEMM_DESCRIPTORS_H_
#define BIGMAC_STAGES_CUDA_GEMM_DESCRIPTORS_H_

// Internal to gemm.cc, exposed for tests/cuda_gemm_test.cc: the cuBLASLt matmul descriptor,
// matrix layouts and heuristic preference that a layer GEMM's plan (gemm_plan.h) becomes.
// Creating them needs no GPU (only cublasLtCreate does), so a CPU test builds every one the
// layers use and reads its attributes back.

#include <cublasLt.h>

#include <cstdint>
#include <string>

#include "core/memory/dtype.h"
#include "stages/cuda/gemm_plan.h"

namespace bigmac::stages::cuda {

// CUDA_R_32F for kF32, CUDA_R_16BF for kBF16; any other dtype is a DeviceError naming `where`.
cudaDataType_t CudaDataType(memory::DType dtype, const std::string& where);

enum class GemmKind { kForward, kBackwardInput, kBackwardWeight };
std::string GemmKindName(GemmKind kind);  // "MatmulForward", ...

// The element types of A/B (activations and weights) and of C/D (the output). Compute is always
// CUBLAS_COMPUTE_32F with CUDA_R_32F scales.
struct GemmTypes {
  memory::DType ab = memory::DType::kF32;
  memory::DType cd = memory::DType::kF32;
};
// The layer's activation dtype for A/B; C/D is the same except for the weight gradient, which is
// fp32 (the master gradient) whatever the activations are.
GemmTypes TypesFor(GemmKind kind, memory::DType dtype);

cublasLtEpilogue_t LtEpilogue(Epilogue epilogue);

// Owns a matmul descriptor and the layouts of A, B and C (also D's: the same buffer).
struct MatmulDescriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;

  MatmulDescriptors() = default;
  MatmulDescriptors(MatmulDescriptors&& other) noexcept;
  MatmulDescriptors& operator=(MatmulDescriptors&& other) noexcept;
  MatmulDescriptors(const MatmulDescriptors&) = delete;
  MatmulDescriptors& operator=(const MatmulDescriptors&) = delete;
  ~MatmulDescriptors();
};

// The descriptors for plan.gemm with `epilogue`: plan.epilogue or a reduced form of it (a
// fallback drops the GELU, the bias, or both), never more; a GELU form needs
// plan.gelu_aux_ld_ok. Sets compute 32F, scale 32F, the transposes, the epilogue, and for a bias
// its data type (C/D's), for a GELU the aux leading dimension (plan.aux_ld) and data type (C/D's).
// Layouts are column-major (rows, cols, ld) from the plan. Throws DeviceError naming `where`.
MatmulDescriptors BuildDescriptors(const LayerGemm& plan, Epilogue epilogue, GemmTypes types,
                                   const std::string& where);

// Points the epilogue at this call's bias and aux (ignored where the epilogue has none). The
// heuristic reads these pointers' alignment, so set them before asking it.
void SetEpiloguePointers(const MatmulDescriptors& descriptors, Epilogue epilogue, const void* bias,
                         void* aux, const std::string& where);

// Owns a heuristic preference.
struct MatmulPreference {
  cublasLtMatmulPreference_t pref = nullptr;

  MatmulPreference() = default;
  MatmulPreference(MatmulPreference&& other) noexcept;
  MatmulPreference& operator=(MatmulPreference&& other) noexcept;
  MatmulPreference(const MatmulPreference&) = delete;
  MatmulPreference& operator=(const MatmulPreference&) = delete;
  ~MatmulPreference();
};

// The implementations an fp32 GEMM may use: everything but reduced-precision inputs (TF32,
// bf16, fp16), so fp32 stays fp32 whatever the library would otherwise choose.
inline constexpr uint64_t kFp32ImplMask =
    ~uint64_t{CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_TF32 | CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_16BF |
              CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_16F};

// The workspace limit, the minimum alignments of A, B, C and D (= C) from the call's pointers,
// and for fp32 A/B the implementation mask above.
MatmulPreference BuildPreference(const Alignments& alignments, GemmTypes types,
                                 uint64_t workspace_bytes, const std::string& where);

}  // namespace bigmac::stages::cuda

#endif  // BIGMAC_STAGES_CUDA_GEMM_DESCRIPTORS_H_
