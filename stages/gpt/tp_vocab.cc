// The GPT-2 embedding and head over a tensor-parallel group, vocab-parallel (Megatron-LM): each
// of the `tp` ranks holds a slice of consecutive rows of the token embedding `wte` over the
// padded vocabulary (layer::PaddedVocabSize), and the head's tied copy holds the same slice, so
// the tied weight is still owned once per tp slice (the embedding's stage) and exchanged between
// the pipeline ends rank by rank. The embedding looks up the tokens of its rows (zero for the
// others) and sums over the group; the head computes its slice of the logits and the
// cross-entropy over the whole vocabulary from three all-reduced row statistics (the max, the
// sum of exponentials, the target's logit), never gathering the logits for the loss; without
// targets (text samples) it gathers them. Padding rows never reach the loss. wpe and the final
// LayerNorm are replicated.
#include <algorithm>
#include <cmath>

#include "core/layer/cost.h"
#include "core/layer/tp_layer.h"
#include "plugins/sdk/cpu_kernels.h"
#include "plugins/sdk/cpu_layer.h"
#include "stages/gpt/params.h"
#include "stages/gpt/tp_params.h"

namespace bigmac::stages::gpt {
namespace {

namespace cpu = sdk::cpu;
using sdk::LayerSpec, sdk::MicroBatch, sdk::Saved, sdk::Tensor;

// What the two layers share: the group, the specs, their slicing and this rank's vocab rows.
template <typename T>
class VocabParallel : public sdk::CpuLayer<T>, public layer::TpSharded {
 public:
  VocabParallel(const LayerSpec& spec, layer::TpGroup* group, std::vector<ParamSpec> specs)
      : sdk::CpuLayer<T>(spec),
        group_(group),
        specs_(std::move(specs)),
        shards_(VocabShards(specs_, group->rank(), group->size())) {
    for (size_t i = 0; i < specs_.size(); ++i) {
      this->AddParam(specs_[i].name, shards_[i].LocalShape(), specs_[i].weight_decay);
      this->params_.back().tied_copy = specs_[i].tied_copy;
      this->params_.back().tied_owner = specs_[i].tied_owner;
      if (shards_[i].sliced()) {
        rows_ = shards_[i].SliceLength();
        first_ = int64_t{group->rank()} * rows_;
      }
    }
  }
  std::vector<layer::TpShard> Shards() const override { return shards_; }
  void InitParams(uint64_t seed) override {
    for (size_t i = 0; i < specs_.size(); ++i)
      InitSlice(specs_[i], shards_[i], &this->params_[i].value, seed, this->layer_id());
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
  std::vector<ParamSpec> specs_;
  std::vector<layer::TpShard> shards_;
  int64_t rows_ = 0;   // this rank's slice of the padded vocabulary
  int64_t first_ = 0;  // its first row
};

template <typename T>
class TpEmbedding : public VocabParallel<T> {
  using Base = VocabParallel<T>;

 public:
  TpEmbedding(const LayerSpec& spec, layer::TpGroup* group)
      : Base(spec, group, EmbeddingParams(spec.dims)) {}

  void Forward(const MicroBatch& mb, const Tensor&, Tensor* y, Saved* saved) override {
    if (mb.seq > this->spec_.dims.max_seq_length)
      throw std::invalid_argument("embedding: sequence longer than the position table");
    const int c = this->C();
    *y = this->NewActivation(mb.batch, mb.seq, c);
    T* out = Base::D(*y);
    const T* wte = this->W(kWte);
    const T* wpe = this->W(kWpe);
    const int64_t n = int64_t{mb.batch} * mb.seq;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = this->LocalRow(mb.tokens[i]);
      for (int j = 0; j < c; ++j) out[i * c + j] = row < 0 ? T(0) : wte[row * c + j];
    }
    this->group_->AllReduceSum(y, "tp embedding: token rows (g)");
    for (int64_t i = 0; i < n; ++i) {
      const T* position = wpe + (i % mb.seq) * c;
      for (int j = 0; j < c; ++j) out[i * c + j] += position[j];
    }
    saved->Clear();
  }

  void BackwardInput(const MicroBatch&, const Tensor& dy, Tensor* dx, Saved* saved) override {
    if (dx) *dx = Tensor();
    saved->tensors.push_back(dy.Clone());
  }

  void BackwardWeight(const MicroBatch& mb, Saved* saved) override {
    const int c = this->C();
    const T* dy = Base::D(saved->tensors.at(0));
    T* dwte = this->G(kWte);
    T* dwpe = this->G(kWpe);
    const int64_t n = int64_t{mb.batch} * mb.seq;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = this->LocalRow(mb.tokens[i]);
      T* position = dwpe + (i % mb.seq) * c;
      for (int j = 0; j < c; ++j) {
        if (row >= 0) dwte[row * c + j] += dy[i * c + j];
        position[j] += dy[i * c + j];
      }
    }
    saved->Clear();
  }

  int64_t ForwardFlops(int batch, int seq) const override {
    return layer::EmbeddingCost(this->spec_.dims, batch, seq).forward_flops;
  }
  int64_t ActivationBytes(int, int) const override { return 0; }
};

template <typename T>
class TpHead : public VocabParallel<T> {
  using Base = VocabParallel<T>;
  // Saved: input, LayerNorm output and statistics, local logits, and per row the all-reduced
  // max and sum of exponentials; then the logits' and the norm's gradients.
  enum SavedIndex { kX, kNorm, kMean, kRstd, kLogits, kRowMax, kRowSum, kDLogits, kDNorm };

 public:
  TpHead(const LayerSpec& spec, layer::TpGroup* group) : Base(spec, group, HeadParams(spec.dims)) {}

  void Forward(const MicroBatch& mb, const Tensor& x, Tensor* y, Saved* saved) override {
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
    cpu::LayerNormForward(Base::D(s[kNorm]), Base::D(s[kMean]), Base::D(s[kRstd]), Base::D(x),
                          this->W(kLnfWeight), this->W(kLnfBias), n, c);
    cpu::MatmulForward<T>(Base::D(s[kLogits]), Base::D(s[kNorm]), this->W(kHeadWte), nullptr, n, c,
                          v);
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

  void BackwardInput(const MicroBatch& mb, const Tensor&, Tensor* dx, Saved* saved) override {
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
    cpu::MatmulBackwardInput(Base::D(dnorm), d, this->W(kHeadWte), n, c, v);
    this->group_->AllReduceSum(&dnorm, "tp head: input gradient of the logits (f)");
    *dx = this->NewActivation(mb.batch, mb.seq, c);
    cpu::LayerNormBackwardInput(Base::D(*dx), Base::D(dnorm), Base::D(s[kX]), this->W(kLnfWeight),
                                Base::D(s[kMean]), Base::D(s[kRstd]), n, c);
    s.push_back(std::move(dlogits));
    s.push_back(std::move(dnorm));
  }

  void BackwardWeight(const MicroBatch& mb, Saved* saved) override {
    const int n = mb.batch * mb.seq;
    auto& s = saved->tensors;
    cpu::MatmulBackwardWeight<T>(this->G(kHeadWte), nullptr, Base::D(s[kDLogits]),
                                 Base::D(s[kNorm]), n, this->C(), static_cast<int>(this->rows_));
    cpu::LayerNormBackwardWeight(this->G(kLnfWeight), this->G(kLnfBias), Base::D(s[kDNorm]),
                                 Base::D(s[kX]), Base::D(s[kMean]), Base::D(s[kRstd]), n,
                                 this->C());
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

const registry::Registrar<layer::Layer, const LayerSpec&, layer::TpGroup*> kEmbedding(
    "gpt_embedding", "cpu", MakeTpForDType<TpEmbedding>);
const registry::Registrar<layer::Layer, const LayerSpec&, layer::TpGroup*> kHead(
    "gpt_head", "cpu", MakeTpForDType<TpHead>);

}  // namespace
}  // namespace bigmac::stages::gpt
