// GPT-2 transformer block: x + attn(ln1(x)), then + mlp(ln2(.)); causal multi-head attention and a
// GELU MLP of width 4C. With activation checkpointing, Forward keeps only its input and
// BackwardInput recomputes the rest with the same kernels, so results are bitwise unchanged.
#include <cmath>

#include "core/layer/gpt_cost.h"
#include "plugins/sdk/cpu_kernels.h"
#include "plugins/sdk/cpu_layer.h"
#include "plugins/sdk/init.h"
#include "stages/gpt/block_forward.h"
#include "stages/gpt/params.h"

namespace bigmac::stages::gpt {
namespace {

namespace cpu = sdk::cpu;
using sdk::LayerSpec, sdk::MicroBatch, sdk::Param, sdk::Saved, sdk::Tensor;

template <typename T>
class Block : public sdk::CpuLayer<T> {
  using Base = sdk::CpuLayer<T>;
  // Saved tensors: the order both backends share (stages/gpt/params.h).
  using enum BlockSaved::Index;

 public:
  explicit Block(const LayerSpec& spec) : Base(spec), specs_(BlockParams(spec.dims)) {
    const int c = this->C();
    if (c % spec.dims.num_heads != 0) {
      throw std::invalid_argument("block: hidden_size " + std::to_string(c) +
                                  " not divisible by num_heads " +
                                  std::to_string(spec.dims.num_heads));
    }
    for (const ParamSpec& param : specs_)
      this->AddParam(param.name, param.shape, param.weight_decay);
  }

  void InitParams(uint64_t seed) override {
    for (size_t i = 0; i < specs_.size(); ++i)
      InitParam(specs_[i], &this->params_[i].value, seed, this->layer_id());
  }

  // It recomputes in BackwardInput itself: the stage must not rerun Forward as well.
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
    s.push_back(dy.Clone());  // kDy
    // MLP: y = res2 + proj(gelu(fc(ln2(res2)))).
    Tensor dfch_gelu = this->New({n, 4 * c});
    cpu::MatmulBackwardInput(Base::D(dfch_gelu), Base::D(dy), this->W(kFcProjWeight), n, 4 * c, c);
    Tensor dfch = this->New({n, 4 * c});
    cpu::GeluBackward(Base::D(dfch), Base::D(s[kFch]), Base::D(dfch_gelu), int64_t{n} * 4 * c);
    s[kFch] = Tensor();
    Tensor dln2 = this->New({n, c});
    cpu::MatmulBackwardInput(Base::D(dln2), Base::D(dfch), this->W(kFcWeight), n, c, 4 * c);
    Tensor dres2 = dy.Clone();
    cpu::LayerNormBackwardInput(Base::D(dres2), Base::D(dln2), Base::D(s[kRes2]),
                                this->W(kLn2Weight), Base::D(s[kLn2Mean]), Base::D(s[kLn2Rstd]), n,
                                c);
    // Attention: res2 = x + proj(attn(qkv(ln1(x)))).
    Tensor datty = this->New({n, c});
    cpu::MatmulBackwardInput(Base::D(datty), Base::D(dres2), this->W(kProjWeight), n, c, c);
    Tensor dqkv = this->New({n, 3 * c});
    cpu::FlashAttentionBackward(Base::D(dqkv), Base::D(datty), Base::D(s[kQkv]), Base::D(s[kAtt]),
                                mb.batch, mb.seq, c, this->spec_.dims.num_heads);
    s[kAtt] = Tensor();
    s[kQkv] = Tensor();
    Tensor dln1 = this->New({n, c});
    cpu::MatmulBackwardInput(Base::D(dln1), Base::D(dqkv), this->W(kQkvWeight), n, c, 3 * c);
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
    cpu::MatmulBackwardWeight(this->G(kFcProjWeight), this->G(kFcProjBias), Base::D(s[kDy]),
                              Base::D(s[kFchGelu]), n, 4 * c, c);
    cpu::MatmulBackwardWeight(this->G(kFcWeight), this->G(kFcBias), Base::D(s[kDFch]),
                              Base::D(s[kLn2]), n, c, 4 * c);
    cpu::LayerNormBackwardWeight(this->G(kLn2Weight), this->G(kLn2Bias), Base::D(s[kDLn2]),
                                 Base::D(s[kRes2]), Base::D(s[kLn2Mean]), Base::D(s[kLn2Rstd]), n,
                                 c);
    cpu::MatmulBackwardWeight(this->G(kProjWeight), this->G(kProjBias), Base::D(s[kDRes2]),
                              Base::D(s[kAtty]), n, c, c);
    cpu::MatmulBackwardWeight(this->G(kQkvWeight), this->G(kQkvBias), Base::D(s[kDQkv]),
                              Base::D(s[kLn1]), n, c, 3 * c);
    cpu::LayerNormBackwardWeight(this->G(kLn1Weight), this->G(kLn1Bias), Base::D(s[kDLn1]),
                                 Base::D(s[kX]), Base::D(s[kLn1Mean]), Base::D(s[kLn1Rstd]), n, c);
    saved->Clear();
  }

  int64_t ForwardFlops(int batch, int seq) const override { return Cost(batch, seq).forward_flops; }
  // BlockCost counts the (B,h,T,T) probabilities; this block keeps their (B,h,T) log-sum-exp.
  int64_t ActivationBytes(int batch, int seq) const override {
    const int64_t dropped = this->spec_.activation_checkpointing
                                ? 0
                                : int64_t{batch} * this->spec_.dims.num_heads * seq * (seq - 1);
    return Cost(batch, seq).activation_bytes -
           dropped * static_cast<int64_t>(memory::DTypeSize(this->spec_.dtype));
  }

 private:
  layer::LayerCost Cost(int batch, int seq) const {
    return layer::BlockCost(this->spec_.dims, batch, seq, this->spec_.activation_checkpointing,
                            static_cast<int>(memory::DTypeSize(this->spec_.dtype)));
  }

  // Fills saved[kLn1 .. kFchGelu] from saved[kX].
  void ComputeInternals(const MicroBatch& mb, Saved* saved) {
    const int n = mb.batch * mb.seq;
    const int c = this->C();
    const int h = this->spec_.dims.num_heads;
    auto& s = saved->tensors;
    s.resize(kForwardCount);
    s[kLn1] = this->New({n, c});
    s[kLn1Mean] = this->New({n});
    s[kLn1Rstd] = this->New({n});
    s[kQkv] = this->New({n, 3 * c});
    s[kAtt] = this->New({mb.batch, h, mb.seq});  // the log-sum-exp of each attention row
    s[kAtty] = this->New({n, c});
    s[kRes2] = this->New({n, c});
    s[kLn2] = this->New({n, c});
    s[kLn2Mean] = this->New({n});
    s[kLn2Rstd] = this->New({n});
    s[kFch] = this->New({n, 4 * c});
    s[kFchGelu] = this->New({n, 4 * c});
    cpu::LayerNormForward(Base::D(s[kLn1]), Base::D(s[kLn1Mean]), Base::D(s[kLn1Rstd]),
                          Base::D(s[kX]), this->W(kLn1Weight), this->W(kLn1Bias), n, c);
    cpu::MatmulForward(Base::D(s[kQkv]), Base::D(s[kLn1]), this->W(kQkvWeight), this->W(kQkvBias),
                       n, c, 3 * c);
    cpu::FlashAttentionForward(Base::D(s[kAtty]), Base::D(s[kAtt]), Base::D(s[kQkv]), mb.batch,
                               mb.seq, c, h);
    Tensor attn_out = this->New({n, c});
    cpu::MatmulForward(Base::D(attn_out), Base::D(s[kAtty]), this->W(kProjWeight),
                       this->W(kProjBias), n, c, c);
    cpu::Add(Base::D(s[kRes2]), Base::D(s[kX]), Base::D(attn_out), int64_t{n} * c);
    cpu::LayerNormForward(Base::D(s[kLn2]), Base::D(s[kLn2Mean]), Base::D(s[kLn2Rstd]),
                          Base::D(s[kRes2]), this->W(kLn2Weight), this->W(kLn2Bias), n, c);
    cpu::MatmulForward(Base::D(s[kFch]), Base::D(s[kLn2]), this->W(kFcWeight), this->W(kFcBias), n,
                       c, 4 * c);
    cpu::GeluForward(Base::D(s[kFchGelu]), Base::D(s[kFch]), int64_t{n} * 4 * c);
  }

  void ComputeOutput(const MicroBatch& mb, const Saved& saved, Tensor* y) {
    const int n = mb.batch * mb.seq;
    const int c = this->C();
    cpu::MatmulForward(Base::D(*y), Base::D(saved.tensors[kFchGelu]), this->W(kFcProjWeight),
                       this->W(kFcProjBias), n, 4 * c, c);
    cpu::AddInPlace(Base::D(*y), Base::D(saved.tensors[kRes2]), int64_t{n} * c);
  }

  std::vector<ParamSpec> specs_;
};

const registry::Registrar<layer::Layer, const LayerSpec&> kRegister("gpt_block", "cpu",
                                                                    layer::MakeForDType<Block>);

}  // namespace
}  // namespace bigmac::stages::gpt
