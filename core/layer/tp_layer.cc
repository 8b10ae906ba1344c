#include "core/layer/tp_layer.h"

#include <cstring>
#include <stdexcept>

namespace bigmac::layer {
namespace {

// Elements before and after `dim` in a row-major tensor of `shape`.
int64_t Product(const std::vector<int64_t>& shape, size_t begin, size_t end) {
  int64_t product = 1;
  for (size_t i = begin; i < end; ++i) product *= shape[i];
  return product;
}

// Copies between full and local rows of one slice; `to_local` picks the direction.
void Copy(const TpShard& shard, const char* from, char* to, int64_t element_bytes, bool to_local) {
  const std::vector<int64_t> local_shape = shard.LocalShape();
  const size_t dim = static_cast<size_t>(shard.dim);
  const int64_t outer = Product(shard.full_shape, 0, dim);
  const int64_t inner = Product(shard.full_shape, dim + 1, shard.full_shape.size());
  const int64_t row = inner * element_bytes;
  const int64_t local_len = local_shape[dim];
  const int64_t full_len = shard.full_shape[dim];
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < local_len; ++i) {
      const int64_t f = shard.FullIndex(i);
      char* local_row = nullptr;
      const char* full_row = nullptr;
      if (to_local) {
        local_row = to + (o * local_len + i) * row;
        if (f < 0) {
          std::memset(local_row, 0, row);
          continue;
        }
        full_row = from + (o * full_len + f) * row;
        std::memcpy(local_row, full_row, row);
      } else if (f >= 0) {
        std::memcpy(to + (o * full_len + f) * row, from + (o * local_len + i) * row, row);
      }
    }
  }
}

}  // namespace

int64_t TpShard::PartLength(int part) const {
  return parts.empty() ? full_shape.at(dim) / blocks : parts.at(part);
}

int64_t TpShard::SliceLength(int part) const {
  return padded > 0 ? padded / size : (PartLength(part) + size - 1) / size;
}

std::vector<int64_t> TpShard::LocalShape() const {
  std::vector<int64_t> shape = full_shape;
  if (!sliced()) return shape;
  shape[dim] = 0;
  for (int part = 0; part < PartCount(); ++part) shape[dim] += SliceLength(part);
  return shape;
}

int64_t TpShard::FullIndex(int64_t i) const {
  if (!sliced()) return i;
  int64_t part_begin = 0;  // in the full tensor
  for (int part = 0; part < PartCount(); ++part) {
    const int64_t slice = SliceLength(part);
    if (i < slice) {
      const int64_t within = rank * slice + i;
      return within < PartLength(part) ? part_begin + within : -1;
    }
    i -= slice;
    part_begin += PartLength(part);
  }
  throw std::out_of_range("TpShard::FullIndex: local index past the slice");
}

void FullToLocal(const TpShard& shard, const void* full, void* local, int64_t element_bytes) {
  if (!shard.sliced()) {
    std::memcpy(local, full, Product(shard.full_shape, 0, shard.full_shape.size()) * element_bytes);
    return;
  }
  Copy(shard, static_cast<const char*>(full), static_cast<char*>(local), element_bytes, true);
}

void LocalToFull(const TpShard& shard, const void* local, void* full, int64_t element_bytes) {
  if (!shard.sliced()) {
    std::memcpy(full, local, Product(shard.full_shape, 0, shard.full_shape.size()) * element_bytes);
    return;
  }
  Copy(shard, static_cast<const char*>(local), static_cast<char*>(full), element_bytes, false);
}

TpBuiltLayer CreateTpLayer(const LayerSpec& spec, TpGroup* group) {
  if (spec.device == nullptr) throw std::logic_error("LayerSpec without a device");
  const std::string backend = device::BackendName(spec.device->backend());
  TpBuiltLayer built;
  if (group == nullptr || TpLayerRegistry::Global().Origin(spec.type, backend).empty()) {
    built.layer = CreateLayer(spec);
    for (Param* param : built.layer->Params()) {
      TpShard replicated;
      replicated.full_shape = param->value.shape();
      built.shards.push_back(replicated);
    }
    return built;
  }
  std::unique_ptr<Layer> layer = TpLayerRegistry::Global().Create(spec.type, backend, spec, group);
  const auto* sharded = dynamic_cast<const TpSharded*>(layer.get());
  if (sharded == nullptr)
    throw std::logic_error(spec.type + ": a tensor-parallel layer that does not say its slicing");
  built.shards = sharded->Shards();
  built.layer = WrapForBackend(spec, std::move(layer));
  return built;
}

}  // namespace bigmac::layer
