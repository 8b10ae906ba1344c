#ifndef BIGMAC_STAGES_CUDA_GEMM_PLAN_H_
#define BIGMAC_STAGES_CUDA_GEMM_PLAN_H_

// Pure functions (no CUDA): the row-major GEMMs of the layers, mapped onto cuBLAS(Lt)'s
// column-major operands. gemm.cc issues exactly these numbers; tests/gemm_plan_test.cc executes
// them with a column-major cblas GEMM and compares with the row-major CPU kernels, so a wrong
// transpose, operand or leading dimension fails on the CPU instead of silently on a GPU.
//
// The mapping: a row-major matrix X(r, c) with row stride ld is, read column-major, X^T(c, r)
// with the same ld. So the row-major C = op(A) op(B) is the column-major C^T = op(B)^T op(A)^T:
// cuBLAS's m is the row-major n, its n the row-major m, k stays; cuBLAS's A is the row-major B
// (transposed iff B was), its B the row-major A (transposed iff A was); every leading dimension
// is the row-major row stride of the same buffer.

#include <cstdint>
#include <string>

namespace bigmac::stages::cuda {

// A row-major GEMM: C(m, n) = alpha * op(A)(m, k) * op(B)(k, n) + beta * C.
// A is stored row-major as (m, k) with row stride lda, or as (k, m) when trans_a (op(A) = A^T);
// B likewise as (k, n), or (n, k) when trans_b; C as (m, n) with row stride ldc.
struct RowMajorGemm {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  int64_t lda = 0, ldb = 0, ldc = 0;
  float alpha = 1.0f, beta = 0.0f;
};

// Which buffer of the row-major problem a cuBLAS operand reads.
enum class Source { kRowA, kRowB };

// The column-major GEMM cuBLAS(Lt) is asked for: D(m, n) = alpha * op(A)(m, k) * op(B)(k, n) +
// beta * C, with C and D the same buffer and layout (ldd = ldc).
struct ColumnMajorGemm {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;  // CUBLAS_OP_T where true
  Source a = Source::kRowB, b = Source::kRowA;
  int64_t lda = 0, ldb = 0, ldc = 0;
  // The stored (before op) column-major shape of A and B, as cublasLtMatrixLayoutCreate takes
  // them: A is (a_rows, a_cols) = (m, k), or (k, m) when trans_a; likewise B. C/D are (m, n).
  int64_t a_rows = 0, a_cols = 0, b_rows = 0, b_cols = 0;
  float alpha = 1.0f, beta = 0.0f;
};

// The mapping above. Throws std::invalid_argument (naming the shape) unless m, n, k >= 1 and
// each leading dimension covers its stored row (ld >= the row-major column count).
ColumnMajorGemm ToColumnMajor(const RowMajorGemm& gemm);

// The operand `source` names: row_a or row_b.
template <typename P>
P Select(Source source, P row_a, P row_b) {
  return source == Source::kRowA ? row_a : row_b;
}

// "m=5 n=7 k=13 transa=T transb=N lda=13 ldb=13 ldc=5 alpha=1 beta=0" (column-major terms).
std::string Describe(const ColumnMajorGemm& gemm);

// What the epilogue of a layer GEMM adds to D: nothing, the bias (length m, broadcast along n),
// and/or GELU (tanh approximation) with its input written to an aux matrix.
enum class Epilogue { kNone, kBias, kGeluAux, kGeluAuxBias };
bool HasBias(Epilogue epilogue);
bool HasGelu(Epilogue epilogue);
std::string EpilogueName(Epilogue epilogue);  // "none", "bias", "gelu_aux", "gelu_aux_bias"

// One of the three layer GEMMs of gemm.h. The row-major A and B are, by layer:
//   forward          A = inp (N, C)            B = w (OC, C), transposed   C = out (N, OC)
//   backward input   A = dout (N, OC)          B = w (OC, C)               C = dinp (N, C)
//   backward weight  A = dout (N, OC), transp. B = inp (N, C)              C = dw (OC, C), beta 1
struct LayerGemm {
  ColumnMajorGemm gemm;
  // The epilogue the layer asks for (forward only; kNone for the backward GEMMs).
  Epilogue epilogue = Epilogue::kNone;
  // With a bias: its length, which is cuBLAS's m (= OC), since the bias runs along the row-major
  // columns, the column-major rows of D. 0 without a bias.
  int64_t bias_length = 0;
  // With GELU: the aux (gelu_pre) matrix, (m, n) column-major with leading dimension aux_ld (= OC,
  // gelu_pre's row stride). cuBLASLt wants aux_ld a multiple of 8 and >= m; gelu_aux_ld_ok says
  // whether it is (when not, the GELU runs as a separate kernel). 0 / false without GELU.
  int64_t aux_ld = 0;
  bool gelu_aux_ld_ok = false;
};

// out(N,OC) = inp(N,C) @ w(OC,C)^T [+ bias] [then GELU, pre-activation to gelu_pre (N,OC)].
// ld_out is out's row stride (0 = oc). Throws std::invalid_argument on a bad shape.
LayerGemm ForwardPlan(int n, int c, int oc, int64_t ld_out, bool bias, bool gelu);
// dinp(N,C) = dout(N,OC) @ w(OC,C); ld_dout is dout's row stride (0 = oc).
LayerGemm BackwardInputPlan(int n, int c, int oc, int64_t ld_dout);
// dw(OC,C) += dout(N,OC)^T @ inp(N,C) (beta = 1); ld_dout is dout's row stride (0 = oc).
LayerGemm BackwardWeightPlan(int n, int c, int oc, int64_t ld_dout);

// The device pointers of one call (as integers: nothing is dereferenced), and the element sizes
// of A/B and of C/D. bias and aux are 0 when absent.
struct GemmPointers {
  uintptr_t a = 0, b = 0, c = 0, bias = 0, aux = 0;
  int64_t ab_size = 4, cd_size = 4;
};

// The alignment of each pointer: the largest power of two dividing it, capped at 256 (cuBLASLt's
// default assumption), 256 for an absent pointer. The plain GEMM passes a, b and c (= d) to the
// heuristic as its minimum-alignment preferences, so it is correct at any alignment.
struct Alignments {
  uint32_t a = 256, b = 256, c = 256, bias = 256, aux = 256;
};
Alignments AlignmentsOf(const GemmPointers& pointers);

// Which fused epilogues a call may use. BigMac's rule, stricter than cuBLASLt's minimum: every
// pointer (A, B, C/D, bias, aux) 16-byte aligned and every leading dimension a whole number of
// 16 bytes; for GELU also aux_ld a multiple of 8 (cuBLASLt's rule). Where a form is not allowed,
// gemm.cc runs the plain GEMM and the separate kernels.
struct AllowedForms {
  bool bias = false;      // CUBLASLT_EPILOGUE_BIAS
  bool gelu_aux = false;  // CUBLASLT_EPILOGUE_GELU_AUX(_BIAS)
  Alignments alignments;
};
AllowedForms CheckAlignment(const LayerGemm& plan, const GemmPointers& pointers);

}  // namespace bigmac::stages::cuda

#endif  // BIGMAC_STAGES_CUDA_GEMM_PLAN_H_
