// BigMac's blocked float GEMM (stages/cpu/blocked_gemm.h), with each micro-kernel the CPU runs
// (AVX2; AVX-512 where the CPU has it): every transpose case, edge and multi-block shapes, alpha
// and beta, against a double reference; the property the layouts need, the same bits at any
// thread count and inside a parallel region; and the same bits from both kernels.
#include "stages/cpu/blocked_gemm.h"

#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace bigmac::sdk::cpu::internal {
namespace {

struct Case {
  bool ta, tb;
  int m, n, k;
  float alpha, beta;
};

struct Operands {
  std::vector<float> a, b, c;
  int lda, ldb, ldc;
};

// Seeded uniform values in [-1, 1). With `padded`, leading dimensions run past the logical
// width, so that a write outside C shows; without, they equal it, so that a read past a row's
// end falls in the next row or outside the allocation (ASan, launch/sanitize.sh).
Operands Make(const Case& cs, uint32_t seed, bool padded = true) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Operands o;
  const int a_rows = cs.ta ? cs.k : cs.m, a_cols = cs.ta ? cs.m : cs.k;
  const int b_rows = cs.tb ? cs.n : cs.k, b_cols = cs.tb ? cs.k : cs.n;
  o.lda = a_cols + (padded ? 3 : 0);
  o.ldb = b_cols + (padded ? 5 : 0);
  o.ldc = cs.n + (padded ? 2 : 0);
  o.a.resize(size_t(a_rows) * o.lda);
  o.b.resize(size_t(b_rows) * o.ldb);
  o.c.resize(size_t(cs.m) * o.ldc);
  for (float& x : o.a) x = u(rng);
  for (float& x : o.b) x = u(rng);
  for (float& x : o.c) x = u(rng);
  return o;
}

float A(const Case& cs, const Operands& o, int i, int p) {
  return cs.ta ? o.a[size_t(p) * o.lda + i] : o.a[size_t(i) * o.lda + p];
}
float B(const Case& cs, const Operands& o, int p, int j) {
  return cs.tb ? o.b[size_t(j) * o.ldb + p] : o.b[size_t(p) * o.ldb + j];
}

void ExpectMatchesReference(GemmKernel kernel, const Case& cs, uint32_t seed, bool padded = true) {
  Operands o = Make(cs, seed, padded);
  const std::vector<float> c0 = o.c;
  BlockedSgemm(kernel, cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, o.a.data(), o.lda, o.b.data(),
               o.ldb, cs.beta, o.c.data(), o.ldc);
  double worst = 0;
  for (int i = 0; i < cs.m; ++i) {
    for (int j = 0; j < o.ldc; ++j) {
      const size_t at = size_t(i) * o.ldc + j;
      if (j >= cs.n) {  // the padding past n is untouched
        ASSERT_EQ(o.c[at], c0[at]) << "wrote outside C at row " << i << " column " << j;
        continue;
      }
      double sum = 0, magnitude = 0;
      for (int p = 0; p < cs.k; ++p) {
        sum += double(A(cs, o, i, p)) * B(cs, o, p, j);
        magnitude += std::fabs(double(A(cs, o, i, p)) * B(cs, o, p, j));
      }
      const double want = cs.alpha * sum + (cs.beta == 0 ? 0.0 : cs.beta * double(c0[at]));
      // Float accumulation over k terms: a few ulp of the sum of magnitudes per term.
      const double tolerance = 1e-6 * (cs.k + 4) * (std::fabs(cs.alpha) * magnitude + 1);
      const double error = std::fabs(o.c[at] - want);
      worst = std::max(worst, error / tolerance);
      ASSERT_LE(error, tolerance) << "C(" << i << ", " << j << ") of ta=" << cs.ta
                                  << " tb=" << cs.tb << " m=" << cs.m << " n=" << cs.n
                                  << " k=" << cs.k;
    }
  }
  EXPECT_GT(cs.m * cs.n, 0);
}

// Each test runs once per micro-kernel; the AVX-512 one where the CPU has it.
class BlockedGemm : public ::testing::TestWithParam<GemmKernel> {
 protected:
  void SetUp() override {
    if (!BlockedSgemmSupported(GetParam())) {
      GTEST_SKIP() << "this CPU cannot run the " << GemmKernelName(GetParam()) << " kernel";
    }
  }
};

TEST_P(BlockedGemm, MatchesADoubleReferenceInEveryLayout) {
  const int shapes[][3] = {
      {1, 1, 1},     {6, 16, 8},    {7, 17, 9},      {5, 3, 300},  {13, 40, 257},
      {150, 33, 64}, {64, 70, 513}, {145, 200, 100}, {32, 96, 32}, {2, 300, 7},
  };
  uint32_t seed = 1;
  for (const auto& s : shapes) {
    for (int layout = 0; layout < 4; ++layout) {
      for (const auto& [alpha, beta] :
           {std::pair{1.0f, 0.0f}, {0.5f, 0.0f}, {1.0f, 1.0f}, {0.5f, -2.0f}}) {
        const Case cs{bool(layout & 1), bool(layout & 2), s[0], s[1], s[2], alpha, beta};
        ExpectMatchesReference(GetParam(), cs, seed++, /*padded=*/true);
        ExpectMatchesReference(GetParam(), cs, seed++, /*padded=*/false);
      }
    }
  }
}

// B is packed as many k blocks at a time as fit kGemmPackedB floats: two at a time for a whole
// column block (4096 columns: groups [0, 512), [512, 1024) and [1024, 1112)), four at a time
// for the 2048 after it (groups [0, 1024) and [1024, 1112)), all five for a narrow one; and
// exactly kGemmNc columns leave no second block. The chunks of rows fold each group into C
// before the next is packed.
TEST_P(BlockedGemm, MatchesTheReferenceWhenBIsPackedInGroupsOfKBlocks) {
  static_assert(int64_t{kGemmNc} * 2 * kGemmKc == kGemmPackedB, "two k blocks per group at 4096");
  static_assert(int64_t{2048} * 4 * kGemmKc == kGemmPackedB, "four k blocks per group at 2048");
  uint32_t seed = 900;
  for (const int n : {kGemmNc + 2048, kGemmNc + 24, kGemmNc}) {
    for (int layout = 0; layout < 4; ++layout) {
      const Case cs{bool(layout & 1),         bool(layout & 2), 13, n, 4 * kGemmKc + 88, 0.5f,
                    layout < 2 ? 0.0f : -1.0f};
      ExpectMatchesReference(GetParam(), cs, seed++);
    }
  }
}

TEST_P(BlockedGemm, BetaZeroIgnoresWhatCHeld) {
  const Case cs{false, true, 9, 20, 11, 1.0f, 0.0f};
  Operands o = Make(cs, 7);
  std::vector<float> clean = o.c;
  for (float& x : o.c) x = std::numeric_limits<float>::quiet_NaN();
  BlockedSgemm(GetParam(), cs.ta, cs.tb, cs.m, cs.n, cs.k, 1.0f, o.a.data(), o.lda, o.b.data(),
               o.ldb, 0.0f, o.c.data(), o.ldc);
  BlockedSgemm(GetParam(), cs.ta, cs.tb, cs.m, cs.n, cs.k, 1.0f, o.a.data(), o.lda, o.b.data(),
               o.ldb, 0.0f, clean.data(), o.ldc);
  for (int i = 0; i < cs.m; ++i) {
    for (int j = 0; j < cs.n; ++j) EXPECT_EQ(o.c[i * o.ldc + j], clean[i * o.ldc + j]);
  }
}

TEST_P(BlockedGemm, KZeroOrAlphaZeroScalesC) {
  std::vector<float> c = {1, 2, 3, 4};
  BlockedSgemm(GetParam(), false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.5f, c.data(), 2);
  EXPECT_EQ(c, (std::vector<float>{0.5f, 1, 1.5f, 2}));
  // As BLAS: alpha == 0 reads neither A nor B, so a NaN there does not reach C.
  const std::vector<float> nan(4, std::numeric_limits<float>::quiet_NaN());
  BlockedSgemm(GetParam(), false, false, 2, 2, 2, 0.0f, nan.data(), 2, nan.data(), 2, 2.0f,
               c.data(), 2);
  EXPECT_EQ(c, (std::vector<float>{1, 2, 3, 4}));
}

// An element's bits do not depend on where the matrix ends: the same row or column falls in a
// full tile in one layout and in an edge tile in another (dp and tp split m and n).
TEST_P(BlockedGemm, BitsDoNotDependOnTheMatrixEdges) {
  for (int layout = 0; layout < 4; ++layout) {
    const bool ta = layout & 1, tb = layout & 2;
    const Case big{ta, tb, 12, 32, 300, 1.0f, 0.0f};
    const Operands o = Make(big, 21);
    std::vector<float> full(o.c.size()), cut(o.c.size());
    BlockedSgemm(GetParam(), ta, tb, 12, 32, 300, 1.0f, o.a.data(), o.lda, o.b.data(), o.ldb, 0.0f,
                 full.data(), o.ldc);
    // The first 7 rows and 17 columns of the same product, as a smaller matrix.
    BlockedSgemm(GetParam(), ta, tb, 7, 17, 300, 1.0f, o.a.data(), o.lda, o.b.data(), o.ldb, 0.0f,
                 cut.data(), o.ldc);
    for (int i = 0; i < 7; ++i) {
      for (int j = 0; j < 17; ++j) {
        ASSERT_EQ(std::memcmp(&full[i * o.ldc + j], &cut[i * o.ldc + j], 4), 0)
            << "layout " << layout << " C(" << i << ", " << j << ")";
      }
    }
  }
}

// The property pp/dp equivalence rests on: the same bits with 1, 2 or 3 threads and inside a
// parallel region, for shapes that split by rows and by columns and span several k blocks.
TEST_P(BlockedGemm, BitsDoNotDependOnThreads) {
  const Case cases[] = {
      {false, true, 2048, 384, 128, 1.0f, 0.0f},         // the block's forward
      {true, false, 384, 128, 2048, 1.0f, 1.0f},         // its weight gradient
      {false, false, 50, 700, 600, 0.25f, 0.0f},         // several k blocks, alpha
      {false, true, 40, 4096 + 40, 30, 1.0f, 0.0f},      // two column blocks
      {false, false, 20, 4096 + 2048, 600, 1.0f, 0.5f},  // B packed in groups of k blocks
      {true, true, 20, 4096 + 20, 600, 1.0f, 0.0f},      // and A transposed
  };
  const int threads_before = omp_get_max_threads();
  for (const Case& cs : cases) {
    const Operands o = Make(cs, 11);
    std::vector<std::vector<float>> results;
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      std::vector<float> c = o.c;
      BlockedSgemm(GetParam(), cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, o.a.data(), o.lda,
                   o.b.data(), o.ldb, cs.beta, c.data(), o.ldc);
      results.push_back(c);
    }
    std::vector<float> nested = o.c;
#pragma omp parallel num_threads(2)
    {
#pragma omp single
      BlockedSgemm(GetParam(), cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, o.a.data(), o.lda,
                   o.b.data(), o.ldb, cs.beta, nested.data(), o.ldc);
    }
    results.push_back(nested);
    for (size_t r = 1; r < results.size(); ++r) {
      EXPECT_EQ(std::memcmp(results[0].data(), results[r].data(), results[0].size() * 4), 0)
          << "m=" << cs.m << " n=" << cs.n << " k=" << cs.k << ": run " << r
          << " differs from one thread";
    }
  }
  omp_set_num_threads(threads_before);
}

// What an epilogue saw: each element of C's copy at the moment the epilogue got it, and how often.
struct Seen {
  const Operands* o;
  std::vector<float> value;
  std::vector<int> times;
};

void Record(void* context, float* c, int64_t ldc, int row0, int col0, int rows, int cols) {
  auto* seen = static_cast<Seen*>(context);
  for (int r = 0; r < rows; ++r) {
    for (int j = 0; j < cols; ++j) {
      const size_t at = size_t(row0 + r) * seen->o->ldc + col0 + j;
#pragma omp atomic
      seen->times[at] += 1;
      seen->value[at] = c[r * ldc + j];
      c[r * ldc + j] = -2.0f * c[r * ldc + j];  // what the epilogue writes stays
    }
  }
}

// The epilogue gets every element of C once, after its last fold (the value the GEMM without one
// gives, bit for bit), and what it writes is C's final value: k in one block and in several,
// B packed in groups of k blocks, two column blocks, both A layouts, edge tiles, k = 0 and
// alpha = 0, at one, two and three threads and inside a parallel region.
TEST_P(BlockedGemm, EpilogueSeesEachElementOnceAtItsFinalValue) {
  const Case cases[] = {
      {false, true, 64, 200, 100, 1.0f, 0.0f},           // one k block
      {false, false, 50, 700, 600, 0.25f, 0.5f},         // several k blocks, alpha, beta
      {false, false, 20, 4096 + 2048, 600, 1.0f, 1.0f},  // k in groups, two column blocks
      {true, false, 37, 300, 700, 1.0f, 1.0f},           // A transposed (the weight gradients)
      {true, true, 20, 4096 + 20, 600, 1.0f, 0.0f},      // and two column blocks
      {false, true, 13, 17, 0, 1.0f, 0.5f},              // k = 0: C = beta C, then the epilogue
      {false, false, 13, 40, 30, 0.0f, 0.5f},            // alpha = 0 likewise
  };
  const int threads_before = omp_get_max_threads();
  for (const Case& cs : cases) {
    const Operands o = Make(cs, 23);
    std::vector<float> plain = o.c;
    BlockedSgemm(GetParam(), cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, o.a.data(), o.lda,
                 o.b.data(), o.ldb, cs.beta, plain.data(), o.ldc);
    for (int threads : {1, 2, 3}) {
      omp_set_num_threads(threads);
      Seen seen{&o, std::vector<float>(o.c.size()), std::vector<int>(o.c.size(), 0)};
      std::vector<float> c = o.c;
      BlockedSgemm(GetParam(), cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, o.a.data(), o.lda,
                   o.b.data(), o.ldb, cs.beta, c.data(), o.ldc, {Record, &seen});
      for (int i = 0; i < cs.m; ++i) {
        for (int j = 0; j < o.ldc; ++j) {
          const size_t at = size_t(i) * o.ldc + j;
          if (j >= cs.n) {
            ASSERT_EQ(seen.times[at], 0) << "the epilogue got the padding past n";
            continue;
          }
          ASSERT_EQ(seen.times[at], 1)
              << "C(" << i << ", " << j << ") of m=" << cs.m << " n=" << cs.n << " k=" << cs.k
              << " at " << threads << " threads";
          ASSERT_EQ(seen.value[at], plain[at]) << "C(" << i << ", " << j << ") before its end";
          ASSERT_EQ(c[at], -2.0f * plain[at]) << "the epilogue's write was lost";
        }
      }
    }
    std::vector<float> nested = o.c;
    Seen seen{&o, std::vector<float>(o.c.size()), std::vector<int>(o.c.size(), 0)};
#pragma omp parallel num_threads(2)
    {
#pragma omp single
      BlockedSgemm(GetParam(), cs.ta, cs.tb, cs.m, cs.n, cs.k, cs.alpha, o.a.data(), o.lda,
                   o.b.data(), o.ldb, cs.beta, nested.data(), o.ldc, {Record, &seen});
    }
    for (int i = 0; i < cs.m; ++i) {
      for (int j = 0; j < cs.n; ++j) {
        const size_t at = size_t(i) * o.ldc + j;
        ASSERT_EQ(seen.times[at], 1) << "inside a parallel region, C(" << i << ", " << j << ")";
        ASSERT_EQ(nested[at], -2.0f * plain[at]) << "inside a parallel region";
      }
    }
  }
  omp_set_num_threads(threads_before);
}

// A 64-byte aligned buffer for B's packing, marked past the packed floats to catch a write
// beyond them.
struct PackBuffer {
  explicit PackBuffer(const Case& cs)
      : floats(BlockedPackedBFloats(cs.k, cs.n)), storage(floats + 32, 7.0f) {
    const auto address = reinterpret_cast<std::uintptr_t>(storage.data());
    packed = storage.data() + (64 - address % 64) % 64 / 4;
  }
  bool Intact() const { return packed[floats] == 7.0f; }

  int64_t floats;
  std::vector<float> storage;
  float* packed;
};

// B packed once (BlockedPackB) and multiplied by A in full, by its first columns or by its first
// rows (the attention's causal prefixes): the bits of BlockedSgemm with the plain B, in both of A's
// layouts, with B transposed or not, alpha and beta, edges of panels and tiles, k up to kGemmKc,
// two column blocks, on one thread and several.
TEST_P(BlockedGemm, PackedOnceGivesThePlainProductsBits) {
  const Case cases[] = {
      {false, true, 48, 256, 64, 0.125f, 0.0f},        // the attention's scores against its keys
      {false, false, 48, 64, kGemmKc, 1.0f, 0.0f},     // its P V against a prefix of the values
      {false, true, 7, 37, 9, 1.0f, 0.5f},             // edges everywhere
      {true, false, 50, 300, kGemmKc, 2.0f, 1.0f},     // A transposed, a whole k block
      {false, false, 13, 4096 + 40, 100, 1.0f, 0.0f},  // two column blocks
      {false, true, 2048, 384, 128, 1.0f, 0.0f},       // enough work for the team
  };
  const int threads_before = omp_get_max_threads();
  for (const Case& cs : cases) {
    const Operands o = Make(cs, 21);
    PackBuffer buffer(cs);
    BlockedPackB(cs.tb, cs.k, cs.n, o.b.data(), o.ldb, buffer.packed);
    EXPECT_TRUE(buffer.Intact()) << "packed past BlockedPackedBFloats";
    const float* packed = buffer.packed;
    for (int threads : {1, 2}) {
      omp_set_num_threads(threads);
      // All columns, then a leading part of them (whole panels, and a cut inside one); all
      // rows, then a leading part of them.
      for (const int n : {cs.n, cs.n / 2, 16}) {
        if (n > cs.n) continue;
        for (const int k : {cs.k, (cs.k + 1) / 2, 1}) {
          std::vector<float> plain = o.c, once = o.c;
          BlockedSgemm(GetParam(), cs.ta, cs.tb, cs.m, n, k, cs.alpha, o.a.data(), o.lda,
                       o.b.data(), o.ldb, cs.beta, plain.data(), o.ldc);
          BlockedSgemmPackedB(GetParam(), cs.ta, cs.m, n, k, cs.alpha, o.a.data(), o.lda, packed,
                              cs.beta, once.data(), o.ldc, cs.k);
          ASSERT_NE(plain, o.c);
          EXPECT_EQ(std::memcmp(plain.data(), once.data(), plain.size() * 4), 0)
              << "ta=" << cs.ta << " tb=" << cs.tb << " m=" << cs.m << " n=" << n << " of " << cs.n
              << " k=" << k << " of " << cs.k << " threads=" << threads;
        }
      }
    }
  }
  omp_set_num_threads(threads_before);
}

// A whole B packed once (BlockedPackWholeB: a weight, k blocks of kGemmKc rows) and multiplied
// by A: the bits of BlockedSgemm with the plain B, with B transposed (the forward's w^T) or not
// (the input gradient's w), k within one block, at a block's edge and over several, in one group
// of k blocks and in several (kGemmPackedB floats of B at a time: 8 blocks at 1024 columns, 2 at
// 4096; a block of fewer rows last), panel edges, alpha and beta, an epilogue, on one thread and
// several.
TEST_P(BlockedGemm, WholeBPackedOnceGivesThePlainProductsBits) {
  const Case cases[] = {
      {false, true, 50, 37, 9, 1.0f, 0.0f},                   // edges everywhere, one short block
      {false, false, 13, 64, kGemmKc, 2.0f, 0.5f},            // one whole block
      {false, true, 100, 300, kGemmKc + 1, 1.0f, 1.0f},       // a block and one row
      {false, false, 61, 1536, 3 * kGemmKc + 7, 1.0f, 0.0f},  // several blocks, one group
      {false, true, 2048, kGemmNc, 2 * kGemmKc, 1.0f, 0.0f},  // the widest B, the team
      {false, false, 61, kGemmNc, 3 * kGemmKc + 7, 1.0f, 0.5f},  // groups of 2 blocks, short last
      {false, true, 50, 1024, 9 * kGemmKc + 7, 1.0f, 0.0f},      // a group of 8, then 2
  };
  const int threads_before = omp_get_max_threads();
  for (const Case& cs : cases) {
    const Operands o = Make(cs, 22);
    PackBuffer buffer(cs);
    BlockedPackWholeB(cs.tb, cs.k, cs.n, o.b.data(), o.ldb, buffer.packed);
    EXPECT_TRUE(buffer.Intact()) << "packed past BlockedPackedBFloats";
    const float* packed = buffer.packed;
    for (int threads : {1, 2}) {
      omp_set_num_threads(threads);
      std::vector<float> plain = o.c, once = o.c;
      Seen plain_record{&o, std::vector<float>(o.c.size()), std::vector<int>(o.c.size(), 0)};
      Seen once_record = plain_record;
      BlockedSgemm(GetParam(), false, cs.tb, cs.m, cs.n, cs.k, cs.alpha, o.a.data(), o.lda,
                   o.b.data(), o.ldb, cs.beta, plain.data(), o.ldc, {Record, &plain_record});
      BlockedSgemmPackedWholeB(GetParam(), cs.m, cs.n, cs.k, cs.alpha, o.a.data(), o.lda, packed,
                               cs.beta, once.data(), o.ldc, {Record, &once_record});
      ASSERT_NE(plain, o.c);
      EXPECT_EQ(std::memcmp(plain.data(), once.data(), plain.size() * 4), 0)
          << "tb=" << cs.tb << " m=" << cs.m << " n=" << cs.n << " k=" << cs.k
          << " threads=" << threads;
      EXPECT_EQ(plain_record.value, once_record.value) << "the epilogue saw other values";
      EXPECT_EQ(plain_record.times, once_record.times);
    }
  }
  omp_set_num_threads(threads_before);
}

INSTANTIATE_TEST_SUITE_P(Kernels, BlockedGemm,
                         ::testing::Values(GemmKernel::kAvx2, GemmKernel::kAvx512),
                         [](const ::testing::TestParamInfo<GemmKernel>& info) {
                           return std::string(GemmKernelName(info.param));
                         });

// Both kernels give the same bits, so the GEMM's results do not depend on the kernel: every
// layout, fold (beta 0, beta != 0, several k blocks) and edge, and both widths of the AVX-512
// tile (four panels and fewer). The AVX-512 runs must really run AVX-512 tiles.
TEST(BlockedGemmKernels, Avx512GivesTheAvx2Bits) {
  if (!BlockedSgemmSupported(GemmKernel::kAvx512)) {
    GTEST_SKIP() << "this CPU lacks AVX-512F: only the AVX2 kernel runs here";
  }
  const int shapes[][3] = {{6, 64, 8},   {7, 17, 9},          {12, 112, 300},   {150, 200, 513},
                           {64, 48, 64}, {13, 4096 + 80, 30}, {2048, 384, 128}, {30, 1000, 257}};
  uint32_t seed = 100;
  for (const auto& s : shapes) {
    for (int layout = 0; layout < 4; ++layout) {
      for (const auto& [alpha, beta] : {std::pair{1.0f, 0.0f}, {0.5f, 1.0f}, {2.0f, -0.5f}}) {
        const Case cs{bool(layout & 1), bool(layout & 2), s[0], s[1], s[2], alpha, beta};
        const Operands o = Make(cs, seed++);
        std::vector<float> narrow = o.c, wide = o.c;
        const int64_t tiles_at_start = WideTilesRun();
        BlockedSgemm(GemmKernel::kAvx2, cs.ta, cs.tb, cs.m, cs.n, cs.k, alpha, o.a.data(), o.lda,
                     o.b.data(), o.ldb, beta, narrow.data(), o.ldc);
        ASSERT_EQ(WideTilesRun(), tiles_at_start) << "the AVX2 kernel ran an AVX-512 tile";
        BlockedSgemm(GemmKernel::kAvx512, cs.ta, cs.tb, cs.m, cs.n, cs.k, alpha, o.a.data(), o.lda,
                     o.b.data(), o.ldb, beta, wide.data(), o.ldc);
        ASSERT_GT(WideTilesRun(), tiles_at_start) << "no AVX-512 tile ran";
        ASSERT_NE(narrow, o.c);
        ASSERT_EQ(std::memcmp(narrow.data(), wide.data(), narrow.size() * 4), 0)
            << "ta=" << cs.ta << " tb=" << cs.tb << " m=" << cs.m << " n=" << cs.n << " k=" << cs.k
            << " alpha=" << alpha << " beta=" << beta;
      }
    }
  }
}

TEST(BlockedGemm, ChunksAreWholeTilesAbout64PerThread) {
  EXPECT_EQ(BlockedSgemmChunkRows(2048, 2), 18);  // 114 chunks, the last of 14 rows
  EXPECT_EQ(BlockedSgemmChunkRows(1536, 2), 12);
  EXPECT_EQ(BlockedSgemmChunkRows(384, 2), kGemmMr);
  EXPECT_EQ(BlockedSgemmChunkRows(10000, 2), 84);        // 79 rows, rounded up to whole tiles
  EXPECT_EQ(BlockedSgemmChunkRows(100000, 2), kGemmMc);  // capped at A's packed block
  EXPECT_EQ(BlockedSgemmChunkRows(5, 2), kGemmMr);
  for (int m : {1, 7, 100, 384, 5000}) {
    for (int threads : {1, 2, 3, 8}) {
      const int rows = BlockedSgemmChunkRows(m, threads);
      EXPECT_EQ(rows % kGemmMr, 0);
      EXPECT_GE(rows, kGemmMr);
      EXPECT_LE(rows, kGemmMc);
    }
  }
}

TEST(BlockedGemm, SmallProductsStayOnOneThread) {
  EXPECT_EQ(BlockedSgemmThreads(32, 32, 32, 8), 1);
  EXPECT_EQ(BlockedSgemmThreads(2048, 384, 128, 2), 2);
  EXPECT_EQ(BlockedSgemmThreads(2048, 384, 128, 1), 1);
}

}  // namespace
}  // namespace bigmac::sdk::cpu::internal
