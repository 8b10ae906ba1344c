#include "core/checkpoint/tp_slices.h"

#include <vector>

namespace bigmac::checkpoint {

memory::Tensor GatherTpSlices(const memory::Tensor& local, const layer::TpShard& shard,
                              comm::Group& tp) {
  if (!shard.sliced()) return local.Clone();
  const std::vector<memory::Tensor> slices =
      tp.AllGather(local, "gathering tensor-parallel slices " + local.ShapeString());
  memory::Tensor full(local.device(), shard.full_shape, local.dtype());
  const int64_t element = memory::DTypeSize(local.dtype());
  std::vector<char> full_host(full.bytes()), slice_host(local.bytes());
  layer::TpShard of_rank = shard;
  for (size_t r = 0; r < slices.size(); ++r) {
    of_rank.rank = static_cast<int>(r);
    slices[r].CopyToHost(slice_host.data());
    layer::LocalToFull(of_rank, slice_host.data(), full_host.data(), element);
  }
  full.CopyFromHost(full_host.data());
  return full;
}

memory::Tensor TpSliceFromHost(const void* full_host, const layer::TpShard& shard,
                               device::Device* device, memory::DType dtype) {
  if (!shard.sliced()) {
    memory::Tensor whole(device, shard.full_shape, dtype);
    whole.CopyFromHost(full_host);
    return whole;
  }
  memory::Tensor local(device, shard.LocalShape(), dtype);
  std::vector<char> local_host(local.bytes());
  layer::FullToLocal(shard, full_host, local_host.data(), memory::DTypeSize(dtype));
  local.CopyFromHost(local_host.data());
  return local;
}

}  // namespace bigmac::checkpoint
