#ifndef BIGMAC_CORE_COMM_PROGRESS_H_
#define BIGMAC_CORE_COMM_PROGRESS_H_

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace bigmac::comm::progress {

// What this rank is doing, kept for the hang report (docs/reliability.md, "Hangs explained"): the
// executor records each action before it runs it, the transport records every wait (the peer,
// the message, the tag). One record per process, written by the rank's own threads and read by
// its status responder (core/comm/hang_watch.h) and, on the same node, by other ranks even when
// this one is stopped (SIGSTOP) or hung: the record lives in a memfd that another process of the
// same user maps through /proc/<pid>/fd/<fd>. Writers hold a mutex; readers use the seqlock.

// What a blocked rank waits for.
enum class WaitKind { kNone = 0, kReceive = 1, kCollective = 2, kSends = 3 };

// A receive of the current exchange: its tag and how the report names it ("RecvGrad mb3",
// "RecvGrad3@s2<r3").
struct ExpectedReceive {
  int tag = 0;
  std::string label;
  std::string action;
};

// A copy of a record, with its ages computed on the record's node (monotonic clocks differ
// between nodes).
struct Snapshot {
  int world_rank = -1;
  int pid = 0;
  int step = 0;  // 1-based; 0 before the first step
  int flush = 0;
  int flushes = 0;
  std::string action;  // the schedule's short name(s): "F5@s3", "SendAct3@s0>r1+RecvGrad1@s0<r1"
  std::string label;   // "Forward mb5", or a phase outside the schedule ("checkpoint of step 4")
  std::vector<ExpectedReceive> receives;
  double since_progress_s = 0;  // since the current action started or the last wait ended
  WaitKind wait = WaitKind::kNone;
  std::string wait_what;    // "RecvGrad(micro-batch 3, stage 2) gradient from pp rank 3"
  std::string wait_group;   // collectives: "pp", "dp", "world"; "" unknown
  std::string wait_expect;  // "f32[2, 16, 32]"
  int wait_tag = -1;
  std::vector<int> wait_peers;  // world ranks (a receive: one; sends: those not yet delivered)
  double waited_s = 0;
  bool torn = false;  // the writer stopped in the middle of an update (read anyway)
};

void SetRank(int world_rank);
// The optimizer step (1-based) and the flush within it; clears the action.
void SetStep(int step, int flush = 0, int flushes = 1);
// The action about to run (counts as progress).
void SetAction(std::string_view action, std::string_view label,
               const std::vector<ExpectedReceive>& receives = {});

struct Wait {
  WaitKind kind = WaitKind::kCollective;
  std::string_view what;
  std::string_view group;
  std::string_view expect;
  int tag = -1;
  std::vector<int> peers;
};

// Records a wait for its lifetime (its end counts as progress). A scope opened while another is
// open records nothing, so the outermost description of a wait is kept: the transport's public
// calls describe their waits (peer, tag, group), and its inner wait loop opens a generic scope
// that only shows where no caller did.
class WaitScope {
 public:
  explicit WaitScope(const Wait& wait);
  WaitScope(const WaitScope&) = delete;
  WaitScope& operator=(const WaitScope&) = delete;
  ~WaitScope();

 private:
  bool owner_ = false;
};

// This process's record.
Snapshot Read();
// The memfd holding the record (-1 if memfd is not available: then no other process can read it).
int SharedFd();
// The process start time (field 22 of /proc/<pid>/stat), to tell a process from a later one
// that reuses its pid; 0 if unknown.
long long StartTime(int pid);

// The record of process `pid` on this node, through its memfd `fd`; nullopt (and `error`) if it
// cannot be read (the process is gone, or not ours).
std::optional<Snapshot> Peek(int pid, int fd, std::string* error);
// "R (running)", "S (sleeping)", "T (stopped)", "Z (zombie: dead, not yet reaped)"; "gone" if
// there is no such process (or `start_time` is not its start time).
std::string ProcessState(int pid, long long start_time = 0);

// What a wait does when its deadline passes, before it throws comm::DeadlineError: the hang
// watch (core/comm/hang_watch.h) installs the diagnosis here. It gets the wait's message and
// returns text appended to it. Empty by default.
using DeadlineHandler = std::function<std::string(const std::string& message)>;
void SetDeadlineHandler(DeadlineHandler handler);
std::string OnDeadline(const std::string& message);

}  // namespace bigmac::comm::progress

#endif  // BIGMAC_CORE_COMM_PROGRESS_H_
