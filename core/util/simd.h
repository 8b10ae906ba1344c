#ifndef BIGMAC_CORE_UTIL_SIMD_H_
#define BIGMAC_CORE_UTIL_SIMD_H_

// BIGMAC_SIMD_CLONES on a function definition makes GCC compile it three times, for AVX-512
// (x86-64-v4), AVX2 + FMA (x86-64-v3) and the baseline, and pick one at load time for the CPU it
// runs on (an ifunc). OpenMP-outlined loop bodies are cloned with their function. The elementwise
// kernels run 4x wider on this project's machines than the SSE2 baseline the build otherwise
// targets, while the binary still runs on any x86-64 (bench/NOTES.md). Results may differ in the
// last bits between CPU types (FMA contraction), never between runs or ranks on one machine type.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define BIGMAC_SIMD_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define BIGMAC_SIMD_CLONES
#endif

#endif  // BIGMAC_CORE_UTIL_SIMD_H_
