#ifndef BIGMAC_STAGES_CUDA_VOCAB_LAYERS_H_
#define BIGMAC_STAGES_CUDA_VOCAB_LAYERS_H_

// The CUDA layers at the vocabulary's two ends, written once for every built-in architecture, as
// the CPU's (stages/vocab/vocab_layers.h) with the same Family description (its parameter tables,
// kPositions, kRmsNorm): the token embedding (plus GPT-2's learned positions) and the head (the
// final LayerNorm or RMSNorm, the output matrix, the fused cross-entropy over logits whose rows
// are padded to PaddedVocab). Activations are T (fp32 or bf16); masters and gradients fp32.
// Register an architecture's pair with VocabRegistration<Family>.

#include <stdexcept>
#include <string>
#include <vector>

#include "core/layer/cost.h"
#include "stages/cuda/cuda_layer.h"
#include "stages/cuda/gemm.h"
#include "stages/cuda/kernels.h"
#include "stages/gpt/cuda/constraints.h"

namespace bigmac::stages::cuda {

template <typename T, typename Family>
class Embedding : public CudaLayer<T> {
  using Base = CudaLayer<T>;
  static constexpr int kWte = 0;
  static constexpr int kWpe = Family::kPositions ? 1 : -1;

 public:
  explicit Embedding(const layer::LayerSpec& spec)
      : Base(spec, Family::EmbeddingParams(spec.dims)) {}

  void Forward(const MicroBatch& mb, const Tensor&, Tensor* y, Saved* saved) override {
    if (Family::kPositions && mb.seq > this->spec_.dims.max_seq_length) {
      throw std::invalid_argument("embedding: sequence of " + std::to_string(mb.seq) +
                                  " tokens is longer than the position table (" +
                                  std::to_string(this->spec_.dims.max_seq_length) + ")");
    }
    *y = this->New({mb.batch, mb.seq, this->C()});
    EmbeddingForward(this->Site("forward"), Base::P(*y), mb.tokens, this->W(kWte), this->W(kWpe),
                     mb.batch, mb.seq, this->C());
    saved->Clear();
  }

  void BackwardInput(const MicroBatch&, const Tensor& dy, Tensor* dx, Saved* saved) override {
    if (dx) *dx = Tensor();
    saved->tensors.push_back(dy.Clone());
  }

  void BackwardWeight(const MicroBatch& mb, Saved* saved) override {
    EmbeddingBackwardWeight(this->Site("backward"), this->G(kWte), this->G(kWpe),
                            Base::P(saved->tensors.at(0)), mb.tokens, mb.host_tokens, mb.batch,
                            mb.seq, this->C(), this->V());
    saved->Clear();
  }

  int64_t ForwardFlops(int batch, int seq) const override {
    return layer::EmbeddingCost(this->spec_.dims, batch, seq).forward_flops;
  }
  int64_t ActivationBytes(int, int) const override { return 0; }
};

template <typename T, typename Family>
class Head : public CudaLayer<T> {
  using Base = CudaLayer<T>;
  static constexpr bool kRms = Family::kRmsNorm;
  static constexpr int kNormWeight = 0;
  static constexpr int kNormBias = kRms ? -1 : 1;
  static constexpr int kOutput = kRms ? 1 : 2;  // the tied copy of wte, or lm_head.weight
  enum SavedIndex { kX, kNorm, kMean, kRstd, kDLogits, kDNorm };

 public:
  explicit Head(const layer::LayerSpec& spec)
      : Base(spec, Family::HeadParams(spec.dims)),
        padded_vocab_(gpt::cuda::PaddedVocab(spec.dims.vocab_size)) {}

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
    s.push_back(kRms ? Tensor() : this->NewFloat({n}));  // RMSNorm has no mean
    s.push_back(this->NewFloat({n}));
    s.push_back(this->New({n, padded_vocab_}));
    if constexpr (kRms) {
      RmsNormForward(site, Base::P(s[kNorm]), Base::F(s[kRstd]), Base::P(x), this->W(kNormWeight),
                     n, c, this->spec_.dims.rms_norm_eps);
    } else {
      LayerNormForward(site, Base::P(s[kNorm]), Base::F(s[kMean]), Base::F(s[kRstd]), Base::P(x),
                       this->W(kNormWeight), this->W(kNormBias), n, c);
    }
    MatmulForward(site.In("logits GEMM"), Base::kActivation, s[kDLogits].raw(), s[kNorm].raw(),
                  this->W(kOutput), nullptr, n, c, this->V(), padded_vocab_);
    if (mb.targets == nullptr) {  // text generation: the logits, (n, padded vocab)
      *y = std::move(s[kDLogits]);
      saved->Clear();
      return;
    }
    *y = this->NewFloat({1});
    CrossEntropyForwardBackward(site, Base::P(s[kDLogits]), Base::F(*y), mb.targets, n, this->V(),
                                padded_vocab_, mb.loss_scale);
  }

  void BackwardInput(const MicroBatch& mb, const Tensor&, Tensor* dx, Saved* saved) override {
    const device::cuda::CallSite site = this->Site("backward");
    const int n = mb.batch * mb.seq;
    const int c = this->C();
    auto& s = saved->tensors;
    Tensor dnorm = this->New({n, c});
    MatmulBackwardInput(site.In("logits dgrad"), Base::kActivation, dnorm.raw(), s[kDLogits].raw(),
                        this->W(kOutput), n, c, this->V(), padded_vocab_);
    *dx = this->NewZeroed({mb.batch, mb.seq, c});
    if constexpr (kRms) {
      RmsNormBackwardInput(site, Base::P(*dx), Base::P(dnorm), Base::P(s[kX]), this->W(kNormWeight),
                           Base::F(s[kRstd]), n, c);
    } else {
      LayerNormBackwardInput(site, Base::P(*dx), Base::P(dnorm), Base::P(s[kX]),
                             this->W(kNormWeight), Base::F(s[kMean]), Base::F(s[kRstd]), n, c);
    }
    s.push_back(std::move(dnorm));
  }

  void BackwardWeight(const MicroBatch& mb, Saved* saved) override {
    const device::cuda::CallSite site = this->Site("weight gradient");
    const int n = mb.batch * mb.seq;
    const int c = this->C();
    auto& s = saved->tensors;
    MatmulBackwardWeight(site.In("logits wgrad"), Base::kActivation, this->G(kOutput), nullptr,
                         s[kDLogits].raw(), s[kNorm].raw(), n, c, this->V(), padded_vocab_);
    if constexpr (kRms) {
      RmsNormBackwardWeight(site, this->G(kNormWeight), Base::P(s[kDNorm]), Base::P(s[kX]),
                            Base::F(s[kRstd]), n, c);
    } else {
      LayerNormBackwardWeight(site, this->G(kNormWeight), this->G(kNormBias), Base::P(s[kDNorm]),
                              Base::P(s[kX]), Base::F(s[kMean]), Base::F(s[kRstd]), n, c);
    }
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

// Registers Family's embedding and head under the given type names for backend "cuda".
template <typename Family>
class VocabRegistration {
  template <typename T>
  using FamilyEmbedding = Embedding<T, Family>;
  template <typename T>
  using FamilyHead = Head<T, Family>;
  using Registrar = registry::Registrar<layer::Layer, const layer::LayerSpec&>;

 public:
  VocabRegistration(const char* embedding, const char* head)
      : embedding_(embedding, "cuda", MakeForPrecision<FamilyEmbedding>),
        head_(head, "cuda", MakeForPrecision<FamilyHead>) {}

 private:
  Registrar embedding_;
  Registrar head_;
};

}  // namespace bigmac::stages::cuda

#endif  // BIGMAC_STAGES_CUDA_VOCAB_LAYERS_H_
