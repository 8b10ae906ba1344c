// The cuDNN frontend's own checks of the SDPA graphs stages/cuda/sdpa.cc builds, on the CPU: with
// the SM version given (90, Hopper), the frontend's validate() needs no GPU. It checks the dims,
// the strides (16-byte alignment of every bf16 stride), the causal band and the support surface
// of the forward and the deterministic backward over the interleaved qkv layout. What needs a GPU
// (heuristics, plans, execution) is in cuda_sdpa_test.
#include <gtest/gtest.h>

#include <string>

#include "core/memory/dtype.h"
#include "stages/cuda/sdpa_internal.h"
#include "stages/cuda/sdpa_layout.h"
#include "tests/testing/expect.h"

namespace bigmac::stages::cuda {
namespace {

using internal::ValidateSdpaGraph;
constexpr int kHopper = 90;

TEST(SdpaGraph, InterleavedLayoutValidatesForwardAndBackward) {
  struct Shape {
    int b, t, h, d;
  };
  for (const Shape& s : {Shape{2, 64, 4, 64}, Shape{2, 128, 2, 128}, Shape{1, 7, 3, 8},
                         Shape{8, 1024, 12, 64}, Shape{3, 100, 5, 96}}) {
    const SdpaLayout layout = InterleavedQkvLayout(s.b, s.t, s.h, s.d);
    EXPECT_EQ(ValidateSdpaGraph(false, layout, kHopper), "")
        << "forward b=" << s.b << " t=" << s.t << " h=" << s.h << " d=" << s.d;
    EXPECT_EQ(ValidateSdpaGraph(true, layout, kHopper), "")
        << "backward b=" << s.b << " t=" << s.t << " h=" << s.h << " d=" << s.d;
  }
}

// Every head dim ChooseAttention sends to cuDNN passes the frontend's checks.
TEST(SdpaGraph, EveryHeadDimChosenForCudnnValidates) {
  for (int d = 1; d <= 256; ++d) {
    if (!ChooseAttention(memory::DType::kBF16, d).cudnn) continue;
    const SdpaLayout layout = InterleavedQkvLayout(1, 16, 3, d);
    EXPECT_EQ(ValidateSdpaGraph(false, layout, kHopper), "") << "forward d=" << d;
    EXPECT_EQ(ValidateSdpaGraph(true, layout, kHopper), "") << "backward d=" << d;
  }
}

// Grouped-query attention (llama): K and V with fewer heads than Q, strides from the fused
// (h + 2 kv) * d row; multi-query (kv 1) and Llama 3's 32/8 and 3.2 1B's 32/8 at d 64.
TEST(SdpaGraph, GroupedQkvLayoutValidatesForwardAndBackward) {
  struct Shape {
    int b, t, h, kv, d;
  };
  for (const Shape& s : {Shape{2, 64, 4, 2, 64}, Shape{1, 16, 6, 1, 128}, Shape{2, 128, 32, 8, 64},
                         Shape{3, 100, 6, 3, 96}}) {
    const SdpaLayout layout = GroupedQkvLayout(s.b, s.t, s.h, s.kv, s.d);
    EXPECT_EQ(ValidateSdpaGraph(false, layout, kHopper), "")
        << "forward h=" << s.h << " kv=" << s.kv << " d=" << s.d;
    EXPECT_EQ(ValidateSdpaGraph(true, layout, kHopper), "")
        << "backward h=" << s.h << " kv=" << s.kv << " d=" << s.d;
  }
}

// validate() reads the head counts: K and V heads that do not divide Q's are refused.
TEST(SdpaGraph, KvHeadsThatDoNotDivideQueryHeadsAreRejected) {
  for (bool backward : {false, true}) {
    EXPECT_NE(ValidateSdpaGraph(backward, GroupedQkvLayout(1, 16, 6, 4, 64), kHopper), "")
        << (backward ? "backward" : "forward");
  }
}

TEST(SdpaGraph, HeadDimsThatAreNotMultiplesOf8AreRejected) {
  for (int d : {4, 12}) {
    for (bool backward : {false, true}) {
      const std::string error =
          ValidateSdpaGraph(backward, InterleavedQkvLayout(1, 16, 2, d), kHopper);
      testutil::ExpectContains(error, "multiple of 8");
    }
  }
}

// validate() checks strides: one that is not a whole number of 16-byte vectors is refused.
TEST(SdpaGraph, MisalignedStrideIsRejected) {
  SdpaLayout layout = InterleavedQkvLayout(2, 32, 2, 64);
  layout.k.strides[2] += 1;  // a token's row 3C + 1 elements long
  for (bool backward : {false, true}) {
    const std::string error = ValidateSdpaGraph(backward, layout, kHopper);
    EXPECT_NE(error, "") << (backward ? "backward" : "forward");
    testutil::ExpectContains(error, "alignment");
  }
}

}  // namespace
}  // namespace bigmac::stages::cuda
