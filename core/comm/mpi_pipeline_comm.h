#ifndef BIGMAC_CORE_COMM_MPI_PIPELINE_COMM_H_
#define BIGMAC_CORE_COMM_MPI_PIPELINE_COMM_H_

#include <memory>

#include "core/comm/mpi_world.h"
#include "core/comm/pipeline_comm.h"

namespace bigmac::comm {

// PipelineComm over MPI and host memory. Sends are MPI_Isend of a buffer holding a small header
// (dtype, shape) and the data; receives probe with a deadline (backing off so that an
// oversubscribed CPU node is not starved by polling), then check the header. A wait polls
// (yielding the core) for `spin_seconds` before it starts to sleep: long when every rank has a
// core of its own (a message is seen within microseconds), short when ranks share cores.
// `deadline_seconds` bounds every wait. Data-parallel sums are MPI_Iallreduce on the dp
// communicator (one per started tensor); MPI progresses them whenever this transport is called
// (any test, probe or wait), so the executor's polls between layers move them along. The
// communicators must outlive this object.
std::unique_ptr<PipelineComm> MakeMpiPipelineComm(const Topology& topology, int world_rank,
                                                  const GroupComms& comms, double deadline_seconds,
                                                  double spin_seconds = 200e-6);

}  // namespace bigmac::comm

#endif  // BIGMAC_CORE_COMM_MPI_PIPELINE_COMM_H_
