#ifndef BIGMAC_CORE_COMM_CUDA_CUDA_PROBE_H_
#define BIGMAC_CORE_COMM_CUDA_CUDA_PROBE_H_

#include <string>

namespace bigmac::comm::cuda {

// Visible CUDA devices; 0 when there is no driver or no device (never throws).
int DeviceCount();

// Runs a small kernel (y = a*x + y on 1M floats) on `device` and checks every element against the
// host result. Returns "" on success, otherwise what went wrong.
std::string SaxpySelfTest(int device);

// True in the emulated build (core/device/cuda/emulation/): the "device" is the CPU, and cuDNN's
// engines are absent.
bool Emulated();

// "cudart 13000" style versions of the linked CUDA libraries (host calls; no GPU needed).
int RuntimeVersion();

}  // namespace bigmac::comm::cuda

#endif  // BIGMAC_CORE_COMM_CUDA_CUDA_PROBE_H_
