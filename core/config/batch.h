#ifndef BIGMAC_CORE_CONFIG_BATCH_H_
#define BIGMAC_CORE_CONFIG_BATCH_H_

#include <cstdint>
#include <string>

#include "core/config/config.pb.h"

namespace bigmac::config {

// The batch formulas, in one place. Seed 2: micro-batches per flush (pipeline fill depth) and
// gradient accumulation steps are separate concepts.
struct BatchPlan {
  int micro_batch_size = 1;    // samples per forward of one stage
  int accumulation_steps = 1;  // micro-batches per optimizer step, per dp replica
  int num_microbatches = 1;    // micro-batches per pipeline flush
  int flushes_per_step = 1;    // accumulation_steps / num_microbatches
  int dp = 1;
  int64_t global_batch = 1;  // micro_batch_size * accumulation_steps * dp

  // "micro_bs*accum*dp = 2*8*2 = 32".
  std::string GlobalBatchFormula() const;
};

// dp = world_size / (pp_size * tp_size). Callers have checked divisibility.
int DataParallelSize(int world_size, int pp_size, int tp_size);

// parallel.num_microbatches, or train.gradient_accumulation_steps when it is 0 (unset).
int NumMicrobatches(const Config& config);

BatchPlan MakeBatchPlan(const Config& config, int dp);

}  // namespace bigmac::config

#endif  // BIGMAC_CORE_CONFIG_BATCH_H_
