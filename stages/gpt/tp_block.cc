// The GPT-2 block over a tensor-parallel group (Megatron-LM's layout): each of the group's
// `tp` ranks holds num_heads/tp heads of the fused q, k, v projection and hidden*4/tp columns of
// the MLP (column-parallel), and the matching input columns of the attention output and fc2
// projections (row-parallel). Forward: the replicated input goes into the column-parallel GEMMs
// as is (Megatron's f: identity), and each row-parallel GEMM's partial output is summed over the
// group (g: one all-reduce). Backward: the conjugates (g: identity; f: one all-reduce of the
// input gradient of each column-parallel GEMM). LayerNorms and the row-parallel biases are
// replicated; their gradients come out equal on every rank (computed from equal tensors). The
// bias of a row-parallel GEMM is added by tp rank 0 only, before the sum. The arithmetic is the
// tp = 1 block's (stages/gpt/cpu_block.h) at the local widths; this file adds the slicing.
#include <stdexcept>
#include <string>

#include "core/layer/tp_layer.h"
#include "stages/gpt/cpu_block.h"
#include "stages/gpt/tp_params.h"

namespace bigmac::stages::gpt {
namespace {

using sdk::LayerSpec, sdk::Tensor;

template <typename T>
class TpBlock : public CpuBlockBody<T>, public layer::TpSharded {
 public:
  TpBlock(const LayerSpec& spec, layer::TpGroup* group)
      : CpuBlockBody<T>(spec, spec.dims.hidden_size / group->size(),
                        spec.dims.num_heads / group->size()),
        group_(group),
        specs_(BlockParams(spec.dims)) {
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
  }

  std::vector<layer::TpShard> Shards() const override { return shards_; }

  void InitParams(uint64_t seed) override {
    for (size_t i = 0; i < specs_.size(); ++i)
      InitSlice(specs_[i], shards_[i], &this->params_[i].value, seed, this->layer_id());
  }

 protected:
  layer::LayerCost Cost(int batch, int seq) const override {
    return layer::TpBlockCost(this->spec_.dims, group_->size(), batch, seq,
                              this->spec_.activation_checkpointing,
                              static_cast<int>(memory::DTypeSize(this->spec_.dtype)),
                              layer::AttentionSaves::kRowLogSumExp);
  }
  void SumOverGroup(Tensor* tensor, const char* what) override {
    group_->AllReduceSum(tensor, what);
  }
  bool AddsRowParallelBias() const override { return group_->rank() == 0; }
  bool HasGroup() const override { return true; }

 private:
  layer::TpGroup* group_;
  std::vector<ParamSpec> specs_;
  std::vector<layer::TpShard> shards_;
};

const registry::Registrar<layer::Layer, const LayerSpec&, layer::TpGroup*> kRegister(
    "gpt_block", "cpu", MakeTpForDType<TpBlock>);

}  // namespace
}  // namespace bigmac::stages::gpt
