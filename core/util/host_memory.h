#ifndef BIGMAC_CORE_UTIL_HOST_MEMORY_H_
#define BIGMAC_CORE_UTIL_HOST_MEMORY_H_

// Host memory for large float arrays (tensors, the GEMM's packing buffers).
#include <cstdint>

namespace bigmac::util {

// `bytes` (> 0) of host memory, 64-byte aligned, or null when there is none; release it with
// std::free. A block of 2 MiB or more starts on a 2 MiB boundary and its whole 2 MiB pages are
// advised as transparent huge pages (where the kernel's setting is "madvise", as on Debian): the
// GEMMs' packing reads activations and weights row by row, a stride apart, and with 4 KiB pages
// each row costs a TLB entry (bench/NOTES.md: 1.4% of a step). The partial page at the end stays
// in 4 KiB pages, so the memory used is what was asked for.
void* AllocateHost(int64_t bytes);

}  // namespace bigmac::util

#endif  // BIGMAC_CORE_UTIL_HOST_MEMORY_H_
