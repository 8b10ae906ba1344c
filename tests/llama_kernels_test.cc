// The CPU kernels a Llama-family block adds to GPT's (plugins/sdk/cpu_kernels.h): grouped-query
// attention through the blocked attention (stages/cpu/flash_attention.cc) and rotary position
// embeddings (RopeTable/RopeForward/RopeBackward). GQA is checked against multi-head attention on
// K and V repeated per query head (the definition), by central finite differences in double, and
// for the same bits whatever the thread count; RoPE against Hugging Face's formula written out
// (x * cos + rotate_half(x) * sin), by finite differences, and for leaving other columns alone;
// RMSNorm and SwiGLU against their formulas written out and by finite differences, and for the
// same bits whatever the thread count; RMSNorm's and LayerNorm's input gradient onto a residual
// for the bits of copying it first.
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

using testutil::Random;
using testutil::ScaledError;

struct GqaShape {
  int b, t, c, h, kv;
  int hs() const { return c / h; }
  int64_t width() const { return c + 2 * int64_t{kv} * hs(); }
};
// t = 70: query blocks of 48 and 22 rows; kv = 1 is multi-query.
const GqaShape kGqaShapes[] = {{2, 70, 32, 4, 2}, {1, 33, 24, 6, 3}, {2, 5, 16, 4, 1}};

// The multi-head qkv (B,T,3C) that GQA means: each query head's key and value are its group's.
template <typename T>
std::vector<T> Expanded(const GqaShape& s, const std::vector<T>& qkv) {
  const int hs = s.hs(), group = s.h / s.kv;
  std::vector<T> mha(int64_t{s.b} * s.t * 3 * s.c);
  for (int64_t row = 0; row < int64_t{s.b} * s.t; ++row) {
    const T* in = qkv.data() + row * s.width();
    T* out = mha.data() + row * 3 * s.c;
    for (int e = 0; e < s.c; ++e) out[e] = in[e];
    for (int hi = 0; hi < s.h; ++hi) {
      for (int e = 0; e < hs; ++e) {
        out[s.c + hi * hs + e] = in[s.c + (hi / group) * hs + e];
        out[2 * s.c + hi * hs + e] = in[s.c + s.kv * hs + (hi / group) * hs + e];
      }
    }
  }
  return mha;
}

template <typename T>
struct Attention {
  std::vector<T> out, lse, dqkv;
};

template <typename T>
Attention<T> RunAttention(int b, int t, int c, int h, int kv, const std::vector<T>& qkv,
                          const std::vector<T>& dout) {
  Attention<T> r{std::vector<T>(int64_t{b} * t * c), std::vector<T>(int64_t{b} * h * t),
                 std::vector<T>(qkv.size(), T(7))};  // dqkv must be overwritten
  FlashAttentionForward(r.out.data(), r.lse.data(), qkv.data(), b, t, c, h, kv);
  FlashAttentionBackward(r.dqkv.data(), dout.data(), qkv.data(), r.lse.data(), b, t, c, h, kv);
  return r;
}

template <typename T>
class GroupedQueryAttention : public testing::Test {};
using Types = testing::Types<float, double>;
TYPED_TEST_SUITE(GroupedQueryAttention, Types);

TYPED_TEST(GroupedQueryAttention, IsMultiHeadAttentionOnRepeatedKeysAndValues) {
  using T = TypeParam;
  const double tolerance = sizeof(T) == 8 ? 1e-12 : 2e-5;
  for (const GqaShape& s : kGqaShapes) {
    SCOPED_TRACE("t=" + std::to_string(s.t) + " h=" + std::to_string(s.h) +
                 " kv=" + std::to_string(s.kv));
    const std::vector<T> qkv = Random<T>(int64_t{s.b} * s.t * s.width(), 1, 2.0);
    const std::vector<T> dout = Random<T>(int64_t{s.b} * s.t * s.c, 2, 2.0);
    const Attention<T> gqa = RunAttention(s.b, s.t, s.c, s.h, s.kv, qkv, dout);
    const Attention<T> mha = RunAttention(s.b, s.t, s.c, s.h, s.h, Expanded(s, qkv), dout);
    // Forward and dQ: the same arithmetic on the same values, bit for bit.
    EXPECT_EQ(gqa.out, mha.out);
    EXPECT_EQ(gqa.lse, mha.lse);
    const int hs = s.hs(), group = s.h / s.kv;
    std::vector<T> dq_gqa, dq_mha, dkv_gqa, dkv_sum;
    for (int64_t row = 0; row < int64_t{s.b} * s.t; ++row) {
      const T* g = gqa.dqkv.data() + row * s.width();
      const T* m = mha.dqkv.data() + row * 3 * s.c;
      dq_gqa.insert(dq_gqa.end(), g, g + s.c);
      dq_mha.insert(dq_mha.end(), m, m + s.c);
      // dK and dV of a kv head: the sum of its query heads' in multi-head attention.
      for (int part = 1; part <= 2; ++part) {
        for (int kh = 0; kh < s.kv; ++kh) {
          for (int e = 0; e < hs; ++e) {
            double sum = 0;
            for (int hi = kh * group; hi < (kh + 1) * group; ++hi)
              sum += m[part * s.c + hi * hs + e];
            dkv_sum.push_back(static_cast<T>(sum));
            dkv_gqa.push_back(g[s.c + (part - 1) * s.kv * hs + kh * hs + e]);
          }
        }
      }
    }
    EXPECT_EQ(dq_gqa, dq_mha);
    EXPECT_LT(ScaledError(dkv_gqa, dkv_sum), tolerance);
  }
}

TYPED_TEST(GroupedQueryAttention, SameBitsForAnyThreadCount) {
  using T = TypeParam;
  const GqaShape s = kGqaShapes[0];
  const std::vector<T> qkv = Random<T>(int64_t{s.b} * s.t * s.width(), 3, 2.0);
  const std::vector<T> dout = Random<T>(int64_t{s.b} * s.t * s.c, 4, 2.0);
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  const Attention<T> one = RunAttention(s.b, s.t, s.c, s.h, s.kv, qkv, dout);
  omp_set_num_threads(3);
  const Attention<T> three = RunAttention(s.b, s.t, s.c, s.h, s.kv, qkv, dout);
  omp_set_num_threads(threads);
  EXPECT_EQ(one.out, three.out);
  EXPECT_EQ(one.lse, three.lse);
  EXPECT_EQ(one.dqkv, three.dqkv);
}

TEST(GroupedQueryAttentionGradcheck, BackwardMatchesFiniteDifferences) {
  for (const GqaShape& s : {GqaShape{1, 40, 16, 4, 2}, GqaShape{1, 35, 12, 3, 1}}) {
    SCOPED_TRACE("kv=" + std::to_string(s.kv));
    std::vector<double> qkv = Random<double>(int64_t{s.b} * s.t * s.width(), 5, 2.0);
    const std::vector<double> r = Random<double>(int64_t{s.b} * s.t * s.c, 6, 2.0);
    const std::vector<double> dqkv = RunAttention(s.b, s.t, s.c, s.h, s.kv, qkv, r).dqkv;
    std::vector<double> out(r.size()), lse(int64_t{s.b} * s.h * s.t);
    const auto objective = [&] {
      FlashAttentionForward(out.data(), lse.data(), qkv.data(), s.b, s.t, s.c, s.h, s.kv);
      double j = 0;
      for (size_t i = 0; i < out.size(); ++i) j += out[i] * r[i];
      return j;
    };
    EXPECT_EQ(testutil::FiniteDifferenceMismatches(&qkv, dqkv, objective, 1e-7), "");
  }
}

// ---- rotary position embeddings

struct RopeShape {
  int b, t, heads, hs;
  int64_t ld;  // the row: `heads` rotated heads, then columns RoPE must leave alone
};
const RopeShape kRope{2, 9, 3, 8, 3 * 8 + 5};

template <typename T>
class Rope : public testing::Test {};
TYPED_TEST_SUITE(Rope, Types);

TYPED_TEST(Rope, TableHoldsTheAnglesOfEveryPositionAndPair) {
  using T = TypeParam;
  const int t = 7, hs = 16;
  const double theta = 500000.0;  // Llama 3's
  std::vector<T> cos(t * hs / 2), sin(t * hs / 2);
  RopeTable(cos.data(), sin.data(), t, hs, theta);
  for (int pos = 0; pos < t; ++pos) {
    for (int i = 0; i < hs / 2; ++i) {
      // HF: inv_freq = 1 / theta^(arange(0, hs, 2) / hs); angle = position * inv_freq.
      const double inverse_frequency = 1.0 / std::pow(theta, double(2 * i) / hs);
      const double tolerance = sizeof(T) == 8 ? 1e-13 : 1e-6;
      EXPECT_NEAR(cos[pos * hs / 2 + i], std::cos(pos * inverse_frequency), tolerance);
      EXPECT_NEAR(sin[pos * hs / 2 + i], std::sin(pos * inverse_frequency), tolerance);
    }
  }
}

TYPED_TEST(Rope, ForwardIsHuggingFacesRotateHalfAndLeavesOtherColumnsAlone) {
  using T = TypeParam;
  const RopeShape s = kRope;
  const int half = s.hs / 2;
  std::vector<T> cos(s.t * half), sin(s.t * half);
  RopeTable(cos.data(), sin.data(), s.t, s.hs, 10000.0);
  const std::vector<T> x = Random<T>(int64_t{s.b} * s.t * s.ld, 7, 3.0);
  std::vector<T> rotated = x;
  RopeForward(rotated.data(), cos.data(), sin.data(), s.b, s.t, s.heads, s.hs, s.ld);
  // q * cos + rotate_half(q) * sin, with cos and sin repeated over both halves of the head.
  std::vector<T> expected = x;
  for (int64_t row = 0; row < int64_t{s.b} * s.t; ++row) {
    const int pos = static_cast<int>(row % s.t);
    for (int head = 0; head < s.heads; ++head) {
      const T* in = x.data() + row * s.ld + head * s.hs;
      T* out = expected.data() + row * s.ld + head * s.hs;
      for (int e = 0; e < s.hs; ++e) {
        const T rotate_half = e < half ? -in[e + half] : in[e - half];
        out[e] = in[e] * cos[pos * half + e % half] + rotate_half * sin[pos * half + e % half];
      }
    }
  }
  EXPECT_LT(ScaledError(rotated, expected), sizeof(T) == 8 ? 1e-15 : 1e-6);
  for (int64_t row = 0; row < int64_t{s.b} * s.t; ++row) {
    for (int64_t e = s.heads * s.hs; e < s.ld; ++e)
      EXPECT_EQ(rotated[row * s.ld + e], x[row * s.ld + e]) << "row " << row << ", column " << e;
  }
  // Position 0 does not turn.
  for (int e = 0; e < s.heads * s.hs; ++e) EXPECT_EQ(rotated[e], x[e]);
}

TEST(RopeGradcheck, BackwardMatchesFiniteDifferencesAndInvertsTheForward) {
  const RopeShape s = kRope;
  std::vector<double> cos(s.t * s.hs / 2), sin(s.t * s.hs / 2);
  RopeTable(cos.data(), sin.data(), s.t, s.hs, 10000.0);
  std::vector<double> x = Random<double>(int64_t{s.b} * s.t * s.ld, 8, 3.0);
  const std::vector<double> r = Random<double>(x.size(), 9, 2.0);
  std::vector<double> dx = r;
  RopeBackward(dx.data(), cos.data(), sin.data(), s.b, s.t, s.heads, s.hs, s.ld);
  std::vector<double> y(x.size());
  const auto objective = [&] {
    y = x;
    RopeForward(y.data(), cos.data(), sin.data(), s.b, s.t, s.heads, s.hs, s.ld);
    double j = 0;
    for (size_t i = 0; i < y.size(); ++i) j += y[i] * r[i];
    return j;
  };
  EXPECT_EQ(testutil::FiniteDifferenceMismatches(&x, dx, objective, 1e-8), "");
  // A rotation's transpose is its inverse.
  y = x;
  RopeForward(y.data(), cos.data(), sin.data(), s.b, s.t, s.heads, s.hs, s.ld);
  RopeBackward(y.data(), cos.data(), sin.data(), s.b, s.t, s.heads, s.hs, s.ld);
  EXPECT_LT(ScaledError(y, x), 1e-14);
}

// RMSNorm: y = x / sqrt(mean(x^2) + eps) * w. n = 5 rows of c = 37 (not a multiple of a vector).
TEST(RmsNorm, ForwardIsTheFormulaAndBackwardMatchesFiniteDifferences) {
  const int n = 5, c = 37;
  const double eps = 1e-5;
  std::vector<double> x = Random<double>(int64_t{n} * c, 11, 2.0);
  std::vector<double> w = Random<double>(c, 12, 1.5);
  const std::vector<double> r = Random<double>(x.size(), 13, 1.0);
  std::vector<double> y(x.size()), rstd(n);
  RmsNormForward(y.data(), rstd.data(), x.data(), w.data(), n, c, eps);
  for (int i = 0; i < n; ++i) {
    double mean_square = 0;
    for (int j = 0; j < c; ++j) mean_square += x[i * c + j] * x[i * c + j] / c;
    for (int j = 0; j < c; ++j) {
      EXPECT_NEAR(y[i * c + j], x[i * c + j] / std::sqrt(mean_square + eps) * w[j], 1e-13);
    }
  }
  // dx accumulates (+=): start from a known value and subtract it.
  std::vector<double> dx(x.size(), 0.5), dw(c, 0.25);
  RmsNormBackwardInput(dx.data(), r.data(), x.data(), w.data(), rstd.data(), n, c);
  RmsNormBackwardWeight(dw.data(), r.data(), x.data(), rstd.data(), n, c);
  for (double& v : dx) v -= 0.5;
  for (double& v : dw) v -= 0.25;
  const auto objective = [&] {
    std::vector<double> out(x.size()), s(n);
    RmsNormForward(out.data(), s.data(), x.data(), w.data(), n, c, eps);
    double j = 0;
    for (size_t i = 0; i < out.size(); ++i) j += out[i] * r[i];
    return j;
  };
  EXPECT_EQ(testutil::FiniteDifferenceMismatches(&x, dx, objective, 1e-7), "");
  EXPECT_EQ(testutil::FiniteDifferenceMismatches(&w, dw, objective, 1e-7), "");
}

// SwiGLU on fused rows [gate | up]: h = gate * sigmoid(gate) * up.
TEST(Swiglu, ForwardIsTheFormulaAndBackwardMatchesFiniteDifferences) {
  const int n = 4, width = 19;
  std::vector<double> gate_up = Random<double>(int64_t{n} * 2 * width, 14, 4.0);
  const std::vector<double> r = Random<double>(int64_t{n} * width, 15, 1.0);
  std::vector<double> h(r.size());
  SwigluForward(h.data(), gate_up.data(), n, width);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < width; ++j) {
      const double g = gate_up[i * 2 * width + j], u = gate_up[i * 2 * width + width + j];
      EXPECT_NEAR(h[i * width + j], g / (1 + std::exp(-g)) * u, 1e-14);
    }
  }
  std::vector<double> d(gate_up.size(), 7.0);  // overwritten
  SwigluBackward(d.data(), r.data(), gate_up.data(), n, width);
  const auto objective = [&] {
    std::vector<double> out(r.size());
    SwigluForward(out.data(), gate_up.data(), n, width);
    double j = 0;
    for (size_t i = 0; i < out.size(); ++i) j += out[i] * r[i];
    return j;
  };
  EXPECT_EQ(testutil::FiniteDifferenceMismatches(&gate_up, d, objective, 1e-8), "");
}

// A block's input gradient written onto its residual's (the residual argument) gives the bits of
// copying the residual's gradient into dinp and accumulating (RMSNorm here, LayerNorm for GPT).
TEST(NormBackwardInput, OntoAResidualGivesTheBitsOfCopyThenAccumulate) {
  const int n = 37, c = 100;
  const std::vector<float> x = Random<float>(int64_t{n} * c, 30, 2.0);
  const std::vector<float> w = Random<float>(c, 31, 1.0);
  const std::vector<float> dy = Random<float>(x.size(), 32, 1.0);
  const std::vector<float> residual = Random<float>(x.size(), 33, 1.0);
  std::vector<float> y(x.size()), mean(n), rstd(n);
  RmsNormForward(y.data(), rstd.data(), x.data(), w.data(), n, c, 1e-5);
  std::vector<float> copied = residual, onto(x.size(), 7.0f);
  RmsNormBackwardInput(copied.data(), dy.data(), x.data(), w.data(), rstd.data(), n, c);
  RmsNormBackwardInput(onto.data(), dy.data(), x.data(), w.data(), rstd.data(), n, c,
                       residual.data());
  EXPECT_TRUE(testutil::BitwiseEqual(onto, copied)) << "RMSNorm";
  const std::vector<float> b = Random<float>(c, 34, 0.5);
  LayerNormForward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), n, c);
  copied = residual;
  std::fill(onto.begin(), onto.end(), 7.0f);
  LayerNormBackwardInput(copied.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(), n,
                         c);
  LayerNormBackwardInput(onto.data(), dy.data(), x.data(), w.data(), mean.data(), rstd.data(), n, c,
                         residual.data());
  EXPECT_TRUE(testutil::BitwiseEqual(onto, copied)) << "LayerNorm";
}

TEST(RmsNormAndSwiglu, FloatBitsDoNotDependOnTheThreadCount) {
  const int n = 64, c = 96;
  const std::vector<float> x = Random<float>(int64_t{n} * c, 16, 2.0);
  const std::vector<float> w = Random<float>(c, 17, 1.0);
  const std::vector<float> dy = Random<float>(x.size(), 18, 1.0);
  const auto run = [&](int threads) {
    omp_set_num_threads(threads);
    std::vector<float> y(x.size()), rstd(n), dx(x.size(), 0.f), dw(c, 0.f), h(n * c / 2),
        dgu(x.size());
    RmsNormForward(y.data(), rstd.data(), x.data(), w.data(), n, c, 1e-5);
    RmsNormBackwardInput(dx.data(), dy.data(), x.data(), w.data(), rstd.data(), n, c);
    RmsNormBackwardWeight(dw.data(), dy.data(), x.data(), rstd.data(), n, c);
    SwigluForward(h.data(), x.data(), n, c / 2);
    SwigluBackward(dgu.data(), dy.data(), x.data(), n, c / 2);
    std::vector<float> all;
    for (const auto* v : {&y, &rstd, &dx, &dw, &h, &dgu})
      all.insert(all.end(), v->begin(), v->end());
    return all;
  };
  const int threads = omp_get_max_threads();
  const std::vector<float> one = run(1), three = run(3);
  omp_set_num_threads(threads);
  ASSERT_EQ(one.size(), three.size());
  for (size_t i = 0; i < one.size(); ++i) ASSERT_EQ(one[i], three[i]) << "element " << i;
}

}  // namespace
}  // namespace bigmac::sdk::cpu
