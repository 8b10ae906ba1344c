#include "core/layer/layer.h"

namespace bigmac::layer {
namespace {

// A CPU layer computes in its spec's dtype (f32); under bf16 the activations between layers are
// bf16. This wrapper widens its inputs and rounds its (batch, seq, width) outputs to the
// activation dtype at the boundary, the CPU kernels' "bf16 in, fp32 arithmetic, round to nearest
// even out". The head's 1-element loss is not an activation and stays fp32.
class ActivationConversion : public Layer {
 public:
  explicit ActivationConversion(std::unique_ptr<Layer> inner)
      : Layer(inner->spec()), inner_(std::move(inner)) {}

  std::vector<Param*> Params() override { return inner_->Params(); }
  void InitParams(uint64_t seed) override { inner_->InitParams(seed); }
  bool checkpoints_activations() const override { return inner_->checkpoints_activations(); }

  void Forward(const MicroBatch& mb, const Tensor& x, Tensor* y, Saved* saved) override {
    Tensor wide_x, wide_y;
    inner_->Forward(mb, Widen(x, &wide_x), &wide_y, saved);
    *y = Narrow(std::move(wide_y));
  }
  void BackwardInput(const MicroBatch& mb, const Tensor& dy, Tensor* dx, Saved* saved) override {
    Tensor wide_dy, wide_dx;
    inner_->BackwardInput(mb, Widen(dy, &wide_dy), dx ? &wide_dx : nullptr, saved);
    if (dx) *dx = Narrow(std::move(wide_dx));
  }
  void BackwardWeight(const MicroBatch& mb, Saved* saved) override {
    inner_->BackwardWeight(mb, saved);
  }
  int64_t ForwardFlops(int batch, int seq) const override {
    return inner_->ForwardFlops(batch, seq);
  }
  int64_t ActivationBytes(int batch, int seq) const override {
    return inner_->ActivationBytes(batch, seq);
  }

 private:
  // `x` itself if it is already of the compute dtype (or empty: the embedding's input), else
  // its widened copy in `storage`.
  const Tensor& Widen(const Tensor& x, Tensor* storage) const {
    if (x.empty() || x.dtype() == spec_.dtype) return x;
    *storage = Tensor(spec_.device, x.shape(), spec_.dtype);
    storage->ConvertFrom(x);
    return *storage;
  }
  Tensor Narrow(Tensor y) const {
    if (y.empty() || y.shape().size() != 3 || y.dtype() == spec_.activation_dtype()) return y;
    Tensor narrow(spec_.device, y.shape(), spec_.activation_dtype());
    narrow.ConvertFrom(y);
    return narrow;
  }

  std::unique_ptr<Layer> inner_;
};

std::unique_ptr<Layer> WrapWithActivationConversion(std::unique_ptr<Layer> layer) {
  return std::make_unique<ActivationConversion>(std::move(layer));
}

}  // namespace

int HeadLayerId(int num_layers) { return num_layers; }

int DefaultIntermediateSize(int hidden_size) {
  const int64_t width = int64_t{8} * hidden_size / 3;
  return static_cast<int>((width + 255) / 256 * 256);
}

std::string LayerIdName(int layer_id, int num_layers) {
  if (layer_id == kEmbeddingLayerId) return "embedding";
  if (layer_id == HeadLayerId(num_layers)) return "head";
  return "block " + std::to_string(layer_id);
}

int64_t Saved::bytes() const {
  int64_t total = 0;
  for (const Tensor& tensor : tensors) total += tensor.bytes();
  return total;
}

Tensor Layer::NewActivation(int batch, int seq, int width) const {
  return Tensor(spec_.device, {batch, seq, width}, spec_.dtype);
}

void RefreshComputeCopy(Param* param) {
  if (param->compute.empty()) return;
  param->compute.ConvertFrom(param->value);
  ++param->compute_version;
}

std::unique_ptr<Layer> CreateLayer(const LayerSpec& spec) {
  if (spec.device == nullptr) throw std::logic_error("LayerSpec without a device");
  const device::Backend backend = spec.device->backend();
  return WrapForBackend(
      spec, LayerRegistry::Global().Create(spec.type, device::BackendName(backend), spec));
}

std::unique_ptr<Layer> WrapForBackend(const LayerSpec& spec, std::unique_ptr<Layer> layer) {
  if (spec.device->backend() == device::Backend::kCpu && spec.bf16)
    return WrapWithActivationConversion(std::move(layer));
  return layer;
}

}  // namespace bigmac::layer
