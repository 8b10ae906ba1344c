#ifndef BIGMAC_CORE_COMM_HANG_WATCH_H_
#define BIGMAC_CORE_COMM_HANG_WATCH_H_

#include <memory>
#include <string>

#include "core/comm/topology.h"

namespace bigmac::comm {

// Hangs explained (docs/reliability.md). Every rank runs a status responder: a thread with a TCP
// socket of its own, outside MPI (MPI runs FUNNELED, and a rank stuck in compute or in a wait
// must still answer). When a wait's deadline passes, the rank that saw it asks every other rank
// for its progress record (core/comm/progress.h), reads the record of a rank that cannot answer
// on that rank's node, builds the wait-for graph and prints the cycle or the rank that stalls the
// job, then the wait throws DeadlineError and the job stops with MPI_Abort (exit 6).
//
// One report per job: the rank whose deadline passes first claims the report at the lowest rank
// that answers (rank 0 unless it is mute); a later claimant prints one line and waits for the
// reporter to stop the job.
class HangWatch {
 public:
  // Collective over MPI_COMM_WORLD, from the main thread, on every rank: publishes this rank's
  // endpoint (host, addresses, port, pid, progress memfd) and learns everyone's. Installs the
  // deadline handler. A rank that cannot open a socket takes part without a responder.
  static std::unique_ptr<HangWatch> Start(const Topology& topology, int world_rank,
                                          const std::string& host, double deadline_seconds);
  virtual ~HangWatch() = default;  // stops the responder and removes the handler

 protected:
  HangWatch() = default;
};

}  // namespace bigmac::comm

#endif  // BIGMAC_CORE_COMM_HANG_WATCH_H_
