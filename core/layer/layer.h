#ifndef BIGMAC_CORE_LAYER_LAYER_H_
#define BIGMAC_CORE_LAYER_LAYER_H_

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/device/device.h"
#include "core/memory/tensor.h"
#include "core/registry/registry.h"

namespace bigmac::layer {

using memory::DType;
using memory::Tensor;

// layer_id numbering: transformer blocks are 0..num_layers-1 (what the partition cuts); the
// embedding is kEmbeddingLayerId (before block 0) and the head is num_layers (after the last
// block), so sorting by layer_id gives model order.
inline constexpr int kEmbeddingLayerId = -1;
int HeadLayerId(int num_layers);
std::string LayerIdName(int layer_id, int num_layers);  // "embedding", "block 3", "head"

// The built-in architectures (model.arch): GPT-2, and the Llama family (docs/llama.md).
enum class Arch { kGpt, kLlama };

struct ModelDims {
  int vocab_size = 256;
  int hidden_size = 64;
  int num_heads = 4;
  int num_layers = 2;
  int max_seq_length = 64;  // rows of the position embedding (GPT), of the RoPE table (llama)
  Arch arch = Arch::kGpt;
  // Llama only (GPT-2 has num_heads, 4 * hidden_size and a tied head):
  int num_kv_heads = 0;       // resolved: dividing num_heads (0 only in a default ModelDims)
  int intermediate_size = 0;  // resolved SwiGLU width
  double rope_theta = 10000;
  double rms_norm_eps = 1e-5;
  bool tie_embeddings = false;

  int head_dim() const { return hidden_size / num_heads; }
  int kv_heads() const { return num_kv_heads > 0 ? num_kv_heads : num_heads; }
  // The MLP's inner width: GPT-2's 4 * hidden_size, or llama's intermediate_size.
  int mlp_width() const { return arch == Arch::kLlama ? intermediate_size : 4 * hidden_size; }
  // Whether the head's output matrix is the embedding's `wte` (GPT-2 always; llama optionally).
  bool tied_head() const { return arch == Arch::kGpt || tie_embeddings; }
};

// Llama's default SwiGLU width for `hidden_size` (model.intermediate_size 0): 8/3 of it, rounded
// up to a multiple of 256 (Meta's reference code, multiple_of = 256).
int DefaultIntermediateSize(int hidden_size);

// What a layer is built from. The device outlives the layer.
struct LayerSpec {
  std::string type;
  int layer_id = 0;
  ModelDims dims;
  // The masters' and gradients' dtype (f32; f64 in gradient checks). CPU kernels compute in it.
  DType dtype = DType::kF32;
  // precision.dtype=bf16: what crosses layer boundaries, and the parameters' compute copies, are
  // bf16 (masters and gradients stay `dtype`).
  bool bf16 = false;
  // What crosses layer boundaries: bf16, or `dtype`.
  DType activation_dtype() const { return bf16 ? DType::kBF16 : dtype; }
  device::Device* device = nullptr;
  bool activation_checkpointing = false;  // keep only the input; recompute the rest in backward
};

struct Param {
  std::string name;  // unique within the layer, e.g. "attn.qkv.weight"
  Tensor value;      // the master (what the optimizer updates and checkpoints hold)
  Tensor grad;       // of the master's dtype; backward passes accumulate into it
  // The copy layers compute from when the activation dtype differs from the master's (bf16),
  // else empty. RefreshComputeCopy writes it after init, load, each optimizer step and each
  // tied-weight exchange; compute_version counts those refreshes so layers can cache views.
  Tensor compute;
  int64_t compute_version = 0;
  bool weight_decay = false;  // matrices decay; biases and norms do not (GPT-2 convention)
  // A read-only copy of a weight another layer owns (the head's view of the tied token
  // embedding). Its gradient is sent to the owner and it receives the owner's value after each
  // step; optimizers, grad norms and checkpoints skip it.
  bool tied_copy = false;
  std::string tied_owner;  // "embedding/wte" for the head's copy
};

// Re-rounds `param`'s compute copy from its master (nothing when it has none).
void RefreshComputeCopy(Param* param);

// One micro-batch as every layer sees it. Tokens and targets are (batch, seq) row-major.
struct MicroBatch {
  int batch = 1;
  int seq = 1;
  const int32_t* tokens = nullptr;
  const int32_t* targets = nullptr;
  // The head's loss is sum(token losses) * loss_scale; the gradient follows. Choosing
  // 1/(tokens in the global batch) makes every pp/dp split of one global batch give one gradient.
  double loss_scale = 1.0;
  int index = 0;  // the micro-batch's number within its pipeline flush (keys kept activations)
  // The same tokens in host memory (null when the caller has none): a GPU layer that needs them
  // on the host (the embedding backward's bucketing) then does not wait for a device copy.
  const int32_t* host_tokens = nullptr;
};

// What a layer keeps between its forward and its backward for one micro-batch.
struct Saved {
  std::vector<Tensor> tensors;
  void Clear() { tensors.clear(); }
  int64_t bytes() const;
};

// A model layer: a stage plugin builds it from the registry by (type name, backend).
// Activations between layers are (batch, seq, width) tensors of the spec's activation dtype;
// on CUDA every tensor, token and target pointer is a device pointer, valid in stream order on
// the device's compute stream. The
// embedding reads tokens instead of `x`; the head writes its loss as a 1-element tensor.
// The backward is split (the zero-bubble schedule needs it): BackwardInput computes dx and keeps
// what BackwardWeight needs; BackwardWeight accumulates the parameter gradients and clears
// `saved`. Backward = BackwardInput then BackwardWeight.
class Layer {
 public:
  explicit Layer(const LayerSpec& spec) : spec_(spec) {}
  virtual ~Layer() = default;

  const std::string& type() const { return spec_.type; }
  int layer_id() const { return spec_.layer_id; }
  const LayerSpec& spec() const { return spec_; }

  virtual std::vector<Param*> Params() = 0;
  // Whether the layer honours spec().activation_checkpointing itself (keeps only its input and
  // recomputes in BackwardInput). If not, the stage does it for the layer: it keeps the input
  // and reruns Forward before the backward.
  virtual bool checkpoints_activations() const { return false; }
  // Deterministic from (seed, layer_id): the same model on any partition.
  virtual void InitParams(uint64_t seed) = 0;

  virtual void Forward(const MicroBatch& mb, const Tensor& x, Tensor* y, Saved* saved) = 0;
  virtual void BackwardInput(const MicroBatch& mb, const Tensor& dy, Tensor* dx, Saved* saved) = 0;
  virtual void BackwardWeight(const MicroBatch& mb, Saved* saved) = 0;

  // Forward FLOPs (multiply-add = 2) and the bytes Forward keeps in `saved`, for planning.
  virtual int64_t ForwardFlops(int batch, int seq) const = 0;
  virtual int64_t ActivationBytes(int batch, int seq) const = 0;

 protected:
  // A (batch, seq, width) tensor of this layer's compute dtype (`dtype`).
  Tensor NewActivation(int batch, int seq, int width) const;
  LayerSpec spec_;
};

using LayerRegistry = registry::Registry<Layer, const LayerSpec&>;

// Builds LayerClass<float> or LayerClass<double> for the spec's dtype (the CPU kernels' types);
// the CPU factory of the built-in GPT layers and of the example plugin.
template <template <typename> class LayerClass>
std::unique_ptr<Layer> MakeForDType(const LayerSpec& spec) {
  if (spec.dtype == memory::DType::kF64) return std::make_unique<LayerClass<double>>(spec);
  if (spec.dtype == memory::DType::kF32) return std::make_unique<LayerClass<float>>(spec);
  throw std::invalid_argument("layer " + spec.type + ": CPU kernels support f32 and f64, not " +
                              memory::DTypeName(spec.dtype));
}

// Builds a layer by type name for the spec's device's backend; an unknown name lists the known
// types, a type without this backend names the backends it has. A CPU layer computes in `dtype`:
// when the activation dtype differs (bf16), its inputs are widened and its (batch, seq, width)
// outputs rounded at the boundary, so every CPU layer, a plugin's too, trains in bf16.
std::unique_ptr<Layer> CreateLayer(const LayerSpec& spec);
// What CreateLayer does to a layer it built: on the CPU under bf16, the activation conversion.
std::unique_ptr<Layer> WrapForBackend(const LayerSpec& spec, std::unique_ptr<Layer> layer);

}  // namespace bigmac::layer

#endif  // BIGMAC_CORE_LAYER_LAYER_H_
