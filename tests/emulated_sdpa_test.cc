// The cuDNN SDPA's fallback decision on the emulated device (which has no cuDNN engines): every
// refusal of the cuDNN frontend becomes a reason to take the fallback attention.
#include <cuda_runtime.h>
#include <cudnn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/device/cuda/check.h"
#include "core/device/cuda/context.h"
#include "stages/cuda/sdpa.h"

namespace bigmac::stages::cuda {
namespace {

using device::cuda::CudaContext;

const CudaContext& Context() {
  static const CudaContext* context = [] {
    auto* c = new CudaContext;
    c->label = "emulated_sdpa_test (cuda:0)";
    BIGMAC_CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "test");
    BIGMAC_CUDA_CHECK(cudnnCreate(&c->dnn), "test");
    c->multiprocessors = 4;
    c->compute_capability = 90;
    return c;
  }();
  return *context;
}

TEST(EmulatedSdpa, AGraphCuDnnCannotBuildIsAReasonToFallBack) {
  const std::string why =
      CudnnAttentionUnavailable(device::cuda::SiteOf(Context(), "test"), 2, 64, 4, 64);
  EXPECT_NE(why.find("cuDNN is not emulated"), std::string::npos) << why;
}

// A cuDNN too old for the fused SDPA falls back too, with the reason (sdpa.cc also turns a
// frontend exception into a reason; no refusal tried here made the frontend throw).
TEST(EmulatedSdpa, AnOldCudnnIsAReasonToFallBack) {
  setenv("BIGMAC_EMULATED_CUDNN_VERSION", "8000", 1);
  std::string why;
  EXPECT_NO_THROW(
      why = CudnnAttentionUnavailable(device::cuda::SiteOf(Context(), "test"), 2, 128, 2, 128));
  unsetenv("BIGMAC_EMULATED_CUDNN_VERSION");
  EXPECT_FALSE(why.empty());
  EXPECT_NE(why.find("test"), std::string::npos) << "names the call site: " << why;
}

}  // namespace
}  // namespace bigmac::stages::cuda
