#ifndef BIGMAC_CORE_CLI_BLAS_CORE_H_
#define BIGMAC_CORE_CLI_BLAS_CORE_H_

namespace bigmac::cli {

// Debian's OpenBLAS picks its kernels by CPU model at load time and falls back to the SSE3
// "Prescott" kernels on models it does not know (as on these cloud VMs), even when the CPU has
// AVX2/AVX-512: GEMMs then run 1.6x slower. If that happened and the user did not choose a core
// with OPENBLAS_CORETYPE, this sets it from the CPU's features and re-executes the program once,
// before MPI starts. Returns only if no re-exec was needed (or it failed).
void EnsureFastBlasKernels(char** argv);

}  // namespace bigmac::cli

#endif  // BIGMAC_CORE_CLI_BLAS_CORE_H_
