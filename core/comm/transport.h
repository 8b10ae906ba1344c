#ifndef BIGMAC_CORE_COMM_TRANSPORT_H_
#define BIGMAC_CORE_COMM_TRANSPORT_H_

#include <string>

#include "core/device/device.h"

namespace bigmac::comm {

// How a rank's tensors travel (docs/transport.md):
//   kMpi        the cpu backend: host memory over MPI, no copies.
//   kMpiStaged  the cuda backend over MPI: device memory staged through pinned host buffers. The
//               fallback when ranks share a GPU (NCCL refuses two ranks on one GPU, or hangs).
//   kNccl       the cuda backend over NCCL: payloads device to device on a communication stream;
//               headers (dtype, shape), tag matching, deadlines and the small collectives stay on
//               MPI.
enum class TransportKind { kMpi, kMpiStaged, kNccl };

// "mpi", "mpi-staged", "nccl".
std::string TransportName(TransportKind kind);

struct TransportChoice {
  TransportKind kind = TransportKind::kMpi;
  std::string reason;  // why, when it is not the plain default: "2 ranks share cuda:0", "forced"
  // What the [rank] line says: "transport=nccl", "transport=mpi-staged (2 ranks share cuda:0)".
  std::string ToString() const;
};

// What the choice depends on. Every rank of a job must pick the same kind (an NCCL rank cannot
// talk to an MPI one), so the sharing is the job's: the most ranks any GPU of the job carries.
struct TransportRequest {
  std::string requested = "auto";  // device.transport (launch layer): auto, nccl or mpi
  std::string source = "default";  // its provenance, for errors: "launch: BIGMAC_TRANSPORT"
  device::Backend backend = device::Backend::kCpu;  // device.backend
  std::string backend_source = "default";
  int ranks_on_device = 1;        // local ranks on this rank's GPU (1: its own)
  int max_ranks_on_device = 1;    // the same, the largest over every rank of the job
  std::string device = "cuda:0";  // this rank's device, for the reason
};

// auto: cuda -> NCCL unless some GPU of the job carries two or more ranks, then MPI staged
// through pinned host memory; cpu -> MPI. mpi: MPI (staged on cuda). nccl: NCCL, refused (false,
// `error` names the setting, its source and the rule) on the cpu backend and when ranks share a
// GPU. An unknown value is refused too.
bool ChooseTransport(const TransportRequest& request, TransportChoice* choice, std::string* error);

// How many of the node's `local_size` ranks ChooseDevice puts on the device of `local_rank`
// (1 when ranks do not share: `cuda_device_count` >= `local_size`).
int RanksOnDevice(int local_rank, int local_size, int cuda_device_count);

}  // namespace bigmac::comm

#endif  // BIGMAC_CORE_COMM_TRANSPORT_H_
