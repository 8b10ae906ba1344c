#ifndef BIGMAC_CORE_SCHEDULE_CONSTRAINTS_H_
#define BIGMAC_CORE_SCHEDULE_CONSTRAINTS_H_

#include <string>
#include <vector>

namespace bigmac::schedule {

// The pipeline schedules, as named in parallel.schedule.
enum class Kind { kGpipe, k1F1B, kInterleaved1F1B, kZeroBubbleH1 };

bool ParseKind(const std::string& name, Kind* kind);
std::string KindName(Kind kind);

// A schedule's own requirements on pp, virtual stages and micro-batches per flush. Each problem
// names the parallel.* fields, their values and the rule. Empty: the schedule can run.
std::vector<std::string> CheckScheduleConstraints(Kind kind, int pp, int virtual_stages,
                                                  int num_microbatches);

}  // namespace bigmac::schedule

#endif  // BIGMAC_CORE_SCHEDULE_CONSTRAINTS_H_
