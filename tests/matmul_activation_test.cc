// The GEMMs fused with what follows them (plugins/sdk/cpu_kernels.h: MatmulGeluForward,
// MatmulGeluBackwardInput, MatmulSwigluForward, MatmulSwigluBackwardInput, MatmulResidualForward):
// the bits of the separate kernels (the GEMM, then GeluForward, GeluBackward, SwigluForward,
// SwigluBackward or AddInPlace), in float, where BigMac's GEMM runs the second step block by block
// as its epilogue, and in double, where they are the two calls; on shapes with edge tiles, several
// k blocks and (SwiGLU, the residual) several column blocks, at one thread and two (float's bits
// do not depend on the thread count; double's GEMM, OpenBLAS's, rounds by it). Built twice: with
// BigMac's GEMM (fused), and as matmul_activation_openblas_test with OpenBLAS (the two calls).
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

TEST(MatmulActivationLibrary, RunsTheLibraryThisBinaryIsFor) {
#ifdef BIGMAC_TEST_GEMM_LIBRARY
  ASSERT_TRUE(library_set);
  EXPECT_STREQ(FloatGemmLibrary(), BIGMAC_TEST_GEMM_LIBRARY);
#else
  // CI's CPUs have AVX2 and FMA, where BigMac's GEMM is the default and fuses the activations.
  EXPECT_EQ(std::string(FloatGemmLibrary()).rfind("bigmac", 0), 0u) << FloatGemmLibrary();
#endif
}

struct Shape {
  int n, c, oc;
};
// Rows that are not whole micro-tiles, columns that are not whole panels, k of several blocks.
const Shape kShapes[] = {{64, 48, 192}, {37, 300, 70}, {130, 600, 1030}};

template <typename T>
class MatmulResidual : public ::testing::Test {};
using ResidualTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(MatmulResidual, ResidualTypes);

TYPED_TEST(MatmulResidual, ForwardGivesTheSeparateKernelsBits) {
  using T = TypeParam;
  const int threads_before = omp_get_max_threads();
  // kShapes, and two column blocks (each block's residual from its own columns).
  const Shape shapes[] = {kShapes[0], kShapes[1], kShapes[2], {30, 64, 4096 + 40}};
  for (const Shape& s : shapes) {
    const std::vector<T> inp = Random<T>(int64_t{s.n} * s.c, 1, 1.0);
    const std::vector<T> w = Random<T>(int64_t{s.oc} * s.c, 2, 0.2);
    const std::vector<T> bias = Random<T>(s.oc, 3, 0.5);
    const std::vector<T> residual = Random<T>(int64_t{s.n} * s.oc, 4, 1.0);
    for (const bool with_bias : {false, true}) {
      const T* b = with_bias ? bias.data() : nullptr;
      for (int threads : {1, 2}) {
        omp_set_num_threads(threads);
        std::vector<T> out(int64_t{s.n} * s.oc);
        MatmulForward(out.data(), inp.data(), w.data(), b, s.n, s.c, s.oc);
        AddInPlace(out.data(), residual.data(), int64_t{s.n} * s.oc);
        std::vector<T> fused(out.size(), T(7));
        MatmulResidualForward(fused.data(), inp.data(), w.data(), b, residual.data(), s.n, s.c,
                              s.oc);
        EXPECT_TRUE(BitwiseEqual(fused, out)) << "n=" << s.n << " c=" << s.c << " oc=" << s.oc
                                              << " bias=" << with_bias << " threads=" << threads;
      }
    }
  }
  omp_set_num_threads(threads_before);
}

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

// SwiGLU: n rows, k = c (forward) or oc (backward), width gate and width up columns. Widths of
// 2100 and 4200 span several of the GEMM's column blocks (kGemmNc = 4096): the forward's 4200
// columns two, its 8400 three, where up columns read gate columns finished one block earlier;
// the backward's 4200 two. k = 520 is three k blocks, packed in two groups.
struct SwigluShape {
  int n, k, width;
};
const SwigluShape kSwigluShapes[] = {{64, 48, 96}, {37, 300, 70}, {13, 520, 2100}, {7, 40, 4200}};

template <typename T>
class MatmulSwiglu : public ::testing::Test {};
TYPED_TEST_SUITE(MatmulSwiglu, Types);

TYPED_TEST(MatmulSwiglu, ForwardGivesTheSeparateKernelsBits) {
  using T = TypeParam;
  const int threads_before = omp_get_max_threads();
  for (const SwigluShape& s : kSwigluShapes) {
    const std::vector<T> inp = Random<T>(int64_t{s.n} * s.k, 7, 1.0);
    const std::vector<T> w = Random<T>(int64_t{2} * s.width * s.k, 8, 0.2);
    for (int threads : {1, 2}) {
      omp_set_num_threads(threads);
      std::vector<T> gate_up(int64_t{s.n} * 2 * s.width), h(int64_t{s.n} * s.width);
      MatmulForward(gate_up.data(), inp.data(), w.data(), static_cast<const T*>(nullptr), s.n, s.k,
                    2 * s.width);
      SwigluForward(h.data(), gate_up.data(), s.n, s.width);
      std::vector<T> fused_gate_up(gate_up.size(), T(7)), fused_h(h.size(), T(7));
      MatmulSwigluForward(fused_gate_up.data(), fused_h.data(), inp.data(), w.data(), s.n, s.k,
                          s.width);
      EXPECT_TRUE(BitwiseEqual(fused_gate_up, gate_up))
          << "n=" << s.n << " c=" << s.k << " width=" << s.width << " threads=" << threads
          << ": the product differs";
      EXPECT_TRUE(BitwiseEqual(fused_h, h)) << "n=" << s.n << " c=" << s.k << " width=" << s.width
                                            << " threads=" << threads << ": the SwiGLU differs";
    }
  }
  omp_set_num_threads(threads_before);
}

TYPED_TEST(MatmulSwiglu, BackwardInputGivesTheSeparateKernelsBits) {
  using T = TypeParam;
  const int threads_before = omp_get_max_threads();
  for (const SwigluShape& s : kSwigluShapes) {
    // dh(N,W) = dout(N,OC) @ w(OC,W); dgate_up(N,2W) = SwiGLU's backward through gate_up.
    const std::vector<T> dout = Random<T>(int64_t{s.n} * s.k, 9, 1.0);
    const std::vector<T> w = Random<T>(int64_t{s.k} * s.width, 10, 0.2);
    const std::vector<T> gate_up = Random<T>(int64_t{s.n} * 2 * s.width, 11, 2.0);
    for (int threads : {1, 2}) {
      omp_set_num_threads(threads);
      std::vector<T> dh(int64_t{s.n} * s.width), dgate_up(gate_up.size());
      MatmulBackwardInput(dh.data(), dout.data(), w.data(), s.n, s.width, s.k);
      SwigluBackward(dgate_up.data(), dh.data(), gate_up.data(), s.n, s.width);
      std::vector<T> fused_dh(dh.size(), T(7)), fused_dgate_up(dgate_up.size(), T(7));
      MatmulSwigluBackwardInput(fused_dh.data(), fused_dgate_up.data(), dout.data(), w.data(),
                                gate_up.data(), s.n, s.width, s.k);
      EXPECT_TRUE(BitwiseEqual(fused_dh, dh))
          << "n=" << s.n << " oc=" << s.k << " width=" << s.width << " threads=" << threads
          << ": the product differs";
      EXPECT_TRUE(BitwiseEqual(fused_dgate_up, dgate_up))
          << "n=" << s.n << " oc=" << s.k << " width=" << s.width << " threads=" << threads
          << ": the SwiGLU gradient differs";
    }
  }
  omp_set_num_threads(threads_before);
}

}  // namespace
}  // namespace bigmac::sdk::cpu
