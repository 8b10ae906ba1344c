// GPT-2 head: final LayerNorm, output projection tied to the token embedding, cross-entropy.
// The head holds a read-only copy of the embedding's `wte` (the embedding's stage owns it).
#include "core/layer/cost.h"
#include "plugins/sdk/cpu_kernels.h"
#include "plugins/sdk/cpu_layer.h"
#include "plugins/sdk/init.h"
#include "stages/gpt/params.h"

namespace bigmac::stages::gpt {
namespace {

namespace cpu = sdk::cpu;
using sdk::LayerSpec, sdk::MicroBatch, sdk::Saved, sdk::Tensor;

template <typename T>
class Head : public sdk::CpuLayer<T> {
  using Base = sdk::CpuLayer<T>;
  enum SavedIndex { kX, kNorm, kMean, kRstd, kLogits, kDLogits, kDNorm };

 public:
  explicit Head(const LayerSpec& spec) : Base(spec), specs_(HeadParams(spec.dims)) {
    for (const ParamSpec& param : specs_) {
      this->AddParam(param.name, param.shape, param.weight_decay);
      this->params_.back().tied_copy = param.tied_copy;
      this->params_.back().tied_owner = param.tied_owner;
    }
  }

  void InitParams(uint64_t seed) override {
    for (size_t i = 0; i < specs_.size(); ++i)
      InitParam(specs_[i], &this->params_[i].value, seed, this->layer_id());
  }

  // y: the loss of this micro-batch, sum(token losses) * loss_scale, as a 1-element tensor; without
  // targets (mb.targets null: text generation), the logits, (batch * seq, vocab).
  void Forward(const MicroBatch& mb, const Tensor& x, Tensor* y, Saved* saved) override {
    const int n = mb.batch * mb.seq;
    saved->Clear();
    saved->tensors.push_back(x.Clone());
    saved->tensors.push_back(this->New({n, this->C()}));
    saved->tensors.push_back(this->New({n}));
    saved->tensors.push_back(this->New({n}));
    saved->tensors.push_back(this->New({n, this->V()}));
    auto& s = saved->tensors;
    cpu::LayerNormForward(Base::D(s[kNorm]), Base::D(s[kMean]), Base::D(s[kRstd]), Base::D(x),
                          this->W(kLnfWeight), this->W(kLnfBias), n, this->C());
    cpu::MatmulForward<T>(Base::D(s[kLogits]), Base::D(s[kNorm]), this->W(kHeadWte), nullptr, n,
                          this->C(), this->V());
    if (mb.targets == nullptr) {
      *y = std::move(s[kLogits]);
      saved->Clear();
      return;
    }
    *y = this->New({1});
    Base::D(*y)[0] = static_cast<T>(
        cpu::CrossEntropyLossSum(Base::D(s[kLogits]), mb.targets, n, this->V()) * mb.loss_scale);
  }

  // dy is ignored: the head starts the backward with d(loss)/d(loss) = 1.
  void BackwardInput(const MicroBatch& mb, const Tensor&, Tensor* dx, Saved* saved) override {
    const int n = mb.batch * mb.seq;
    auto& s = saved->tensors;
    Tensor dlogits = this->New({n, this->V()});
    cpu::CrossEntropyBackward(Base::D(dlogits), Base::D(s[kLogits]), mb.targets, n, this->V(),
                              mb.loss_scale);
    s[kLogits] = Tensor();  // no longer needed
    Tensor dnorm = this->New({n, this->C()});
    cpu::MatmulBackwardInput(Base::D(dnorm), Base::D(dlogits), this->W(kHeadWte), n, this->C(),
                             this->V());
    *dx = this->NewActivation(mb.batch, mb.seq, this->C());
    cpu::LayerNormBackwardInput(Base::D(*dx), Base::D(dnorm), Base::D(s[kX]), this->W(kLnfWeight),
                                Base::D(s[kMean]), Base::D(s[kRstd]), n, this->C());
    s.push_back(std::move(dlogits));
    s.push_back(std::move(dnorm));
  }

  void BackwardWeight(const MicroBatch& mb, Saved* saved) override {
    const int n = mb.batch * mb.seq;
    auto& s = saved->tensors;
    cpu::MatmulBackwardWeight<T>(this->G(kHeadWte), nullptr, Base::D(s[kDLogits]),
                                 Base::D(s[kNorm]), n, this->C(), this->V());
    cpu::LayerNormBackwardWeight(this->G(kLnfWeight), this->G(kLnfBias), Base::D(s[kDNorm]),
                                 Base::D(s[kX]), Base::D(s[kMean]), Base::D(s[kRstd]), n,
                                 this->C());
    saved->Clear();
  }

  int64_t ForwardFlops(int batch, int seq) const override {
    return layer::HeadCost(this->spec_.dims, batch, seq).forward_flops;
  }
  int64_t ActivationBytes(int batch, int seq) const override {
    return layer::HeadCost(this->spec_.dims, batch, seq,
                           static_cast<int>(memory::DTypeSize(this->spec_.dtype)))
        .activation_bytes;
  }

 private:
  std::vector<ParamSpec> specs_;
};

const registry::Registrar<layer::Layer, const LayerSpec&> kRegister("gpt_head", "cpu",
                                                                    layer::MakeForDType<Head>);

}  // namespace
}  // namespace bigmac::stages::gpt
