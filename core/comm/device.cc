#include "core/comm/device.h"

namespace bigmac::comm {

bool ChooseDevice(const std::string& backend, int local_rank, int local_size, int cuda_device_count,
                  DevicePlacement* placement, std::string* error) {
  placement->backend = backend;
  placement->index = local_rank;
  if (backend == "cpu") return true;
  if (backend != "cuda") {
    *error = "device.backend=" + backend + " is not a known backend (cpu, cuda)";
    return false;
  }
  if (cuda_device_count < local_size) {
    *error =
        "device.backend=cuda needs one GPU per rank on this node: " + std::to_string(local_size) +
        " local ranks but " + std::to_string(cuda_device_count) +
        " visible CUDA devices (launch layer: lower the ranks per node in mpirun/sbatch, or check "
        "CUDA_VISIBLE_DEVICES)";
    return false;
  }
  return true;
}

}  // namespace bigmac::comm
