#ifndef BIGMAC_STAGES_RESIDUAL_PROJECTION_H_
#define BIGMAC_STAGES_RESIDUAL_PROJECTION_H_

// The one rule for a row-parallel projection into the residual stream in the built-in CPU blocks
// (stages/gpt/cpu_block.h: attn.proj and mlp.proj; stages/llama/block.cc: o_proj and down_proj):
// out = inp w^T (+ bias), summed over the tensor-parallel group, + residual. Without a group the
// residual joins inside the GEMM (sdk::cpu::MatmulResidualForward, the bits of the separate add,
// one pass over memory fewer: bench/NOTES.md lever 24); with one it is added after the sum.

#include <cstdint>
#include <functional>

#include "plugins/sdk/cpu_kernels.h"
#include "plugins/sdk/cpu_layer.h"

namespace bigmac::stages {

// `sum_over_group` sums a tensor over the group in place; null for a group of one. out is the
// caller's, of n x oc, and overlaps neither inp nor residual.
template <typename T>
void ProjectIntoResidual(sdk::Tensor* out, const sdk::Tensor& inp, const T* w, const T* bias,
                         const sdk::Tensor& residual, int n, int in, int oc,
                         const std::function<void(sdk::Tensor*)>& sum_over_group) {
  T* o = out->data<T>();
  if (!sum_over_group) {
    sdk::cpu::MatmulResidualForward(o, inp.data<T>(), w, bias, residual.data<T>(), n, in, oc);
    return;
  }
  sdk::cpu::MatmulForward(o, inp.data<T>(), w, bias, n, in, oc);
  sum_over_group(out);
  sdk::cpu::AddInPlace(o, residual.data<T>(), int64_t{n} * oc);
}

}  // namespace bigmac::stages

#endif  // BIGMAC_STAGES_RESIDUAL_PROJECTION_H_
