// The GPT-2 layers on CUDA (gpt_embedding, gpt_block, gpt_head for backend "cuda"): the CPU
// layers' algorithm (stages/gpt) with cuBLASLt GEMMs (stages/cuda/gemm.h), cuDNN's fused
// attention where it serves the shape (stages/cuda/sdpa.h) and kernels of our own
// (stages/cuda/kernels.h). Activations are T (fp32 or bf16); masters and gradients fp32.
#include <cuda_bf16.h>

#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "core/layer/cost.h"
#include "stages/cuda/gemm.h"
#include "stages/cuda/kernels.h"
#include "stages/cuda/sdpa.h"
#include "stages/cuda/sdpa_layout.h"
#include "stages/gpt/cuda/constraints.h"
#include "stages/gpt/cuda/cuda_layer.h"

namespace bigmac::stages::gpt::cuda {
namespace {

namespace k = ::bigmac::stages::cuda;
using layer::LayerSpec;

template <typename T>
class Embedding : public CudaGptLayer<T> {
  using Base = CudaGptLayer<T>;

 public:
  explicit Embedding(const LayerSpec& spec) : Base(spec, EmbeddingParams(spec.dims)) {}

  void Forward(const MicroBatch& mb, const Tensor&, Tensor* y, Saved* saved) override {
    if (mb.seq > this->spec_.dims.max_seq_length) {
      throw std::invalid_argument("embedding: sequence of " + std::to_string(mb.seq) +
                                  " tokens is longer than the position table (" +
                                  std::to_string(this->spec_.dims.max_seq_length) + ")");
    }
    *y = this->New({mb.batch, mb.seq, this->C()});
    k::EmbeddingForward(this->Site("forward"), Base::P(*y), mb.tokens, this->W(kWte), this->W(kWpe),
                        mb.batch, mb.seq, this->C());
    saved->Clear();
  }

  void BackwardInput(const MicroBatch&, const Tensor& dy, Tensor* dx, Saved* saved) override {
    if (dx) *dx = Tensor();
    saved->tensors.push_back(dy.Clone());
  }

  void BackwardWeight(const MicroBatch& mb, Saved* saved) override {
    k::EmbeddingBackwardWeight(this->Site("backward"), this->G(kWte), this->G(kWpe),
                               Base::P(saved->tensors.at(0)), mb.tokens, mb.host_tokens, mb.batch,
                               mb.seq, this->C(), this->V());
    saved->Clear();
  }

  int64_t ForwardFlops(int batch, int seq) const override {
    return layer::EmbeddingCost(this->spec_.dims, batch, seq).forward_flops;
  }
  int64_t ActivationBytes(int, int) const override { return 0; }
};

template <typename T>
class Block : public CudaGptLayer<T> {
  using Base = CudaGptLayer<T>;
  // Saved tensors: the CPU block's order (stages/gpt/params.h).
  using enum BlockSaved::Index;

 public:
  explicit Block(const LayerSpec& spec)
      : Base(spec, BlockParams(spec.dims)),
        head_dim_(spec.dims.num_heads > 0 ? spec.dims.hidden_size / spec.dims.num_heads : 0),
        cudnn_allowed_(k::ChooseAttention(Base::kActivation, head_dim_).cudnn) {
    if (const auto problems = CudaModelProblems(spec.dims); !problems.empty())
      throw std::invalid_argument("gpt_block (cuda): " + problems.front());
  }

  bool checkpoints_activations() const override { return true; }

  void Forward(const MicroBatch& mb, const Tensor& x, Tensor* y, Saved* saved) override {
    const device::cuda::CallSite site = this->Site("forward");
    saved->Clear();
    saved->tensors.push_back(x.Clone());
    *y = this->New({mb.batch, mb.seq, this->C()});
    if (this->spec_.activation_checkpointing) {
      Saved scratch;
      scratch.tensors.push_back(x.Clone());
      ComputeInternals(site, mb, &scratch);
      ComputeOutput(site, mb, scratch, y);
    } else {
      ComputeInternals(site, mb, saved);
      ComputeOutput(site, mb, *saved, y);
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
    if (UseCudnn(mb)) {
      k::CudnnAttentionBackward(site.In("attention"), dqkv.raw(), datty.raw(), s[kQkv].raw(),
                                s[kAtty].raw(), Base::F(s[kAtt]), mb.batch, mb.seq, h, head_dim_);
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
  void ComputeInternals(const device::cuda::CallSite& site, const MicroBatch& mb, Saved* saved) {
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
    const bool cudnn = UseCudnn(mb);
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
                               s[kQkv].raw(), mb.batch, mb.seq, h, head_dim_);
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
                     Tensor* y) {
    const int n = mb.batch * mb.seq;
    const int c = this->C();
    k::MatmulForward(site.In("mlp.proj GEMM"), Base::kActivation, y->raw(),
                     saved.tensors[kFchGelu].raw(), this->W(kFcProjWeight), this->W(kFcProjBias), n,
                     4 * c, c);
    k::AddInPlace(site, Base::P(*y), Base::P(saved.tensors[kRes2]), int64_t{n} * c);
  }

  // cuDNN's fused attention when ChooseAttention allows it and this cuDNN builds both graphs for
  // the micro-batch's shape; otherwise the fallback, for forward and backward alike (the saved
  // tensor differs: softmax statistics vs probabilities). Decided once per shape.
  bool UseCudnn(const MicroBatch& mb) {
    if (!cudnn_allowed_) return false;
    const auto shape = std::make_pair(mb.batch, mb.seq);
    if (auto it = cudnn_by_shape_.find(shape); it != cudnn_by_shape_.end()) return it->second;
    const std::string why = k::CudnnAttentionUnavailable(
        this->Site("attention set-up"), mb.batch, mb.seq, this->spec_.dims.num_heads, head_dim_);
    if (!why.empty()) {
      std::fprintf(stderr, "[device] %s: cuDNN fused SDPA unavailable, using the fallback: %s\n",
                   layer::LayerIdName(this->layer_id(), this->spec_.dims.num_layers).c_str(),
                   why.c_str());
    }
    return cudnn_by_shape_[shape] = why.empty();
  }

  const int head_dim_;
  const bool cudnn_allowed_;
  std::map<std::pair<int, int>, bool> cudnn_by_shape_;
};

template <typename T>
class Head : public CudaGptLayer<T> {
  using Base = CudaGptLayer<T>;
  enum SavedIndex { kX, kNorm, kMean, kRstd, kDLogits, kDNorm };

 public:
  explicit Head(const LayerSpec& spec)
      : Base(spec, HeadParams(spec.dims)), padded_vocab_(PaddedVocab(spec.dims.vocab_size)) {}

  // y: the micro-batch's loss, sum(token losses) * loss_scale, one fp32 element (without targets,
  // mb.targets null: the logits, (n, padded vocab), for text generation). The fused
  // cross-entropy also leaves dlogits in the logits' place, so the backward starts from them.
  void Forward(const MicroBatch& mb, const Tensor& x, Tensor* y, Saved* saved) override {
    const device::cuda::CallSite site = this->Site("forward");
    const int n = mb.batch * mb.seq;
    const int c = this->C();
    saved->Clear();
    auto& s = saved->tensors;
    s.push_back(x.Clone());
    s.push_back(this->New({n, c}));
    s.push_back(this->NewFloat({n}));
    s.push_back(this->NewFloat({n}));
    s.push_back(this->New({n, padded_vocab_}));
    k::LayerNormForward(site, Base::P(s[kNorm]), Base::F(s[kMean]), Base::F(s[kRstd]), Base::P(x),
                        this->W(kLnfWeight), this->W(kLnfBias), n, c);
    k::MatmulForward(site.In("logits GEMM"), Base::kActivation, s[kDLogits].raw(), s[kNorm].raw(),
                     this->W(kHeadWte), nullptr, n, c, this->V(), padded_vocab_);
    if (mb.targets == nullptr) {  // text generation: the logits, (n, padded vocab)
      *y = std::move(s[kDLogits]);
      saved->Clear();
      return;
    }
    *y = this->NewFloat({1});
    k::CrossEntropyForwardBackward(site, Base::P(s[kDLogits]), Base::F(*y), mb.targets, n,
                                   this->V(), padded_vocab_, mb.loss_scale);
  }

  void BackwardInput(const MicroBatch& mb, const Tensor&, Tensor* dx, Saved* saved) override {
    const device::cuda::CallSite site = this->Site("backward");
    const int n = mb.batch * mb.seq;
    const int c = this->C();
    auto& s = saved->tensors;
    Tensor dnorm = this->New({n, c});
    k::MatmulBackwardInput(site.In("logits dgrad"), Base::kActivation, dnorm.raw(),
                           s[kDLogits].raw(), this->W(kHeadWte), n, c, this->V(), padded_vocab_);
    *dx = this->NewZeroed({mb.batch, mb.seq, c});
    k::LayerNormBackwardInput(site, Base::P(*dx), Base::P(dnorm), Base::P(s[kX]),
                              this->W(kLnfWeight), Base::F(s[kMean]), Base::F(s[kRstd]), n, c);
    s.push_back(std::move(dnorm));
  }

  void BackwardWeight(const MicroBatch& mb, Saved* saved) override {
    const device::cuda::CallSite site = this->Site("weight gradient");
    const int n = mb.batch * mb.seq;
    auto& s = saved->tensors;
    k::MatmulBackwardWeight(site.In("logits wgrad"), Base::kActivation, this->G(kHeadWte), nullptr,
                            s[kDLogits].raw(), s[kNorm].raw(), n, this->C(), this->V(),
                            padded_vocab_);
    k::LayerNormBackwardWeight(site, this->G(kLnfWeight), this->G(kLnfBias), Base::P(s[kDNorm]),
                               Base::P(s[kX]), Base::F(s[kMean]), Base::F(s[kRstd]), n, this->C());
    saved->Clear();
  }

  int64_t ForwardFlops(int batch, int seq) const override {
    return layer::HeadCost(this->spec_.dims, batch, seq).forward_flops;
  }
  int64_t ActivationBytes(int batch, int seq) const override {
    return layer::HeadCost(this->spec_.dims, batch, seq,
                           static_cast<int>(memory::DTypeSize(Base::kActivation)))
        .activation_bytes;
  }

 private:
  const int64_t padded_vocab_;
};

// float activations under precision fp32, bf16 under bf16.
template <template <typename> class LayerClass>
std::unique_ptr<layer::Layer> MakeForPrecision(const LayerSpec& spec) {
  if (spec.bf16) return std::make_unique<LayerClass<__nv_bfloat16>>(spec);
  return std::make_unique<LayerClass<float>>(spec);
}

using Registrar = registry::Registrar<layer::Layer, const LayerSpec&>;
const Registrar kEmbedding("gpt_embedding", "cuda", MakeForPrecision<Embedding>);
const Registrar kBlock("gpt_block", "cuda", MakeForPrecision<Block>);
const Registrar kHead("gpt_head", "cuda", MakeForPrecision<Head>);

}  // namespace
}  // namespace bigmac::stages::gpt::cuda
