#ifndef BIGMAC_STAGES_CUDA_SDPA_INTERNAL_H_
#define BIGMAC_STAGES_CUDA_SDPA_INTERNAL_H_

// For tests of sdpa.cc (its graphs and their cache); not part of the layers' API.

#include <cstdint>
#include <string>

#include "stages/cuda/sdpa_layout.h"

namespace bigmac::stages::cuda::internal {

// Declares the graph CudnnAttentionForward (backward = false) or CudnnAttentionBackward runs,
// over `layout`, for a GPU of compute capability `sm_version` (90: Hopper), and runs the
// frontend's validate(): its dims, strides, alignment and support-surface checks. Needs no GPU
// (with the SM version given, the frontend does not query a device). Returns "" when the graph
// is valid, otherwise "<error code>: <the frontend's message>".
std::string ValidateSdpaGraph(bool backward, const SdpaLayout& layout, int sm_version);

// cuDNN SDPA graphs built successfully since the start of the process (forward and backward).
int64_t SdpaGraphBuilds();
// Graphs in the cache now.
int64_t SdpaCachedGraphs();

}  // namespace bigmac::stages::cuda::internal

#endif  // BIGMAC_STAGES_CUDA_SDPA_INTERNAL_H_
