#ifndef BIGMAC_CORE_COMM_NCCL_NCCL_PIPELINE_COMM_H_
#define BIGMAC_CORE_COMM_NCCL_NCCL_PIPELINE_COMM_H_

// The NCCL transport (docs/transport.md). No CUDA or NCCL header here: the CLI includes it.
//
// What goes where:
//   MPI (the MPI transport's parts: core/comm/mpi_pipeline_comm.h): every message's header
//     (dtype, shape) with its tag and the dtype/shape check, every wait's deadline, the world and
//     pp groups, and every group's host helpers (doubles, ints, strings; the NCCL groups derive
//     from MpiGroup); the NCCL unique ids.
//   NCCL: the tensor payloads, device to device. Each direction of each pipeline link (to and from
//     every neighbour, and between the first and the last stage: the wrap of interleaved
//     schedules and the tied weight) has a communicator of two ranks and a stream of its own, so
//     its operations never wait behind another link's; the data-parallel and the
//     tensor-parallel groups each have one communicator and stream (their tensor collectives).
//     Communicators are non-blocking (ncclConfig_t.blocking = 0): creation and every enqueue return
//     at once and are polled under the deadline, so a hang is reported, and can be aborted.
//
// Why a communicator per direction: NCCL's sends are rendezvous (a send holds its communicator's
// queue until the receive is posted), where MPI's are buffered, and the schedules are proven
// deadlock-free with buffered sends. With one direction per communicator and stream, a send
// blocks nothing but later sends on the same direction, which is MPI's semantics.
// tests/rendezvous_test.cc runs every schedule under both layouts: one stream per rank deadlocks
// interleaved_1f1b, one per direction finishes them all.
//
// Streams and events: an Exchange (a lone Send or Receive is an exchange of one) posts its
// headers over MPI, records an event on the compute stream (the sent tensors were written there,
// the received ones allocated), and enqueues every payload on its direction's stream after that
// event, before it waits for anything. A receive's completion event is waited for by the compute
// stream (the tensor is used there) and, under the deadline, by the host. A sent tensor stays
// alive in the transport until its completion event has fired (checked at every call;
// FinishSends waits for all): the caching allocator never reuses memory NCCL still reads.
//
// Matching: NCCL matches a direction's sends and receives in order, without tags, so a rank must
// receive a peer's messages in the order the peer sent them (the schedules do:
// tests/rendezvous_test.cc). Receives are posted with the expected dtype and shape; the headers
// are then read in order and must name the expected tag, dtype and shape, or the communicators are
// aborted and a TransportError names both.
//
// A group's all-reduce: ncclAllReduce in place on the group's stream; bf16 is reduced in f32 as
// over MPI. NCCL's result is deterministic run to run for the same ranks, topology, NCCL version
// and count (fixed ring/tree order); it may differ in the last bits from MPI's sum and from other
// topologies. With dp = 2 both are a + b: bitwise equal.

#include <memory>

#include "core/comm/mpi_world.h"
#include "core/comm/pipeline_comm.h"
#include "core/comm/transport.h"
#include "core/device/device.h"

namespace bigmac::comm {

// Needs `device` to be the rank's CUDA device (it outlives the transport), one GPU per rank, and
// every rank of the job calling it at the same point (communicator creation is collective over
// the pp group's links, then the dp group, then the tp group). Throws device::DeviceError when NCCL
// or CUDA fails, and DeadlineError when creation does not finish within `deadline_seconds`.
std::unique_ptr<PipelineComm> MakeNcclPipelineComm(const Topology& topology, int world_rank,
                                                   const GroupComms& comms, device::Device* device,
                                                   double deadline_seconds, double spin_seconds);

// The transport `kind` names: kMpi and kMpiStaged are MakeMpiPipelineComm (device tensors staged
// through pinned host buffers; `stage_host_tensors` stages host ones too, for tests;
// `max_message_bytes` as there), kNccl is
// MakeNcclPipelineComm.
std::unique_ptr<PipelineComm> MakePipelineComm(TransportKind kind, const Topology& topology,
                                               int world_rank, const GroupComms& comms,
                                               device::Device* device, double deadline_seconds,
                                               double spin_seconds, bool stage_host_tensors = false,
                                               int64_t max_message_bytes = 0);

// The linked NCCL's version (ncclGetVersion: 22809 for 2.28.9), 0 if unknown. No GPU needed.
int NcclVersion();

}  // namespace bigmac::comm

#endif  // BIGMAC_CORE_COMM_NCCL_NCCL_PIPELINE_COMM_H_
