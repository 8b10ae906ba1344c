// The blocked causal attention (stages/cpu/flash_attention.cc) against the full-square kernels
// (AttentionForward/Backward) in float and double, on shapes with several query blocks and a
// partial last one; its backward against central finite differences in double; and the same
// bits whatever the OpenMP thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "plugins/sdk/cpu_kernels.h"
#include "tests/testing/numeric.h"

namespace bigmac::sdk::cpu {
namespace {

struct Shape {
  int b, t, c, h;
};
// t = 110: query blocks of 48, 48 and 14 rows (head size 8, and 32: two of the GEMM's 16-column
// panels of packed keys and values); t = 5: one partial block; t = 300: more keys than one GEMM k
// block packs (kGemmKc = 256), so O = P V and dQ = dS K multiply the plain keys and values.
const Shape kShapes[] = {
    {2, 110, 16, 2}, {1, 5, 8, 2}, {3, 33, 12, 3}, {1, 300, 8, 2}, {1, 110, 64, 2}};

using testutil::ScaledError;

// Scores up to about 4 / sqrt(head size) * head size: softmax rows far from uniform.
template <typename T>
std::vector<T> Random(int64_t n, uint64_t seed) {
  return testutil::Random<T>(n, seed, 2.0);
}

template <typename T>
struct Result {
  std::vector<T> out, lse, dqkv;
};

template <typename T>
Result<T> Flash(const Shape& s, const std::vector<T>& qkv, const std::vector<T>& dout) {
  Result<T> r{std::vector<T>(int64_t{s.b} * s.t * s.c), std::vector<T>(int64_t{s.b} * s.h * s.t),
              std::vector<T>(qkv.size(), T(7))};  // dqkv must be overwritten, not accumulated
  FlashAttentionForward(r.out.data(), r.lse.data(), qkv.data(), s.b, s.t, s.c, s.h);
  FlashAttentionBackward(r.dqkv.data(), dout.data(), qkv.data(), r.lse.data(), s.b, s.t, s.c, s.h);
  return r;
}

template <typename T>
class FlashAttention : public testing::Test {};
using Types = testing::Types<float, double>;
TYPED_TEST_SUITE(FlashAttention, Types);

TYPED_TEST(FlashAttention, MatchesTheFullSquareKernels) {
  using T = TypeParam;
  const double tolerance = sizeof(T) == 8 ? 1e-12 : 2e-5;
  for (const Shape& s : kShapes) {
    const std::vector<T> qkv = Random<T>(int64_t{s.b} * s.t * 3 * s.c, 1);
    const std::vector<T> dout = Random<T>(int64_t{s.b} * s.t * s.c, 2);
    const Result<T> flash = Flash(s, qkv, dout);
    std::vector<T> out(flash.out.size()), att(int64_t{s.b} * s.h * s.t * s.t), dqkv(qkv.size());
    AttentionForward(out.data(), att.data(), qkv.data(), s.b, s.t, s.c, s.h);
    AttentionBackward(dqkv.data(), dout.data(), qkv.data(), att.data(), s.b, s.t, s.c, s.h);
    EXPECT_LT(ScaledError(flash.out, out), tolerance) << "out, t=" << s.t;
    EXPECT_LT(ScaledError(flash.dqkv, dqkv), tolerance) << "dqkv, t=" << s.t;
    // lse = log sum_j exp(scale q.k_j) over the causal prefix, from the scores in double.
    const int hs = s.c / s.h;
    std::vector<T> lse(flash.lse.size());
    for (int bi = 0; bi < s.b; ++bi) {
      for (int hi = 0; hi < s.h; ++hi) {
        for (int i = 0; i < s.t; ++i) {
          double sum = 0;
          for (int j = 0; j <= i; ++j) {
            double dot = 0;
            for (int e = 0; e < hs; ++e) {
              dot += double(qkv[(int64_t{bi} * s.t + i) * 3 * s.c + hi * hs + e]) *
                     qkv[(int64_t{bi} * s.t + j) * 3 * s.c + s.c + hi * hs + e];
            }
            sum += std::exp(dot / std::sqrt(double(hs)));
          }
          lse[(int64_t{bi} * s.h + hi) * s.t + i] = static_cast<T>(std::log(sum));
        }
      }
    }
    EXPECT_LT(ScaledError(flash.lse, lse), tolerance) << "lse, t=" << s.t;
  }
}

TYPED_TEST(FlashAttention, SameBitsForAnyThreadCount) {
  using T = TypeParam;
  const Shape s = kShapes[0];
  const std::vector<T> qkv = Random<T>(int64_t{s.b} * s.t * 3 * s.c, 3);
  const std::vector<T> dout = Random<T>(int64_t{s.b} * s.t * s.c, 4);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const Result<T> one = Flash(s, qkv, dout);
  omp_set_num_threads(3);
  const Result<T> three = Flash(s, qkv, dout);
  omp_set_num_threads(threads);
  EXPECT_EQ(one.out, three.out);
  EXPECT_EQ(one.lse, three.lse);
  EXPECT_EQ(one.dqkv, three.dqkv);
}

// dqkv of J = sum(out * R) against central differences over every element of qkv, in double.
TEST(FlashAttentionGradcheck, BackwardMatchesFiniteDifferences) {
  const Shape s{1, 70, 8, 2};
  std::vector<double> qkv = Random<double>(int64_t{s.b} * s.t * 3 * s.c, 5);
  const std::vector<double> r = Random<double>(int64_t{s.b} * s.t * s.c, 6);
  const std::vector<double> dqkv = Flash(s, qkv, r).dqkv;
  std::vector<double> out(r.size()), lse(int64_t{s.b} * s.h * s.t);
  auto objective = [&] {
    FlashAttentionForward(out.data(), lse.data(), qkv.data(), s.b, s.t, s.c, s.h);
    double j = 0;
    for (size_t i = 0; i < out.size(); ++i) j += out[i] * r[i];
    return j;
  };
  EXPECT_EQ(testutil::FiniteDifferenceMismatches(&qkv, dqkv, objective, 1e-7), "");
}

}  // namespace
}  // namespace bigmac::sdk::cpu
