#ifndef BIGMAC_STAGES_CUDA_GEMM_H_
#define BIGMAC_STAGES_CUDA_GEMM_H_

// The GPT layers' three GEMMs on cuBLASLt, the GPU twins of cpu::MatmulForward,
// MatmulBackwardInput and MatmulBackwardWeight (plugins/sdk/cpu_kernels.h), with the same
// row-major shapes. The row-major -> column-major mapping is gemm_plan.h's pure function (tested
// on the CPU); this file only issues it.
//
// `dtype` is the type of the activations and weights (kF32 or kBF16); accumulation is fp32
// (CUBLAS_COMPUTE_32F, no TF32), alpha/beta fp32. The weight gradient is fp32 and accumulated
// (beta = 1) straight into the master gradient. Bias (and GELU, where asked) go into cuBLASLt
// epilogues; when the heuristic offers no algorithm for the fused form, the plain GEMM runs and
// kernels add the bias and the GELU (kernels.h). Descriptors and the chosen algorithm are cached
// per shape. A GEMM no algorithm serves at all is a DeviceError naming the shape.
//
// Pointers are device memory on the call site's device, 16-byte aligned (the allocator gives
// 256). Uses the context's cuBLASLt handle and 32 MiB workspace on its compute stream.

#include <cstdint>

#include "core/device/cuda/context.h"
#include "core/memory/dtype.h"

namespace bigmac::stages::cuda {

using device::cuda::CallSite;
using memory::DType;

// out(N,OC) = inp(N,C) @ w(OC,C)^T + bias (bias may be null). out has row stride ld_out
// (0 = oc). With gelu_pre non-null, gelu_pre (N,OC, row stride oc) receives the pre-activation
// and out = gelu(gelu_pre) (tanh approximation, as the CPU's).
void MatmulForward(const CallSite& site, DType dtype, void* out, const void* inp, const void* w,
                   const void* bias, int n, int c, int oc, int64_t ld_out = 0,
                   void* gelu_pre = nullptr);
// dinp(N,C) = dout(N,OC) @ w(OC,C). dout has row stride ld_dout (0 = oc).
void MatmulBackwardInput(const CallSite& site, DType dtype, void* dinp, const void* dout,
                         const void* w, int n, int c, int oc, int64_t ld_dout = 0);
// dw(OC,C) += dout(N,OC)^T @ inp(N,C) in fp32; dbias(OC) += column sums of dout (dbias may be
// null). dw and dbias are fp32 master gradients. dout has row stride ld_dout (0 = oc).
void MatmulBackwardWeight(const CallSite& site, DType dtype, float* dw, float* dbias,
                          const void* dout, const void* inp, int n, int c, int oc,
                          int64_t ld_dout = 0);

}  // namespace bigmac::stages::cuda

#endif  // BIGMAC_STAGES_CUDA_GEMM_H_
