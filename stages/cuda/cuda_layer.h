#ifndef BIGMAC_STAGES_CUDA_CUDA_LAYER_H_
#define BIGMAC_STAGES_CUDA_CUDA_LAYER_H_

// The base of the CUDA layers of every built-in architecture (stages/gpt/cuda, stages/llama/cuda):
// parameters from the backend-neutral tables (stages/param_spec.h) on the layer's CUDA device,
// typed device pointers for the kernels, and call sites that name the layer, the phase, the rank
// and the device in every error.
//
// T is the activation and compute type: float (precision fp32: the kernels read the fp32
// masters) or __nv_bfloat16 (bf16: they read the bf16 compute copies the optimizer writes).
// Masters and gradients are always fp32. The layer owns its Params; its device (spec.device, a
// CUDA device) outlives it.

#include <cuda_bf16.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "core/device/cuda/cuda_device.h"
#include "core/layer/layer.h"
#include "stages/param_spec.h"

namespace bigmac::stages::cuda {

using layer::MicroBatch;
using layer::Param;
using layer::Saved;
using memory::DType;
using memory::Tensor;

template <typename T>
class CudaLayer : public layer::Layer {
 public:
  static constexpr DType kActivation = std::is_same_v<T, float> ? DType::kF32 : DType::kBF16;

  CudaLayer(const layer::LayerSpec& spec, std::vector<ParamSpec> params)
      : layer::Layer(spec),
        context_(device::cuda::ContextOf(spec.device)),
        specs_(std::move(params)) {
    if (spec.dtype != DType::kF32) {
      throw std::invalid_argument(spec.type + ": the CUDA layers keep fp32 masters, not " +
                                  memory::DTypeName(spec.dtype));
    }
    for (const ParamSpec& param : specs_) params_.push_back(MakeParam(param, spec));
  }

  std::vector<Param*> Params() override {
    std::vector<Param*> params;
    for (Param& param : params_) params.push_back(&param);
    return params;
  }

  void InitParams(uint64_t seed) override {
    for (size_t i = 0; i < specs_.size(); ++i)
      InitParam(specs_[i], &params_[i].value, seed, layer_id());
  }

 protected:
  // The weights the kernels read: the bf16 compute copy, or the fp32 master.
  const T* W(int index) const {
    if (index < 0) return nullptr;  // a parameter the architecture does not have
    const Param& param = params_[index];
    return static_cast<const T*>(param.compute.empty() ? param.value.raw() : param.compute.raw());
  }
  float* G(int index) {
    return index < 0 ? nullptr : static_cast<float*>(params_[index].grad.raw());
  }

  // Outputs and activations: every one is written whole by the kernel or GEMM that produces it
  // before anything reads it (the CPU's ForOverwrite rule), so no zeroing pass. The logits'
  // padding columns are never written nor read. The emulated device fills new blocks, and blocks
  // the caching allocator hands out again, with NaN: a kernel that reads what nobody wrote fails
  // emulated_train_test's comparison with the CPU.
  Tensor New(std::vector<int64_t> shape) const {
    return Tensor::ForOverwrite(spec_.device, shape, kActivation);
  }
  Tensor NewFloat(std::vector<int64_t> shape) const {
    return Tensor::ForOverwrite(spec_.device, shape, DType::kF32);
  }
  // Zeroed: for outputs a kernel adds into (LayerNormBackwardInput accumulates into dinp).
  Tensor NewZeroed(std::vector<int64_t> shape) const {
    return Tensor(spec_.device, shape, kActivation);
  }
  static T* P(Tensor& tensor) { return static_cast<T*>(tensor.raw()); }
  static const T* P(const Tensor& tensor) { return static_cast<const T*>(tensor.raw()); }
  static float* F(Tensor& tensor) { return static_cast<float*>(tensor.raw()); }
  static const float* F(const Tensor& tensor) { return static_cast<const float*>(tensor.raw()); }

  // "gpt_block 3 forward, on rank 2 (cuda:0)".
  device::cuda::CallSite Site(const char* phase) const {
    return device::cuda::SiteOf(
        context_,
        type() + " " + layer::LayerIdName(layer_id(), spec_.dims.num_layers) + " " + phase);
  }

  int C() const { return spec_.dims.hidden_size; }
  int V() const { return spec_.dims.vocab_size; }

  const device::cuda::CudaContext& context_;
  std::vector<ParamSpec> specs_;
  std::vector<Param> params_;
};

// float activations under precision fp32, bf16 under bf16.
template <template <typename> class LayerClass>
std::unique_ptr<layer::Layer> MakeForPrecision(const layer::LayerSpec& spec) {
  if (spec.bf16) return std::make_unique<LayerClass<__nv_bfloat16>>(spec);
  return std::make_unique<LayerClass<float>>(spec);
}

}  // namespace bigmac::stages::cuda

#endif  // BIGMAC_STAGES_CUDA_CUDA_LAYER_H_
