#include "core/util/constant_weights.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>

namespace bigmac::util {
namespace {

// Written by the scope's thread while no kernel runs (before the flush's first and after its
// last), read by the kernels in between.
std::vector<std::pair<const void*, int64_t>> listed;  // sorted by start
std::atomic<uint64_t> live_epoch{0};                  // 0: no scope
uint64_t last_epoch = 0;

}  // namespace

ConstantWeightsScope::ConstantWeightsScope(std::vector<std::pair<const void*, int64_t>> weights) {
  if (live_epoch.load(std::memory_order_acquire) != 0) {
    std::fprintf(stderr, "bigmac: a ConstantWeightsScope inside another\n");
    std::abort();
  }
  std::sort(weights.begin(), weights.end());
  listed = std::move(weights);
  live_epoch.store(++last_epoch, std::memory_order_release);
}

ConstantWeightsScope::~ConstantWeightsScope() {
  live_epoch.store(0, std::memory_order_release);
  listed.clear();
}

uint64_t ConstantWeightEpoch(const void* data, int64_t bytes) {
  const uint64_t epoch = live_epoch.load(std::memory_order_acquire);
  if (epoch == 0) return 0;
  const auto it = std::lower_bound(listed.begin(), listed.end(), std::make_pair(data, int64_t{0}));
  return it != listed.end() && it->first == data && it->second == bytes ? epoch : 0;
}

}  // namespace bigmac::util
