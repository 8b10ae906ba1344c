#ifndef BIGMAC_CORE_UTIL_FAULT_PLAN_H_
#define BIGMAC_CORE_UTIL_FAULT_PLAN_H_

#include <cstdint>

namespace bigmac::util {

// The faults a reliability test injects (docs/exit_codes.md), in LevelDB's SpecialEnv style:
// production code asks the plan it was handed, never the environment. The CLI reads the plan once
// from the BIGMAC_TEST_* variables (core/cli/fault_env.h) and passes it in the options of the
// trainer, the checkpoint and the transport. Steps are 1-based, as printed; -1 means never. A
// default plan injects nothing.
struct FaultPlan {
  // BIGMAC_TEST_STALL_RANK=<rank>[:<step>]: that rank stops responding at that step (0: before
  // the first).
  int stall_rank = -1;
  int stall_step = 0;
  // BIGMAC_TEST_KILL=<rank>:<step>: that rank SIGKILLs itself after that step's backward.
  int kill_rank = -1;
  int kill_step = -1;
  // BIGMAC_TEST_NAN_GRAD=<step>:<layer_id>: a NaN in that layer's gradient at that step.
  int nan_step = -1;
  int nan_layer = 0;
  // BIGMAC_TEST_SIGSTOP=<rank>:<step>: that rank SIGSTOPs itself before its Forward of
  // micro-batch 1.
  int sigstop_rank = -1;
  int sigstop_step = -1;
  // BIGMAC_TEST_SLOW_RANK=<rank>:<ms>: that rank sleeps this long before each of its forward
  // computations, counted as computing on the CPU backend (a straggler: a slower CPU; on a GPU
  // the compute time is the stream's, which the sleep does not lengthen).
  int slow_rank = -1;
  int slow_rank_ms = 0;
  // BIGMAC_TEST_MISMATCH_SCHEDULE=<rank>: that rank runs schedule::MismatchForTesting.
  int mismatch_rank = -1;
  // BIGMAC_TEST_CRASH_IN_CHECKPOINT=<step>: the writer of that step's first checkpoint file dies
  // half-way through it.
  int64_t crash_in_checkpoint_step = -1;
  // BIGMAC_TEST_FAIL_CHECKPOINT=<step>: that step's checkpoint file writes fail half-way (a full
  // disk).
  int64_t fail_checkpoint_step = -1;
  // BIGMAC_TEST_SLOW_CHECKPOINT=<ms>: every checkpoint file's write waits this long before its
  // fsync, so that a test can signal or kill a run while an asynchronous save is in flight.
  int64_t slow_checkpoint_ms = 0;
  // BIGMAC_TEST_MAX_MESSAGE_BYTES=<bytes>: the MPI transport splits payloads into messages of at
  // most this many bytes instead of 1 GiB (0: its own limit).
  int64_t max_message_bytes = 0;
  // BIGMAC_TEST_STALL_STARTUP=1: the CLI waits for a signal before MPI starts.
  bool stall_startup = false;
};

}  // namespace bigmac::util

#endif  // BIGMAC_CORE_UTIL_FAULT_PLAN_H_
