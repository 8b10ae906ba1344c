#include "core/config/batch.h"

namespace bigmac::config {

std::string BatchPlan::GlobalBatchFormula() const {
  return "micro_bs*accum*dp = " + std::to_string(micro_batch_size) + "*" +
         std::to_string(accumulation_steps) + "*" + std::to_string(dp) + " = " +
         std::to_string(global_batch);
}

int DataParallelSize(int world_size, int pp_size, int tp_size) {
  return world_size / (pp_size * tp_size);
}

int NumMicrobatches(const Config& config) {
  const int explicit_count = config.parallel().num_microbatches();
  return explicit_count > 0 ? explicit_count : config.train().gradient_accumulation_steps();
}

BatchPlan MakeBatchPlan(const Config& config, int dp) {
  BatchPlan plan;
  plan.micro_batch_size = config.train().micro_batch_size();
  plan.accumulation_steps = config.train().gradient_accumulation_steps();
  plan.num_microbatches = NumMicrobatches(config);
  plan.flushes_per_step =
      plan.num_microbatches > 0 ? plan.accumulation_steps / plan.num_microbatches : 0;
  plan.dp = dp;
  plan.global_batch = int64_t{plan.micro_batch_size} * plan.accumulation_steps * dp;
  return plan;
}

}  // namespace bigmac::config
