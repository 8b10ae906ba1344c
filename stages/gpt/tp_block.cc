// The GPT-2 block over a tensor-parallel group (Megatron-LM's layout): each of the group's
// `tp` ranks holds num_heads/tp heads of the fused q, k, v projection and hidden*4/tp columns of
// the MLP (column-parallel), and the matching input columns of the attention output and fc2
// projections (row-parallel). Forward: the replicated input goes into the column-parallel GEMMs
// as is (Megatron's f: identity), and each row-parallel GEMM's partial output is summed over the
// group (g: one all-reduce). Backward: the conjugates (g: identity; f: one all-reduce of the
// input gradient of each column-parallel GEMM). LayerNorms and the row-parallel biases are
// replicated; their gradients come out equal on every rank (computed from equal tensors). The
// bias of a row-parallel GEMM is added by tp rank 0 only, before the sum. Same kernels, same
// saved-tensor order (stages/gpt/params.h BlockSaved) as the tp = 1 block (block.cc).
#include <cmath>

#include "core/layer/gpt_cost.h"
#include "core/layer/tp_layer.h"
#include "plugins/sdk/cpu_kernels.h"
#include "plugins/sdk/cpu_layer.h"
#include "stages/gpt/block_forward.h"
#include "stages/gpt/params.h"
#include "stages/gpt/tp_params.h"

namespace bigmac::stages::gpt {
namespace {

namespace cpu = sdk::cpu;
using sdk::LayerSpec, sdk::MicroBatch, sdk::Saved, sdk::Tensor;

template <typename T>
class TpBlock : public sdk::CpuLayer<T>, public layer::TpSharded {
  using Base = sdk::CpuLayer<T>;
  using enum BlockSaved::Index;

 public:
  TpBlock(const LayerSpec& spec, layer::TpGroup* group)
      : Base(spec), group_(group), specs_(BlockParams(spec.dims)) {
    const int tp = group->size();
    const int c = this->C();
    const int h = spec.dims.num_heads;
    if (c % h != 0 || h % tp != 0 || c % tp != 0) {
      throw std::invalid_argument("tensor-parallel block: hidden_size " + std::to_string(c) +
                                  ", num_heads " + std::to_string(h) + " and tp_size " +
                                  std::to_string(tp) +
                                  " need hidden % heads == 0 and heads % tp == 0");
    }
    shards_ = BlockShards(specs_, group->rank(), tp);
    for (size_t i = 0; i < specs_.size(); ++i)
      this->AddParam(specs_[i].name, shards_[i].LocalShape(), specs_[i].weight_decay);
    cl_ = c / tp;
    hl_ = h / tp;
  }

  std::vector<layer::TpShard> Shards() const override { return shards_; }

  void InitParams(uint64_t seed) override {
    for (size_t i = 0; i < specs_.size(); ++i)
      InitSlice(specs_[i], shards_[i], &this->params_[i].value, seed, this->layer_id());
  }

  bool checkpoints_activations() const override { return true; }

  void Forward(const MicroBatch& mb, const Tensor& x, Tensor* y, Saved* saved) override {
    BlockForward(
        this->spec_.activation_checkpointing, x, saved,
        [&](Saved* into) { ComputeInternals(mb, into); },
        [&] { *y = this->NewActivation(mb.batch, mb.seq, this->C()); },
        [&](const Saved& from) { ComputeOutput(mb, from, y); });
  }

  void BackwardInput(const MicroBatch& mb, const Tensor& dy, Tensor* dx, Saved* saved) override {
    auto& s = saved->tensors;
    if (s.size() == 1) ComputeInternals(mb, saved);  // checkpointed: recompute
    const int n = mb.batch * mb.seq;
    const int c = this->C();
    const int fl = 4 * cl_;
    s.push_back(dy.Clone());  // kDy
    // MLP, fc2 row-parallel (g's backward: dy as is), fc column-parallel (f's: all-reduce).
    Tensor dfch_gelu = this->New({n, fl});
    cpu::MatmulBackwardInput(Base::D(dfch_gelu), Base::D(dy), this->W(kFcProjWeight), n, fl, c);
    Tensor dfch = this->New({n, fl});
    cpu::GeluBackward(Base::D(dfch), Base::D(s[kFch]), Base::D(dfch_gelu), int64_t{n} * fl);
    s[kFch] = Tensor();
    Tensor dln2 = this->New({n, c});
    cpu::MatmulBackwardInput(Base::D(dln2), Base::D(dfch), this->W(kFcWeight), n, c, fl);
    group_->AllReduceSum(&dln2, "tp block: input gradient of mlp.fc (f)");
    Tensor dres2 = dy.Clone();
    cpu::LayerNormBackwardInput(Base::D(dres2), Base::D(dln2), Base::D(s[kRes2]),
                                this->W(kLn2Weight), Base::D(s[kLn2Mean]), Base::D(s[kLn2Rstd]), n,
                                c);
    // Attention: proj row-parallel, qkv column-parallel by heads.
    Tensor datty = this->New({n, cl_});
    cpu::MatmulBackwardInput(Base::D(datty), Base::D(dres2), this->W(kProjWeight), n, cl_, c);
    Tensor dqkv = this->New({n, 3 * cl_});
    cpu::FlashAttentionBackward(Base::D(dqkv), Base::D(datty), Base::D(s[kQkv]), Base::D(s[kAtt]),
                                mb.batch, mb.seq, cl_, hl_);
    s[kAtt] = Tensor();
    s[kQkv] = Tensor();
    Tensor dln1 = this->New({n, c});
    cpu::MatmulBackwardInput(Base::D(dln1), Base::D(dqkv), this->W(kQkvWeight), n, c, 3 * cl_);
    group_->AllReduceSum(&dln1, "tp block: input gradient of attn.qkv (f)");
    *dx = dres2.Clone();
    cpu::LayerNormBackwardInput(Base::D(*dx), Base::D(dln1), Base::D(s[kX]), this->W(kLn1Weight),
                                Base::D(s[kLn1Mean]), Base::D(s[kLn1Rstd]), n, c);
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
    cpu::MatmulBackwardWeight(this->G(kFcProjWeight), this->G(kFcProjBias), Base::D(s[kDy]),
                              Base::D(s[kFchGelu]), n, fl, c);
    cpu::MatmulBackwardWeight(this->G(kFcWeight), this->G(kFcBias), Base::D(s[kDFch]),
                              Base::D(s[kLn2]), n, c, fl);
    cpu::LayerNormBackwardWeight(this->G(kLn2Weight), this->G(kLn2Bias), Base::D(s[kDLn2]),
                                 Base::D(s[kRes2]), Base::D(s[kLn2Mean]), Base::D(s[kLn2Rstd]), n,
                                 c);
    cpu::MatmulBackwardWeight(this->G(kProjWeight), this->G(kProjBias), Base::D(s[kDRes2]),
                              Base::D(s[kAtty]), n, cl_, c);
    cpu::MatmulBackwardWeight(this->G(kQkvWeight), this->G(kQkvBias), Base::D(s[kDQkv]),
                              Base::D(s[kLn1]), n, c, 3 * cl_);
    cpu::LayerNormBackwardWeight(this->G(kLn1Weight), this->G(kLn1Bias), Base::D(s[kDLn1]),
                                 Base::D(s[kX]), Base::D(s[kLn1Mean]), Base::D(s[kLn1Rstd]), n, c);
    saved->Clear();
  }

  int64_t ForwardFlops(int batch, int seq) const override { return Cost(batch, seq).forward_flops; }
  // TpBlockCost counts the (B,h/tp,T,T) probabilities; this block keeps their log-sum-exp, as the
  // tp = 1 block does (stages/gpt/block.cc).
  int64_t ActivationBytes(int batch, int seq) const override {
    const int64_t dropped =
        this->spec_.activation_checkpointing ? 0 : int64_t{batch} * hl_ * seq * (seq - 1);
    return Cost(batch, seq).activation_bytes -
           dropped * static_cast<int64_t>(memory::DTypeSize(this->spec_.dtype));
  }

 private:
  layer::LayerCost Cost(int batch, int seq) const {
    return layer::TpBlockCost(this->spec_.dims, group_->size(), batch, seq,
                              this->spec_.activation_checkpointing,
                              static_cast<int>(memory::DTypeSize(this->spec_.dtype)));
  }

  // A row-parallel GEMM: out = sum over the group of inp @ w^T, plus the bias (rank 0 adds it).
  void RowParallel(Tensor* out, const Tensor& inp, int w, int bias, int n, int in, int oc,
                   const char* what) {
    cpu::MatmulForward(Base::D(*out), Base::D(inp), this->W(w),
                       group_->rank() == 0 ? this->W(bias) : nullptr, n, in, oc);
    group_->AllReduceSum(out, what);
  }

  // Fills saved[kLn1 .. kFchGelu] from saved[kX].
  void ComputeInternals(const MicroBatch& mb, Saved* saved) {
    const int n = mb.batch * mb.seq;
    const int c = this->C();
    const int fl = 4 * cl_;
    auto& s = saved->tensors;
    s.resize(kForwardCount);
    s[kLn1] = this->New({n, c});
    s[kLn1Mean] = this->New({n});
    s[kLn1Rstd] = this->New({n});
    s[kQkv] = this->New({n, 3 * cl_});
    s[kAtt] = this->New({mb.batch, hl_, mb.seq});  // the log-sum-exp of each attention row
    s[kAtty] = this->New({n, cl_});
    s[kRes2] = this->New({n, c});
    s[kLn2] = this->New({n, c});
    s[kLn2Mean] = this->New({n});
    s[kLn2Rstd] = this->New({n});
    s[kFch] = this->New({n, fl});
    s[kFchGelu] = this->New({n, fl});
    cpu::LayerNormForward(Base::D(s[kLn1]), Base::D(s[kLn1Mean]), Base::D(s[kLn1Rstd]),
                          Base::D(s[kX]), this->W(kLn1Weight), this->W(kLn1Bias), n, c);
    cpu::MatmulForward(Base::D(s[kQkv]), Base::D(s[kLn1]), this->W(kQkvWeight), this->W(kQkvBias),
                       n, c, 3 * cl_);
    cpu::FlashAttentionForward(Base::D(s[kAtty]), Base::D(s[kAtt]), Base::D(s[kQkv]), mb.batch,
                               mb.seq, cl_, hl_);
    Tensor attn_out = this->New({n, c});
    RowParallel(&attn_out, s[kAtty], kProjWeight, kProjBias, n, cl_, c,
                "tp block: attn.proj output (g)");
    cpu::Add(Base::D(s[kRes2]), Base::D(s[kX]), Base::D(attn_out), int64_t{n} * c);
    cpu::LayerNormForward(Base::D(s[kLn2]), Base::D(s[kLn2Mean]), Base::D(s[kLn2Rstd]),
                          Base::D(s[kRes2]), this->W(kLn2Weight), this->W(kLn2Bias), n, c);
    cpu::MatmulForward(Base::D(s[kFch]), Base::D(s[kLn2]), this->W(kFcWeight), this->W(kFcBias), n,
                       c, fl);
    cpu::GeluForward(Base::D(s[kFchGelu]), Base::D(s[kFch]), int64_t{n} * fl);
  }

  void ComputeOutput(const MicroBatch& mb, const Saved& saved, Tensor* y) {
    const int n = mb.batch * mb.seq;
    RowParallel(y, saved.tensors[kFchGelu], kFcProjWeight, kFcProjBias, n, 4 * cl_, this->C(),
                "tp block: mlp.proj output (g)");
    cpu::AddInPlace(Base::D(*y), Base::D(saved.tensors[kRes2]), int64_t{n} * this->C());
  }

  layer::TpGroup* group_;
  std::vector<ParamSpec> specs_;
  std::vector<layer::TpShard> shards_;
  int cl_ = 0;  // hidden / tp: this rank's share of the attention width
  int hl_ = 0;  // heads / tp
};

const registry::Registrar<layer::Layer, const LayerSpec&, layer::TpGroup*> kRegister(
    "gpt_block", "cpu", MakeTpForDType<TpBlock>);

}  // namespace
}  // namespace bigmac::stages::gpt
