#ifndef BIGMAC_CORE_UTIL_CONSTANT_WEIGHTS_H_
#define BIGMAC_CORE_UTIL_CONSTANT_WEIGHTS_H_

#include <cstdint>
#include <utility>
#include <vector>

namespace bigmac::util {

// The model's weights do not change while a flush's micro-batches pass the stages: the optimizer,
// the tied-weight exchange and checkpoint loads all run between flushes. While a
// ConstantWeightsScope lives, kernels may keep copies derived from the weights it lists (the CPU
// GEMM's packed B: bench/NOTES.md, lever 22) and use them again for the next micro-batch; each
// scope has its own epoch, and a copy made in one epoch is never used in another. Only the
// listed buffers count: a plugin's scratch matrix passed as a weight is not one of them.
//
// One scope at a time per process, opened and closed on one thread (the executor's); the queries
// are safe from any thread while it lives. The listed buffers must outlive the scope and stay
// unchanged while it lives.
class ConstantWeightsScope {
 public:
  // (start, bytes) of each weight buffer.
  explicit ConstantWeightsScope(std::vector<std::pair<const void*, int64_t>> weights);
  ~ConstantWeightsScope();
  ConstantWeightsScope(const ConstantWeightsScope&) = delete;
  ConstantWeightsScope& operator=(const ConstantWeightsScope&) = delete;
};

// The live scope's epoch when [data, data + bytes) is one of its listed buffers from its start
// (a whole weight, not a part of one); 0 otherwise, and always outside a scope.
uint64_t ConstantWeightEpoch(const void* data, int64_t bytes);

}  // namespace bigmac::util

#endif  // BIGMAC_CORE_UTIL_CONSTANT_WEIGHTS_H_
