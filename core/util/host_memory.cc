#include "core/util/host_memory.h"

#include <sys/mman.h>

#include <cstdlib>

namespace bigmac::util {

void* AllocateHost(int64_t bytes) {
  constexpr int64_t kAlignment = 64;
  constexpr int64_t kHugePage = int64_t{2} << 20;
  const int64_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded < kHugePage) return std::aligned_alloc(kAlignment, rounded);
  // posix_memalign: aligned_alloc's size must be a multiple of the alignment (ASan enforces it).
  void* pointer = nullptr;
  if (posix_memalign(&pointer, kHugePage, rounded) != 0) return nullptr;
  // Advice only: where it fails or the kernel says "never", the pages are 4 KiB as before.
  madvise(pointer, rounded / kHugePage * kHugePage, MADV_HUGEPAGE);
  return pointer;
}

}  // namespace bigmac::util
