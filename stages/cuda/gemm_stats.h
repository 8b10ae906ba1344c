#ifndef BIGMAC_STAGES_CUDA_GEMM_STATS_H_
#define BIGMAC_STAGES_CUDA_GEMM_STATS_H_

// Internal to gemm.cc, for tests and measurements: which forms the GEMMs of this process ran,
// and a switch that turns the fused epilogues off (llm.c found the GELU fusion slower on some
// shapes; measure both before settling).

#include <cstdint>

namespace bigmac::stages::cuda {

struct GemmStats {
  // Calls by the epilogue cuBLASLt ran, indexed by Epilogue (gemm_plan.h): a forward that asked
  // for GELU and ran kNone did its bias and GELU in kernels.
  int64_t calls_by_epilogue[4] = {};
  int64_t heuristic_queries = 0;  // cache misses: descriptors built and the heuristic asked
  int64_t heuristic_misses = 0;   // of those, the ones with no algorithm (or a heuristic error)
};

GemmStats GetGemmStats();
// true (the default): fused epilogues where allowed and served; false: always the plain GEMM,
// then AddBias / GeluForward / BiasGradAccumulate.
void SetEpilogueFusion(bool enabled);

}  // namespace bigmac::stages::cuda

#endif  // BIGMAC_STAGES_CUDA_GEMM_STATS_H_
