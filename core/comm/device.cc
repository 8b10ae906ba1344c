#include "core/comm/device.h"

#include <charconv>
#include <cstring>

namespace bigmac::comm {
namespace {

bool ParseInt(const char* text, int* value) {
  if (text == nullptr) return false;
  const char* end = text + std::strlen(text);
  auto [ptr, ec] = std::from_chars(text, end, *value);
  return ec == std::errc() && ptr == end && ptr != text;
}

}  // namespace

bool ChooseDevice(device::Backend backend, int local_rank, int local_size, int cuda_device_count,
                  bool share_devices, DevicePlacement* placement, std::string* error) {
  placement->backend = backend;
  placement->index = local_rank;
  placement->shared = false;
  if (backend == device::Backend::kCpu) return true;
  if (cuda_device_count < 1) {
    *error =
        "device.backend=cuda but no CUDA device is visible (check the node's GPUs, the "
        "driver, and CUDA_VISIBLE_DEVICES)";
    return false;
  }
  if (cuda_device_count < local_size) {
    if (!share_devices) {
      *error =
          "device.backend=cuda needs one GPU per rank on this node: " + std::to_string(local_size) +
          " local ranks but " + std::to_string(cuda_device_count) +
          " visible CUDA devices (launch layer: lower the ranks per node in mpirun/sbatch, "
          "check CUDA_VISIBLE_DEVICES, or share GPUs on purpose with " +
          kShareDevicesEnv + "=1 / bigmac-mpirun --share-gpus)";
      return false;
    }
    placement->index = local_rank % cuda_device_count;
    placement->shared = true;
  }
  return true;
}

std::string CheckLocalRank(int world_rank, int world_size, int local_rank, const EnvLookup& env,
                           std::string* launcher) {
  launcher->clear();
  int claimed = 0;
  std::string variable;
  if (ParseInt(env("OMPI_COMM_WORLD_LOCAL_RANK"), &claimed)) {
    *launcher = "mpirun";
    variable = "OMPI_COMM_WORLD_LOCAL_RANK";
  } else {
    int procid = -1;
    int ntasks = -1;
    if (!ParseInt(env("SLURM_LOCALID"), &claimed) || !ParseInt(env("SLURM_PROCID"), &procid) ||
        !ParseInt(env("SLURM_NTASKS"), &ntasks) || procid != world_rank || ntasks != world_size) {
      return "";
    }
    *launcher = "srun";
    variable = "SLURM_LOCALID";
  }
  if (claimed == local_rank) return "";
  return "rank " + std::to_string(world_rank) + ": MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) " +
         "gives local rank " + std::to_string(local_rank) + ", but the launcher (" + *launcher +
         ") set " + variable + "=" + std::to_string(claimed) +
         "; they disagree about which ranks share this node, so the device choice would be wrong "
         "(launch layer: check the hostfile / node list and the mapping options)";
}

}  // namespace bigmac::comm
