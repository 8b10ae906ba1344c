#ifndef BIGMAC_STAGES_VOCAB_VOCAB_LAYERS_H_
#define BIGMAC_STAGES_VOCAB_VOCAB_LAYERS_H_

// The CPU layers at the vocabulary's two ends, written once for every built-in architecture: the
// token embedding (plus GPT-2's learned positions; llama has none) and the head (a final norm,
// the output matrix and the cross-entropy). An architecture describes itself with a Family
// (stages/gpt/vocab.cc, stages/llama/vocab.cc):
//
//   struct Family {
//     // `wte` first, then `wpe` when kPositions.
//     static std::vector<ParamSpec> EmbeddingParams(const layer::ModelDims&);
//     // The final norm's weight (then its bias unless kRmsNorm), then the output matrix: the
//     // tied copy of the embedding's `wte`, or the head's own `lm_head.weight`.
//     static std::vector<ParamSpec> HeadParams(const layer::ModelDims&);
//     static constexpr bool kPositions;  // a learned position embedding
//     static constexpr bool kRmsNorm;    // RMSNorm (weight), else LayerNorm (weight, bias)
//   };
//
// tp = 1: Embedding and Head. Over a tensor-parallel group, vocab-parallel (Megatron-LM):
// TpEmbedding and TpHead hold a slice of consecutive rows of the padded vocabulary
// (layer::PaddedVocabSize) of `wte` and of the output matrix (a tied copy holds the same slice, so
// the tied weight is still owned once per tp slice and exchanged between the pipeline ends rank by
// rank). The embedding looks up the tokens of its rows (zero for the others) and sums over the
// group; the head computes its slice of the logits and the cross-entropy over the whole
// vocabulary from three all-reduced row statistics (the max, the sum of exponentials, the
// target's logit), never gathering the logits for the loss; without targets (text samples) it
// gathers them. Padding rows never reach the loss. wpe and the final norm are replicated.

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/layer/cost.h"
#include "core/layer/tp_layer.h"
#include "plugins/sdk/cpu_kernels.h"
#include "plugins/sdk/cpu_layer.h"
#include "stages/param_spec.h"

namespace bigmac::stages::vocab {

// The vocabulary-row matrices: the token embedding and the head's own output matrix.
inline bool IsVocabMatrix(const ParamSpec& spec) {
  return spec.name == "wte" || spec.name == "lm_head.weight";
}

// The slicing of an embedding's or head's parameters: the vocabulary-row matrices are
// vocab-parallel (rows of the padded vocabulary split over the ranks); the rest is replicated.
inline std::vector<layer::TpShard> VocabShards(const std::vector<ParamSpec>& specs, int rank,
                                               int size) {
  return ShardsOf(specs, rank, size, [&](size_t index, layer::TpShard* shard) {
    if (!IsVocabMatrix(specs[index])) return;
    shard->dim = 0;
    shard->padded = layer::PaddedVocabSize(specs[index].shape[0], size);
  });
}

// What all four layers share: the parameters from the Family's table, in its order, with the
// tied copy marked; and the final norm, which the two heads apply the same way.
template <typename T, typename Family>
class VocabLayer : public sdk::CpuLayer<T> {
  using Base = sdk::CpuLayer<T>;

 public:
  VocabLayer(const sdk::LayerSpec& spec, std::vector<ParamSpec> specs,
             const std::vector<layer::TpShard>& shards)
      : Base(spec), specs_(std::move(specs)) {
    for (size_t i = 0; i < specs_.size(); ++i) {
      this->AddParam(specs_[i].name, shards.empty() ? specs_[i].shape : shards[i].LocalShape(),
                     specs_[i].weight_decay);
      this->params_.back().tied_copy = specs_[i].tied_copy;
      this->params_.back().tied_owner = specs_[i].tied_owner;
    }
  }

  // The whole tensors (tp = 1); VocabParallel initialises its slices instead.
  void InitParams(uint64_t seed) override {
    for (size_t i = 0; i < specs_.size(); ++i)
      InitParam(specs_[i], &this->params_[i].value, seed, this->layer_id());
  }

 protected:
  static constexpr int kNormWeight = 0;
  static constexpr int kNormBias = Family::kRmsNorm ? -1 : 1;
  static constexpr int kOutput = Family::kRmsNorm ? 1 : 2;
  static constexpr int kWte = 0;
  static constexpr int kWpe = Family::kPositions ? 1 : -1;

  T* WOrNull(int index) { return index < 0 ? nullptr : this->W(index); }
  T* GOrNull(int index) { return index < 0 ? nullptr : this->G(index); }

  // The head's final norm over n rows: out and the statistics (mean is unused by RMSNorm).
  void NormForward(sdk::Tensor* out, sdk::Tensor* mean, sdk::Tensor* rstd, const sdk::Tensor& x,
                   int n) {
    if constexpr (Family::kRmsNorm) {
      sdk::cpu::RmsNormForward(Base::D(*out), Base::D(*rstd), Base::D(x), this->W(kNormWeight), n,
                               this->C(), this->spec_.dims.rms_norm_eps);
    } else {
      sdk::cpu::LayerNormForward(Base::D(*out), Base::D(*mean), Base::D(*rstd), Base::D(x),
                                 this->W(kNormWeight), this->W(kNormBias), n, this->C());
    }
  }
  // dx += the norm's input gradient for dnorm.
  void NormBackwardInput(sdk::Tensor* dx, const sdk::Tensor& dnorm, const sdk::Tensor& x,
                         const sdk::Tensor& mean, const sdk::Tensor& rstd, int n) {
    if constexpr (Family::kRmsNorm) {
      sdk::cpu::RmsNormBackwardInput(Base::D(*dx), Base::D(dnorm), Base::D(x), this->W(kNormWeight),
                                     Base::D(rstd), n, this->C());
    } else {
      sdk::cpu::LayerNormBackwardInput(Base::D(*dx), Base::D(dnorm), Base::D(x),
                                       this->W(kNormWeight), Base::D(mean), Base::D(rstd), n,
                                       this->C());
    }
  }
  void NormBackwardWeight(const sdk::Tensor& dnorm, const sdk::Tensor& x, const sdk::Tensor& mean,
                          const sdk::Tensor& rstd, int n) {
    if constexpr (Family::kRmsNorm) {
      sdk::cpu::RmsNormBackwardWeight(this->G(kNormWeight), Base::D(dnorm), Base::D(x),
                                      Base::D(rstd), n, this->C());
    } else {
      sdk::cpu::LayerNormBackwardWeight(this->G(kNormWeight), this->G(kNormBias), Base::D(dnorm),
                                        Base::D(x), Base::D(mean), Base::D(rstd), n, this->C());
    }
  }

  void CheckPositions(const sdk::MicroBatch& mb) const {
    if (Family::kPositions && mb.seq > this->spec_.dims.max_seq_length) {
      throw std::invalid_argument("embedding: sequence of " + std::to_string(mb.seq) +
                                  " tokens is longer than the position table (" +
                                  std::to_string(this->spec_.dims.max_seq_length) + ")");
    }
  }

  std::vector<ParamSpec> specs_;
};

// What both embeddings (plain and vocab-parallel, `Layer`) share: the first layer has no input
// gradient and keeps only dy for the weights; its forward keeps nothing.
template <typename Layer>
class EmbeddingBase : public Layer {
 public:
  using Layer::Layer;

  void BackwardInput(const sdk::MicroBatch&, const sdk::Tensor& dy, sdk::Tensor* dx,
                     sdk::Saved* saved) override {
    if (dx) *dx = sdk::Tensor();
    saved->tensors.push_back(dy.Clone());
  }

  int64_t ForwardFlops(int batch, int seq) const override {
    return layer::EmbeddingCost(this->spec_.dims, batch, seq).forward_flops;
  }
  int64_t ActivationBytes(int, int) const override { return 0; }
};

template <typename T, typename Family>
class Embedding : public EmbeddingBase<VocabLayer<T, Family>> {
  using Base = VocabLayer<T, Family>;
  using Tensor = sdk::Tensor;

 public:
  explicit Embedding(const sdk::LayerSpec& spec)
      : EmbeddingBase<Base>(spec, Family::EmbeddingParams(spec.dims),
                            std::vector<layer::TpShard>{}) {}

  void Forward(const sdk::MicroBatch& mb, const Tensor&, Tensor* y, sdk::Saved* saved) override {
    this->CheckPositions(mb);
    *y = this->NewActivation(mb.batch, mb.seq, this->C());
    sdk::cpu::EmbeddingForward(Base::D(*y), mb.tokens, this->W(Base::kWte),
                               this->WOrNull(Base::kWpe), mb.batch, mb.seq, this->C());
    saved->Clear();
  }

  void BackwardWeight(const sdk::MicroBatch& mb, sdk::Saved* saved) override {
    sdk::cpu::EmbeddingBackwardWeight(this->G(Base::kWte), this->GOrNull(Base::kWpe),
                                      Base::D(saved->tensors.at(0)), mb.tokens, mb.batch, mb.seq,
                                      this->C());
    saved->Clear();
  }
};

template <typename T, typename Family>
class Head : public VocabLayer<T, Family> {
  using Base = VocabLayer<T, Family>;
  using Tensor = sdk::Tensor;
  enum SavedIndex { kX, kNorm, kMean, kRstd, kLogits, kDLogits, kDNorm };

 public:
  explicit Head(const sdk::LayerSpec& spec) : Base(spec, Family::HeadParams(spec.dims), {}) {}

  // y: the loss of this micro-batch, sum(token losses) * loss_scale, as a 1-element tensor; without
  // targets (mb.targets null: text generation), the logits, (batch * seq, vocab).
  void Forward(const sdk::MicroBatch& mb, const Tensor& x, Tensor* y, sdk::Saved* saved) override {
    const int n = mb.batch * mb.seq;
    saved->Clear();
    auto& s = saved->tensors;
    s.push_back(x.Clone());
    s.push_back(this->New({n, this->C()}));
    s.push_back(this->New({n}));
    s.push_back(this->New({n}));
    s.push_back(this->New({n, this->V()}));
    this->NormForward(&s[kNorm], &s[kMean], &s[kRstd], x, n);
    sdk::cpu::MatmulForward<T>(Base::D(s[kLogits]), Base::D(s[kNorm]), this->W(Base::kOutput),
                               nullptr, n, this->C(), this->V());
    if (mb.targets == nullptr) {
      *y = std::move(s[kLogits]);
      saved->Clear();
      return;
    }
    *y = this->New({1});
    Base::D(*y)[0] = static_cast<T>(
        sdk::cpu::CrossEntropyLossSum(Base::D(s[kLogits]), mb.targets, n, this->V()) *
        mb.loss_scale);
  }

  // dy is ignored: the head starts the backward with d(loss)/d(loss) = 1.
  void BackwardInput(const sdk::MicroBatch& mb, const Tensor&, Tensor* dx,
                     sdk::Saved* saved) override {
    const int n = mb.batch * mb.seq;
    auto& s = saved->tensors;
    Tensor dlogits = this->New({n, this->V()});
    sdk::cpu::CrossEntropyBackward(Base::D(dlogits), Base::D(s[kLogits]), mb.targets, n, this->V(),
                                   mb.loss_scale);
    s[kLogits] = Tensor();  // no longer needed
    Tensor dnorm = this->New({n, this->C()});
    sdk::cpu::MatmulBackwardInput(Base::D(dnorm), Base::D(dlogits), this->W(Base::kOutput), n,
                                  this->C(), this->V());
    *dx = this->NewActivation(mb.batch, mb.seq, this->C());
    this->NormBackwardInput(dx, dnorm, s[kX], s[kMean], s[kRstd], n);
    s.push_back(std::move(dlogits));
    s.push_back(std::move(dnorm));
  }

  void BackwardWeight(const sdk::MicroBatch& mb, sdk::Saved* saved) override {
    const int n = mb.batch * mb.seq;
    auto& s = saved->tensors;
    sdk::cpu::MatmulBackwardWeight<T>(this->G(Base::kOutput), nullptr, Base::D(s[kDLogits]),
                                      Base::D(s[kNorm]), n, this->C(), this->V());
    this->NormBackwardWeight(s[kDNorm], s[kX], s[kMean], s[kRstd], n);
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
};

// What the two tensor-parallel layers add: the group, the slicing and this rank's vocab rows.
template <typename T, typename Family>
class VocabParallel : public VocabLayer<T, Family>, public layer::TpSharded {
  using Base = VocabLayer<T, Family>;

 public:
  VocabParallel(const sdk::LayerSpec& spec, layer::TpGroup* group, std::vector<ParamSpec> specs)
      : VocabParallel(spec, group, specs, VocabShards(specs, group->rank(), group->size())) {}

  std::vector<layer::TpShard> Shards() const override { return shards_; }
  void InitParams(uint64_t seed) override {
    for (size_t i = 0; i < this->specs_.size(); ++i)
      InitSlice(this->specs_[i], shards_[i], &this->params_[i].value, seed, this->layer_id());
  }

 protected:
  // The local row of vocabulary entry `token`, or -1 if another rank holds it.
  int64_t LocalRow(int32_t token) const {
    const int64_t row = token - first_;
    return row >= 0 && row < rows_ ? row : -1;
  }
  // Local rows that are real vocabulary entries (the rest is padding).
  int64_t RealRows() const { return std::clamp<int64_t>(this->V() - first_, 0, rows_); }

  layer::TpGroup* group_;
  std::vector<layer::TpShard> shards_;
  int64_t rows_ = 0;   // this rank's slice of the padded vocabulary
  int64_t first_ = 0;  // its first row

 private:
  VocabParallel(const sdk::LayerSpec& spec, layer::TpGroup* group, std::vector<ParamSpec> specs,
                std::vector<layer::TpShard> shards)
      : Base(spec, std::move(specs), shards), group_(group), shards_(std::move(shards)) {
    for (const layer::TpShard& shard : shards_) {
      if (!shard.sliced()) continue;
      rows_ = shard.SliceLength();
      first_ = int64_t{group->rank()} * rows_;
    }
  }
};

template <typename T, typename Family>
class TpEmbedding : public EmbeddingBase<VocabParallel<T, Family>> {
  using Base = VocabParallel<T, Family>;
  using Tensor = sdk::Tensor;

 public:
  TpEmbedding(const sdk::LayerSpec& spec, layer::TpGroup* group)
      : EmbeddingBase<Base>(spec, group, Family::EmbeddingParams(spec.dims)) {}

  void Forward(const sdk::MicroBatch& mb, const Tensor&, Tensor* y, sdk::Saved* saved) override {
    this->CheckPositions(mb);
    const int c = this->C();
    *y = this->NewActivation(mb.batch, mb.seq, c);
    T* out = Base::D(*y);
    const T* wte = this->W(Base::kWte);
    const int64_t n = int64_t{mb.batch} * mb.seq;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = this->LocalRow(mb.tokens[i]);
      for (int j = 0; j < c; ++j) out[i * c + j] = row < 0 ? T(0) : wte[row * c + j];
    }
    this->group_->AllReduceSum(y, "tp embedding: token rows (g)");
    if (const T* wpe = this->WOrNull(Base::kWpe)) {
      for (int64_t i = 0; i < n; ++i) {
        const T* position = wpe + (i % mb.seq) * c;
        for (int j = 0; j < c; ++j) out[i * c + j] += position[j];
      }
    }
    saved->Clear();
  }

  void BackwardWeight(const sdk::MicroBatch& mb, sdk::Saved* saved) override {
    const int c = this->C();
    const T* dy = Base::D(saved->tensors.at(0));
    T* dwte = this->G(Base::kWte);
    T* dwpe = this->GOrNull(Base::kWpe);
    const int64_t n = int64_t{mb.batch} * mb.seq;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = this->LocalRow(mb.tokens[i]);
      if (row >= 0) {
        for (int j = 0; j < c; ++j) dwte[row * c + j] += dy[i * c + j];
      }
      if (dwpe == nullptr) continue;
      T* position = dwpe + (i % mb.seq) * c;
      for (int j = 0; j < c; ++j) position[j] += dy[i * c + j];
    }
    saved->Clear();
  }
};

template <typename T, typename Family>
class TpHead : public VocabParallel<T, Family> {
  using Base = VocabParallel<T, Family>;
  using Tensor = sdk::Tensor;
  // Saved: input, norm output and statistics, local logits, and per row the all-reduced max and
  // sum of exponentials; then the logits' and the norm's gradients.
  enum SavedIndex { kX, kNorm, kMean, kRstd, kLogits, kRowMax, kRowSum, kDLogits, kDNorm };

 public:
  TpHead(const sdk::LayerSpec& spec, layer::TpGroup* group)
      : Base(spec, group, Family::HeadParams(spec.dims)) {}

  void Forward(const sdk::MicroBatch& mb, const Tensor& x, Tensor* y, sdk::Saved* saved) override {
    const int n = mb.batch * mb.seq;
    const int c = this->C();
    const int v = static_cast<int>(this->rows_);
    auto& s = saved->tensors;
    saved->Clear();
    s.push_back(x.Clone());
    s.push_back(this->New({n, c}));
    s.push_back(this->New({n}));
    s.push_back(this->New({n}));
    s.push_back(this->New({n, v}));
    this->NormForward(&s[kNorm], &s[kMean], &s[kRstd], x, n);
    sdk::cpu::MatmulForward<T>(Base::D(s[kLogits]), Base::D(s[kNorm]), this->W(Base::kOutput),
                               nullptr, n, c, v);
    if (mb.targets == nullptr) {  // text generation: the logits of the whole vocabulary
      *y = GatherLogits(s[kLogits], n, v);
      saved->Clear();
      return;
    }
    const T* logits = Base::D(s[kLogits]);
    const int64_t real = this->RealRows();
    // The row maxima over the whole vocabulary.
    Tensor row_max = this->New({n});
    for (int i = 0; i < n; ++i) {
      T m = -INFINITY;
      for (int64_t j = 0; j < real; ++j) m = std::max(m, logits[int64_t{i} * v + j]);
      Base::D(row_max)[i] = m;
    }
    this->group_->AllReduceMax(&row_max, "tp head: logit maxima");
    // Sums of exponentials and the targets' logits, in one reduction, in double (as the tp = 1
    // cross-entropy sums).
    Tensor sums(this->spec_.device, {2, n}, memory::DType::kF64);
    double* sum_exp = sums.data<double>();
    double* target_logit = sum_exp + n;
    for (int i = 0; i < n; ++i) {
      const T* l = logits + int64_t{i} * v;
      const double m = Base::D(row_max)[i];
      double sum = 0;
      for (int64_t j = 0; j < real; ++j) sum += std::exp(double(l[j]) - m);
      sum_exp[i] = sum;
      const int64_t row = this->LocalRow(mb.targets[i]);
      target_logit[i] = row < 0 ? 0.0 : double(l[row]);
    }
    this->group_->AllReduceSum(&sums, "tp head: cross-entropy sums");
    double loss = 0;
    for (int i = 0; i < n; ++i) {
      loss += double(Base::D(row_max)[i]) + std::log(sum_exp[i]) - target_logit[i];
    }
    Tensor row_sum = this->New({n});
    std::copy(sum_exp, sum_exp + n, Base::D(row_sum));  // the backward computes in T
    s.push_back(std::move(row_max));
    s.push_back(std::move(row_sum));
    *y = this->New({1});
    Base::D(*y)[0] = static_cast<T>(loss * mb.loss_scale);
  }

  void BackwardInput(const sdk::MicroBatch& mb, const Tensor&, Tensor* dx,
                     sdk::Saved* saved) override {
    const int n = mb.batch * mb.seq;
    const int c = this->C();
    const int v = static_cast<int>(this->rows_);
    auto& s = saved->tensors;
    Tensor dlogits = this->New({n, v});
    const T* logits = Base::D(s[kLogits]);
    T* d = Base::D(dlogits);
    const int64_t real = this->RealRows();
    const T scale = static_cast<T>(mb.loss_scale);
    for (int i = 0; i < n; ++i) {
      const T m = Base::D(s[kRowMax])[i];
      const T inv = T(1) / Base::D(s[kRowSum])[i];
      const int64_t target = this->LocalRow(mb.targets[i]);
      for (int64_t j = 0; j < v; ++j) {
        const int64_t at = int64_t{i} * v + j;
        d[at] = j < real ? scale * (std::exp(logits[at] - m) * inv - (j == target ? T(1) : T(0)))
                         : T(0);
      }
    }
    s[kLogits] = Tensor();
    Tensor dnorm = this->New({n, c});
    sdk::cpu::MatmulBackwardInput(Base::D(dnorm), d, this->W(Base::kOutput), n, c, v);
    this->group_->AllReduceSum(&dnorm, "tp head: input gradient of the logits (f)");
    *dx = this->NewActivation(mb.batch, mb.seq, c);
    this->NormBackwardInput(dx, dnorm, s[kX], s[kMean], s[kRstd], n);
    s.push_back(std::move(dlogits));
    s.push_back(std::move(dnorm));
  }

  void BackwardWeight(const sdk::MicroBatch& mb, sdk::Saved* saved) override {
    const int n = mb.batch * mb.seq;
    auto& s = saved->tensors;
    sdk::cpu::MatmulBackwardWeight<T>(this->G(Base::kOutput), nullptr, Base::D(s[kDLogits]),
                                      Base::D(s[kNorm]), n, this->C(),
                                      static_cast<int>(this->rows_));
    this->NormBackwardWeight(s[kDNorm], s[kX], s[kMean], s[kRstd], n);
    saved->Clear();
  }

  int64_t ForwardFlops(int batch, int seq) const override { return Cost(batch, seq).forward_flops; }
  int64_t ActivationBytes(int batch, int seq) const override {
    return Cost(batch, seq).activation_bytes;
  }

 private:
  // (n, padded vocabulary) logits on every tp rank, as the tp = 1 head returns them without
  // targets: each rank places its slice's columns in zeros and the group sums, which is exact
  // (every other term is zero), so every rank holds the same bits and draws the same token.
  Tensor GatherLogits(const Tensor& local, int n, int v) const {
    const int64_t width = int64_t{v} * this->group_->size();
    Tensor full = this->New({n, width});
    full.Zero();
    const T* from = Base::D(local);
    T* to = Base::D(full);
    for (int i = 0; i < n; ++i)
      std::copy(from + int64_t{i} * v, from + int64_t{i + 1} * v, to + i * width + this->first_);
    this->group_->AllReduceSum(&full, "tp head: logits for a text sample (gather)");
    return full;
  }

  layer::LayerCost Cost(int batch, int seq) const {
    return layer::TpHeadCost(this->spec_.dims, this->group_->size(), batch, seq,
                             static_cast<int>(memory::DTypeSize(this->spec_.dtype)));
  }
};

// Registers `Family`'s four CPU layers under `embedding` and `head` (plain and tensor-parallel).
template <typename Family>
struct Registration {
  template <typename T>
  using EmbeddingOf = Embedding<T, Family>;
  template <typename T>
  using HeadOf = Head<T, Family>;
  template <typename T>
  using TpEmbeddingOf = TpEmbedding<T, Family>;
  template <typename T>
  using TpHeadOf = TpHead<T, Family>;

  Registration(const char* embedding, const char* head)
      : embedding_(embedding, "cpu", layer::MakeForDType<EmbeddingOf>),
        head_(head, "cpu", layer::MakeForDType<HeadOf>),
        tp_embedding_(embedding, "cpu", MakeTpForDType<TpEmbeddingOf>),
        tp_head_(head, "cpu", MakeTpForDType<TpHeadOf>) {}

 private:
  registry::Registrar<layer::Layer, const sdk::LayerSpec&> embedding_, head_;
  registry::Registrar<layer::Layer, const sdk::LayerSpec&, layer::TpGroup*> tp_embedding_, tp_head_;
};

}  // namespace bigmac::stages::vocab

#endif  // BIGMAC_STAGES_VOCAB_VOCAB_LAYERS_H_
