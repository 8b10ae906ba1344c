#ifndef BIGMAC_CORE_COMM_HANG_REPORT_H_
#define BIGMAC_CORE_COMM_HANG_REPORT_H_

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/comm/progress.h"

namespace bigmac::comm {

// One rank as the reporting rank found it after a deadline (core/comm/hang_watch.h collects them).
struct RankStatus {
  enum class Contact {
    kSelf,          // the reporting rank
    kAnswered,      // its status responder answered
    kNoAnswer,      // connected, but no answer in time: stopped (SIGSTOP), or the process is frozen
    kRefused,       // nothing listens on its port any more: the process is gone
    kNoConnection,  // no connection in time: its node or the network
    kNoChannel,     // it has no status channel (it could not open one at start-up)
  };
  int rank = 0;
  std::string host;
  int pid = 0;
  Contact contact = Contact::kAnswered;
  std::string contact_detail;  // "did not answer within 2 s"
  // Its progress record: from its answer, or, if it cannot answer, read on its node.
  std::optional<progress::Snapshot> record;
  bool record_from_node = false;
  std::string
      process_state;  // from /proc on its node ("T (stopped by a signal)", "gone"); "" unknown
};

// The world ranks of `group` ("pp", "dp", "tied", "world") as seen from `rank`; empty if unknown.
using GroupMembers = std::function<std::vector<int>(int rank, const std::string& group)>;

struct HangReport {
  // One line: the cycle, or the chain of waits from the reporting rank to the rank that stalls
  // it: "rank 2 waits RecvGrad mb3 from rank 3; rank 3 is stopped in Forward mb5 of step 4 (no
  // progress for 30 s)".
  std::string summary;
  std::vector<std::string> ranks;  // one line per rank: what it does, waits for, or why it is mute
  std::vector<int> culprits;       // the rank(s) that stall the others, or the cycle's ranks
  bool cycle = false;
  // Hosts none of whose ranks answered while ranks on other hosts did (a lost node), with the
  // line that says so and how to go on: "no rank on hostB answers (ranks 2, 3): a lost node?
  // Resume with --resume auto, excluding host hostB". Empty when every host has a live rank.
  std::vector<std::string> lost_hosts;
  std::string lost_hosts_line;
};

// Builds the wait-for graph (an edge from each waiting rank to each rank it waits on; a
// collective waits on the members of its group that are not in it) and follows it from
// `reporter`: to a cycle, or to a rank that does not wait (stopped, busy or unreachable).
HangReport ExplainHang(const std::vector<RankStatus>& ranks, int reporter,
                       const GroupMembers& members);

}  // namespace bigmac::comm

#endif  // BIGMAC_CORE_COMM_HANG_REPORT_H_
