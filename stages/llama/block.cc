// The llama block on the CPU: x + o(attn(rope(qkv(rmsnorm1(x))))), then + down(swiglu(gate_up(
// rmsnorm2(.)))), with grouped-query causal attention (the blocked attention with kv_heads: each
// group of query heads reads its key and value head in place, never copied per head), no biases.
// One body for tp = 1 and for a tensor-parallel group in Megatron's layout (stages/llama/params.h
// BlockShards): at tp = 1 the group sums are no-ops. Activation checkpointing:
// stages/checkpointed_block.h. Saved tensors follow stages/llama/params.h BlockSaved.
#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/layer/cost.h"
#include "core/layer/tp_layer.h"
#include "plugins/sdk/cpu_kernels.h"
#include "plugins/sdk/cpu_layer.h"
#include "stages/checkpointed_block.h"
#include "stages/llama/params.h"
#include "stages/residual_projection.h"

namespace bigmac::stages::llama {
namespace {

namespace cpu = sdk::cpu;
using sdk::LayerSpec, sdk::MicroBatch, sdk::Saved, sdk::Tensor;

// A block over `group` (null: tp = 1, a group of one).
template <typename T>
class Block : public CheckpointedBlock<T>, public layer::TpSharded {
  using Base = CheckpointedBlock<T>;
  using enum BlockSaved::Index;

 public:
  Block(const LayerSpec& spec, layer::TpGroup* group)
      : Base(spec), group_(group), specs_(BlockParams(spec.dims)) {
    const layer::ModelDims& d = spec.dims;
    const int tp = group ? group->size() : 1;
    if (d.arch != layer::Arch::kLlama) {
      throw std::invalid_argument(
          "llama_block needs model.arch: llama (its key/value heads, SwiGLU width, RoPE base and "
          "RMSNorm epsilon come from the llama keys)");
    }
    if (d.hidden_size % d.num_heads != 0 || d.head_dim() % 2 != 0 ||
        d.num_heads % d.kv_heads() != 0 || d.kv_heads() % tp != 0 ||
        d.intermediate_size % tp != 0) {
      throw std::invalid_argument(
          "llama_block: hidden_size " + std::to_string(d.hidden_size) + ", num_heads " +
          std::to_string(d.num_heads) + ", num_kv_heads " + std::to_string(d.kv_heads()) +
          ", intermediate_size " + std::to_string(d.intermediate_size) + " and tp " +
          std::to_string(tp) +
          " need an even head_dim, num_heads % num_kv_heads == 0, num_kv_heads % tp == 0 and "
          "intermediate_size % tp == 0");
    }
    hs_ = d.head_dim();
    hl_ = d.num_heads / tp;
    kvl_ = d.kv_heads() / tp;
    il_ = d.intermediate_size / tp;
    shards_ = BlockShards(d, specs_, group ? group->rank() : 0, tp);
    for (size_t i = 0; i < specs_.size(); ++i)
      this->AddParam(specs_[i].name, shards_[i].LocalShape(), specs_[i].weight_decay);
  }

  std::vector<layer::TpShard> Shards() const override { return shards_; }

  void InitParams(uint64_t seed) override {
    for (size_t i = 0; i < specs_.size(); ++i)
      InitSlice(specs_[i], shards_[i], &this->params_[i].value, seed, this->layer_id());
  }

  void BackwardInput(const MicroBatch& mb, const Tensor& dy, Tensor* dx, Saved* saved) override {
    this->RestoreInternals(mb, saved);
    auto& s = saved->tensors;
    const int n = mb.batch * mb.seq;
    const int c = this->C();
    s.push_back(dy.Clone());  // kDy
    // The gradients made with NewForOverwrite are whole outputs of their kernels (no "+=").
    // MLP: y = res2 + down(swiglu(gate_up(norm2(res2)))); down row-parallel (g's backward: dy as
    // is), gate_up column-parallel (f's backward: a sum over the group).
    Tensor dswiglu = this->NewForOverwrite({n, il_});
    Tensor dgate_up = this->NewForOverwrite({n, 2 * il_});
    cpu::MatmulSwigluBackwardInput(Base::D(dswiglu), Base::D(dgate_up), Base::D(dy),
                                   this->W(kDownWeight), Base::D(s[kGateUp]), n, il_, c);
    dswiglu = Tensor();
    s[kGateUp] = Tensor();
    Tensor dnorm2 = this->NewForOverwrite({n, c});
    cpu::MatmulBackwardInput(Base::D(dnorm2), Base::D(dgate_up), this->W(kGateUpWeight), n, c,
                             2 * il_);
    SumOverGroup(&dnorm2, "tp llama block: input gradient of mlp.gate_up_proj (f)");
    Tensor dres2 = this->NewForOverwrite({n, c});  // dy + the gradient through the norm
    cpu::RmsNormBackwardInput(Base::D(dres2), Base::D(dnorm2), Base::D(s[kRes2]),
                              this->W(kMlpNormWeight), Base::D(s[kRstd2]), n, c, Base::D(dy));
    // Attention: res2 = x + o(attn(rope(qkv(norm1(x))))); o row-parallel, qkv column-parallel
    // by heads.
    Tensor datty = this->NewForOverwrite({n, cl()});
    cpu::MatmulBackwardInput(Base::D(datty), Base::D(dres2), this->W(kOWeight), n, cl(), c);
    Tensor dqkv = this->NewForOverwrite({n, QkvWidth()});
    cpu::FlashAttentionBackward(Base::D(dqkv), Base::D(datty), Base::D(s[kQkv]), Base::D(s[kLse]),
                                mb.batch, mb.seq, cl(), hl_, kvl_);
    s[kLse] = Tensor();
    s[kQkv] = Tensor();
    Rotate(&dqkv, mb, /*inverse=*/true);  // the gradient of the values before the rotation
    Tensor dnorm1 = this->NewForOverwrite({n, c});
    cpu::MatmulBackwardInput(Base::D(dnorm1), Base::D(dqkv), this->W(kQkvWeight), n, c, QkvWidth());
    SumOverGroup(&dnorm1, "tp llama block: input gradient of self_attn.qkv_proj (f)");
    *dx = this->NewForOverwrite(dy.shape());  // dres2 + the gradient through the norm, as x
    cpu::RmsNormBackwardInput(Base::D(*dx), Base::D(dnorm1), Base::D(s[kX]),
                              this->W(kAttnNormWeight), Base::D(s[kRstd1]), n, c, Base::D(dres2));
    s.push_back(std::move(dgate_up));
    s.push_back(std::move(dnorm2));
    s.push_back(std::move(dres2));
    s.push_back(std::move(dqkv));
    s.push_back(std::move(dnorm1));
  }

  void BackwardWeight(const MicroBatch& mb, Saved* saved) override {
    auto& s = saved->tensors;
    const int n = mb.batch * mb.seq;
    const int c = this->C();
    cpu::MatmulBackwardWeight<T>(this->G(kDownWeight), nullptr, Base::D(s[kDy]),
                                 Base::D(s[kSwiglu]), n, il_, c);
    cpu::MatmulBackwardWeight<T>(this->G(kGateUpWeight), nullptr, Base::D(s[kDGateUp]),
                                 Base::D(s[kNorm2]), n, c, 2 * il_);
    cpu::RmsNormBackwardWeight(this->G(kMlpNormWeight), Base::D(s[kDNorm2]), Base::D(s[kRes2]),
                               Base::D(s[kRstd2]), n, c);
    cpu::MatmulBackwardWeight<T>(this->G(kOWeight), nullptr, Base::D(s[kDRes2]), Base::D(s[kAtty]),
                                 n, cl(), c);
    cpu::MatmulBackwardWeight<T>(this->G(kQkvWeight), nullptr, Base::D(s[kDQkv]),
                                 Base::D(s[kNorm1]), n, c, QkvWidth());
    cpu::RmsNormBackwardWeight(this->G(kAttnNormWeight), Base::D(s[kDNorm1]), Base::D(s[kX]),
                               Base::D(s[kRstd1]), n, c);
    saved->Clear();
  }

  int64_t ForwardFlops(int batch, int seq) const override { return Cost(batch, seq).forward_flops; }
  int64_t ActivationBytes(int batch, int seq) const override {
    return Cost(batch, seq).activation_bytes;
  }

 private:
  int cl() const { return hl_ * hs_; }                     // this rank's query width
  int QkvWidth() const { return (hl_ + 2 * kvl_) * hs_; }  // this rank's q|k|v row

  layer::LayerCost Cost(int batch, int seq) const {
    return layer::TpBlockCost(this->spec_.dims, group_ ? group_->size() : 1, batch, seq,
                              this->spec_.activation_checkpointing,
                              static_cast<int>(memory::DTypeSize(this->spec_.dtype)),
                              layer::AttentionSaves::kRowLogSumExp);
  }

  void SumOverGroup(Tensor* tensor, const char* what) {
    if (group_ != nullptr) group_->AllReduceSum(tensor, what);
  }

  // Turns q and k of each row of `qkv` (forward), or their gradients back (inverse), in place.
  void Rotate(Tensor* qkv, const MicroBatch& mb, bool inverse) {
    EnsureRopeTable(mb.seq);
    T* q = Base::D(*qkv);
    T* k = q + cl();
    for (auto [x, heads] : {std::pair{q, hl_}, std::pair{k, kvl_}}) {
      if (inverse) {
        cpu::RopeBackward(x, rope_cos_.data(), rope_sin_.data(), mb.batch, mb.seq, heads, hs_,
                          QkvWidth());
      } else {
        cpu::RopeForward(x, rope_cos_.data(), rope_sin_.data(), mb.batch, mb.seq, heads, hs_,
                         QkvWidth());
      }
    }
  }

  // The table's rows are positions, so one for the longest sequence serves every shorter one.
  void EnsureRopeTable(int seq) {
    const int rows = std::max(seq, this->spec_.dims.max_seq_length);
    if (rope_rows_ >= rows) return;
    rope_cos_.resize(int64_t{rows} * hs_ / 2);
    rope_sin_.resize(rope_cos_.size());
    cpu::RopeTable(rope_cos_.data(), rope_sin_.data(), rows, hs_, this->spec_.dims.rope_theta);
    rope_rows_ = rows;
  }

  // Fills saved[kNorm1 .. kSwiglu] from saved[kX].
  void ComputeInternals(const MicroBatch& mb, Saved* saved) override {
    const int n = mb.batch * mb.seq;
    const int c = this->C();
    auto& s = saved->tensors;
    s.resize(kForwardCount);
    // Every tensor below is a kernel's whole output (no "+="), so none is zeroed first.
    s[kNorm1] = this->NewForOverwrite({n, c});
    s[kRstd1] = this->NewForOverwrite({n});
    s[kQkv] = this->NewForOverwrite({n, QkvWidth()});
    s[kLse] = this->NewForOverwrite({mb.batch, hl_, mb.seq});
    s[kAtty] = this->NewForOverwrite({n, cl()});
    s[kRes2] = this->NewForOverwrite({n, c});
    s[kNorm2] = this->NewForOverwrite({n, c});
    s[kRstd2] = this->NewForOverwrite({n});
    s[kGateUp] = this->NewForOverwrite({n, 2 * il_});
    s[kSwiglu] = this->NewForOverwrite({n, il_});
    const double eps = this->spec_.dims.rms_norm_eps;
    cpu::RmsNormForward(Base::D(s[kNorm1]), Base::D(s[kRstd1]), Base::D(s[kX]),
                        this->W(kAttnNormWeight), n, c, eps);
    cpu::MatmulForward<T>(Base::D(s[kQkv]), Base::D(s[kNorm1]), this->W(kQkvWeight), nullptr, n, c,
                          QkvWidth());
    Rotate(&s[kQkv], mb, /*inverse=*/false);
    cpu::FlashAttentionForward(Base::D(s[kAtty]), Base::D(s[kLse]), Base::D(s[kQkv]), mb.batch,
                               mb.seq, cl(), hl_, kvl_);
    RowParallelResidual(&s[kRes2], s[kAtty], kOWeight, s[kX], n, cl(),
                        "tp llama block: self_attn.o_proj output (g)");
    cpu::RmsNormForward(Base::D(s[kNorm2]), Base::D(s[kRstd2]), Base::D(s[kRes2]),
                        this->W(kMlpNormWeight), n, c, eps);
    cpu::MatmulSwigluForward(Base::D(s[kGateUp]), Base::D(s[kSwiglu]), Base::D(s[kNorm2]),
                             this->W(kGateUpWeight), n, c, il_);
  }

  void ComputeOutput(const MicroBatch& mb, const Saved& saved, Tensor* y) override {
    RowParallelResidual(y, saved.tensors[kSwiglu], kDownWeight, saved.tensors[kRes2],
                        mb.batch * mb.seq, il_, "tp llama block: mlp.down_proj output (g)");
  }

  // out = inp w^T, summed over the group, + residual: a row-parallel projection into the residual
  // stream (stages/residual_projection.h).
  void RowParallelResidual(Tensor* out, const Tensor& inp, BlockParam w, const Tensor& residual,
                           int n, int in, const char* what) {
    std::function<void(Tensor*)> sum;
    if (group_ != nullptr) sum = [this, what](Tensor* t) { SumOverGroup(t, what); };
    ProjectIntoResidual<T>(out, inp, this->W(w), nullptr, residual, n, in, this->C(), sum);
  }

  layer::TpGroup* group_;  // null at tp = 1; else outlives the layer
  std::vector<ParamSpec> specs_;
  std::vector<layer::TpShard> shards_;
  int hs_ = 0;                          // head_dim
  int hl_ = 0;                          // query heads on this rank
  int kvl_ = 0;                         // key/value heads on this rank
  int il_ = 0;                          // SwiGLU width on this rank
  std::vector<T> rope_cos_, rope_sin_;  // (rope_rows_, head_dim / 2)
  int rope_rows_ = 0;
};

// The plain factory builds the group-of-one block.
template <typename T>
class PlainBlock : public Block<T> {
 public:
  explicit PlainBlock(const LayerSpec& spec) : Block<T>(spec, nullptr) {}
};

const registry::Registrar<layer::Layer, const LayerSpec&> kRegister(
    "llama_block", "cpu", layer::MakeForDType<PlainBlock>);
const registry::Registrar<layer::Layer, const LayerSpec&, layer::TpGroup*> kRegisterTp(
    "llama_block", "cpu", MakeTpForDType<Block>);

}  // namespace
}  // namespace bigmac::stages::llama
