// The MLP's GEMM and GELU fused (plugins/sdk/cpu_kernels.h: MatmulGeluForward,
// MatmulGeluBackwardInput): the bits of the separate kernels (MatmulForward then GeluForward,
// MatmulBackwardInput then GeluBackward), in float, where BigMac's GEMM runs the GELU block by
// block as its epilogue, and in double, where they are the two calls; with and without a bias,
// on shapes with edge tiles and several k blocks, at one thread and two (float's bits do not
// depend on the thread count; double's GEMM, OpenBLAS's, rounds by it). Built twice: with
// BigMac's GEMM (fused), and as gelu_matmul_openblas_test with OpenBLAS (the two calls).
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "plugins/sdk/cpu_kernels.h"
#include "tests/testing/numeric.h"

namespace bigmac::sdk::cpu {
namespace {

using testutil::BitwiseEqual;
using testutil::Random;

#ifdef BIGMAC_TEST_GEMM_LIBRARY
// Set before main, so before the first GEMM chooses its library (stages/cpu/gemm.cc).
const bool library_set = setenv("BIGMAC_CPU_GEMM", BIGMAC_TEST_GEMM_LIBRARY, 1) == 0;
#endif

TEST(MatmulGeluLibrary, RunsTheLibraryThisBinaryIsFor) {
#ifdef BIGMAC_TEST_GEMM_LIBRARY
  ASSERT_TRUE(library_set);
  EXPECT_STREQ(FloatGemmLibrary(), BIGMAC_TEST_GEMM_LIBRARY);
#else
  // CI's CPUs have AVX2 and FMA, where BigMac's GEMM is the default and fuses the GELU.
  EXPECT_EQ(std::string(FloatGemmLibrary()).rfind("bigmac", 0), 0u) << FloatGemmLibrary();
#endif
}

struct Shape {
  int n, c, oc;
};
// Rows that are not whole micro-tiles, columns that are not whole panels, k of several blocks.
const Shape kShapes[] = {{64, 48, 192}, {37, 300, 70}, {130, 600, 1030}};

template <typename T>
class MatmulGelu : public ::testing::Test {};
using Types = ::testing::Types<float, double>;
TYPED_TEST_SUITE(MatmulGelu, Types);

TYPED_TEST(MatmulGelu, ForwardGivesTheSeparateKernelsBits) {
  using T = TypeParam;
  const int threads_before = omp_get_max_threads();
  for (const Shape& s : kShapes) {
    // Inputs of about unit size, so that the GELU sees both signs and its curved part.
    const std::vector<T> inp = Random<T>(int64_t{s.n} * s.c, 1, 1.0);
    const std::vector<T> w = Random<T>(int64_t{s.oc} * s.c, 2, 0.2);
    const std::vector<T> bias = Random<T>(s.oc, 3, 0.5);
    for (const bool with_bias : {false, true}) {
      const T* b = with_bias ? bias.data() : nullptr;
      for (int threads : {1, 2}) {
        // The reference at the same thread count: OpenBLAS's double GEMM rounds by it.
        omp_set_num_threads(threads);
        std::vector<T> out(int64_t{s.n} * s.oc), act(out.size());
        MatmulForward(out.data(), inp.data(), w.data(), b, s.n, s.c, s.oc);
        GeluForward(act.data(), out.data(), int64_t{s.n} * s.oc);
        std::vector<T> fused_out(out.size(), T(7)), fused_act(out.size(), T(7));
        MatmulGeluForward(fused_out.data(), fused_act.data(), inp.data(), w.data(), b, s.n, s.c,
                          s.oc);
        EXPECT_TRUE(BitwiseEqual(fused_out, out))
            << "n=" << s.n << " c=" << s.c << " oc=" << s.oc << " bias=" << with_bias
            << " threads=" << threads << ": the product differs";
        EXPECT_TRUE(BitwiseEqual(fused_act, act))
            << "n=" << s.n << " c=" << s.c << " oc=" << s.oc << " bias=" << with_bias
            << " threads=" << threads << ": the GELU differs";
      }
    }
  }
  omp_set_num_threads(threads_before);
}

TYPED_TEST(MatmulGelu, BackwardInputGivesTheSeparateKernelsBits) {
  using T = TypeParam;
  const int threads_before = omp_get_max_threads();
  for (const Shape& s : kShapes) {
    // dinp(N,C) = (dout(N,OC) @ w(OC,C)) * GELU'(pre(N,C)).
    const std::vector<T> dout = Random<T>(int64_t{s.n} * s.oc, 4, 1.0);
    const std::vector<T> w = Random<T>(int64_t{s.oc} * s.c, 5, 0.2);
    const std::vector<T> pre = Random<T>(int64_t{s.n} * s.c, 6, 2.0);
    for (int threads : {1, 2}) {
      omp_set_num_threads(threads);
      std::vector<T> product(int64_t{s.n} * s.c), dinp(product.size());
      MatmulBackwardInput(product.data(), dout.data(), w.data(), s.n, s.c, s.oc);
      GeluBackward(dinp.data(), pre.data(), product.data(), int64_t{s.n} * s.c);
      std::vector<T> fused(dinp.size(), T(7));
      MatmulGeluBackwardInput(fused.data(), dout.data(), w.data(), pre.data(), s.n, s.c, s.oc);
      EXPECT_TRUE(BitwiseEqual(fused, dinp))
          << "n=" << s.n << " c=" << s.c << " oc=" << s.oc << " threads=" << threads;
    }
  }
  omp_set_num_threads(threads_before);
}

}  // namespace
}  // namespace bigmac::sdk::cpu
