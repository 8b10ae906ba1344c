#ifndef BIGMAC_CORE_COMM_PIPELINE_COMM_H_
#define BIGMAC_CORE_COMM_PIPELINE_COMM_H_

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/comm/group.h"
#include "core/comm/peer_links.h"
#include "core/device/device_spans.h"
#include "core/memory/tensor.h"

namespace bigmac::comm {

// A receive that did not get what it expected (shape, dtype); names the message and the peer.
class TransportError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A wait that ran past its deadline; names the action, the message and the peer.
class DeadlineError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "bf16[4, 64, 128]": a tensor's dtype and shape, as transport errors print them.
std::string DescribeTensor(memory::DType dtype, const std::vector<int64_t>& shape);

// The transport: what the trainer needs from the machines, as groups and links. It hands out
// the world, the pipeline (pp), the data-parallel replicas (dp) and the tensor-parallel ranks of
// this stage (tp) as Groups, and the pipeline's point-to-point PeerLinks. Adding a parallelism
// dimension means adding a group. Implementations (assembled from parts): MPI
// (MakeMpiPipelineComm; device memory is staged through pinned host buffers), NCCL (core/comm/nccl:
// device memory over NCCL, headers and the host helpers over MPI; docs/transport.md) and a single
// process (MakeLocalPipelineComm). The devices outlive the transport.
class PipelineComm {
 public:
  struct Parts {
    std::unique_ptr<PeerLinks> links;
    std::unique_ptr<Group> world;
    std::unique_ptr<Group> pp;
    std::unique_ptr<Group> dp;
    std::unique_ptr<Group> tp;
    // What the parts share (an MPI progress engine, NCCL's communicators), if anything: destroyed
    // after them.
    std::shared_ptr<void> shared;
  };
  // Every part must be set.
  explicit PipelineComm(Parts parts);
  PipelineComm(const PipelineComm&) = delete;
  PipelineComm& operator=(const PipelineComm&) = delete;
  ~PipelineComm();

  Group& world() const { return *parts_.world; }
  Group& pp() const { return *parts_.pp; }
  Group& dp() const { return *parts_.dp; }
  Group& tp() const { return *parts_.tp; }
  PeerLinks& links() const { return *parts_.links; }

  // Moves messages and collectives in flight along without blocking (MPI needs calls into it to
  // progress a rendezvous send or a collective); the executor calls it between actions.
  void Progress();
  // The links' and the groups' trace spans (Group::set_device_spans).
  void set_device_spans(device::DeviceSpans* spans);

 private:
  Parts parts_;
};

// One process, one rank: sends to oneself are queued, every group is a LocalGroup. A test that
// stands in for a larger group passes its own part (null: the local one).
std::unique_ptr<PipelineComm> MakeLocalPipelineComm(std::unique_ptr<Group> dp = nullptr);

}  // namespace bigmac::comm

#endif  // BIGMAC_CORE_COMM_PIPELINE_COMM_H_
