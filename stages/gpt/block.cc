// GPT-2 transformer block on the CPU (tp = 1): the arithmetic is stages/gpt/cpu_block.h's, with the
// whole width on this rank and no group to sum over.
#include <stdexcept>
#include <string>

#include "plugins/sdk/init.h"
#include "stages/gpt/cpu_block.h"

namespace bigmac::stages::gpt {
namespace {

using sdk::LayerSpec, sdk::Tensor;

template <typename T>
class Block : public CpuBlockBody<T> {
 public:
  explicit Block(const LayerSpec& spec)
      : CpuBlockBody<T>(spec, spec.dims.hidden_size, spec.dims.num_heads),
        specs_(BlockParams(spec.dims)) {
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

 protected:
  layer::LayerCost Cost(int batch, int seq) const override {
    return layer::BlockCost(this->spec_.dims, batch, seq, this->spec_.activation_checkpointing,
                            static_cast<int>(memory::DTypeSize(this->spec_.dtype)),
                            layer::AttentionSaves::kRowLogSumExp);
  }
  void SumOverGroup(Tensor*, const char*) override {}  // a group of one
  bool AddsRowParallelBias() const override { return true; }
  bool HasGroup() const override { return false; }

 private:
  std::vector<ParamSpec> specs_;
};

const registry::Registrar<layer::Layer, const LayerSpec&> kRegister("gpt_block", "cpu",
                                                                    layer::MakeForDType<Block>);

}  // namespace
}  // namespace bigmac::stages::gpt
