// GPT-2 embedding: token embedding plus learned position embedding. Owns the tied token
// embedding `wte` that the head also uses.
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
class Embedding : public sdk::CpuLayer<T> {
  using Base = sdk::CpuLayer<T>;

 public:
  explicit Embedding(const LayerSpec& spec) : Base(spec), specs_(EmbeddingParams(spec.dims)) {
    for (const ParamSpec& param : specs_)
      this->AddParam(param.name, param.shape, param.weight_decay);
  }

  void InitParams(uint64_t seed) override {
    for (size_t i = 0; i < specs_.size(); ++i)
      InitParam(specs_[i], &this->params_[i].value, seed, this->layer_id());
  }

  void Forward(const MicroBatch& mb, const Tensor&, Tensor* y, Saved* saved) override {
    CheckBatch(mb);
    *y = this->NewActivation(mb.batch, mb.seq, this->C());
    cpu::EmbeddingForward(Base::D(*y), mb.tokens, this->W(kWte), this->W(kWpe), mb.batch, mb.seq,
                          this->C());
    saved->Clear();
  }

  // The embedding is the first layer: there is no input gradient. Keep dy for the weights.
  void BackwardInput(const MicroBatch&, const Tensor& dy, Tensor* dx, Saved* saved) override {
    if (dx) *dx = Tensor();
    saved->tensors.push_back(dy.Clone());
  }

  void BackwardWeight(const MicroBatch& mb, Saved* saved) override {
    cpu::EmbeddingBackwardWeight(this->G(kWte), this->G(kWpe), Base::D(saved->tensors.at(0)),
                                 mb.tokens, mb.batch, mb.seq, this->C());
    saved->Clear();
  }

  int64_t ForwardFlops(int batch, int seq) const override {
    return layer::EmbeddingCost(this->spec_.dims, batch, seq).forward_flops;
  }
  int64_t ActivationBytes(int, int) const override { return 0; }

 private:
  void CheckBatch(const MicroBatch& mb) const {
    if (mb.seq > this->spec_.dims.max_seq_length) {
      throw std::invalid_argument("embedding: sequence of " + std::to_string(mb.seq) +
                                  " tokens is longer than the position table (" +
                                  std::to_string(this->spec_.dims.max_seq_length) + ")");
    }
  }
  std::vector<ParamSpec> specs_;
};

const registry::Registrar<layer::Layer, const LayerSpec&> kRegister("gpt_embedding", "cpu",
                                                                    layer::MakeForDType<Embedding>);

}  // namespace
}  // namespace bigmac::stages::gpt
