// The GPT-2 layers on CUDA (gpt_embedding, gpt_block, gpt_head for backend "cuda"; the embedding
// and head are stages/cuda/vocab_layers.h's): the CPU layers' algorithm (stages/gpt) with cuBLASLt
// GEMMs (stages/cuda/gemm.h), cuDNN's fused
// attention where it serves the shape (stages/cuda/sdpa.h) and kernels of our own
// (stages/cuda/kernels.h). Activations are T (fp32 or bf16); masters and gradients fp32.
#include <cuda_bf16.h>

#include <memory>
#include <string>
#include <utility>

#include "core/layer/cost.h"
#include "stages/cuda/cuda_block.h"
#include "stages/cuda/gemm.h"
#include "stages/cuda/kernels.h"
#include "stages/cuda/sdpa.h"
#include "stages/cuda/sdpa_layout.h"
#include "stages/cuda/vocab_layers.h"
#include "stages/gpt/cuda/constraints.h"
#include "stages/gpt/params.h"

namespace bigmac::stages::gpt::cuda {
namespace {

namespace k = ::bigmac::stages::cuda;
using k::CudaLayer;
using k::MakeForPrecision;
using layer::LayerSpec;
using layer::MicroBatch;
using layer::Saved;
using memory::DType;
using memory::Tensor;

template <typename T>
class Block : public k::CudaBlock<T> {
  using Base = k::CudaBlock<T>;
  // Saved tensors: the CPU block's order (stages/gpt/params.h).
  using enum BlockSaved::Index;

 public:
  explicit Block(const LayerSpec& spec)
      : Base(spec, BlockParams(spec.dims), spec.dims.num_heads, spec.dims.num_heads,
             spec.dims.num_heads > 0 ? spec.dims.hidden_size / spec.dims.num_heads : 0) {
    if (const auto problems = CudaModelProblems(spec.dims); !problems.empty())
      throw std::invalid_argument("gpt_block (cuda): " + problems.front());
  }

  void BackwardInput(const MicroBatch& mb, const Tensor& dy, Tensor* dx, Saved* saved) override {
    const device::cuda::CallSite site = this->Site("backward");
    auto& s = saved->tensors;
    if (s.size() == 1) ComputeInternals(this->Site("recompute"), mb, saved);
    const int n = mb.batch * mb.seq;
    const int c = this->C();
    const DType dt = Base::kActivation;
    s.push_back(dy.Clone());  // kDy
    // MLP: y = res2 + proj(gelu(fc(ln2(res2)))).
    Tensor dfch_gelu = this->New({n, 4 * c});
    k::MatmulBackwardInput(site.In("mlp.proj dgrad"), dt, dfch_gelu.raw(), dy.raw(),
                           this->W(kFcProjWeight), n, 4 * c, c);
    Tensor dfch = this->New({n, 4 * c});
    k::GeluBackward(site, Base::P(dfch), Base::P(s[kFch]), Base::P(dfch_gelu), int64_t{n} * 4 * c);
    dfch_gelu = Tensor();
    s[kFch] = Tensor();
    Tensor dln2 = this->New({n, c});
    k::MatmulBackwardInput(site.In("mlp.fc dgrad"), dt, dln2.raw(), dfch.raw(), this->W(kFcWeight),
                           n, c, 4 * c);
    Tensor dres2 = dy.Clone();
    k::LayerNormBackwardInput(site, Base::P(dres2), Base::P(dln2), Base::P(s[kRes2]),
                              this->W(kLn2Weight), Base::F(s[kLn2Mean]), Base::F(s[kLn2Rstd]), n,
                              c);
    // Attention: res2 = x + proj(attn(qkv(ln1(x)))).
    Tensor datty = this->New({n, c});
    k::MatmulBackwardInput(site.In("attn.proj dgrad"), dt, datty.raw(), dres2.raw(),
                           this->W(kProjWeight), n, c, c);
    Tensor dqkv = this->New({n, 3 * c});
    const int h = this->spec_.dims.num_heads;
    if (this->UseCudnn(mb)) {
      k::CudnnAttentionBackward(site.In("attention"), dqkv.raw(), datty.raw(), s[kQkv].raw(),
                                s[kAtty].raw(), Base::F(s[kAtt]), mb.batch, mb.seq, h,
                                this->head_dim_);
    } else {
      k::AttentionBackward(site, Base::P(dqkv), Base::P(datty), Base::P(s[kQkv]), Base::F(s[kAtt]),
                           mb.batch, mb.seq, c, h);
    }
    s[kAtt] = Tensor();
    s[kQkv] = Tensor();
    Tensor dln1 = this->New({n, c});
    k::MatmulBackwardInput(site.In("attn.qkv dgrad"), dt, dln1.raw(), dqkv.raw(),
                           this->W(kQkvWeight), n, c, 3 * c);
    *dx = dres2.Clone();
    k::LayerNormBackwardInput(site, Base::P(*dx), Base::P(dln1), Base::P(s[kX]),
                              this->W(kLn1Weight), Base::F(s[kLn1Mean]), Base::F(s[kLn1Rstd]), n,
                              c);
    s.push_back(std::move(dfch));
    s.push_back(std::move(dln2));
    s.push_back(std::move(dres2));
    s.push_back(std::move(dqkv));
    s.push_back(std::move(dln1));
  }

  void BackwardWeight(const MicroBatch& mb, Saved* saved) override {
    const device::cuda::CallSite site = this->Site("weight gradient");
    auto& s = saved->tensors;
    const int n = mb.batch * mb.seq;
    const int c = this->C();
    const DType dt = Base::kActivation;
    k::MatmulBackwardWeight(site.In("mlp.proj wgrad"), dt, this->G(kFcProjWeight),
                            this->G(kFcProjBias), s[kDy].raw(), s[kFchGelu].raw(), n, 4 * c, c);
    k::MatmulBackwardWeight(site.In("mlp.fc wgrad"), dt, this->G(kFcWeight), this->G(kFcBias),
                            s[kDFch].raw(), s[kLn2].raw(), n, c, 4 * c);
    k::LayerNormBackwardWeight(site, this->G(kLn2Weight), this->G(kLn2Bias), Base::P(s[kDLn2]),
                               Base::P(s[kRes2]), Base::F(s[kLn2Mean]), Base::F(s[kLn2Rstd]), n, c);
    k::MatmulBackwardWeight(site.In("attn.proj wgrad"), dt, this->G(kProjWeight),
                            this->G(kProjBias), s[kDRes2].raw(), s[kAtty].raw(), n, c, c);
    k::MatmulBackwardWeight(site.In("attn.qkv wgrad"), dt, this->G(kQkvWeight), this->G(kQkvBias),
                            s[kDQkv].raw(), s[kLn1].raw(), n, c, 3 * c);
    k::LayerNormBackwardWeight(site, this->G(kLn1Weight), this->G(kLn1Bias), Base::P(s[kDLn1]),
                               Base::P(s[kX]), Base::F(s[kLn1Mean]), Base::F(s[kLn1Rstd]), n, c);
    saved->Clear();
  }

  int64_t ForwardFlops(int batch, int seq) const override {
    return layer::BlockCost(this->spec_.dims, batch, seq, this->spec_.activation_checkpointing,
                            static_cast<int>(memory::DTypeSize(Base::kActivation)))
        .forward_flops;
  }
  int64_t ActivationBytes(int batch, int seq) const override {
    return layer::BlockCost(this->spec_.dims, batch, seq, this->spec_.activation_checkpointing,
                            static_cast<int>(memory::DTypeSize(Base::kActivation)))
        .activation_bytes;
  }

 private:
  // Fills saved[kLn1 .. kFchGelu] from saved[kX].
  void ComputeInternals(const device::cuda::CallSite& site, const MicroBatch& mb,
                        Saved* saved) override {
    const int n = mb.batch * mb.seq;
    const int c = this->C();
    const int h = this->spec_.dims.num_heads;
    const DType dt = Base::kActivation;
    auto& s = saved->tensors;
    s.resize(kForwardCount);
    s[kLn1] = this->New({n, c});
    s[kLn1Mean] = this->NewFloat({n});
    s[kLn1Rstd] = this->NewFloat({n});
    s[kQkv] = this->New({n, 3 * c});
    const bool cudnn = this->UseCudnn(mb);
    s[kAtt] = cudnn ? this->NewFloat({mb.batch, h, mb.seq})
                    : this->NewFloat({mb.batch, h, mb.seq, mb.seq});
    s[kAtty] = this->New({n, c});
    s[kRes2] = this->New({n, c});
    s[kLn2] = this->New({n, c});
    s[kLn2Mean] = this->NewFloat({n});
    s[kLn2Rstd] = this->NewFloat({n});
    s[kFch] = this->New({n, 4 * c});
    s[kFchGelu] = this->New({n, 4 * c});
    k::LayerNormForward(site, Base::P(s[kLn1]), Base::F(s[kLn1Mean]), Base::F(s[kLn1Rstd]),
                        Base::P(s[kX]), this->W(kLn1Weight), this->W(kLn1Bias), n, c);
    k::MatmulForward(site.In("attn.qkv GEMM"), dt, s[kQkv].raw(), s[kLn1].raw(),
                     this->W(kQkvWeight), this->W(kQkvBias), n, c, 3 * c);
    if (cudnn) {
      k::CudnnAttentionForward(site.In("attention"), s[kAtty].raw(), Base::F(s[kAtt]),
                               s[kQkv].raw(), mb.batch, mb.seq, h, this->head_dim_);
    } else {
      k::AttentionForward(site, Base::P(s[kAtty]), Base::F(s[kAtt]), Base::P(s[kQkv]), mb.batch,
                          mb.seq, c, h);
    }
    Tensor attn_out = this->New({n, c});
    k::MatmulForward(site.In("attn.proj GEMM"), dt, attn_out.raw(), s[kAtty].raw(),
                     this->W(kProjWeight), this->W(kProjBias), n, c, c);
    k::Add(site, Base::P(s[kRes2]), Base::P(s[kX]), Base::P(attn_out), int64_t{n} * c);
    k::LayerNormForward(site, Base::P(s[kLn2]), Base::F(s[kLn2Mean]), Base::F(s[kLn2Rstd]),
                        Base::P(s[kRes2]), this->W(kLn2Weight), this->W(kLn2Bias), n, c);
    // fc with its GELU: the epilogue keeps the pre-activation in kFch for the backward.
    k::MatmulForward(site.In("mlp.fc GEMM"), dt, s[kFchGelu].raw(), s[kLn2].raw(),
                     this->W(kFcWeight), this->W(kFcBias), n, c, 4 * c, 0, s[kFch].raw());
  }

  void ComputeOutput(const device::cuda::CallSite& site, const MicroBatch& mb, const Saved& saved,
                     Tensor* y) override {
    const int n = mb.batch * mb.seq;
    const int c = this->C();
    k::MatmulForward(site.In("mlp.proj GEMM"), Base::kActivation, y->raw(),
                     saved.tensors[kFchGelu].raw(), this->W(kFcProjWeight), this->W(kFcProjBias), n,
                     4 * c, c);
    k::AddInPlace(site, Base::P(*y), Base::P(saved.tensors[kRes2]), int64_t{n} * c);
  }
};

using Registrar = registry::Registrar<layer::Layer, const LayerSpec&>;
const Registrar kBlock("gpt_block", "cuda", MakeForPrecision<Block>);
const k::VocabRegistration<Vocab> kVocab("gpt_embedding", "gpt_head");

}  // namespace
}  // namespace bigmac::stages::gpt::cuda
