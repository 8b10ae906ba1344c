#include "core/cli/fault_env.h"

#include <cstdlib>
#include <cstring>

namespace bigmac::cli {
namespace {

// "<first>[:<second>]" into the two numbers (each left as it is when absent).
template <typename T>
void ReadPair(const char* name, T* first, T* second) {
  const char* text = std::getenv(name);
  if (text == nullptr) return;
  *first = static_cast<T>(std::atoll(text));
  if (const char* colon = std::strchr(text, ':'); colon && second)
    *second = static_cast<T>(std::atoll(colon + 1));
}

}  // namespace

util::FaultPlan FaultPlanFromEnvironment() {
  util::FaultPlan plan;
  ReadPair("BIGMAC_TEST_STALL_RANK", &plan.stall_rank, &plan.stall_step);
  ReadPair("BIGMAC_TEST_KILL", &plan.kill_rank, &plan.kill_step);
  ReadPair("BIGMAC_TEST_NAN_GRAD", &plan.nan_step, &plan.nan_layer);
  ReadPair("BIGMAC_TEST_SIGSTOP", &plan.sigstop_rank, &plan.sigstop_step);
  ReadPair("BIGMAC_TEST_SLOW_RANK", &plan.slow_rank, &plan.slow_rank_ms);
  ReadPair<int>("BIGMAC_TEST_MISMATCH_SCHEDULE", &plan.mismatch_rank, nullptr);
  ReadPair<int64_t>("BIGMAC_TEST_CRASH_IN_CHECKPOINT", &plan.crash_in_checkpoint_step, nullptr);
  ReadPair<int64_t>("BIGMAC_TEST_FAIL_CHECKPOINT", &plan.fail_checkpoint_step, nullptr);
  ReadPair<int64_t>("BIGMAC_TEST_SLOW_CHECKPOINT", &plan.slow_checkpoint_ms, nullptr);
  int64_t max_message_bytes = 0;
  ReadPair<int64_t>("BIGMAC_TEST_MAX_MESSAGE_BYTES", &max_message_bytes, nullptr);
  if (max_message_bytes > 0) plan.max_message_bytes = max_message_bytes;
  const char* stall = std::getenv("BIGMAC_TEST_STALL_STARTUP");
  plan.stall_startup = stall && *stall == '1';
  return plan;
}

}  // namespace bigmac::cli
