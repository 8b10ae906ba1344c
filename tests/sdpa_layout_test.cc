// The dims and strides through which cuDNN's fused SDPA reads the CUDA block's interleaved qkv
// buffer, proven on the CPU: a strided attention that reads and writes only through those numbers
// (tests/testing/sdpa_reference.h) must equal the CPU backend's attention, forward and backward.
// Tolerances (absolute, scaled by max(1, max |reference|)): 1e-12 in double, 1e-5 in float; the
// two sides differ only in summation order (OpenBLAS GEMMs vs loops).
#include "stages/cuda/sdpa_layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "core/memory/dtype.h"
#include "plugins/sdk/cpu_kernels.h"
#include "tests/testing/numeric.h"
#include "tests/testing/sdpa_reference.h"

namespace bigmac::stages::cuda {
namespace {

namespace cpu = sdk::cpu;
using memory::DType;
using testutil::ElementAt;
using testutil::StridedAttentionBackward;
using testutil::StridedAttentionForward;

struct Shape {
  int b, t, h, d;
};
const Shape kShapes[] = {{2, 7, 3, 8}, {1, 16, 4, 16}, {3, 5, 2, 8}};

using testutil::MaxAbs;
using testutil::Random;
using testutil::ScaledError;

template <typename T>
double Tolerance() {
  return std::is_same_v<T, double> ? 1e-12 : 1e-5;
}

// The CPU backend's attention and the strided reference on one seeded random input.
template <typename T>
struct AttentionRun {
  Shape s;
  int64_t c, qkv_size, out_size, stats_size;
  std::vector<T> qkv, dout;
  std::vector<T> cpu_out, cpu_att, cpu_dqkv;
  std::vector<T> ref_out, ref_stats, ref_dqkv;

  explicit AttentionRun(Shape shape, uint64_t seed) : s(shape) {
    c = int64_t{s.h} * s.d;
    qkv_size = int64_t{s.b} * s.t * 3 * c;
    out_size = int64_t{s.b} * s.t * c;
    stats_size = int64_t{s.b} * s.h * s.t;
    qkv = Random<T>(qkv_size, seed);
    dout = Random<T>(out_size, seed + 1);
    cpu_out.assign(out_size, T(0));
    cpu_att.assign(int64_t{s.b} * s.h * s.t * s.t, T(0));
    cpu_dqkv.assign(qkv_size, T(0));
    cpu::AttentionForward(cpu_out.data(), cpu_att.data(), qkv.data(), s.b, s.t, static_cast<int>(c),
                          s.h);
    cpu::AttentionBackward(cpu_dqkv.data(), dout.data(), qkv.data(), cpu_att.data(), s.b, s.t,
                           static_cast<int>(c), s.h);
  }

  // NaN-filled outputs: an element the layout never writes stays NaN and fails the comparison.
  void Reference(const SdpaLayout& layout) {
    const T nan = std::numeric_limits<T>::quiet_NaN();
    ref_out.assign(out_size, nan);
    ref_stats.assign(stats_size, nan);
    ref_dqkv.assign(qkv_size, nan);
    StridedAttentionForward(ref_out.data(), out_size, ref_stats.data(), stats_size, qkv.data(),
                            qkv_size, layout);
    StridedAttentionBackward(ref_dqkv.data(), dout.data(), out_size, qkv.data(), qkv_size,
                             ref_stats.data(), stats_size, layout);
  }

  // The log-sum-exp the CPU attention implies, indexed (b, h, t) packed: the diagonal
  // probability is exp(s_ii - lse), so lse = s_ii - log(p_ii), with s_ii from qkv directly.
  std::vector<T> CpuStats() const {
    std::vector<T> lse(stats_size);
    const T scale = T(1) / std::sqrt(T(s.d));
    for (int b = 0; b < s.b; ++b) {
      for (int h = 0; h < s.h; ++h) {
        for (int i = 0; i < s.t; ++i) {
          const T* q = qkv.data() + (int64_t{b} * s.t + i) * 3 * c + int64_t{h} * s.d;
          const T* k = q + c;
          T dot = 0;
          for (int e = 0; e < s.d; ++e) dot += q[e] * k[e];
          const T p = cpu_att[((int64_t{b} * s.h + h) * s.t + i) * s.t + i];
          lse[(int64_t{b} * s.h + h) * s.t + i] = dot * scale - std::log(p);
        }
      }
    }
    return lse;
  }
};

TEST(SdpaLayout, InterleavedQkvNumbers) {
  // b=2, t=7, h=3, d=8: C = 24, a qkv row is 72 elements, an out row 24.
  const SdpaLayout l = InterleavedQkvLayout(2, 7, 3, 8);
  for (const SdpaTensor* x : {&l.q, &l.k, &l.v, &l.o}) {
    EXPECT_EQ(x->dims, (std::array<int64_t, 4>{2, 3, 7, 8}));
  }
  for (const SdpaTensor* x : {&l.q, &l.k, &l.v}) {
    EXPECT_EQ(x->strides, (std::array<int64_t, 4>{7 * 72, 8, 72, 1}));
  }
  EXPECT_EQ(l.q.offset, 0);
  EXPECT_EQ(l.k.offset, 24);
  EXPECT_EQ(l.v.offset, 48);
  EXPECT_EQ(l.o.strides, (std::array<int64_t, 4>{7 * 24, 8, 24, 1}));
  EXPECT_EQ(l.o.offset, 0);
  EXPECT_EQ(l.stats.dims, (std::array<int64_t, 4>{2, 3, 7, 1}));
  EXPECT_EQ(l.stats.strides, (std::array<int64_t, 4>{21, 7, 1, 1}));
  EXPECT_EQ(l.stats.offset, 0);
}

// q, k and v tile qkv exactly (so dq, dk, dv written through them cover all of dqkv); o tiles out
// and stats tiles stats.
TEST(SdpaLayout, TensorsTileTheirBuffersExactlyOnce) {
  for (const Shape& s : kShapes) {
    const SdpaLayout l = InterleavedQkvLayout(s.b, s.t, s.h, s.d);
    const int64_t c = int64_t{s.h} * s.d;
    auto count = [](std::vector<int>& hits, const SdpaTensor& x) {
      for (int64_t i0 = 0; i0 < x.dims[0]; ++i0)
        for (int64_t i1 = 0; i1 < x.dims[1]; ++i1)
          for (int64_t i2 = 0; i2 < x.dims[2]; ++i2)
            for (int64_t i3 = 0; i3 < x.dims[3]; ++i3) ++hits.at(ElementAt(x, i0, i1, i2, i3));
    };
    std::vector<int> qkv(int64_t{s.b} * s.t * 3 * c), out(int64_t{s.b} * s.t * c),
        stats(int64_t{s.b} * s.h * s.t);
    count(qkv, l.q);
    count(qkv, l.k);
    count(qkv, l.v);
    count(out, l.o);
    count(stats, l.stats);
    for (const auto* hits : {&qkv, &out, &stats}) {
      EXPECT_TRUE(std::all_of(hits->begin(), hits->end(), [](int n) { return n == 1; }))
          << "b=" << s.b << " t=" << s.t << " h=" << s.h << " d=" << s.d;
    }
  }
}

// cuDNN's SDPA loads bf16 operands in 16-byte vectors and rejects strides (and pointers) that are
// not multiples of 16 bytes: every head dim ChooseAttention sends to cuDNN must give such
// strides and offsets (the innermost stride is 1 element, a vector's own step).
TEST(SdpaLayout, CudnnShapesAreSixteenByteAlignedInBf16) {
  for (int d = 1; d <= 256; ++d) {
    if (!ChooseAttention(DType::kBF16, d).cudnn) continue;
    for (int h : {1, 3, 12, 25}) {
      const SdpaLayout l = InterleavedQkvLayout(2, 9, h, d);
      for (const SdpaTensor* x : {&l.q, &l.k, &l.v, &l.o}) {
        EXPECT_EQ(x->offset * 2 % 16, 0) << "d=" << d << " h=" << h;
        for (int i = 0; i < 3; ++i) EXPECT_EQ(x->strides[i] * 2 % 16, 0) << "d=" << d;
        EXPECT_EQ(x->strides[3], 1);
      }
    }
  }
}

template <typename T>
class StridedAttention : public ::testing::Test {};
using FloatTypes = ::testing::Types<double, float>;
TYPED_TEST_SUITE(StridedAttention, FloatTypes);

TYPED_TEST(StridedAttention, ForwardMatchesCpuAttention) {
  using T = TypeParam;
  uint64_t seed = 11;
  for (const Shape& s : kShapes) {
    AttentionRun<T> run(s, seed += 7);
    run.Reference(InterleavedQkvLayout(s.b, s.t, s.h, s.d));
    EXPECT_LE(ScaledError(run.ref_out, run.cpu_out), Tolerance<T>())
        << "b=" << s.b << " t=" << s.t << " h=" << s.h << " d=" << s.d;
    EXPECT_LE(ScaledError(run.ref_stats, run.CpuStats()), Tolerance<T>())
        << "b=" << s.b << " t=" << s.t << " h=" << s.h << " d=" << s.d;
  }
}

TYPED_TEST(StridedAttention, BackwardMatchesCpuAttentionBackward) {
  using T = TypeParam;
  uint64_t seed = 101;
  for (const Shape& s : kShapes) {
    AttentionRun<T> run(s, seed += 7);
    run.Reference(InterleavedQkvLayout(s.b, s.t, s.h, s.d));
    EXPECT_LE(ScaledError(run.ref_dqkv, run.cpu_dqkv), Tolerance<T>())
        << "b=" << s.b << " t=" << s.t << " h=" << s.h << " d=" << s.d;
    EXPECT_GT(MaxAbs(run.cpu_dqkv), 1e-2);  // the gradients are not trivially zero
  }
}

// The comparison can fail: each deliberately wrong layout gives a large error (b=2, t=7, h=3,
// d=8, where the wrong strides still stay inside the buffers).
TEST(StridedAttentionNegative, WrongLayoutsFailTheComparison) {
  const Shape s{2, 7, 3, 8};
  AttentionRun<double> run(s, 5);
  const SdpaLayout good = InterleavedQkvLayout(s.b, s.t, s.h, s.d);
  run.Reference(good);
  ASSERT_LE(ScaledError(run.ref_out, run.cpu_out), 1e-12);

  struct Case {
    const char* what;
    SdpaLayout layout;
  };
  std::vector<Case> cases;
  SdpaLayout l = good;
  for (SdpaTensor* x : {&l.q, &l.k, &l.v}) std::swap(x->strides[1], x->strides[2]);
  cases.push_back({"q/k/v with T and H strides swapped", l});
  l = good;
  l.k.offset = 0;
  cases.push_back({"k at q's offset", l});
  l = good;
  std::swap(l.k.offset, l.v.offset);
  cases.push_back({"k and v swapped", l});
  l = good;
  std::swap(l.o.strides[1], l.o.strides[2]);
  cases.push_back({"o with T and H strides swapped", l});
  l = good;
  l.stats.strides = {int64_t{s.h} * s.t, 1, s.h, 1};
  cases.push_back({"stats in (B,T,H) order", l});

  for (const Case& c : cases) {
    AttentionRun<double> wrong(s, 5);
    wrong.Reference(c.layout);
    const double forward = std::max(ScaledError(wrong.ref_out, wrong.cpu_out),
                                    ScaledError(wrong.ref_stats, wrong.CpuStats()));
    const double backward = ScaledError(wrong.ref_dqkv, wrong.cpu_dqkv);
    EXPECT_GT(std::max(forward, backward), 1e-3) << c.what;
  }
}

TEST(StridedAttentionNegative, LayoutOutsideItsBufferThrows) {
  const Shape s{2, 7, 3, 8};
  AttentionRun<double> run(s, 5);
  SdpaLayout l = InterleavedQkvLayout(s.b, s.t, s.h, s.d);
  l.v.offset = 3 * run.c;  // v would start in the next token's q
  EXPECT_THROW(run.Reference(l), std::out_of_range);
}

// Grouped-query attention (llama): b=2, t=7, h=4 query heads, 2 kv heads, d=8: a qkv row is
// (4 + 2 + 2) * 8 = 64 elements, an out row 32.
TEST(SdpaLayout, GroupedQkvNumbers) {
  const SdpaLayout l = GroupedQkvLayout(2, 7, 4, 2, 8);
  EXPECT_EQ(l.q.dims, (std::array<int64_t, 4>{2, 4, 7, 8}));
  EXPECT_EQ(l.o.dims, (std::array<int64_t, 4>{2, 4, 7, 8}));
  for (const SdpaTensor* x : {&l.k, &l.v}) {
    EXPECT_EQ(x->dims, (std::array<int64_t, 4>{2, 2, 7, 8}));
  }
  for (const SdpaTensor* x : {&l.q, &l.k, &l.v}) {
    EXPECT_EQ(x->strides, (std::array<int64_t, 4>{7 * 64, 8, 64, 1}));
  }
  EXPECT_EQ(l.q.offset, 0);
  EXPECT_EQ(l.k.offset, 32);
  EXPECT_EQ(l.v.offset, 48);
  EXPECT_EQ(l.o.strides, (std::array<int64_t, 4>{7 * 32, 8, 32, 1}));
  EXPECT_EQ(l.stats.dims, (std::array<int64_t, 4>{2, 4, 7, 1}));
  EXPECT_EQ(l.stats.strides, (std::array<int64_t, 4>{28, 7, 1, 1}));
  // kv_heads = h is the interleaved layout.
  const SdpaLayout mha = GroupedQkvLayout(2, 7, 3, 3, 8);
  const SdpaLayout interleaved = InterleavedQkvLayout(2, 7, 3, 8);
  for (auto [a, b] : {std::pair{&mha.q, &interleaved.q},
                      {&mha.k, &interleaved.k},
                      {&mha.v, &interleaved.v},
                      {&mha.o, &interleaved.o}}) {
    EXPECT_EQ(a->dims, b->dims);
    EXPECT_EQ(a->strides, b->strides);
    EXPECT_EQ(a->offset, b->offset);
  }
}

// {b, t, h, kv, d}: groups of 2 and 3, multi-query.
struct GroupedShape {
  int b, t, h, kv, d;
};
const GroupedShape kGroupedShapes[] = {{2, 7, 4, 2, 8}, {1, 9, 6, 2, 16}, {3, 5, 3, 1, 8}};

TEST(SdpaLayout, GroupedTensorsTileQkvExactlyOnce) {
  for (const GroupedShape& s : kGroupedShapes) {
    const SdpaLayout l = GroupedQkvLayout(s.b, s.t, s.h, s.kv, s.d);
    std::vector<int> hits(int64_t{s.b} * s.t * (s.h + 2 * s.kv) * s.d);
    for (const SdpaTensor* x : {&l.q, &l.k, &l.v}) {
      for (int64_t i0 = 0; i0 < x->dims[0]; ++i0)
        for (int64_t i1 = 0; i1 < x->dims[1]; ++i1)
          for (int64_t i2 = 0; i2 < x->dims[2]; ++i2)
            for (int64_t i3 = 0; i3 < x->dims[3]; ++i3) ++hits.at(ElementAt(*x, i0, i1, i2, i3));
    }
    EXPECT_TRUE(std::all_of(hits.begin(), hits.end(), [](int n) { return n == 1; }))
        << "h=" << s.h << " kv=" << s.kv;
  }
}

TEST(SdpaLayout, GroupedCudnnShapesAreSixteenByteAlignedInBf16) {
  for (int d : {8, 64, 128}) {
    for (auto [h, kv] : {std::pair{4, 1}, {6, 2}, {32, 8}, {3, 3}}) {
      const SdpaLayout l = GroupedQkvLayout(2, 9, h, kv, d);
      for (const SdpaTensor* x : {&l.q, &l.k, &l.v, &l.o}) {
        EXPECT_EQ(x->offset * 2 % 16, 0) << "d=" << d << " h=" << h << " kv=" << kv;
        for (int i = 0; i < 3; ++i) EXPECT_EQ(x->strides[i] * 2 % 16, 0) << "d=" << d;
        EXPECT_EQ(x->strides[3], 1);
      }
    }
  }
}

// The strided reference through GroupedQkvLayout against the CPU's grouped-query blocked
// attention (FlashAttentionForward/Backward with kv_heads): out, the log-sum-exp, and dqkv.
TYPED_TEST(StridedAttention, GroupedMatchesCpuFlashAttention) {
  using T = TypeParam;
  uint64_t seed = 301;
  for (const GroupedShape& s : kGroupedShapes) {
    const int c = s.h * s.d;
    const int64_t qkv_size = int64_t{s.b} * s.t * (s.h + 2 * s.kv) * s.d;
    const int64_t out_size = int64_t{s.b} * s.t * c;
    const int64_t stats_size = int64_t{s.b} * s.h * s.t;
    const std::vector<T> qkv = Random<T>(qkv_size, seed += 7);
    const std::vector<T> dout = Random<T>(out_size, seed + 1);
    std::vector<T> out(out_size), lse(stats_size), dqkv(qkv_size);
    cpu::FlashAttentionForward(out.data(), lse.data(), qkv.data(), s.b, s.t, c, s.h, s.kv);
    cpu::FlashAttentionBackward(dqkv.data(), dout.data(), qkv.data(), lse.data(), s.b, s.t, c, s.h,
                                s.kv);
    const T nan = std::numeric_limits<T>::quiet_NaN();
    std::vector<T> ref_out(out_size, nan), ref_stats(stats_size, nan), ref_dqkv(qkv_size, nan);
    const SdpaLayout layout = GroupedQkvLayout(s.b, s.t, s.h, s.kv, s.d);
    StridedAttentionForward(ref_out.data(), out_size, ref_stats.data(), stats_size, qkv.data(),
                            qkv_size, layout);
    StridedAttentionBackward(ref_dqkv.data(), dout.data(), out_size, qkv.data(), qkv_size,
                             ref_stats.data(), stats_size, layout);
    EXPECT_LE(ScaledError(ref_out, out), Tolerance<T>()) << "h=" << s.h << " kv=" << s.kv;
    EXPECT_LE(ScaledError(ref_stats, lse), Tolerance<T>()) << "h=" << s.h << " kv=" << s.kv;
    EXPECT_LE(ScaledError(ref_dqkv, dqkv), Tolerance<T>()) << "h=" << s.h << " kv=" << s.kv;
    EXPECT_GT(MaxAbs(dqkv), 1e-2);
    // Keys one head further along the row (the next kv head's, or the first value head's) fail.
    {
      SdpaLayout wrong = layout;
      wrong.k.offset += s.d;
      std::vector<T> bad_out(out_size, nan), bad_stats(stats_size, nan);
      StridedAttentionForward(bad_out.data(), out_size, bad_stats.data(), stats_size, qkv.data(),
                              qkv_size, wrong);
      EXPECT_GT(ScaledError(bad_out, out), 1e-3) << "h=" << s.h << " kv=" << s.kv;
    }
  }
}

TEST(ChooseAttention, CudnnForBf16HeadsThatAreMultiplesOf8UpTo128) {
  for (int d : {8, 16, 32, 64, 96, 128}) {
    const AttentionChoice choice = ChooseAttention(DType::kBF16, d);
    EXPECT_TRUE(choice.cudnn) << d;
    EXPECT_EQ(choice.reason, "cuDNN fused SDPA (bf16, head dim " + std::to_string(d) + ")");
  }
}

TEST(ChooseAttention, FallbackSaysWhy) {
  AttentionChoice choice = ChooseAttention(DType::kBF16, 12);
  EXPECT_FALSE(choice.cudnn);
  EXPECT_EQ(choice.reason,
            "fallback attention: head dim 12 is not a multiple of 8 (cuDNN fused SDPA needs it)");

  choice = ChooseAttention(DType::kF32, 64);
  EXPECT_FALSE(choice.cudnn);
  EXPECT_EQ(choice.reason, "fallback attention: fp32 (cuDNN fused SDPA is bf16 here)");

  choice = ChooseAttention(DType::kF64, 64);
  EXPECT_FALSE(choice.cudnn);
  EXPECT_EQ(choice.reason, "fallback attention: fp64 (cuDNN fused SDPA is bf16 here)");

  // fp32 is reported before the head dim.
  EXPECT_EQ(ChooseAttention(DType::kF32, 12).reason,
            "fallback attention: fp32 (cuDNN fused SDPA is bf16 here)");

  for (int d : {136, 192, 256}) {
    choice = ChooseAttention(DType::kBF16, d);
    EXPECT_FALSE(choice.cudnn) << d;
    EXPECT_EQ(choice.reason.rfind(
                  "fallback attention: head dim " + std::to_string(d) + " is above 128", 0),
              0u)
        << choice.reason;
  }
  for (int d : {0, -8}) {
    choice = ChooseAttention(DType::kBF16, d);
    EXPECT_FALSE(choice.cudnn) << d;
    EXPECT_EQ(choice.reason,
              "fallback attention: head dim " + std::to_string(d) + " is not positive");
  }
  for (int d : {1, 4, 7, 60, 100}) EXPECT_FALSE(ChooseAttention(DType::kBF16, d).cudnn) << d;
}

}  // namespace
}  // namespace bigmac::stages::cuda
