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

}  // namespace bigmac::checkpoint
