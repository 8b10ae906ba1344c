#ifndef BIGMAC_CORE_COMM_MPI_PIPELINE_COMM_H_
#define BIGMAC_CORE_COMM_MPI_PIPELINE_COMM_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/comm/mpi_world.h"
#include "core/comm/pipeline_comm.h"

namespace bigmac::comm {

// A message's header as the MPI transport sends it ahead of the data: the tag it came with, the
// dtype and the shape.
struct MessageHeader {
  int tag = 0;
  memory::DType dtype = memory::DType::kF32;
  std::vector<int64_t> shape;
  int64_t numel = 0;
};

// PipelineComm over MPI and host memory. Sends are MPI_Isend of a buffer holding a small header
// (dtype, shape) and the data; receives probe with a deadline (backing off so that an
// oversubscribed CPU node is not starved by polling), then check the header. A wait polls
// (yielding the core) for `spin_seconds` before it starts to sleep: long when every rank has a
// core of its own (a message is seen within microseconds), short when ranks share cores.
// `deadline_seconds` bounds every wait. Data-parallel sums are MPI_Iallreduce on the dp
// communicator (one per started tensor); MPI progresses them whenever this transport is called
// (any test, probe or wait), so the executor's polls between layers move them along. Device
// tensors are staged through host buffers from
// their device (Device::AllocateHostStaging: pinned on CUDA), reused from message to message;
// `stage_host_tensors` stages host tensors the same way (the CPU tests of the staged path).
// The communicators and the devices must outlive this object.
//
// It also serves a transport that moves only the payloads itself (NCCL, core/comm/nccl): the
// headers with their checks and tag matching, the waits with the deadline, and the collectives
// on doubles and strings stay here.
class MpiPipelineComm : public PipelineComm {
 public:
  // Posts the header of `tensor` alone (non-blocking; no data follows over MPI).
  virtual void SendHeader(const memory::Tensor& tensor, int peer, int tag) = 0;
  // The next header pp rank `peer` sent, whatever its tag (MPI keeps one sender's messages to one
  // receiver in order: the order an NCCL receiver must follow). Waits up to the deadline: throws
  // DeadlineError naming `what`, or TransportError for a message that is not a header.
  virtual MessageHeader ReceiveNextHeader(int peer, const std::string& what) = 0;
  // Polls `ready` until it returns true (progressing sends in between), up to the deadline:
  // throws DeadlineError naming `what`.
  virtual void Wait(const std::string& what, const std::function<bool()>& ready) = 0;
  // The staging buffers taken from the devices so far (they are reused), and their bytes.
  virtual int64_t staging_buffers() const = 0;
  virtual int64_t staging_bytes() const = 0;
};

std::unique_ptr<MpiPipelineComm> MakeMpiPipelineComm(const Topology& topology, int world_rank,
                                                     const GroupComms& comms,
                                                     double deadline_seconds,
                                                     double spin_seconds = 200e-6,
                                                     bool stage_host_tensors = false);

}  // namespace bigmac::comm

#endif  // BIGMAC_CORE_COMM_MPI_PIPELINE_COMM_H_
