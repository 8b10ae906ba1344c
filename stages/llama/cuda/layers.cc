// The llama layers on CUDA (llama_embedding, llama_block, llama_head for backend "cuda"): the CPU
// layers' algorithm (stages/llama) with cuBLASLt GEMMs (stages/cuda/gemm.h), cuDNN's fused
// grouped-query attention where it serves the shape (stages/cuda/sdpa.h), the fallback attention
// elsewhere, and kernels of our own (stages/cuda/kernels.h). The embedding and head are
// stages/cuda/vocab_layers.h's. Activations are T (fp32 or bf16); masters and gradients fp32.
#include <cuda_bf16.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/layer/cost.h"
#include "plugins/sdk/cpu_kernels.h"
#include "stages/cuda/cuda_block.h"
#include "stages/cuda/gemm.h"
#include "stages/cuda/kernels.h"
#include "stages/cuda/sdpa.h"
#include "stages/cuda/sdpa_layout.h"
#include "stages/cuda/vocab_layers.h"
#include "stages/gpt/cuda/constraints.h"
#include "stages/llama/params.h"

namespace bigmac::stages::llama::cuda {
namespace {

namespace k = ::bigmac::stages::cuda;
using layer::LayerSpec;
using layer::MicroBatch;
using layer::Saved;
using memory::DType;
using memory::Tensor;

// x + o(attn(rope(qkv(rmsnorm1(x))))), then + down(swiglu(gate_up(rmsnorm2(.)))), no biases, as
// stages/llama/block.cc at tp = 1, in its saved-tensor order (stages/llama/params.h BlockSaved).
// kLse holds cuDNN's log-sum-exp (B,h,T) or, on the fallback, the probabilities (B,h,T,T), as
// the CUDA GPT block's kAtt does.
template <typename T>
class Block : public k::CudaBlock<T> {
  using Base = k::CudaBlock<T>;
  using enum BlockSaved::Index;

 public:
  explicit Block(const LayerSpec& spec)
      : Base(spec, BlockParams(spec.dims), spec.dims.num_heads, spec.dims.kv_heads(),
             spec.dims.num_heads > 0 ? spec.dims.head_dim() : 0),
        inner_(spec.dims.intermediate_size) {
    if (spec.dims.arch != layer::Arch::kLlama) {
      throw std::invalid_argument(
          "llama_block (cuda) needs model.arch: llama (its key/value heads, SwiGLU width, RoPE "
          "base and RMSNorm epsilon come from the llama keys)");
    }
    if (const auto problems = gpt::cuda::CudaModelProblems(spec.dims); !problems.empty())
      throw std::invalid_argument("llama_block (cuda): " + problems.front());
    if (this->head_dim_ % 2 != 0 || this->kv_heads_ <= 0 || this->heads_ % this->kv_heads_ != 0 ||
        inner_ <= 0) {
      throw std::invalid_argument(
          "llama_block (cuda): head_dim " + std::to_string(this->head_dim_) + ", num_heads " +
          std::to_string(this->heads_) + ", num_kv_heads " + std::to_string(this->kv_heads_) +
          ", intermediate_size " + std::to_string(inner_) +
          " need an even head_dim, num_heads % num_kv_heads == 0 and a "
          "positive intermediate_size");
    }
  }

  void BackwardInput(const MicroBatch& mb, const Tensor& dy, Tensor* dx, Saved* saved) override {
    const device::cuda::CallSite site = this->Site("backward");
    auto& s = saved->tensors;
    if (s.size() == 1) ComputeInternals(this->Site("recompute"), mb, saved);
    const int n = mb.batch * mb.seq;
    const int c = this->C();
    const DType dt = Base::kActivation;
    s.push_back(dy.Clone());  // kDy
    // MLP: y = res2 + down(swiglu(gate_up(norm2(res2)))).
    Tensor dswiglu = this->New({n, inner_});
    k::MatmulBackwardInput(site.In("mlp.down_proj dgrad"), dt, dswiglu.raw(), dy.raw(),
                           this->W(kDownWeight), n, inner_, c);
    Tensor dgate_up = this->New({n, 2 * inner_});
    k::SwigluBackward(site, Base::P(dgate_up), Base::P(dswiglu), Base::P(s[kGateUp]), n, inner_);
    dswiglu = Tensor();
    s[kGateUp] = Tensor();
    Tensor dnorm2 = this->New({n, c});
    k::MatmulBackwardInput(site.In("mlp.gate_up_proj dgrad"), dt, dnorm2.raw(), dgate_up.raw(),
                           this->W(kGateUpWeight), n, c, 2 * inner_);
    Tensor dres2 = dy.Clone();
    k::RmsNormBackwardInput(site, Base::P(dres2), Base::P(dnorm2), Base::P(s[kRes2]),
                            this->W(kMlpNormWeight), Base::F(s[kRstd2]), n, c);
    // Attention: res2 = x + o(attn(rope(qkv(norm1(x))))).
    Tensor datty = this->New({n, c});
    k::MatmulBackwardInput(site.In("self_attn.o_proj dgrad"), dt, datty.raw(), dres2.raw(),
                           this->W(kOWeight), n, c, c);
    Tensor dqkv = this->New({n, QkvWidth()});
    if (this->UseCudnn(mb)) {
      k::CudnnAttentionBackward(site.In("attention"), dqkv.raw(), datty.raw(), s[kQkv].raw(),
                                s[kAtty].raw(), Base::F(s[kLse]), mb.batch, mb.seq, this->heads_,
                                this->head_dim_, this->kv_heads_);
    } else {
      k::AttentionBackward(site, Base::P(dqkv), Base::P(datty), Base::P(s[kQkv]), Base::F(s[kLse]),
                           mb.batch, mb.seq, c, this->heads_, this->kv_heads_);
    }
    s[kLse] = Tensor();
    s[kQkv] = Tensor();
    // The gradient of q and k before the rotation.
    k::RopeBackward(site, Base::P(dqkv), Base::F(rope_cos_), Base::F(rope_sin_), mb.batch, mb.seq,
                    this->heads_ + this->kv_heads_, this->head_dim_, QkvWidth());
    Tensor dnorm1 = this->New({n, c});
    k::MatmulBackwardInput(site.In("self_attn.qkv_proj dgrad"), dt, dnorm1.raw(), dqkv.raw(),
                           this->W(kQkvWeight), n, c, QkvWidth());
    *dx = dres2.Clone();
    k::RmsNormBackwardInput(site, Base::P(*dx), Base::P(dnorm1), Base::P(s[kX]),
                            this->W(kAttnNormWeight), Base::F(s[kRstd1]), n, c);
    s.push_back(std::move(dgate_up));
    s.push_back(std::move(dnorm2));
    s.push_back(std::move(dres2));
    s.push_back(std::move(dqkv));
    s.push_back(std::move(dnorm1));
  }

  void BackwardWeight(const MicroBatch& mb, Saved* saved) override {
    const device::cuda::CallSite site = this->Site("weight gradient");
    auto& s = saved->tensors;
    const int n = mb.batch * mb.seq;
    const int c = this->C();
    const DType dt = Base::kActivation;
    k::MatmulBackwardWeight(site.In("mlp.down_proj wgrad"), dt, this->G(kDownWeight), nullptr,
                            s[kDy].raw(), s[kSwiglu].raw(), n, inner_, c);
    k::MatmulBackwardWeight(site.In("mlp.gate_up_proj wgrad"), dt, this->G(kGateUpWeight), nullptr,
                            s[kDGateUp].raw(), s[kNorm2].raw(), n, c, 2 * inner_);
    k::RmsNormBackwardWeight(site, this->G(kMlpNormWeight), Base::P(s[kDNorm2]), Base::P(s[kRes2]),
                             Base::F(s[kRstd2]), n, c);
    k::MatmulBackwardWeight(site.In("self_attn.o_proj wgrad"), dt, this->G(kOWeight), nullptr,
                            s[kDRes2].raw(), s[kAtty].raw(), n, c, c);
    k::MatmulBackwardWeight(site.In("self_attn.qkv_proj wgrad"), dt, this->G(kQkvWeight), nullptr,
                            s[kDQkv].raw(), s[kNorm1].raw(), n, c, QkvWidth());
    k::RmsNormBackwardWeight(site, this->G(kAttnNormWeight), Base::P(s[kDNorm1]), Base::P(s[kX]),
                             Base::F(s[kRstd1]), n, c);
    saved->Clear();
  }

  int64_t ForwardFlops(int batch, int seq) const override { return Cost(batch, seq).forward_flops; }
  // The cost model counts the (B,h,T,T) probabilities, which the fallback keeps; cuDNN keeps their
  // (B,h,T) log-sum-exp instead.
  int64_t ActivationBytes(int batch, int seq) const override {
    const bool dropped = this->cudnn_allowed_ && !this->spec_.activation_checkpointing;
    return Cost(batch, seq).activation_bytes -
           (dropped ? int64_t{batch} * this->heads_ * seq * (seq - 1) *
                          static_cast<int64_t>(memory::DTypeSize(Base::kActivation))
                    : 0);
  }

 private:
  int QkvWidth() const {
    return (this->heads_ + 2 * this->kv_heads_) * this->head_dim_;
  }  // q|k|v row

  layer::LayerCost Cost(int batch, int seq) const {
    return layer::BlockCost(this->spec_.dims, batch, seq, this->spec_.activation_checkpointing,
                            static_cast<int>(memory::DTypeSize(Base::kActivation)));
  }

  // The CPU's RopeTable (fp32, computed in double), uploaded once for the longest sequence seen:
  // its rows are positions, so it serves every shorter one.
  void EnsureRopeTable(int seq) {
    const int rows = std::max(seq, this->spec_.dims.max_seq_length);
    if (rope_rows_ >= rows) return;
    std::vector<float> cos(int64_t{rows} * this->head_dim_ / 2), sin(cos.size());
    sdk::cpu::RopeTable(cos.data(), sin.data(), rows, this->head_dim_, this->spec_.dims.rope_theta);
    rope_cos_ = this->NewFloat({rows, this->head_dim_ / 2});
    rope_sin_ = this->NewFloat({rows, this->head_dim_ / 2});
    rope_cos_.CopyFromHost(cos.data());
    rope_sin_.CopyFromHost(sin.data());
    rope_rows_ = rows;
  }

  // Fills saved[kNorm1 .. kSwiglu] from saved[kX].
  void ComputeInternals(const device::cuda::CallSite& site, const MicroBatch& mb,
                        Saved* saved) override {
    const int n = mb.batch * mb.seq;
    const int c = this->C();
    const DType dt = Base::kActivation;
    const double eps = this->spec_.dims.rms_norm_eps;
    auto& s = saved->tensors;
    s.resize(kForwardCount);
    s[kNorm1] = this->New({n, c});
    s[kRstd1] = this->NewFloat({n});
    s[kQkv] = this->New({n, QkvWidth()});
    const bool cudnn = this->UseCudnn(mb);
    s[kLse] = cudnn ? this->NewFloat({mb.batch, this->heads_, mb.seq})
                    : this->NewFloat({mb.batch, this->heads_, mb.seq, mb.seq});
    s[kAtty] = this->New({n, c});
    s[kRes2] = this->New({n, c});
    s[kNorm2] = this->New({n, c});
    s[kRstd2] = this->NewFloat({n});
    s[kGateUp] = this->New({n, 2 * inner_});
    s[kSwiglu] = this->New({n, inner_});
    k::RmsNormForward(site, Base::P(s[kNorm1]), Base::F(s[kRstd1]), Base::P(s[kX]),
                      this->W(kAttnNormWeight), n, c, eps);
    k::MatmulForward(site.In("self_attn.qkv_proj GEMM"), dt, s[kQkv].raw(), s[kNorm1].raw(),
                     this->W(kQkvWeight), nullptr, n, c, QkvWidth());
    // q and k heads are contiguous at the start of each row: one rotation turns both.
    EnsureRopeTable(mb.seq);
    k::RopeForward(site, Base::P(s[kQkv]), Base::F(rope_cos_), Base::F(rope_sin_), mb.batch, mb.seq,
                   this->heads_ + this->kv_heads_, this->head_dim_, QkvWidth());
    if (cudnn) {
      k::CudnnAttentionForward(site.In("attention"), s[kAtty].raw(), Base::F(s[kLse]),
                               s[kQkv].raw(), mb.batch, mb.seq, this->heads_, this->head_dim_,
                               this->kv_heads_);
    } else {
      k::AttentionForward(site, Base::P(s[kAtty]), Base::F(s[kLse]), Base::P(s[kQkv]), mb.batch,
                          mb.seq, c, this->heads_, this->kv_heads_);
    }
    Tensor attn_out = this->New({n, c});
    k::MatmulForward(site.In("self_attn.o_proj GEMM"), dt, attn_out.raw(), s[kAtty].raw(),
                     this->W(kOWeight), nullptr, n, c, c);
    k::Add(site, Base::P(s[kRes2]), Base::P(s[kX]), Base::P(attn_out), int64_t{n} * c);
    k::RmsNormForward(site, Base::P(s[kNorm2]), Base::F(s[kRstd2]), Base::P(s[kRes2]),
                      this->W(kMlpNormWeight), n, c, eps);
    k::MatmulForward(site.In("mlp.gate_up_proj GEMM"), dt, s[kGateUp].raw(), s[kNorm2].raw(),
                     this->W(kGateUpWeight), nullptr, n, c, 2 * inner_);
    k::SwigluForward(site, Base::P(s[kSwiglu]), Base::P(s[kGateUp]), n, inner_);
  }

  void ComputeOutput(const device::cuda::CallSite& site, const MicroBatch& mb, const Saved& saved,
                     Tensor* y) override {
    const int n = mb.batch * mb.seq;
    const int c = this->C();
    k::MatmulForward(site.In("mlp.down_proj GEMM"), Base::kActivation, y->raw(),
                     saved.tensors[kSwiglu].raw(), this->W(kDownWeight), nullptr, n, inner_, c);
    k::AddInPlace(site, Base::P(*y), Base::P(saved.tensors[kRes2]), int64_t{n} * c);
  }

  const int inner_;             // SwiGLU width
  Tensor rope_cos_, rope_sin_;  // (rope_rows_, head_dim / 2) fp32
  int rope_rows_ = 0;
};

const registry::Registrar<layer::Layer, const LayerSpec&> kBlock("llama_block", "cuda",
                                                                 k::MakeForPrecision<Block>);
const k::VocabRegistration<Vocab> kVocab("llama_embedding", "llama_head");

}  // namespace
}  // namespace bigmac::stages::llama::cuda
