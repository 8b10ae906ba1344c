#ifndef BIGMAC_CORE_COMM_DEVICE_H_
#define BIGMAC_CORE_COMM_DEVICE_H_

#include <functional>
#include <string>

#include "core/device/device.h"

namespace bigmac::comm {

// The device a rank computes on, chosen from its local rank (its index among the ranks on its
// node).
struct DevicePlacement {
  device::Backend backend = device::Backend::kCpu;
  int index = 0;        // cuda: device ordinal among the visible devices; cpu: the local rank
  bool shared = false;  // cuda: other local ranks use this device too (BIGMAC_SHARE_DEVICES=1)
  // "cuda:1", "cuda:0 (shared)", "cpu:3".
  std::string ToString() const {
    return device::BackendName(backend) + ":" + std::to_string(index) + (shared ? " (shared)" : "");
  }
};

// Environment lookup (getenv in production, a map in tests): null if unset.
using EnvLookup = std::function<const char*(const char*)>;

// The launch layer's switch for more ranks than GPUs on a node: the launcher (bigmac-mpirun
// --share-gpus, or `export` in a batch script) sets it, never the YAML.
inline constexpr char kShareDevicesEnv[] = "BIGMAC_SHARE_DEVICES";

// Picks local rank -> device. With cuda, a node needs one visible device per local rank: fewer is
// a launch-layer mistake (too many ranks per node, or CUDA_VISIBLE_DEVICES too short) and `error`
// says so, unless `share_devices` (then local rank r uses device r mod count). Returns false on
// error.
bool ChooseDevice(device::Backend backend, int local_rank, int local_size, int cuda_device_count,
                  bool share_devices, DevicePlacement* placement, std::string* error);

// The local rank MPI found (MPI_Comm_split_type) against what the launcher says: mpirun's
// OMPI_COMM_WORLD_LOCAL_RANK, or srun's SLURM_LOCALID when srun started this rank (SLURM_PROCID is
// the world rank; a batch script's own SLURM_LOCALID, inherited by mpirun's ranks, is ignored).
// Returns "" if they agree or the launcher says nothing, else the problem. `launcher` is set to
// what was compared ("mpirun", "srun" or "").
std::string CheckLocalRank(int world_rank, int world_size, int local_rank, const EnvLookup& env,
                           std::string* launcher);

}  // namespace bigmac::comm

#endif  // BIGMAC_CORE_COMM_DEVICE_H_
