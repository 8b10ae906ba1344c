#ifndef BIGMAC_CORE_DEVICE_CUDA_EMULATION_CUBLASLT_SWITCH_H_
#define BIGMAC_CORE_DEVICE_CUDA_EMULATION_CUBLASLT_SWITCH_H_

// Test-only control of the emulated cuBLASLt (cublaslt.cc).
//
// Real cuBLASLt has no algorithm for some fused epilogues on some GPUs and types; BigMac then
// runs the plain GEMM and separate kernels. Turning fused epilogues off makes the emulated
// heuristic answer every non-DEFAULT epilogue the way cuBLASLt does when it has no algorithm
// (CUBLAS_STATUS_NOT_SUPPORTED, no result), so that fallback path runs without a GPU.

namespace bigmac::device::cuda::emulation {

// Default: offered, unless the environment has BIGMAC_EMULATED_FUSED_EPILOGUES=0 when the
// emulated cuBLASLt first asks. Affects later cublasLtMatmulAlgoGetHeuristic calls only: an
// algorithm already returned keeps working.
void SetFusedEpilogues(bool offered);
bool FusedEpiloguesOffered();

}  // namespace bigmac::device::cuda::emulation

#endif  // BIGMAC_CORE_DEVICE_CUDA_EMULATION_CUBLASLT_SWITCH_H_
