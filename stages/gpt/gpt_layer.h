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

// Shared plumbing of the GPT layers: parameter storage and typed access. T is float or double.
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
    param.value = Tensor(spec_.allocator, shape, spec_.dtype);
    param.grad = Tensor(spec_.allocator, shape, spec_.dtype);
    param.weight_decay = weight_decay;
    params_.push_back(std::move(param));
    return static_cast<int>(params_.size()) - 1;
  }
  T* W(int index) { return params_[index].value.template data<T>(); }
  T* G(int index) { return params_[index].grad.template data<T>(); }
  Tensor New(std::vector<int64_t> shape) const {
    return Tensor(spec_.allocator, shape, spec_.dtype);
  }
  static T* D(Tensor& tensor) { return tensor.data<T>(); }
  static const T* D(const Tensor& tensor) { return tensor.data<T>(); }

  int C() const { return spec_.dims.hidden_size; }
  int V() const { return spec_.dims.vocab_size; }

  std::vector<Param> params_;
};

}  // namespace bigmac::stages::gpt

#endif  // BIGMAC_STAGES_GPT_GPT_LAYER_H_
