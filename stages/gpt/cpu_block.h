#ifndef BIGMAC_STAGES_GPT_CPU_BLOCK_H_
#define BIGMAC_STAGES_GPT_CPU_BLOCK_H_

// The CPU GPT-2 block's arithmetic, written once for the tp = 1 block (block.cc) and the
// tensor-parallel one (tp_block.cc): x + attn(ln1(x)), then + mlp(ln2(.)), causal multi-head
// attention over this rank's heads and a GELU MLP over this rank's 4C/tp columns. A derived block
// gives the local widths and the Megatron hooks: SumOverGroup (the all-reduce after each
// row-parallel GEMM's forward and each column-parallel GEMM's input gradient; nothing at tp = 1),
// HasGroup (whether there is a sum) and AddsRowParallelBias (only one rank of a group adds the
// bias before the sum). Activation checkpointing: stages/checkpointed_block.h. Saved tensors
// follow stages/gpt/params.h BlockSaved.

#include <cstdint>
#include <functional>

#include "core/layer/cost.h"
#include "plugins/sdk/cpu_kernels.h"
#include "plugins/sdk/cpu_layer.h"
#include "stages/checkpointed_block.h"
#include "stages/gpt/params.h"
#include "stages/residual_projection.h"

namespace bigmac::stages::gpt {

template <typename T>
class CpuBlockBody : public CheckpointedBlock<T> {
  using Base = CheckpointedBlock<T>;
  using Saved = sdk::Saved;
  using Tensor = sdk::Tensor;
  using MicroBatch = sdk::MicroBatch;
  using enum BlockSaved::Index;

 public:
  // local_width: hidden / tp, the attention width this rank holds; local_heads: heads / tp.
  CpuBlockBody(const sdk::LayerSpec& spec, int local_width, int local_heads)
      : Base(spec), cl_(local_width), hl_(local_heads) {}

  void BackwardInput(const MicroBatch& mb, const Tensor& dy, Tensor* dx, Saved* saved) override {
    this->RestoreInternals(mb, saved);
    auto& s = saved->tensors;
    const int n = mb.batch * mb.seq;
    const int c = this->C();
    const int fl = 4 * cl_;
    s.push_back(dy.Clone());  // kDy
    // The gradients made with NewForOverwrite are whole outputs of their kernels (no "+=").
    // MLP: y = res2 + proj(gelu(fc(ln2(res2)))); fc2 row-parallel (g's backward: dy as is), fc
    // column-parallel (f's backward: a sum over the group).
    Tensor dfch = this->NewForOverwrite({n, fl});
    sdk::cpu::MatmulGeluBackwardInput(Base::D(dfch), Base::D(dy), this->W(kFcProjWeight),
                                      Base::D(s[kFch]), n, fl, c);
    s[kFch] = Tensor();
    Tensor dln2 = this->NewForOverwrite({n, c});
    sdk::cpu::MatmulBackwardInput(Base::D(dln2), Base::D(dfch), this->W(kFcWeight), n, c, fl);
    SumOverGroup(&dln2, "tp block: input gradient of mlp.fc (f)");
    Tensor dres2 = this->NewForOverwrite({n, c});  // dy + the gradient through ln2
    sdk::cpu::LayerNormBackwardInput(Base::D(dres2), Base::D(dln2), Base::D(s[kRes2]),
                                     this->W(kLn2Weight), Base::D(s[kLn2Mean]),
                                     Base::D(s[kLn2Rstd]), n, c, Base::D(dy));
    // Attention: res2 = x + proj(attn(qkv(ln1(x)))); proj row-parallel, qkv column-parallel by
    // heads.
    Tensor datty = this->NewForOverwrite({n, cl_});
    sdk::cpu::MatmulBackwardInput(Base::D(datty), Base::D(dres2), this->W(kProjWeight), n, cl_, c);
    Tensor dqkv = this->NewForOverwrite({n, 3 * cl_});
    sdk::cpu::FlashAttentionBackward(Base::D(dqkv), Base::D(datty), Base::D(s[kQkv]),
                                     Base::D(s[kAtt]), mb.batch, mb.seq, cl_, hl_);
    s[kAtt] = Tensor();
    s[kQkv] = Tensor();
    Tensor dln1 = this->NewForOverwrite({n, c});
    sdk::cpu::MatmulBackwardInput(Base::D(dln1), Base::D(dqkv), this->W(kQkvWeight), n, c, 3 * cl_);
    SumOverGroup(&dln1, "tp block: input gradient of attn.qkv (f)");
    *dx = this->NewForOverwrite(dy.shape());  // dres2 + the gradient through ln1, shaped as x
    sdk::cpu::LayerNormBackwardInput(Base::D(*dx), Base::D(dln1), Base::D(s[kX]),
                                     this->W(kLn1Weight), Base::D(s[kLn1Mean]),
                                     Base::D(s[kLn1Rstd]), n, c, Base::D(dres2));
    s.push_back(std::move(dfch));
    s.push_back(std::move(dln2));
    s.push_back(std::move(dres2));
    s.push_back(std::move(dqkv));
    s.push_back(std::move(dln1));
  }

  void BackwardWeight(const MicroBatch& mb, Saved* saved) override {
    auto& s = saved->tensors;
    const int n = mb.batch * mb.seq;
    const int c = this->C();
    const int fl = 4 * cl_;
    sdk::cpu::MatmulBackwardWeight(this->G(kFcProjWeight), this->G(kFcProjBias), Base::D(s[kDy]),
                                   Base::D(s[kFchGelu]), n, fl, c);
    sdk::cpu::MatmulBackwardWeight(this->G(kFcWeight), this->G(kFcBias), Base::D(s[kDFch]),
                                   Base::D(s[kLn2]), n, c, fl);
    sdk::cpu::LayerNormBackwardWeight(this->G(kLn2Weight), this->G(kLn2Bias), Base::D(s[kDLn2]),
                                      Base::D(s[kRes2]), Base::D(s[kLn2Mean]), Base::D(s[kLn2Rstd]),
                                      n, c);
    sdk::cpu::MatmulBackwardWeight(this->G(kProjWeight), this->G(kProjBias), Base::D(s[kDRes2]),
                                   Base::D(s[kAtty]), n, cl_, c);
    sdk::cpu::MatmulBackwardWeight(this->G(kQkvWeight), this->G(kQkvBias), Base::D(s[kDQkv]),
                                   Base::D(s[kLn1]), n, c, 3 * cl_);
    sdk::cpu::LayerNormBackwardWeight(this->G(kLn1Weight), this->G(kLn1Bias), Base::D(s[kDLn1]),
                                      Base::D(s[kX]), Base::D(s[kLn1Mean]), Base::D(s[kLn1Rstd]), n,
                                      c);
    saved->Clear();
  }

  int64_t ForwardFlops(int batch, int seq) const override { return Cost(batch, seq).forward_flops; }
  int64_t ActivationBytes(int batch, int seq) const override {
    return Cost(batch, seq).activation_bytes;
  }

 protected:
  // The block's cost for one rank (layer::BlockCost or layer::TpBlockCost; the blocked attention
  // keeps each row's log-sum-exp, layer::AttentionSaves::kRowLogSumExp).
  virtual layer::LayerCost Cost(int batch, int seq) const = 0;
  // Sums `tensor` over the tensor-parallel group in place; `what` names it in a hang report.
  virtual void SumOverGroup(Tensor* tensor, const char* what) = 0;
  // Whether this rank adds the row-parallel GEMMs' biases (one rank per group does).
  virtual bool AddsRowParallelBias() const = 0;
  // Whether the row-parallel GEMMs' outputs are summed over a group (false: a group of one).
  virtual bool HasGroup() const = 0;

 private:
  // A row-parallel GEMM into the residual stream (stages/residual_projection.h): out = sum over
  // the group of inp @ w^T, plus the bias, plus residual.
  void RowParallelResidual(Tensor* out, const Tensor& inp, int w, int bias, const Tensor& residual,
                           int n, int in, int oc, const char* what) {
    std::function<void(Tensor*)> sum;
    if (HasGroup()) sum = [this, what](Tensor* t) { SumOverGroup(t, what); };
    ProjectIntoResidual<T>(out, inp, this->W(w), AddsRowParallelBias() ? this->W(bias) : nullptr,
                           residual, n, in, oc, sum);
  }

  // Fills saved[kLn1 .. kFchGelu] from saved[kX].
  void ComputeInternals(const MicroBatch& mb, Saved* saved) override {
    const int n = mb.batch * mb.seq;
    const int c = this->C();
    const int fl = 4 * cl_;
    auto& s = saved->tensors;
    s.resize(kForwardCount);
    // Every tensor below is a kernel's whole output (no "+="), so none is zeroed first.
    s[kLn1] = this->NewForOverwrite({n, c});
    s[kLn1Mean] = this->NewForOverwrite({n});
    s[kLn1Rstd] = this->NewForOverwrite({n});
    s[kQkv] = this->NewForOverwrite({n, 3 * cl_});
    s[kAtt] =
        this->NewForOverwrite({mb.batch, hl_, mb.seq});  // the log-sum-exp of each attention row
    s[kAtty] = this->NewForOverwrite({n, cl_});
    s[kRes2] = this->NewForOverwrite({n, c});
    s[kLn2] = this->NewForOverwrite({n, c});
    s[kLn2Mean] = this->NewForOverwrite({n});
    s[kLn2Rstd] = this->NewForOverwrite({n});
    s[kFch] = this->NewForOverwrite({n, fl});
    s[kFchGelu] = this->NewForOverwrite({n, fl});
    sdk::cpu::LayerNormForward(Base::D(s[kLn1]), Base::D(s[kLn1Mean]), Base::D(s[kLn1Rstd]),
                               Base::D(s[kX]), this->W(kLn1Weight), this->W(kLn1Bias), n, c);
    sdk::cpu::MatmulForward(Base::D(s[kQkv]), Base::D(s[kLn1]), this->W(kQkvWeight),
                            this->W(kQkvBias), n, c, 3 * cl_);
    sdk::cpu::FlashAttentionForward(Base::D(s[kAtty]), Base::D(s[kAtt]), Base::D(s[kQkv]), mb.batch,
                                    mb.seq, cl_, hl_);
    RowParallelResidual(&s[kRes2], s[kAtty], kProjWeight, kProjBias, s[kX], n, cl_, c,
                        "tp block: attn.proj output (g)");
    sdk::cpu::LayerNormForward(Base::D(s[kLn2]), Base::D(s[kLn2Mean]), Base::D(s[kLn2Rstd]),
                               Base::D(s[kRes2]), this->W(kLn2Weight), this->W(kLn2Bias), n, c);
    sdk::cpu::MatmulGeluForward(Base::D(s[kFch]), Base::D(s[kFchGelu]), Base::D(s[kLn2]),
                                this->W(kFcWeight), this->W(kFcBias), n, c, fl);
  }

  void ComputeOutput(const MicroBatch& mb, const Saved& saved, Tensor* y) override {
    const int n = mb.batch * mb.seq;
    RowParallelResidual(y, saved.tensors[kFchGelu], kFcProjWeight, kFcProjBias,
                        saved.tensors[kRes2], n, 4 * cl_, this->C(),
                        "tp block: mlp.proj output (g)");
  }

  const int cl_;  // hidden / tp: this rank's share of the attention width
  const int hl_;  // heads / tp
};

}  // namespace bigmac::stages::gpt

#endif  // BIGMAC_STAGES_GPT_CPU_BLOCK_H_
