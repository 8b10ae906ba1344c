#include "core/cli/blas_core.h"

#include <cblas.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "core/util/process.h"

namespace bigmac::cli {

void EnsureFastBlasKernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") || std::getenv("BIGMAC_BLAS_REEXEC")) return;
  const char* core = openblas_get_corename();
  if (!core || std::strcmp(core, "Prescott") != 0) return;
  __builtin_cpu_init();
  const char* better = __builtin_cpu_supports("avx512f") ? "SkylakeX"
                       : __builtin_cpu_supports("avx2")  ? "Haswell"
                                                         : nullptr;
  if (!better) return;
  setenv("OPENBLAS_CORETYPE", better, 1);
  setenv("BIGMAC_BLAS_REEXEC", "1", 1);
  // The resolved path, not /proc/self/exe: the process keeps its name ("bigmac", not "exe") for
  // ps, top and `pkill -x bigmac`.
  const std::string self = util::SelfPath();
  execv(self.empty() ? "/proc/self/exe" : self.c_str(), argv);  // on failure: the slow kernels
}

}  // namespace bigmac::cli
