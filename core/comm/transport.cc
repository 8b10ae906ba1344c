#include "core/comm/transport.h"

namespace bigmac::comm {

std::string TransportName(TransportKind kind) {
  switch (kind) {
    case TransportKind::kMpi:
      return "mpi";
    case TransportKind::kMpiStaged:
      return "mpi-staged";
    case TransportKind::kNccl:
      return "nccl";
  }
  return "unknown";
}

std::string TransportChoice::ToString() const {
  return "transport=" + TransportName(kind) + (reason.empty() ? "" : " (" + reason + ")");
}

bool ChooseTransport(const TransportRequest& request, TransportChoice* choice, std::string* error) {
  const std::string setting = "device.transport=" + request.requested + " (" + request.source + ")";
  const std::string backend = "device.backend=" + device::BackendName(request.backend) + " (" +
                              request.backend_source + ")";
  if (request.requested != "auto" && request.requested != "nccl" && request.requested != "mpi") {
    *error = setting + " is not one of: auto, nccl, mpi";
    return false;
  }
  if (request.backend != device::Backend::kCuda) {
    if (request.requested == "nccl") {
      *error = setting + " needs device.backend=cuda, but " + backend +
               " (rule: NCCL moves GPU memory; the cpu backend's tensors travel over MPI: set "
               "BIGMAC_TRANSPORT to auto or mpi, or unset it)";
      return false;
    }
    *choice = {TransportKind::kMpi, ""};
    return true;
  }
  // Who shares: this rank's GPU, or (multi-node) a GPU elsewhere in the job.
  const std::string sharing =
      request.ranks_on_device > 1
          ? std::to_string(request.ranks_on_device) + " ranks share " + request.device
          : std::to_string(request.max_ranks_on_device) + " ranks share a GPU elsewhere in the job";
  const bool shared = request.max_ranks_on_device > 1;
  if (request.requested == "mpi") {
    *choice = {TransportKind::kMpiStaged, "forced by " + setting};
    return true;
  }
  if (request.requested == "nccl") {
    if (shared) {
      *error = setting + " cannot run: " + sharing +
               " (BIGMAC_SHARE_DEVICES=1), and NCCL does not support two ranks on one GPU "
               "(rule: NCCL needs one GPU per rank; set BIGMAC_TRANSPORT to auto or mpi to stage "
               "through pinned host memory over MPI, or give every rank a GPU of its own)";
      return false;
    }
    *choice = {TransportKind::kNccl, "forced by " + setting};
    return true;
  }
  if (shared) {
    *choice = {TransportKind::kMpiStaged, sharing};
    return true;
  }
  *choice = {TransportKind::kNccl, ""};
  return true;
}

int RanksOnDevice(int local_rank, int local_size, int cuda_device_count) {
  if (cuda_device_count < 1 || cuda_device_count >= local_size) return 1;
  int count = 0;
  for (int r = 0; r < local_size; ++r) {
    if (r % cuda_device_count == local_rank % cuda_device_count) ++count;
  }
  return count;
}

}  // namespace bigmac::comm
