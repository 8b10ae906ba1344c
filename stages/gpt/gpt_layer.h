#ifndef BIGMAC_STAGES_GPT_GPT_LAYER_H_
#define BIGMAC_STAGES_GPT_GPT_LAYER_H_

#include <memory>
#include <string>
#include <vector>

#include "core/layer/layer.h"

namespace bigmac::stages::gpt {

using layer::LayerSpec;
using layer::MicroBatch;
using layer::Param;
using layer::Saved;
using memory::Tensor;

// Shared plumbing of the CPU layers (the GPT layers and the example plugin): parameter storage and
// typed access. T is float or double, the spec's dtype, in which the kernels compute. Under bf16
// each parameter also has a bf16 compute copy; W() then gives the kernels that copy widened to T
// (re-widened only when the copy was refreshed), so the arithmetic sees bf16 weights.
template <typename T>
class GptLayer : public layer::Layer {
 public:
  explicit GptLayer(const LayerSpec& spec) : layer::Layer(spec) {}

  std::vector<Param*> Params() override {
    std::vector<Param*> params;
    for (Param& param : params_) params.push_back(&param);
    return params;
  }

 protected:
  int AddParam(const std::string& name, std::vector<int64_t> shape, bool weight_decay) {
    Param param;
    param.name = name;
    param.value = Tensor(spec_.device, shape, spec_.dtype);
    param.grad = Tensor(spec_.device, shape, spec_.dtype);
    if (spec_.bf16) param.compute = Tensor(spec_.device, shape, memory::DType::kBF16);
    param.weight_decay = weight_decay;
    params_.push_back(std::move(param));
    widened_.emplace_back();
    return static_cast<int>(params_.size()) - 1;
  }
  // The weights the kernels read: the master, or the widened compute copy.
  T* W(int index) {
    Param& param = params_[index];
    if (param.compute.empty()) return param.value.template data<T>();
    Widened& wide = widened_[index];
    if (wide.tensor.empty()) wide.tensor = Tensor(spec_.device, param.value.shape(), spec_.dtype);
    if (wide.version != param.compute_version) {
      wide.tensor.ConvertFrom(param.compute);
      wide.version = param.compute_version;
    }
    return wide.tensor.template data<T>();
  }
  T* G(int index) { return params_[index].grad.template data<T>(); }
  Tensor New(std::vector<int64_t> shape) const {
    return Tensor(spec_.device, shape, spec_.dtype);
  }
  static T* D(Tensor& tensor) { return tensor.data<T>(); }
  static const T* D(const Tensor& tensor) { return tensor.data<T>(); }

  int C() const { return spec_.dims.hidden_size; }
  int V() const { return spec_.dims.vocab_size; }

  std::vector<Param> params_;

 private:
  struct Widened {
    Tensor tensor;
    int64_t version = -1;
  };
  std::vector<Widened> widened_;  // per parameter, under bf16
};

}  // namespace bigmac::stages::gpt

#endif  // BIGMAC_STAGES_GPT_GPT_LAYER_H_
