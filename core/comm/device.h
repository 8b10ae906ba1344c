#ifndef BIGMAC_CORE_COMM_DEVICE_H_
#define BIGMAC_CORE_COMM_DEVICE_H_

#include <string>

namespace bigmac::comm {

// The device a rank computes on, chosen from its local rank (its index among the ranks on its
// node).
struct DevicePlacement {
  std::string backend;  // "cpu" or "cuda"
  int index = 0;  // cuda: device ordinal; cpu: the local rank (for logs and memory accounting)
  std::string ToString() const { return backend + ":" + std::to_string(index); }
};

// Picks local rank -> device. With cuda, a node needs one visible device per local rank; fewer is a
// launch-layer mistake (too many ranks per node, or CUDA_VISIBLE_DEVICES too short) and `error`
// says so. Returns false on error.
bool ChooseDevice(const std::string& backend, int local_rank, int local_size, int cuda_device_count,
                  DevicePlacement* placement, std::string* error);

}  // namespace bigmac::comm

#endif  // BIGMAC_CORE_COMM_DEVICE_H_
