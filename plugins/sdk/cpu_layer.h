#ifndef BIGMAC_PLUGINS_SDK_CPU_LAYER_H_
#define BIGMAC_PLUGINS_SDK_CPU_LAYER_H_

// Plugin SDK: the base class of CPU layers (the built-in GPT layers and plugin layers alike):
// parameter storage and typed access for kernels templated on T = float (training) or double
// (gradient checks), the spec's dtype. Header-only; target //plugins/sdk:cpu_layer.
//
// Stability: the class is compiled into each plugin, so only what it derives from
// (layer::Layer, LayerSpec, Param, Tensor: core/layer/layer.h) crosses the host/plugin boundary
// and is covered by BIGMAC_PLUGIN_ABI_VERSION (plugins/bigmac_plugin.h). The members below are a
// source API, kept within an ABI version; a plugin built against older SDK headers keeps working
// until the ABI version changes.
//
// Ownership and lifetime: the layer owns its Params (masters, gradients, bf16 compute copies) and
// the widened copies W() caches; every tensor comes from spec.device, which outlives the layer.
// Pointers from W(), G() and D() are valid until the tensor is replaced or the layer destroyed.

#include <memory>
#include <string>
#include <vector>

#include "core/layer/layer.h"

namespace bigmac::sdk {

using layer::LayerSpec;
using layer::MicroBatch;
using layer::Param;
using layer::Saved;
using memory::Tensor;

// Under precision.dtype=bf16 (spec.bf16) each parameter also has a bf16 compute copy
// (Param::compute, refreshed by the host after init, load, each optimizer step and each
// tied-weight exchange); W() then gives the kernels that copy widened to T, re-widened only when
// the copy was refreshed, so the arithmetic sees bf16 weights while the masters stay fp32. The
// host converts activations at the layer boundary (bf16 in, widened to T; T out, rounded to
// bf16), so a CPU layer only ever sees T.
template <typename T>
class CpuLayer : public layer::Layer {
 public:
  explicit CpuLayer(const LayerSpec& spec) : layer::Layer(spec) {}

  std::vector<Param*> Params() override {
    std::vector<Param*> params;
    for (Param& param : params_) params.push_back(&param);
    return params;
  }

 protected:
  // Adds a parameter (master and gradient of `dtype`, plus a bf16 compute copy under bf16) and
  // returns its index for W() and G(). Names are what checkpoints store: unique in the layer.
  // `weight_decay`: true for matrices, false for biases and norms.
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
  // The weights the kernels read: the master, or the widened bf16 compute copy. Read-only for
  // the kernels (the optimizer writes the master).
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
  // The gradient of parameter `index`: backward passes accumulate (+=) into it.
  T* G(int index) { return params_[index].grad.template data<T>(); }
  // A new tensor of the compute dtype on the layer's device (counted against its capacity).
  Tensor New(std::vector<int64_t> shape) const { return Tensor(spec_.device, shape, spec_.dtype); }
  // The same, not zeroed (contents unspecified): for a kernel's output that it overwrites whole,
  // a Forward's or a BackwardInput's without "+=" (cpu_kernels.h).
  Tensor NewForOverwrite(std::vector<int64_t> shape) const {
    return Tensor::ForOverwrite(spec_.device, shape, spec_.dtype);
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

}  // namespace bigmac::sdk

#endif  // BIGMAC_PLUGINS_SDK_CPU_LAYER_H_
