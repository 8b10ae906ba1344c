#ifndef BIGMAC_CORE_LAYER_TP_LAYER_H_
#define BIGMAC_CORE_LAYER_TP_LAYER_H_

// Tensor parallelism (Megatron's layout, docs/tensor_parallel.md) as the layers see it: the
// collectives of the tp group, how a parameter is sliced over it, and a second registry of the
// layer types that have a tensor-parallel implementation. A type without one runs replicated on
// every tp rank (correct, just redundant). Nothing here changes the plugin ABI: plugins build
// plain layers only.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/layer/layer.h"
#include "core/registry/registry.h"

namespace bigmac::layer {

// The ranks that split one stage's matrices (same pp and dp coordinates). The engine owns it
// (over its transport) and it outlives the layers. Calls are collective over the group, made in
// the same order on every rank; every rank gets the same bits.
class TpGroup {
 public:
  virtual ~TpGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In place, f32 or f64. `what` names the call in a deadline message.
  virtual void AllReduceSum(Tensor* tensor, const std::string& what) = 0;
  virtual void AllReduceMax(Tensor* tensor, const std::string& what) = 0;
};

// How a tp rank holds one parameter. Replicated (dim < 0): the whole tensor on every tp rank,
// updated identically, counted once in norms and checkpoints. Sliced: along `dim`, the full
// dimension is a sequence of parts (`blocks` equal ones: 3 for GPT's fused q, k, v, 2 for
// llama's fused gate and up, else 1; or the lengths in `parts`: llama's q, k and v of
// grouped-query attention), each cut into `size` consecutive slices of equal length (the last
// padded with rows that hold zeros and never reach the loss when the part does not divide: the
// padded vocabulary); rank `rank` holds slice `rank` of every part, parts in order.
struct TpShard {
  int dim = -1;
  int blocks = 1;
  std::vector<int64_t> parts;  // lengths along dim, summing to full_shape[dim]; empty: blocks
  int rank = 0;
  int size = 1;
  std::vector<int64_t> full_shape;  // the unsharded tensor: what checkpoints hold
  // The padded length of each part along `dim` (a multiple of size), or 0 for the smallest:
  // size * ceil(part / size).
  int64_t padded = 0;
  bool sliced() const { return dim >= 0; }
  int PartCount() const { return parts.empty() ? blocks : static_cast<int>(parts.size()); }
  // The full length of part `part` along `dim`.
  int64_t PartLength(int part = 0) const;
  // The length of part `part`'s slice along `dim`.
  int64_t SliceLength(int part = 0) const;
  // This rank's shape: full_shape with dim's length the sum of the parts' slices.
  std::vector<int64_t> LocalShape() const;
  // Index along `dim` of the full tensor for local index `i`, or -1 for a padding row.
  int64_t FullIndex(int64_t i) const;
};

// The vocabulary a vocab-parallel embedding and head compute with: `vocab` rounded up to a
// multiple of tp * 64 (Megatron's padding; each tp rank's slice a multiple of 64 rows). The
// padding rows hold zeros, their logits are left out of the cross-entropy, and checkpoints hold
// the `vocab` real rows only.
inline int64_t PaddedVocabSize(int64_t vocab, int tp) {
  const int64_t multiple = int64_t{tp} * 64;
  return (vocab + multiple - 1) / multiple * multiple;
}

// Host copies between a full tensor and this rank's slice, `element_bytes` per element:
// FullToLocal writes every local element (zeros in padding rows); LocalToFull writes this rank's
// elements of `full` and leaves the others.
void FullToLocal(const TpShard& shard, const void* full, void* local, int64_t element_bytes);
void LocalToFull(const TpShard& shard, const void* local, void* full, int64_t element_bytes);

// What a layer built for a tp group also is: the slicing of each of its parameters, in Params()
// order. (A mix-in, so that such a layer can derive from the SDK's CpuLayer.)
class TpSharded {
 public:
  virtual ~TpSharded() = default;
  virtual std::vector<TpShard> Shards() const = 0;
};

// (type, backend) -> a layer that also is TpSharded.
using TpLayerRegistry = registry::Registry<Layer, const LayerSpec&, TpGroup*>;

// A layer of `spec` for `group` and the slicing of its parameters (Params() order): the type's
// tensor-parallel implementation for the device's backend if it has one, else the plain layer,
// every parameter replicated. Like CreateLayer, under bf16 on the CPU the result converts
// activations at its boundary.
struct TpBuiltLayer {
  std::unique_ptr<Layer> layer;
  std::vector<TpShard> shards;
};
TpBuiltLayer CreateTpLayer(const LayerSpec& spec, TpGroup* group);

}  // namespace bigmac::layer

#endif  // BIGMAC_CORE_LAYER_TP_LAYER_H_
