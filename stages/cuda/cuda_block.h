#ifndef BIGMAC_STAGES_CUDA_CUDA_BLOCK_H_
#define BIGMAC_STAGES_CUDA_CUDA_BLOCK_H_

// What every architecture's CUDA transformer block shares (stages/gpt/cuda, stages/llama/cuda):
// Forward with activation checkpointing (only the input is kept and BackwardInput recomputes the
// rest, with the same kernels, so results are bitwise unchanged), and the choice of where the
// attention runs. A block fills saved[1 ..] from saved[0] (its input) in ComputeInternals and
// writes its output from them in ComputeOutput.

#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "stages/cuda/cuda_layer.h"
#include "stages/cuda/sdpa.h"
#include "stages/cuda/sdpa_layout.h"

namespace bigmac::stages::cuda {

template <typename T>
class CudaBlock : public CudaLayer<T> {
 public:
  // kv_heads = heads: multi-head attention.
  CudaBlock(const layer::LayerSpec& spec, std::vector<ParamSpec> params, int heads, int kv_heads,
            int head_dim)
      : CudaLayer<T>(spec, std::move(params)),
        heads_(heads),
        kv_heads_(kv_heads),
        head_dim_(head_dim),
        cudnn_allowed_(ChooseAttention(CudaLayer<T>::kActivation, head_dim).cudnn) {}

  // It recomputes in BackwardInput itself: the stage must not rerun Forward as well.
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

 protected:
  virtual void ComputeInternals(const device::cuda::CallSite& site, const MicroBatch& mb,
                                Saved* saved) = 0;
  virtual void ComputeOutput(const device::cuda::CallSite& site, const MicroBatch& mb,
                             const Saved& saved, Tensor* y) = 0;

  // cuDNN's fused attention when ChooseAttention allows it and this cuDNN builds both graphs for
  // the micro-batch's shape; otherwise the fallback, for forward and backward alike (the saved
  // tensor differs: softmax statistics vs probabilities). Decided once per shape.
  bool UseCudnn(const MicroBatch& mb) {
    if (!cudnn_allowed_) return false;
    const auto shape = std::make_pair(mb.batch, mb.seq);
    if (auto it = cudnn_by_shape_.find(shape); it != cudnn_by_shape_.end()) return it->second;
    const std::string why = CudnnAttentionUnavailable(this->Site("attention set-up"), mb.batch,
                                                      mb.seq, heads_, head_dim_, kv_heads_);
    if (!why.empty()) {
      std::fprintf(stderr, "[device] %s: cuDNN fused SDPA unavailable, using the fallback: %s\n",
                   layer::LayerIdName(this->layer_id(), this->spec_.dims.num_layers).c_str(),
                   why.c_str());
    }
    return cudnn_by_shape_[shape] = why.empty();
  }

  const int heads_;
  const int kv_heads_;
  const int head_dim_;
  const bool cudnn_allowed_;

 private:
  std::map<std::pair<int, int>, bool> cudnn_by_shape_;
};

}  // namespace bigmac::stages::cuda

#endif  // BIGMAC_STAGES_CUDA_CUDA_BLOCK_H_
