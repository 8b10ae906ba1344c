#ifndef BIGMAC_CORE_CHECKPOINT_TP_SLICES_H_
#define BIGMAC_CORE_CHECKPOINT_TP_SLICES_H_

// Between a parameter's full tensor (what checkpoint files and weight dumps hold) and the slice
// a tp rank holds (core/layer/tp_layer.h TpShard). The returned tensors are new, on the
// argument's device.

#include "core/comm/group.h"
#include "core/layer/tp_layer.h"
#include "core/memory/tensor.h"

namespace bigmac::checkpoint {

// The full tensor assembled from every tp rank's `local` slice, on every rank of the group `tp`
// (collective over it when the shard is sliced; a copy when replicated).
memory::Tensor GatherTpSlices(const memory::Tensor& local, const layer::TpShard& shard,
                              comm::Group& tp);

}  // namespace bigmac::checkpoint

#endif  // BIGMAC_CORE_CHECKPOINT_TP_SLICES_H_
