#ifndef BIGMAC_CORE_CLI_RUN_RECORD_H_
#define BIGMAC_CORE_CLI_RUN_RECORD_H_

// What a short child training run measured, read back by the commands that start one (compare,
// plan --check): its metrics.jsonl in `dir` and the [memory] lines of its `output`.

#include <string>
#include <vector>

#include "core/plan/compare.h"

namespace bigmac::cli {

// The run's losses, step times (the first `warmup` steps left out) and each rank's memory and
// times. A missing or unreadable metrics file is said on stderr and leaves those fields empty.
plan::RunRecord ReadRunRecord(const std::string& name, const std::string& dir,
                              const std::string& output, int warmup);

// Each rank's memory from the `[memory]` lines of a run's `output` (no times).
std::vector<plan::RankRecord> ReadMemoryLines(const std::string& output);

}  // namespace bigmac::cli

#endif  // BIGMAC_CORE_CLI_RUN_RECORD_H_
