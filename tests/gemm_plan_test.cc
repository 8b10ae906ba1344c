// The row-major -> column-major GEMM mapping (stages/cuda/gemm_plan.h), executed on the CPU: each
// plan runs through a column-major cblas GEMM with exactly its m, n, k, transposes, operands and
// leading dimensions, and is compared with a row-major reference (a naive triple loop for the
// generic mapper, the CPU kernels cpu::Matmul* for the layer plans).
//
// Tolerances: double with small-integer data is exact whatever the summation order, so those
// comparisons are bitwise; double with real data against the CPU kernels (which call cblas
// row-major, itself mapped the same way inside OpenBLAS) is bitwise too; float with real data is
// |got - want| <= 1e-5 * max|want|. Data are seeded random and never zero.

#include "stages/cuda/gemm_plan.h"

#include <cblas.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <vector>

#include "plugins/sdk/cpu_kernels.h"

namespace bigmac::stages::cuda {
namespace {

namespace cpu = ::bigmac::sdk::cpu;

constexpr double kFloatTol = 1e-5;  // relative to the reference's max-abs
constexpr double kSentinel = 1234.5;

// Uniform in +-[0.1, 1): never zero.
template <typename T>
std::vector<T> Random(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> magnitude(0.1, 1.0);
  std::vector<T> values(count);
  for (T& v : values) v = T((rng() & 1 ? 1 : -1) * magnitude(rng));
  return values;
}

// Integers in +-[1, 9]: products and sums are exact in double.
std::vector<double> RandomIntegers(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> magnitude(1, 9);
  std::vector<double> values(count);
  for (double& v : values) v = (rng() & 1 ? 1 : -1) * magnitude(rng);
  return values;
}

void ColumnMajor(const ColumnMajorGemm& g, const float* row_a, const float* row_b, float* c) {
  cblas_sgemm(CblasColMajor, g.trans_a ? CblasTrans : CblasNoTrans,
              g.trans_b ? CblasTrans : CblasNoTrans, g.m, g.n, g.k, g.alpha,
              Select(g.a, row_a, row_b), g.lda, Select(g.b, row_a, row_b), g.ldb, g.beta, c, g.ldc);
}

void ColumnMajor(const ColumnMajorGemm& g, const double* row_a, const double* row_b, double* c) {
  cblas_dgemm(CblasColMajor, g.trans_a ? CblasTrans : CblasNoTrans,
              g.trans_b ? CblasTrans : CblasNoTrans, g.m, g.n, g.k, g.alpha,
              Select(g.a, row_a, row_b), g.lda, Select(g.b, row_a, row_b), g.ldb, g.beta, c, g.ldc);
}

// The reference: C(m,n) = alpha op(A) op(B) + beta C, all row-major, summed in double.
template <typename T>
void NaiveRowMajor(const RowMajorGemm& g, const T* a, const T* b, T* c) {
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t j = 0; j < g.n; ++j) {
      double sum = 0;
      for (int64_t p = 0; p < g.k; ++p) {
        const double x = g.trans_a ? a[p * g.lda + i] : a[i * g.lda + p];
        const double y = g.trans_b ? b[j * g.ldb + p] : b[p * g.ldb + j];
        sum += x * y;
      }
      T& out = c[i * g.ldc + j];
      out = T(g.alpha * sum + g.beta * double(out));
    }
  }
}

// Stored row-major sizes (rows * ld) of A, B, C.
int64_t SizeA(const RowMajorGemm& g) { return (g.trans_a ? g.k : g.m) * g.lda; }
int64_t SizeB(const RowMajorGemm& g) { return (g.trans_b ? g.n : g.k) * g.ldb; }
int64_t SizeC(const RowMajorGemm& g) { return g.m * g.ldc; }

template <typename T>
double MaxAbs(const std::vector<T>& values) {
  double max = 0;
  for (T v : values) max = std::max(max, std::fabs(double(v)));
  return max;
}

// max |got - want| over the (rows, cols) region of two row-major matrices with row strides.
template <typename T>
double MaxDiff(const T* got, int64_t ld_got, const T* want, int64_t ld_want, int64_t rows,
               int64_t cols) {
  double diff = 0;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      diff = std::max(diff, std::fabs(double(got[i * ld_got + j]) - double(want[i * ld_want + j])));
    }
  }
  return diff;
}

// Every element of columns [cols, ld) of each row still holds the sentinel.
template <typename T>
bool PaddingUntouched(const std::vector<T>& values, int64_t rows, int64_t cols, int64_t ld) {
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = cols; j < ld; ++j) {
      if (values[i * ld + j] != T(kSentinel)) return false;
    }
  }
  return true;
}

struct Shape {
  int64_t m, n, k;
  int64_t pad_a, pad_b, pad_c;  // extra columns in each stored row
};

const Shape kShapes[] = {
    {7, 5, 13, 0, 0, 0}, {33, 17, 9, 0, 0, 0}, {7, 5, 13, 3, 1, 2},
    {1, 9, 4, 2, 0, 5},  {16, 8, 24, 0, 0, 0}, {6, 257, 24, 0, 0, 63},
};

RowMajorGemm MakeGemm(const Shape& s, bool trans_a, bool trans_b, float alpha, float beta) {
  RowMajorGemm g;
  g.m = s.m;
  g.n = s.n;
  g.k = s.k;
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.lda = (trans_a ? s.m : s.k) + s.pad_a;
  g.ldb = (trans_b ? s.k : s.n) + s.pad_b;
  g.ldc = s.n + s.pad_c;
  g.alpha = alpha;
  g.beta = beta;
  return g;
}

// ---- The generic mapper, all four transpose combinations.

TEST(ToColumnMajor, SwapsOperandsAndDimensions) {
  RowMajorGemm g = MakeGemm({7, 5, 13, 3, 1, 2}, /*trans_a=*/true, /*trans_b=*/false, 1, 0);
  const ColumnMajorGemm cm = ToColumnMajor(g);
  EXPECT_EQ(cm.m, 5);
  EXPECT_EQ(cm.n, 7);
  EXPECT_EQ(cm.k, 13);
  EXPECT_EQ(cm.a, Source::kRowB);
  EXPECT_EQ(cm.b, Source::kRowA);
  EXPECT_FALSE(cm.trans_a);  // = trans_b
  EXPECT_TRUE(cm.trans_b);   // = trans_a
  EXPECT_EQ(cm.lda, g.ldb);
  EXPECT_EQ(cm.ldb, g.lda);
  EXPECT_EQ(cm.ldc, g.ldc);
  // Stored shapes: A = row-major B (13, 5) read column-major is (5, 13) = (m, k), untransposed;
  // B = row-major A^T stored (13, 7) is column-major (7, 13) = (n, k), transposed.
  EXPECT_EQ(cm.a_rows, 5);
  EXPECT_EQ(cm.a_cols, 13);
  EXPECT_EQ(cm.b_rows, 7);
  EXPECT_EQ(cm.b_cols, 13);
}

TEST(ToColumnMajor, AllTransposesBitwiseInDoubleWithIntegers) {
  int cases = 0;
  for (const Shape& s : kShapes) {
    for (int t = 0; t < 4; ++t) {
      const RowMajorGemm g = MakeGemm(s, t & 1, t & 2, 0.75f, 0.5f);
      const std::vector<double> a = RandomIntegers(SizeA(g), 11 + t);
      const std::vector<double> b = RandomIntegers(SizeB(g), 23 + t);
      std::vector<double> want = RandomIntegers(SizeC(g), 37 + t);
      std::vector<double> got = want;
      NaiveRowMajor(g, a.data(), b.data(), want.data());
      ColumnMajor(ToColumnMajor(g), a.data(), b.data(), got.data());
      EXPECT_EQ(got, want) << "m=" << g.m << " n=" << g.n << " k=" << g.k
                           << " trans_a=" << g.trans_a << " trans_b=" << g.trans_b;
      ++cases;
    }
  }
  EXPECT_EQ(cases, 24);
}

TEST(ToColumnMajor, AllTransposesInFloat) {
  for (const Shape& s : kShapes) {
    for (int t = 0; t < 4; ++t) {
      const RowMajorGemm g = MakeGemm(s, t & 1, t & 2, -1.25f, 0.5f);
      const std::vector<float> a = Random<float>(SizeA(g), 101 + t);
      const std::vector<float> b = Random<float>(SizeB(g), 202 + t);
      std::vector<float> want = Random<float>(SizeC(g), 303 + t);
      std::vector<float> got = want;
      NaiveRowMajor(g, a.data(), b.data(), want.data());
      ColumnMajor(ToColumnMajor(g), a.data(), b.data(), got.data());
      EXPECT_LE(MaxDiff(got.data(), g.ldc, want.data(), g.ldc, g.m, g.ldc),
                kFloatTol * MaxAbs(want))
          << "m=" << g.m << " n=" << g.n << " k=" << g.k << " trans_a=" << g.trans_a
          << " trans_b=" << g.trans_b;
    }
  }
}

TEST(ToColumnMajor, LeavesPaddingColumnsAlone) {
  for (int t = 0; t < 4; ++t) {
    const RowMajorGemm g = MakeGemm({6, 257, 24, 1, 2, 63}, t & 1, t & 2, 1, 0);
    const std::vector<double> a = RandomIntegers(SizeA(g), 5);
    const std::vector<double> b = RandomIntegers(SizeB(g), 6);
    std::vector<double> c(SizeC(g), kSentinel);
    ColumnMajor(ToColumnMajor(g), a.data(), b.data(), c.data());
    EXPECT_TRUE(PaddingUntouched(c, g.m, g.n, g.ldc));
  }
}

// The tests can fail: plausible wrong mappings give wrong answers on the same data.
TEST(ToColumnMajor, CorruptedPlansGiveDifferentResults) {
  const RowMajorGemm g = MakeGemm({6, 6, 6, 2, 1, 0}, false, true, 1, 0);  // square, padded
  const std::vector<double> a = RandomIntegers(SizeA(g) + 64, 1);
  const std::vector<double> b = RandomIntegers(SizeB(g) + 64, 2);
  std::vector<double> want(SizeC(g), 0);
  NaiveRowMajor(g, a.data(), b.data(), want.data());
  const ColumnMajorGemm right = ToColumnMajor(g);
  auto run = [&](const ColumnMajorGemm& plan) {
    std::vector<double> c(SizeC(g), 0);
    ColumnMajor(plan, a.data(), b.data(), c.data());
    return c;
  };
  ASSERT_EQ(run(right), want);

  ColumnMajorGemm no_swap = right;  // treating row-major as column-major: the classic mistake
  no_swap.a = Source::kRowA;
  no_swap.b = Source::kRowB;
  no_swap.trans_a = g.trans_a;
  no_swap.trans_b = g.trans_b;
  no_swap.lda = g.lda;
  no_swap.ldb = g.ldb;
  EXPECT_NE(run(no_swap), want);

  ColumnMajorGemm swapped_ld = right;  // lda and ldb exchanged (8 vs 7: both in bounds)
  std::swap(swapped_ld.lda, swapped_ld.ldb);
  ASSERT_NE(swapped_ld.lda, right.lda);
  EXPECT_NE(run(swapped_ld), want);

  ColumnMajorGemm flipped = right;  // one transpose flag wrong
  flipped.trans_a = !flipped.trans_a;
  EXPECT_NE(run(flipped), want);

  ColumnMajorGemm ld_off = right;  // a leading dimension off by one
  ld_off.ldb += 1;
  EXPECT_NE(run(ld_off), want);
}

TEST(ToColumnMajor, RejectsBadShapes) {
  RowMajorGemm g = MakeGemm({7, 5, 13, 0, 0, 0}, false, false, 1, 0);
  g.lda = 12;  // < k
  EXPECT_THROW(ToColumnMajor(g), std::invalid_argument);
  g = MakeGemm({7, 5, 13, 0, 0, 0}, true, false, 1, 0);
  g.lda = 6;  // < m (A stored (k, m))
  EXPECT_THROW(ToColumnMajor(g), std::invalid_argument);
  g = MakeGemm({7, 5, 13, 0, 0, 0}, false, false, 1, 0);
  g.ldc = 4;
  EXPECT_THROW(ToColumnMajor(g), std::invalid_argument);
  g.ldc = 5;
  g.k = 0;
  EXPECT_THROW(ToColumnMajor(g), std::invalid_argument);
  EXPECT_THROW(ForwardPlan(7, 13, 5, /*ld_out=*/4, false, false), std::invalid_argument);
  EXPECT_THROW(BackwardInputPlan(0, 13, 5, 0), std::invalid_argument);
}

// ---- The layer plans, against the CPU kernels.

struct LayerShape {
  int n, c, oc;
  int64_t ld;  // ld_out / ld_dout; 0 = oc
};

const LayerShape kLayerShapes[] = {
    {7, 13, 5, 0}, {33, 17, 9, 0}, {7, 13, 5, 8}, {6, 24, 257, 320}, {16, 64, 40, 0},
};

int64_t Ld(const LayerShape& s) { return s.ld == 0 ? s.oc : s.ld; }

// Runs a forward plan as cuBLASLt would: the GEMM into D, then the epilogue the plan describes,
// in column-major terms (bias indexed by D's row i < bias_length; aux at i + j * aux_ld).
template <typename T>
void RunForwardPlan(const LayerGemm& plan, const T* inp, const T* w, const T* bias, T* out,
                    T* aux) {
  const ColumnMajorGemm& g = plan.gemm;
  ColumnMajor(g, inp, w, out);  // row-major A = inp, B = w
  for (int64_t j = 0; j < g.n; ++j) {
    for (int64_t i = 0; i < g.m; ++i) {
      T& d = out[i + j * g.ldc];
      if (HasBias(plan.epilogue)) {
        ASSERT_LT(i, plan.bias_length);
        d += bias[i];
      }
      if (HasGelu(plan.epilogue)) {
        aux[i + j * plan.aux_ld] = d;
        cpu::GeluForward(&d, &d, 1);
      }
    }
  }
}

template <typename T>
void CheckForward(const LayerShape& s, bool with_bias, bool with_gelu, bool bitwise) {
  SCOPED_TRACE(testing::Message() << "n=" << s.n << " c=" << s.c << " oc=" << s.oc << " ld_out="
                                  << Ld(s) << " bias=" << with_bias << " gelu=" << with_gelu);
  const LayerGemm plan = ForwardPlan(s.n, s.c, s.oc, s.ld, with_bias, with_gelu);
  const std::vector<T> inp = Random<T>(size_t(s.n) * s.c, 1);
  const std::vector<T> w = Random<T>(size_t(s.oc) * s.c, 2);
  const std::vector<T> bias = Random<T>(s.oc, 3);
  std::vector<T> pre(size_t(s.n) * s.oc), want(pre.size());
  cpu::MatmulForward(pre.data(), inp.data(), w.data(), with_bias ? bias.data() : nullptr, s.n, s.c,
                     s.oc);
  want = pre;
  if (with_gelu) cpu::GeluForward(want.data(), pre.data(), int64_t(want.size()));

  std::vector<T> out(size_t(s.n) * Ld(s), T(kSentinel));
  std::vector<T> aux(size_t(s.n) * s.oc, T(kSentinel));
  RunForwardPlan(plan, inp.data(), w.data(), bias.data(), out.data(), aux.data());

  const double tol = bitwise ? 0.0 : kFloatTol * MaxAbs(want);
  EXPECT_LE(MaxDiff(out.data(), Ld(s), want.data(), s.oc, s.n, s.oc), tol);
  EXPECT_TRUE(PaddingUntouched(out, s.n, s.oc, Ld(s)));
  if (with_gelu) {
    EXPECT_LE(MaxDiff(aux.data(), s.oc, pre.data(), s.oc, s.n, s.oc), tol);
  }
}

TEST(LayerPlans, ForwardFields) {
  const LayerGemm plan = ForwardPlan(/*n=*/6, /*c=*/24, /*oc=*/257, /*ld_out=*/320, true, false);
  const ColumnMajorGemm& g = plan.gemm;
  EXPECT_EQ(g.m, 257);  // oc
  EXPECT_EQ(g.n, 6);    // n
  EXPECT_EQ(g.k, 24);   // c
  EXPECT_TRUE(g.trans_a);
  EXPECT_FALSE(g.trans_b);
  EXPECT_EQ(g.a, Source::kRowB);  // w
  EXPECT_EQ(g.b, Source::kRowA);  // inp
  EXPECT_EQ(g.lda, 24);
  EXPECT_EQ(g.ldb, 24);
  EXPECT_EQ(g.ldc, 320);
  EXPECT_EQ(g.a_rows, 24);  // w (257, 24) row-major = (24, 257) column-major
  EXPECT_EQ(g.a_cols, 257);
  EXPECT_EQ(g.b_rows, 24);  // inp (6, 24) row-major = (24, 6) column-major
  EXPECT_EQ(g.b_cols, 6);
  EXPECT_EQ(g.beta, 0.0f);
  EXPECT_EQ(plan.epilogue, Epilogue::kBias);
  EXPECT_EQ(plan.bias_length, 257);
  EXPECT_EQ(plan.aux_ld, 0);

  const LayerGemm gelu = ForwardPlan(8, 16, 40, 0, true, true);
  EXPECT_EQ(gelu.epilogue, Epilogue::kGeluAuxBias);
  EXPECT_EQ(gelu.aux_ld, 40);
  EXPECT_TRUE(gelu.gelu_aux_ld_ok);
  EXPECT_EQ(ForwardPlan(8, 16, 40, 0, false, true).epilogue, Epilogue::kGeluAux);
  EXPECT_FALSE(ForwardPlan(8, 16, 5, 0, true, true).gelu_aux_ld_ok);  // 5 % 8 != 0
  EXPECT_FALSE(ForwardPlan(8, 16, 12, 0, true, true).gelu_aux_ld_ok);
}

TEST(LayerPlans, BackwardFields) {
  const LayerGemm in = BackwardInputPlan(6, 24, 257, 320);
  EXPECT_EQ(in.gemm.m, 24);   // c
  EXPECT_EQ(in.gemm.n, 6);    // n
  EXPECT_EQ(in.gemm.k, 257);  // oc
  EXPECT_FALSE(in.gemm.trans_a);
  EXPECT_FALSE(in.gemm.trans_b);
  EXPECT_EQ(in.gemm.a, Source::kRowB);  // w
  EXPECT_EQ(in.gemm.lda, 24);
  EXPECT_EQ(in.gemm.ldb, 320);  // dout's padded row stride
  EXPECT_EQ(in.gemm.ldc, 24);
  EXPECT_EQ(in.gemm.beta, 0.0f);
  EXPECT_EQ(in.epilogue, Epilogue::kNone);

  const LayerGemm wt = BackwardWeightPlan(6, 24, 257, 320);
  EXPECT_EQ(wt.gemm.m, 24);   // c
  EXPECT_EQ(wt.gemm.n, 257);  // oc
  EXPECT_EQ(wt.gemm.k, 6);    // n
  EXPECT_FALSE(wt.gemm.trans_a);
  EXPECT_TRUE(wt.gemm.trans_b);
  EXPECT_EQ(wt.gemm.a, Source::kRowB);  // inp
  EXPECT_EQ(wt.gemm.b, Source::kRowA);  // dout
  EXPECT_EQ(wt.gemm.lda, 24);
  EXPECT_EQ(wt.gemm.ldb, 320);
  EXPECT_EQ(wt.gemm.ldc, 24);
  EXPECT_EQ(wt.gemm.beta, 1.0f);
  EXPECT_EQ(wt.gemm.b_rows, 257);  // dout (6, 320-strided) column-major is (257, 6)
  EXPECT_EQ(wt.gemm.b_cols, 6);
}

TEST(LayerPlans, ForwardMatchesCpuKernelDouble) {
  for (const LayerShape& s : kLayerShapes) {
    for (int bias = 0; bias < 2; ++bias) CheckForward<double>(s, bias, false, /*bitwise=*/true);
  }
}

TEST(LayerPlans, ForwardMatchesCpuKernelFloat) {
  for (const LayerShape& s : kLayerShapes) {
    for (int bias = 0; bias < 2; ++bias) CheckForward<float>(s, bias, false, false);
  }
}

// The GELU epilogue's aux is gelu_pre: the pre-activation (after the bias) at row stride oc.
TEST(LayerPlans, ForwardGeluAuxMatchesCpuKernels) {
  for (const LayerShape& s : kLayerShapes) {
    for (int bias = 0; bias < 2; ++bias) {
      CheckForward<double>(s, bias, true, /*bitwise=*/true);
      CheckForward<float>(s, bias, true, false);
    }
  }
}

template <typename T>
void CheckBackwardInput(const LayerShape& s, bool bitwise) {
  SCOPED_TRACE(testing::Message() << "n=" << s.n << " c=" << s.c << " oc=" << s.oc
                                  << " ld_dout=" << Ld(s));
  const LayerGemm plan = BackwardInputPlan(s.n, s.c, s.oc, s.ld);
  const std::vector<T> dout_padded = Random<T>(size_t(s.n) * Ld(s), 4);
  std::vector<T> dout(size_t(s.n) * s.oc);
  for (int i = 0; i < s.n; ++i) {
    std::copy_n(dout_padded.begin() + i * Ld(s), s.oc, dout.begin() + i * s.oc);
  }
  const std::vector<T> w = Random<T>(size_t(s.oc) * s.c, 5);
  std::vector<T> want(size_t(s.n) * s.c);
  cpu::MatmulBackwardInput(want.data(), dout.data(), w.data(), s.n, s.c, s.oc);
  std::vector<T> got(want.size(), T(kSentinel));
  ColumnMajor(plan.gemm, dout_padded.data(), w.data(), got.data());  // row-major A = dout, B = w
  EXPECT_LE(MaxDiff(got.data(), s.c, want.data(), s.c, s.n, s.c),
            bitwise ? 0.0 : kFloatTol * MaxAbs(want));
}

TEST(LayerPlans, BackwardInputMatchesCpuKernel) {
  for (const LayerShape& s : kLayerShapes) {
    CheckBackwardInput<double>(s, /*bitwise=*/true);
    CheckBackwardInput<float>(s, false);
  }
}

template <typename T>
void CheckBackwardWeight(const LayerShape& s, bool bitwise) {
  SCOPED_TRACE(testing::Message() << "n=" << s.n << " c=" << s.c << " oc=" << s.oc
                                  << " ld_dout=" << Ld(s));
  const LayerGemm plan = BackwardWeightPlan(s.n, s.c, s.oc, s.ld);
  const std::vector<T> dout_padded = Random<T>(size_t(s.n) * Ld(s), 6);
  std::vector<T> dout(size_t(s.n) * s.oc);
  for (int i = 0; i < s.n; ++i) {
    std::copy_n(dout_padded.begin() + i * Ld(s), s.oc, dout.begin() + i * s.oc);
  }
  const std::vector<T> inp = Random<T>(size_t(s.n) * s.c, 7);
  const std::vector<T> dw0 = Random<T>(size_t(s.oc) * s.c, 8);  // beta = 1 accumulates into it
  std::vector<T> want = dw0, got = dw0;
  cpu::MatmulBackwardWeight(want.data(), static_cast<T*>(nullptr), dout.data(), inp.data(), s.n,
                            s.c, s.oc);
  ColumnMajor(plan.gemm, dout_padded.data(), inp.data(), got.data());  // A = dout, B = inp
  EXPECT_LE(MaxDiff(got.data(), s.c, want.data(), s.c, s.oc, s.c),
            bitwise ? 0.0 : kFloatTol * MaxAbs(want));
  // And the accumulation matters: the same GEMM from zero differs from the prefilled result.
  std::vector<T> from_zero(got.size(), T(0));
  ColumnMajor(plan.gemm, dout_padded.data(), inp.data(), from_zero.data());
  EXPECT_GT(MaxDiff(from_zero.data(), s.c, want.data(), s.c, s.oc, s.c), 0.01);
}

TEST(LayerPlans, BackwardWeightAccumulatesLikeCpuKernel) {
  for (const LayerShape& s : kLayerShapes) {
    CheckBackwardWeight<double>(s, /*bitwise=*/true);
    CheckBackwardWeight<float>(s, false);
  }
}

// A layer plan with a corrupted leading dimension fails the same comparison.
TEST(LayerPlans, CorruptedLayerPlanFails) {
  const LayerShape s{6, 24, 257, 320};
  LayerGemm plan = BackwardInputPlan(s.n, s.c, s.oc, s.ld);
  plan.gemm.ldb = s.oc;  // forgot the padded stride of dout
  const std::vector<double> dout_padded = Random<double>(size_t(s.n) * Ld(s), 4);
  std::vector<double> dout(size_t(s.n) * s.oc);
  for (int i = 0; i < s.n; ++i) {
    std::copy_n(dout_padded.begin() + i * Ld(s), s.oc, dout.begin() + i * s.oc);
  }
  const std::vector<double> w = Random<double>(size_t(s.oc) * s.c, 5);
  std::vector<double> want(size_t(s.n) * s.c), got(want.size());
  cpu::MatmulBackwardInput(want.data(), dout.data(), w.data(), s.n, s.c, s.oc);
  ColumnMajor(plan.gemm, dout_padded.data(), w.data(), got.data());
  EXPECT_GT(MaxDiff(got.data(), s.c, want.data(), s.c, s.n, s.c), 0.1);
}

// ---- The alignment check.

TEST(CheckAlignment, AlignmentsArePowersOfTwoCappedAt256) {
  GemmPointers p;
  p.a = 0x1000;
  p.b = 0x1010;
  p.c = 0x1002;
  p.bias = 0;
  p.aux = 0x1180;
  const Alignments al = AlignmentsOf(p);
  EXPECT_EQ(al.a, 256u);
  EXPECT_EQ(al.b, 16u);
  EXPECT_EQ(al.c, 2u);
  EXPECT_EQ(al.bias, 256u);  // absent
  EXPECT_EQ(al.aux, 128u);
}

TEST(CheckAlignment, FusedFormsNeedAlignedPointersAndLeadingDimensions) {
  GemmPointers p;
  p.a = 0x10000;
  p.b = 0x20000;
  p.c = 0x30000;
  p.bias = 0x40000;
  p.aux = 0x50000;
  p.ab_size = p.cd_size = 2;  // bf16

  const LayerGemm gelu = ForwardPlan(64, 768, 3072, 0, true, true);
  AllowedForms forms = CheckAlignment(gelu, p);
  EXPECT_TRUE(forms.gelu_aux);
  EXPECT_TRUE(forms.bias);

  GemmPointers misaligned = p;
  misaligned.bias = 0x40002;  // 2-byte aligned bias
  forms = CheckAlignment(gelu, misaligned);
  EXPECT_FALSE(forms.gelu_aux);
  EXPECT_FALSE(forms.bias);
  EXPECT_EQ(forms.alignments.bias, 2u);

  misaligned = p;
  misaligned.aux = 0x50008;
  forms = CheckAlignment(gelu, misaligned);
  EXPECT_FALSE(forms.gelu_aux);
  EXPECT_TRUE(forms.bias);  // the bias epilogue alone is still allowed

  misaligned = p;
  misaligned.a = 0x10008;
  EXPECT_FALSE(CheckAlignment(gelu, misaligned).bias);

  // oc = 5: aux_ld 5 is not a multiple of 8, and 5 bf16 (10 bytes) is not a 16-byte row.
  const LayerGemm odd = ForwardPlan(7, 13, 5, 0, true, true);
  forms = CheckAlignment(odd, p);
  EXPECT_FALSE(forms.gelu_aux);
  EXPECT_FALSE(forms.bias);

  // oc = 12 in fp32: 48-byte rows are fine for the bias, but aux_ld 12 is not a multiple of 8.
  GemmPointers f32 = p;
  f32.ab_size = f32.cd_size = 4;
  const LayerGemm twelve = ForwardPlan(8, 16, 12, 0, true, true);
  forms = CheckAlignment(twelve, f32);
  EXPECT_TRUE(forms.bias);
  EXPECT_FALSE(forms.gelu_aux);

  // Padded logits: ld_out 320 bf16 rows (640 bytes) keep the bias epilogue.
  const LayerGemm head = ForwardPlan(64, 768, 257, 320, true, false);
  EXPECT_TRUE(CheckAlignment(head, p).bias);
  EXPECT_FALSE(CheckAlignment(head, p).gelu_aux);

  // No bias asked: no fused form applies.
  const LayerGemm plain = ForwardPlan(64, 768, 3072, 0, false, false);
  EXPECT_FALSE(CheckAlignment(plain, p).bias);
  EXPECT_FALSE(CheckAlignment(plain, p).gelu_aux);
}

}  // namespace
}  // namespace bigmac::stages::cuda
