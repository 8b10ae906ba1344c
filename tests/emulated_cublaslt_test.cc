// The emulated cuBLASLt (core/device/cuda/emulation/cublaslt.cc), on the CPU.
//
// Every supported form (A/B f32 with C/D f32, A/B bf16 with C/D bf16 or f32; each transpose of A
// and B; leading dimensions above the row count; alpha and beta other than 1 and 0; C and D apart
// or in place; epilogues DEFAULT, BIAS, GELU_AUX, GELU_AUX_BIAS with a padded aux) is compared
// with a double-precision loop written from cuBLASLt's documented formula, D = epilogue(alpha *
// op(A) op(B) + beta * C), column-major, on the values the device holds (bf16-rounded inputs).
// Per element, with u = 2^-24 and scale = |alpha| sum |op(A)||op(B)| + |beta C| + |bias|:
//   f32 accumulation:    |got - want| <= 2 (k + 4) u * scale (twice the worst-case f32 sum error)
//   after GELU:          that times 1.2 (|GELU'| <= 1.13), plus 8 u (|pre| + |want|) for tanhf
//   bf16 outputs (D, aux): plus 2^-8 (|want| + the above), bf16's rounding
// and exactly: bf16 rounding is to nearest even, f32 is not TF32, padding is never written.
// Then what is refused (NOT_SUPPORTED, INVALID_VALUE, NOT_INITIALIZED) and that a refused call
// computes nothing and counts no GEMM; the heuristic's switch for fused epilogues; attribute
// get/set contracts; and the asynchronous faults for host memory and misaligned pointers (death
// tests: a fault is sticky for the process).

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/device/cuda/emulation/cublaslt_switch.h"
#include "core/device/cuda/emulation/runtime.h"

namespace bigmac::device::cuda::emulation {
namespace {

constexpr double kU = 1.0 / (1 << 24);  // f32 unit roundoff
constexpr double kBf16U = 1.0 / 256;    // bf16 unit roundoff
constexpr float kSentinel = -1536.0f;   // exact in bf16 and f32
constexpr uint64_t kWorkspace = uint64_t{32} << 20;

size_t TypeSize(cudaDataType_t type) { return type == CUDA_R_16BF ? 2 : 4; }

float Rounded(cudaDataType_t type, float value) {
  return type == CUDA_R_16BF ? __bfloat162float(__float2bfloat16_rn(value)) : value;
}

// cudaMalloc'd memory (the emulated device's), read and written through host pointers, which the
// emulation allows; results are read only after WaitStream.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) {
    EXPECT_EQ(cudaMalloc(&ptr_, std::max<size_t>(bytes, 1)), cudaSuccess);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(ptr_); }
  void* get() const { return ptr_; }
  char* bytes() const { return static_cast<char*>(ptr_); }

 private:
  void* ptr_ = nullptr;
};

void Put(void* base, cudaDataType_t type, size_t index, float value) {
  if (type == CUDA_R_16BF) {
    static_cast<__nv_bfloat16*>(base)[index] = __float2bfloat16_rn(value);
  } else {
    static_cast<float*>(base)[index] = value;
  }
}

float Get(const void* base, cudaDataType_t type, size_t index) {
  if (type == CUDA_R_16BF) return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[index]);
  return static_cast<const float*>(base)[index];
}

// Seeded, never zero: sign * [0.25, 1).
std::vector<float> Random(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> magnitude(0.25f, 1.0f);
  std::vector<float> values(count);
  for (float& v : values) v = (rng() & 1 ? 1.0f : -1.0f) * magnitude(rng);
  return values;
}

// A column-major matrix on the device; `seen` holds what the device holds (padding: kSentinel).
struct Matrix {
  Matrix(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, uint32_t seed)
      : type(type),
        rows(rows),
        cols(cols),
        ld(ld),
        seen(size_t(ld * cols), kSentinel),
        buffer(size_t(ld * cols) * TypeSize(type)) {
    const std::vector<float> values = Random(size_t(rows * cols), seed);
    for (int64_t j = 0; j < cols; ++j) {
      for (int64_t i = 0; i < rows; ++i) seen[i + j * ld] = Rounded(type, values[i + j * rows]);
    }
    Upload();
  }
  void Upload() {
    for (size_t i = 0; i < seen.size(); ++i) Put(buffer.get(), type, i, seen[i]);
  }
  float At(int64_t i, int64_t j) const { return seen[i + j * ld]; }
  float Device(int64_t i, int64_t j) const { return Get(buffer.get(), type, i + j * ld); }
  bool PaddingUntouched() const {
    for (int64_t j = 0; j < cols; ++j) {
      for (int64_t i = rows; i < ld; ++i) {
        if (Device(i, j) != kSentinel) return false;
      }
    }
    return true;
  }

  cudaDataType_t type;
  int64_t rows, cols, ld;
  std::vector<float> seen;
  DeviceBuffer buffer;
};

double GeluRef(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

bool HasBias(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}
bool HasGelu(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}

const char* EpilogueName(cublasLtEpilogue_t e) {
  switch (e) {
    case CUBLASLT_EPILOGUE_DEFAULT:
      return "DEFAULT";
    case CUBLASLT_EPILOGUE_BIAS:
      return "BIAS";
    case CUBLASLT_EPILOGUE_GELU_AUX:
      return "GELU_AUX";
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
      return "GELU_AUX_BIAS";
    default:
      return "other";
  }
}

// Owns the handle, descriptors and preference of one GEMM, set up the way stages/cuda/gemm.cc
// does, and runs the heuristic and the matmul.
class Gemm {
 public:
  struct Spec {
    cudaDataType_t ab = CUDA_R_32F, cd = CUDA_R_32F;
    bool trans_a = false, trans_b = false;
    int64_t m = 13, n = 7, k = 29;
    int64_t pad = 0;  // added to every leading dimension
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
    float alpha = 1.0f, beta = 0.0f;
    bool in_place = true;  // C and D one buffer, as BigMac runs it
    uint32_t seed = 1;
  };

  explicit Gemm(const Spec& s)
      : spec(s),
        a(s.ab, s.trans_a ? s.k : s.m, s.trans_a ? s.m : s.k, (s.trans_a ? s.k : s.m) + s.pad,
          s.seed * 10 + 1),
        b(s.ab, s.trans_b ? s.n : s.k, s.trans_b ? s.k : s.n, (s.trans_b ? s.n : s.k) + s.pad,
          s.seed * 10 + 2),
        c(s.cd, s.m, s.n, s.m + s.pad, s.seed * 10 + 3),
        d(s.cd, s.m, s.n, s.m + s.pad + 1, s.seed * 10 + 4),
        bias(s.cd, s.m, 1, s.m, s.seed * 10 + 5),
        aux(s.cd, s.m, s.n, (s.m + 8) / 8 * 8 + 8, s.seed * 10 + 6) {
    EXPECT_EQ(cublasLtCreate(&handle), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
    SetDesc(CUBLASLT_MATMUL_DESC_TRANSA, int32_t(s.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N));
    SetDesc(CUBLASLT_MATMUL_DESC_TRANSB, int32_t(s.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N));
    SetDesc(CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(s.epilogue));
    if (HasBias(s.epilogue)) {
      SetDesc(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(s.cd));
      SetDesc(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(bias.buffer.get()));
    }
    if (HasGelu(s.epilogue)) {
      SetDesc(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux.ld);
      SetDesc(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux.buffer.get());
    }
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&a_desc, s.ab, a.rows, a.cols, a.ld),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&b_desc, s.ab, b.rows, b.cols, b.ld),
              CUBLAS_STATUS_SUCCESS);
    const int64_t ldd = s.in_place ? c.ld : d.ld;
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&c_desc, s.cd, s.m, s.n, c.ld), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatrixLayoutCreate(&d_desc, s.cd, s.m, s.n, ldd), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
    SetPref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, kWorkspace);
    // 256-byte aligned cudaMalloc pointers: promise what they have, as gemm.cc does.
    for (const auto attr :
         {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
          CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
      SetPref(attr, uint32_t{16});
    }
  }
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;
  ~Gemm() {
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(d_desc);
    cublasLtMatrixLayoutDestroy(c_desc);
    cublasLtMatrixLayoutDestroy(b_desc);
    cublasLtMatrixLayoutDestroy(a_desc);
    cublasLtMatmulDescDestroy(op);
    cublasLtDestroy(handle);
  }

  template <typename T>
  void SetDesc(cublasLtMatmulDescAttributes_t attr, const T& value) {
    EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, attr, &value, sizeof(value)),
              CUBLAS_STATUS_SUCCESS)
        << "attribute " << attr;
  }
  template <typename T>
  void SetPref(cublasLtMatmulPreferenceAttributes_t attr, const T& value) {
    EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(value)),
              CUBLAS_STATUS_SUCCESS)
        << "attribute " << attr;
  }

  // Asks the heuristic; on success `algo` holds its one answer.
  cublasStatus_t Heuristic() {
    cublasLtMatmulHeuristicResult_t results[4] = {};
    returned = -1;
    const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
        handle, op, a_desc, b_desc, c_desc, d_desc, pref, 4, results, &returned);
    if (status == CUBLAS_STATUS_SUCCESS && returned > 0) {
      result = results[0];
      algo = results[0].algo;
    }
    return status;
  }

  void* DPointer() const { return spec.in_place ? c.buffer.get() : d.buffer.get(); }

  cublasStatus_t Matmul() {
    return cublasLtMatmul(handle, op, &spec.alpha, a.buffer.get(), a_desc, b.buffer.get(), b_desc,
                          &spec.beta, c.buffer.get(), c_desc, DPointer(), d_desc, &algo, nullptr, 0,
                          nullptr);
  }

  // The reference pre-activation at (i, j), and its error scale.
  void Reference(int64_t i, int64_t j, double* pre, double* scale) const {
    double sum = 0, abs_sum = 0;
    for (int64_t p = 0; p < spec.k; ++p) {
      const double x = spec.trans_a ? a.At(p, i) : a.At(i, p);
      const double y = spec.trans_b ? b.At(j, p) : b.At(p, j);
      sum += x * y;
      abs_sum += std::fabs(x * y);
    }
    *pre = double(spec.alpha) * sum + double(spec.beta) * c.At(i, j);
    *scale = std::fabs(spec.alpha) * abs_sum + std::fabs(double(spec.beta) * c.At(i, j));
    if (HasBias(spec.epilogue)) {
      *pre += bias.At(i, 0);
      *scale += std::fabs(bias.At(i, 0));
    }
  }

  // Checks D (and aux) against the reference, and that no padding was written.
  void ExpectMatchesReference() {
    WaitStream(nullptr);
    const Matrix& out = spec.in_place ? c : d;
    const bool gelu = HasGelu(spec.epilogue);
    const bool bf16 = spec.cd == CUDA_R_16BF;
    double worst_d = 0, worst_aux = 0;
    for (int64_t j = 0; j < spec.n; ++j) {
      for (int64_t i = 0; i < spec.m; ++i) {
        double pre = 0, scale = 0;
        Reference(i, j, &pre, &scale);
        const double accumulation = 2.0 * double(spec.k + 4) * kU * scale;
        const double want = gelu ? GeluRef(pre) : pre;
        double tol =
            gelu ? 1.2 * accumulation + 8 * kU * (std::fabs(pre) + std::fabs(want)) : accumulation;
        if (bf16) tol += kBf16U * (std::fabs(want) + tol);
        const double got = out.Device(i, j);
        ASSERT_LE(std::fabs(got - want), tol) << "D(" << i << ", " << j << ")";
        worst_d = std::max(worst_d, std::fabs(got - want) / tol);
        if (gelu) {
          const double aux_tol =
              accumulation + (bf16 ? kBf16U * (std::fabs(pre) + accumulation) : 0);
          ASSERT_LE(std::fabs(aux.Device(i, j) - pre), aux_tol) << "aux(" << i << ", " << j << ")";
          worst_aux = std::max(worst_aux, std::fabs(aux.Device(i, j) - pre) / aux_tol);
        }
      }
    }
    EXPECT_TRUE(out.PaddingUntouched());
    if (gelu) {
      EXPECT_TRUE(aux.PaddingUntouched());
    }
    // Inputs are never written.
    for (const Matrix* m : {&a, &b, &bias, spec.in_place ? &d : &c}) {
      for (int64_t j = 0; j < m->cols; ++j) {
        for (int64_t i = 0; i < m->ld; ++i) ASSERT_EQ(m->Device(i, j), m->At(i, j));
      }
    }
    if (!gelu) {
      for (int64_t j = 0; j < aux.cols; ++j) {
        for (int64_t i = 0; i < aux.ld; ++i) ASSERT_EQ(aux.Device(i, j), aux.At(i, j));
      }
    }
    worst_ratio_d = worst_d;
    worst_ratio_aux = worst_aux;
  }

  // True when D still holds what it held before (nothing was computed).
  bool OutputUntouched() {
    WaitStream(nullptr);
    const Matrix& out = spec.in_place ? c : d;
    for (int64_t j = 0; j < out.cols; ++j) {
      for (int64_t i = 0; i < out.ld; ++i) {
        if (out.Device(i, j) != out.At(i, j)) return false;
      }
    }
    for (int64_t j = 0; j < aux.cols; ++j) {
      for (int64_t i = 0; i < aux.ld; ++i) {
        if (aux.Device(i, j) != aux.At(i, j)) return false;
      }
    }
    return true;
  }

  Spec spec;
  Matrix a, b, c, d, bias, aux;
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a_desc = nullptr, b_desc = nullptr, c_desc = nullptr, d_desc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulHeuristicResult_t result{};
  cublasLtMatmulAlgo_t algo{};
  int returned = -1;
  double worst_ratio_d = 0, worst_ratio_aux = 0;
};

struct Types {
  cudaDataType_t ab, cd;
  const char* name;
};
constexpr Types kTypes[] = {{CUDA_R_32F, CUDA_R_32F, "f32"},
                            {CUDA_R_16BF, CUDA_R_16BF, "bf16"},
                            {CUDA_R_16BF, CUDA_R_32F, "bf16->f32"}};
constexpr cublasLtEpilogue_t kEpilogues[] = {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_BIAS,
                                             CUBLASLT_EPILOGUE_GELU_AUX,
                                             CUBLASLT_EPILOGUE_GELU_AUX_BIAS};

class EmulatedCublasLt : public testing::Test {
 protected:
  void SetUp() override { SetFusedEpilogues(true); }
  void TearDown() override { SetFusedEpilogues(true); }
};

// ---------------------------------------------------------------- results

TEST_F(EmulatedCublasLt, EveryFormMatchesTheDocumentedFormula) {
  int cases = 0;
  for (const Types& t : kTypes) {
    double worst = 0;  // |error| / tolerance
    for (const bool trans_a : {false, true}) {
      for (const bool trans_b : {false, true}) {
        for (const cublasLtEpilogue_t e : kEpilogues) {
          for (const auto& [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{0.75f, -1.5f}}) {
            for (const bool in_place : {true, false}) {
              SCOPED_TRACE(testing::Message()
                           << t.name << " transa=" << trans_a << " transb=" << trans_b
                           << " epilogue=" << EpilogueName(e) << " alpha=" << alpha
                           << " beta=" << beta << " in_place=" << in_place);
              Gemm::Spec s;
              s.ab = t.ab;
              s.cd = t.cd;
              s.trans_a = trans_a;
              s.trans_b = trans_b;
              s.pad = 3;
              s.epilogue = e;
              s.alpha = alpha;
              s.beta = beta;
              s.in_place = in_place;
              s.seed = uint32_t(cases + 1);
              Gemm g(s);
              ASSERT_EQ(g.Heuristic(), CUBLAS_STATUS_SUCCESS);
              ASSERT_EQ(g.returned, 1);
              EXPECT_EQ(g.result.state, CUBLAS_STATUS_SUCCESS);
              EXPECT_EQ(g.result.workspaceSize, 0u);
              ASSERT_EQ(g.Matmul(), CUBLAS_STATUS_SUCCESS);
              g.ExpectMatchesReference();
              worst = std::max({worst, g.worst_ratio_d, g.worst_ratio_aux});
              ++cases;
            }
          }
        }
      }
    }
    std::printf("%s: worst |error| / tolerance %.3g\n", t.name, worst);
  }
  EXPECT_EQ(cases, 3 * 2 * 2 * 4 * 2 * 2);
}

// Large enough for OpenBLAS's blocked and threaded paths; the MLP's transposes (gemm_plan.h).
TEST_F(EmulatedCublasLt, LargerShapes) {
  for (const Types& t : kTypes) {
    for (const cublasLtEpilogue_t e :
         {CUBLASLT_EPILOGUE_DEFAULT, CUBLASLT_EPILOGUE_GELU_AUX_BIAS}) {
      SCOPED_TRACE(testing::Message() << t.name << " " << EpilogueName(e));
      Gemm::Spec s;
      s.ab = t.ab;
      s.cd = t.cd;
      s.trans_a = true;
      s.m = 264;
      s.n = 97;
      s.k = 333;
      s.epilogue = e;
      s.alpha = 1.25f;
      s.beta = e == CUBLASLT_EPILOGUE_DEFAULT ? 0.5f : 0.0f;
      Gemm g(s);
      ASSERT_EQ(g.Heuristic(), CUBLAS_STATUS_SUCCESS);
      ASSERT_EQ(g.Matmul(), CUBLAS_STATUS_SUCCESS);
      g.ExpectMatchesReference();
    }
  }
}

// 1 x 1 x 1 products whose f32 value lies exactly halfway between two bf16 values.
TEST_F(EmulatedCublasLt, Bf16OutputRoundsToNearestEven) {
  struct Halfway {
    float value, want;
  };
  const Halfway cases[] = {
      {1.0f + 0x1p-8f, 1.0f},                       // between 1 and 1 + 2^-7: to even, down
      {1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-6f},         // between 1 + 2^-7 and 1 + 2^-6: to even, up
      {-(1.0f + 0x1p-8f), -1.0f},                   // sign-symmetric
      {1.0f + 0x1p-8f + 0x1p-20f, 1.0f + 0x1p-7f},  // above halfway: up
  };
  for (const Halfway& h : cases) {
    Gemm::Spec s;
    s.ab = s.cd = CUDA_R_16BF;
    s.m = s.n = s.k = 1;
    s.alpha = h.value;  // A and B are set to 1 below: D = alpha exactly in f32
    Gemm g(s);
    Put(g.a.buffer.get(), CUDA_R_16BF, 0, 1.0f);
    Put(g.b.buffer.get(), CUDA_R_16BF, 0, 1.0f);
    ASSERT_EQ(g.Heuristic(), CUBLAS_STATUS_SUCCESS);
    ASSERT_EQ(g.Matmul(), CUBLAS_STATUS_SUCCESS);
    WaitStream(nullptr);
    EXPECT_EQ(g.c.Device(0, 0), h.want) << "value " << h.value;
  }
}

// f32 stays f32: (1 + 2^-20) * 1 summed over k = 64 is exactly 64 (1 + 2^-20) in f32; TF32 (10
// mantissa bits) would read 1 + 2^-20 as 1.
TEST_F(EmulatedCublasLt, Fp32IsNotTf32) {
  Gemm::Spec s;
  s.m = 8;
  s.n = 4;
  s.k = 64;
  Gemm g(s);
  const float x = 1.0f + 0x1p-20f;
  for (int64_t i = 0; i < g.a.ld * g.a.cols; ++i) Put(g.a.buffer.get(), CUDA_R_32F, i, x);
  for (int64_t i = 0; i < g.b.ld * g.b.cols; ++i) Put(g.b.buffer.get(), CUDA_R_32F, i, 1.0f);
  ASSERT_EQ(g.Heuristic(), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(g.Matmul(), CUBLAS_STATUS_SUCCESS);
  WaitStream(nullptr);
  for (int64_t j = 0; j < s.n; ++j) {
    for (int64_t i = 0; i < s.m; ++i) ASSERT_EQ(g.c.Device(i, j), 64.0f * x);
  }
}

// BLAS convention: with beta = 0, C is not read (NaN there does not reach D).
TEST_F(EmulatedCublasLt, BetaZeroDoesNotReadC) {
  Gemm::Spec s;
  s.in_place = false;
  Gemm g(s);
  for (float& v : g.c.seen) v = std::numeric_limits<float>::quiet_NaN();
  g.c.Upload();
  ASSERT_EQ(g.Heuristic(), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(g.Matmul(), CUBLAS_STATUS_SUCCESS);
  WaitStream(nullptr);
  for (int64_t j = 0; j < s.n; ++j) {
    for (int64_t i = 0; i < s.m; ++i) ASSERT_TRUE(std::isfinite(g.d.Device(i, j)));
  }
}

// The call reads alpha, beta and the descriptor's epilogue pointers when it is made: gemm.cc
// repoints the cached descriptor for the next call before this one has run.
TEST_F(EmulatedCublasLt, CallSnapshotsScalarsAndEpiloguePointersAndCountsGemms) {
  Gemm::Spec s;
  s.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  s.alpha = 0.5f;
  s.beta = 2.0f;
  Gemm g(s);
  ASSERT_EQ(g.Heuristic(), CUBLAS_STATUS_SUCCESS);
  const int64_t before = GetCounters().gemm_calls.load();
  ASSERT_EQ(g.Matmul(), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(GetCounters().gemm_calls.load(), before + 1);
  Matrix other_bias(s.cd, s.m, 1, s.m, 99), other_aux(s.cd, s.m, s.n, g.aux.ld, 98);
  g.SetDesc(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(other_bias.buffer.get()));
  g.SetDesc(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, other_aux.buffer.get());
  g.spec.alpha = 100.0f;  // the host scalars the call pointed at
  g.spec.beta = 100.0f;
  WaitStream(nullptr);
  g.spec.alpha = 0.5f;
  g.spec.beta = 2.0f;
  g.ExpectMatchesReference();
  for (int64_t j = 0; j < s.n; ++j) {
    for (int64_t i = 0; i < other_aux.ld; ++i)
      ASSERT_EQ(other_aux.Device(i, j), other_aux.At(i, j));
  }
}

// ---------------------------------------------------------------- refusals

// Applies `mutate` to a valid bf16 GELU_AUX_BIAS GEMM whose algorithm was already chosen; then
// both the heuristic and the matmul must refuse with `want`, computing and counting nothing.
template <typename F>
void ExpectRefused(const char* what, cublasStatus_t want, F mutate) {
  SCOPED_TRACE(what);
  Gemm::Spec s;
  s.ab = s.cd = CUDA_R_16BF;
  s.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  s.beta = 0.5f;
  Gemm g(s);
  ASSERT_EQ(g.Heuristic(), CUBLAS_STATUS_SUCCESS);
  mutate(g);
  const int64_t before = GetCounters().gemm_calls.load();
  EXPECT_EQ(g.Heuristic(), want);
  EXPECT_EQ(g.returned, 0);
  EXPECT_EQ(g.Matmul(), want);
  EXPECT_EQ(GetCounters().gemm_calls.load(), before);
  EXPECT_TRUE(g.OutputUntouched());
}

void ReplaceLayout(cublasLtMatrixLayout_t* layout, cudaDataType_t type, uint64_t rows,
                   uint64_t cols, int64_t ld) {
  cublasLtMatrixLayoutDestroy(*layout);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(layout, type, rows, cols, ld), CUBLAS_STATUS_SUCCESS);
}

TEST_F(EmulatedCublasLt, UnsupportedRequestsAreNotSupported) {
  constexpr cublasStatus_t kNo = CUBLAS_STATUS_NOT_SUPPORTED;
  ExpectRefused("compute 32F_FAST_TF32", kNo, [](Gemm& g) {
    g.SetDesc(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, int32_t(CUBLAS_COMPUTE_32F_FAST_TF32));
  });
  ExpectRefused("compute 64F", kNo, [](Gemm& g) {
    g.SetDesc(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, int32_t(CUBLAS_COMPUTE_64F));
  });
  ExpectRefused("scale 16BF", kNo,
                [](Gemm& g) { g.SetDesc(CUBLASLT_MATMUL_DESC_SCALE_TYPE, int32_t(CUDA_R_16BF)); });
  ExpectRefused("device pointer mode", kNo, [](Gemm& g) {
    g.SetDesc(CUBLASLT_MATMUL_DESC_POINTER_MODE, int32_t(CUBLASLT_POINTER_MODE_DEVICE));
  });
  ExpectRefused("conjugate transpose", kNo,
                [](Gemm& g) { g.SetDesc(CUBLASLT_MATMUL_DESC_TRANSA, int32_t(CUBLAS_OP_C)); });
  for (const cublasLtEpilogue_t e :
       {CUBLASLT_EPILOGUE_RELU, CUBLASLT_EPILOGUE_RELU_BIAS, CUBLASLT_EPILOGUE_RELU_AUX_BIAS,
        CUBLASLT_EPILOGUE_GELU, CUBLASLT_EPILOGUE_GELU_BIAS, CUBLASLT_EPILOGUE_DGELU,
        CUBLASLT_EPILOGUE_DGELU_BGRAD, CUBLASLT_EPILOGUE_DRELU_BGRAD, CUBLASLT_EPILOGUE_BGRADA,
        CUBLASLT_EPILOGUE_BGRADB}) {
    // Not used by BigMac (it accumulates dbias with a kernel), so not emulated.
    ExpectRefused(("epilogue " + std::to_string(e)).c_str(), kNo,
                  [e](Gemm& g) { g.SetDesc(CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(e)); });
  }
  ExpectRefused("f32 bias for bf16 D", kNo, [](Gemm& g) {
    g.SetDesc(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(CUDA_R_32F));
  });
  ExpectRefused("f32 aux for bf16 D", kNo, [](Gemm& g) {
    g.SetDesc(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, int32_t(CUDA_R_32F));
  });
  ExpectRefused("fp16 A and B", kNo, [](Gemm& g) {
    ReplaceLayout(&g.a_desc, CUDA_R_16F, g.a.rows, g.a.cols, g.a.ld);
    ReplaceLayout(&g.b_desc, CUDA_R_16F, g.b.rows, g.b.cols, g.b.ld);
  });
  ExpectRefused("f64 everywhere", kNo, [](Gemm& g) {
    ReplaceLayout(&g.a_desc, CUDA_R_64F, g.a.rows, g.a.cols, g.a.ld);
    ReplaceLayout(&g.b_desc, CUDA_R_64F, g.b.rows, g.b.cols, g.b.ld);
    ReplaceLayout(&g.c_desc, CUDA_R_64F, g.c.rows, g.c.cols, g.c.ld);
    ReplaceLayout(&g.d_desc, CUDA_R_64F, g.c.rows, g.c.cols, g.c.ld);
  });
  ExpectRefused("A bf16, B f32", kNo,
                [](Gemm& g) { ReplaceLayout(&g.b_desc, CUDA_R_32F, g.b.rows, g.b.cols, g.b.ld); });
  ExpectRefused("C bf16, D f32", kNo,
                [](Gemm& g) { ReplaceLayout(&g.d_desc, CUDA_R_32F, g.c.rows, g.c.cols, g.c.ld); });
  ExpectRefused("int8 D", kNo, [](Gemm& g) {
    ReplaceLayout(&g.c_desc, CUDA_R_8I, g.c.rows, g.c.cols, g.c.ld);
    ReplaceLayout(&g.d_desc, CUDA_R_8I, g.c.rows, g.c.cols, g.c.ld);
  });
  ExpectRefused("rows beyond int32", kNo, [](Gemm& g) {
    ReplaceLayout(&g.a_desc, CUDA_R_16BF, uint64_t{1} << 31, g.a.cols, int64_t{1} << 31);
  });
}

TEST_F(EmulatedCublasLt, FloatInputsIntoBf16AreNotSupported) {
  Gemm::Spec s;
  s.ab = CUDA_R_32F;
  s.cd = CUDA_R_16BF;
  Gemm g(s);
  EXPECT_EQ(g.Heuristic(), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(g.returned, 0);
}

TEST_F(EmulatedCublasLt, InvalidRequestsAreInvalidValues) {
  constexpr cublasStatus_t kBad = CUBLAS_STATUS_INVALID_VALUE;
  ExpectRefused("lda < rows", kBad, [](Gemm& g) {
    ReplaceLayout(&g.a_desc, CUDA_R_16BF, g.a.rows, g.a.cols, g.a.rows - 1);
  });
  ExpectRefused("ldc < rows", kBad, [](Gemm& g) {
    ReplaceLayout(&g.c_desc, CUDA_R_16BF, g.c.rows, g.c.cols, g.c.rows - 1);
    ReplaceLayout(&g.d_desc, CUDA_R_16BF, g.c.rows, g.c.cols, g.c.rows - 1);
  });
  ExpectRefused("k of A and B differ", kBad, [](Gemm& g) {
    ReplaceLayout(&g.b_desc, CUDA_R_16BF, g.b.rows - 1, g.b.cols, g.b.ld);
  });
  ExpectRefused("C and D shapes differ", kBad, [](Gemm& g) {
    ReplaceLayout(&g.d_desc, CUDA_R_16BF, g.c.rows, g.c.cols - 1, g.c.ld);
  });
  ExpectRefused("A not transposed as its layout says", kBad,
                [](Gemm& g) { g.SetDesc(CUBLASLT_MATMUL_DESC_TRANSA, int32_t(CUBLAS_OP_T)); });
  ExpectRefused("aux ld not a multiple of 8", kBad,
                [](Gemm& g) { g.SetDesc(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t{20}); });
  ExpectRefused("aux ld < m", kBad,
                [](Gemm& g) { g.SetDesc(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t{8}); });
  ExpectRefused("aux ld unset", kBad,
                [](Gemm& g) { g.SetDesc(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t{0}); });
  ExpectRefused("transpose 7", kBad,
                [](Gemm& g) { g.SetDesc(CUBLASLT_MATMUL_DESC_TRANSB, int32_t{7}); });
}

// What only the matmul can see: its pointers and algo.
TEST_F(EmulatedCublasLt, MatmulArgumentChecks) {
  Gemm::Spec s;
  s.epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  s.in_place = false;
  Gemm g(s);
  ASSERT_EQ(g.Heuristic(), CUBLAS_STATUS_SUCCESS);
  const int64_t before = GetCounters().gemm_calls.load();
  const float alpha = 1.0f, beta = 0.0f;
  void* a = g.a.buffer.get();
  void* b = g.b.buffer.get();
  void* c = g.c.buffer.get();
  void* d = g.d.buffer.get();
  auto call = [&](const void* alpha_p, const void* a_p, const void* b_p, const void* c_p, void* d_p,
                  const cublasLtMatmulAlgo_t* algo, cublasLtHandle_t handle) {
    return cublasLtMatmul(handle, g.op, alpha_p, a_p, g.a_desc, b_p, g.b_desc, &beta, c_p, g.c_desc,
                          d_p, g.d_desc, algo, nullptr, 0, nullptr);
  };
  EXPECT_EQ(call(nullptr, a, b, c, d, &g.algo, g.handle), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(call(&alpha, nullptr, b, c, d, &g.algo, g.handle), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(call(&alpha, a, nullptr, c, d, &g.algo, g.handle), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(call(&alpha, a, b, nullptr, d, &g.algo, g.handle), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(call(&alpha, a, b, c, nullptr, &g.algo, g.handle), CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(call(&alpha, a, b, c, d, &g.algo, nullptr), CUBLAS_STATUS_NOT_INITIALIZED);
  // cuBLASLt's implicit heuristic (null algo) is not emulated; BigMac always passes one.
  EXPECT_EQ(call(&alpha, a, b, c, d, nullptr, g.handle), CUBLAS_STATUS_NOT_SUPPORTED);
  cublasLtMatmulAlgo_t garbage{};
  EXPECT_EQ(call(&alpha, a, b, c, d, &garbage, g.handle), CUBLAS_STATUS_INVALID_VALUE);
  // In place with a D layout other than C's.
  EXPECT_EQ(call(&alpha, a, b, c, c, &g.algo, g.handle), CUBLAS_STATUS_INVALID_VALUE);
  // The epilogue's pointers.
  g.SetDesc(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(nullptr));
  EXPECT_EQ(call(&alpha, a, b, c, d, &g.algo, g.handle), CUBLAS_STATUS_INVALID_VALUE);
  g.SetDesc(CUBLASLT_MATMUL_DESC_BIAS_POINTER, static_cast<const void*>(g.bias.buffer.get()));
  g.SetDesc(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(nullptr));
  EXPECT_EQ(call(&alpha, a, b, c, d, &g.algo, g.handle), CUBLAS_STATUS_INVALID_VALUE);
  g.SetDesc(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, g.aux.buffer.get());
  // An algorithm chosen for another epilogue.
  g.SetDesc(CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(CUBLASLT_EPILOGUE_BIAS));
  EXPECT_EQ(call(&alpha, a, b, c, d, &g.algo, g.handle), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(GetCounters().gemm_calls.load(), before);
  EXPECT_TRUE(g.OutputUntouched());
  // And back to a valid call.
  g.SetDesc(CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(CUBLASLT_EPILOGUE_GELU_AUX_BIAS));
  EXPECT_EQ(call(&alpha, a, b, c, d, &g.algo, g.handle), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(GetCounters().gemm_calls.load(), before + 1);
  WaitStream(nullptr);
}

// ---------------------------------------------------------------- heuristic

TEST_F(EmulatedCublasLt, HeuristicArguments) {
  Gemm g(Gemm::Spec{});
  cublasLtMatmulHeuristicResult_t result{};
  int returned = -1;
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(g.handle, g.op, g.a_desc, g.b_desc, g.c_desc, g.d_desc,
                                           g.pref, 0, &result, &returned),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(nullptr, g.op, g.a_desc, g.b_desc, g.c_desc, g.d_desc,
                                           g.pref, 1, &result, &returned),
            CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(g.handle, g.op, g.a_desc, g.b_desc, g.c_desc, g.d_desc,
                                           nullptr, 1, &result, &returned),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulAlgoGetHeuristic(g.handle, g.op, g.a_desc, g.b_desc, g.c_desc, g.d_desc,
                                           g.pref, 1, &result, &returned),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(returned, 1);
}

// Switched off, every fused epilogue is answered as cuBLASLt answers a form it has no algorithm
// for (NOT_SUPPORTED, none returned), which is what makes gemm.cc fall back; DEFAULT still runs,
// and an algorithm chosen before keeps working.
TEST_F(EmulatedCublasLt, FusedEpilogueSwitch) {
  EXPECT_TRUE(FusedEpiloguesOffered());
  for (const Types& t : kTypes) {
    for (const cublasLtEpilogue_t e : kEpilogues) {
      SCOPED_TRACE(testing::Message() << t.name << " " << EpilogueName(e));
      Gemm::Spec s;
      s.ab = t.ab;
      s.cd = t.cd;
      s.epilogue = e;
      Gemm g(s);
      ASSERT_EQ(g.Heuristic(), CUBLAS_STATUS_SUCCESS);  // chosen while offered
      SetFusedEpilogues(false);
      EXPECT_FALSE(FusedEpiloguesOffered());
      cublasLtMatmulHeuristicResult_t result{};
      int returned = -1;
      const cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(
          g.handle, g.op, g.a_desc, g.b_desc, g.c_desc, g.d_desc, g.pref, 1, &result, &returned);
      if (e == CUBLASLT_EPILOGUE_DEFAULT) {
        EXPECT_EQ(status, CUBLAS_STATUS_SUCCESS);
        EXPECT_EQ(returned, 1);
      } else {
        EXPECT_EQ(status, CUBLAS_STATUS_NOT_SUPPORTED);
        EXPECT_EQ(returned, 0);
      }
      ASSERT_EQ(g.Matmul(), CUBLAS_STATUS_SUCCESS);
      g.ExpectMatchesReference();
      SetFusedEpilogues(true);
    }
  }
}

// Not a fixture test: its SetUp would set the switch before the environment is read.
TEST(EmulatedCublasLtEnvironment, SwitchesFusedEpiloguesOff) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: the switch not yet read
  EXPECT_EXIT(
      {
        setenv("BIGMAC_EMULATED_FUSED_EPILOGUES", "0", 1);
        std::_Exit(FusedEpiloguesOffered() ? 1 : 0);
      },
      testing::ExitedWithCode(0), "");
  EXPECT_EXIT(
      {
        setenv("BIGMAC_EMULATED_FUSED_EPILOGUES", "1", 1);
        std::_Exit(FusedEpiloguesOffered() ? 0 : 1);
      },
      testing::ExitedWithCode(0), "");
}

// The numerical implementation mask filters, as documented: gemm.cc's f32 mask (no TF32, bf16 or
// fp16 inputs) keeps f32 GEMMs; a mask without the input type leaves nothing.
TEST_F(EmulatedCublasLt, ImplementationMask) {
  const uint64_t fp32_mask =
      ~uint64_t{CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_TF32 |
                CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_16BF | CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_16F};
  {
    Gemm g(Gemm::Spec{});
    g.SetPref(CUBLASLT_MATMUL_PREF_IMPL_MASK, fp32_mask);
    EXPECT_EQ(g.Heuristic(), CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(g.returned, 1);
    g.SetPref(CUBLASLT_MATMUL_PREF_IMPL_MASK, ~uint64_t{CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_32F});
    EXPECT_EQ(g.Heuristic(), CUBLAS_STATUS_NOT_SUPPORTED);
    EXPECT_EQ(g.returned, 0);
  }
  {
    Gemm::Spec s;
    s.ab = s.cd = CUDA_R_16BF;
    Gemm g(s);
    g.SetPref(CUBLASLT_MATMUL_PREF_IMPL_MASK, fp32_mask);
    EXPECT_EQ(g.Heuristic(), CUBLAS_STATUS_NOT_SUPPORTED);
    EXPECT_EQ(g.returned, 0);
  }
}

// Alignment preferences promise at least whole elements; the workspace limit never excludes the
// emulated algorithm (it needs none).
TEST_F(EmulatedCublasLt, AlignmentAndWorkspacePreferences) {
  Gemm g(Gemm::Spec{});
  g.SetPref(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t{0});
  EXPECT_EQ(g.Heuristic(), CUBLAS_STATUS_SUCCESS);
  g.SetPref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, uint32_t{4});  // one f32: enough
  EXPECT_EQ(g.Heuristic(), CUBLAS_STATUS_SUCCESS);
  g.SetPref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, uint32_t{2});
  EXPECT_EQ(g.Heuristic(), CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(g.returned, 0);
  g.SetPref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, uint32_t{0});
  EXPECT_EQ(g.Heuristic(), CUBLAS_STATUS_NOT_SUPPORTED);

  // The heuristic reads the bias pointer's alignment: half an element is no algorithm.
  Gemm::Spec s;
  s.epilogue = CUBLASLT_EPILOGUE_BIAS;
  Gemm biased(s);
  biased.SetDesc(CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                 static_cast<const void*>(biased.bias.buffer.bytes() + 2));
  EXPECT_EQ(biased.Heuristic(), CUBLAS_STATUS_NOT_SUPPORTED);
}

// A matmul at the alignment the algorithm was chosen for (here 4 bytes, below cudaMalloc's) runs.
TEST_F(EmulatedCublasLt, PointersAsAlignedAsPromisedRun) {
  Gemm::Spec s;
  s.in_place = false;
  Gemm g(s);
  g.SetPref(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, uint32_t{4});
  ASSERT_EQ(g.Heuristic(), CUBLAS_STATUS_SUCCESS);
  // D one column in (14 floats = 56 bytes: 8-byte aligned, less than the 16 promised for A..C),
  // one column fewer.
  cublasLtMatrixLayoutDestroy(g.d_desc);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&g.d_desc, CUDA_R_32F, s.m, s.n - 1, g.d.ld),
            CUBLAS_STATUS_SUCCESS);
  cublasLtMatrixLayoutDestroy(g.b_desc);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&g.b_desc, CUDA_R_32F, s.k, s.n - 1, g.b.ld),
            CUBLAS_STATUS_SUCCESS);
  cublasLtMatrixLayoutDestroy(g.c_desc);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&g.c_desc, CUDA_R_32F, s.m, s.n - 1, g.c.ld),
            CUBLAS_STATUS_SUCCESS);
  float* d = reinterpret_cast<float*>(g.d.buffer.get()) + g.d.ld;
  ASSERT_EQ(cublasLtMatmul(g.handle, g.op, &s.alpha, g.a.buffer.get(), g.a_desc, g.b.buffer.get(),
                           g.b_desc, &s.beta, g.c.buffer.get(), g.c_desc, d, g.d_desc, &g.algo,
                           nullptr, 0, nullptr),
            CUBLAS_STATUS_SUCCESS);
  WaitStream(nullptr);
  for (int64_t i = 0; i < g.d.ld; ++i) EXPECT_EQ(g.d.Device(i, 0), g.d.At(i, 0));  // untouched
  for (int64_t j = 1; j < s.n; ++j) {
    for (int64_t i = 0; i < s.m; ++i) {
      double pre = 0, scale = 0;
      g.Reference(i, j - 1, &pre, &scale);
      EXPECT_NEAR(g.d.Device(i, j), pre, 2.0 * (s.k + 4) * kU * scale);
    }
  }
}

// ---------------------------------------------------------------- asynchronous faults

// On a GPU these calls return SUCCESS and the kernel faults; the fault is sticky, hence a child
// process. `run` returns the matmul's status; D must stay untouched.
template <typename F>
void ExpectStreamFault(cudaError_t want, F run) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        const bool ok = run();
        const cudaError_t error = cudaDeviceSynchronize();
        std::fprintf(stderr, "ok=%d error=%d\n", int(ok), int(error));
        std::_Exit(ok && error == want ? 0 : 1);
      },
      testing::ExitedWithCode(0), "cublasLtMatmul");
}

TEST_F(EmulatedCublasLt, HostMemoryFaultsTheStream) {
  ExpectStreamFault(cudaErrorIllegalAddress, [] {
    Gemm g(Gemm::Spec{});
    if (g.Heuristic() != CUBLAS_STATUS_SUCCESS) return false;
    std::vector<float> host_d(size_t(g.c.ld * g.c.cols), kSentinel);  // not cudaMalloc'd
    const cublasStatus_t status =
        cublasLtMatmul(g.handle, g.op, &g.spec.alpha, g.a.buffer.get(), g.a_desc, g.b.buffer.get(),
                       g.b_desc, &g.spec.beta, g.c.buffer.get(), g.c_desc, host_d.data(), g.c_desc,
                       &g.algo, nullptr, 0, nullptr);
    WaitStream(nullptr);
    return status == CUBLAS_STATUS_SUCCESS &&
           std::all_of(host_d.begin(), host_d.end(), [](float v) { return v == kSentinel; });
  });
}

// The algorithm was chosen for 16-byte aligned A; A 4 bytes further on breaks that promise.
TEST_F(EmulatedCublasLt, PointerLessAlignedThanPromisedFaultsTheStream) {
  ExpectStreamFault(cudaErrorMisalignedAddress, [] {
    Gemm::Spec s;
    s.pad = 1;  // room for A one element further on
    Gemm g(s);
    if (g.Heuristic() != CUBLAS_STATUS_SUCCESS) return false;
    const cublasStatus_t status =
        cublasLtMatmul(g.handle, g.op, &s.alpha, g.a.buffer.bytes() + 4, g.a_desc, g.b.buffer.get(),
                       g.b_desc, &s.beta, g.c.buffer.get(), g.c_desc, g.c.buffer.get(), g.c_desc,
                       &g.algo, nullptr, 0, nullptr);
    return status == CUBLAS_STATUS_SUCCESS && g.OutputUntouched();
  });
}

// ---------------------------------------------------------------- attributes and library

TEST_F(EmulatedCublasLt, DescriptorDefaultsAndAttributeContract) {
  cublasLtMatmulDesc_t op = nullptr;
  ASSERT_EQ(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
  auto get_i32 = [&](cublasLtMatmulDescAttributes_t attr) {
    int32_t value = 12345;
    size_t written = 0;
    EXPECT_EQ(cublasLtMatmulDescGetAttribute(op, attr, &value, sizeof(value), &written),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(written, sizeof(value));
    return value;
  };
  EXPECT_EQ(get_i32(CUBLASLT_MATMUL_DESC_COMPUTE_TYPE), int32_t(CUBLAS_COMPUTE_32F));
  EXPECT_EQ(get_i32(CUBLASLT_MATMUL_DESC_SCALE_TYPE), int32_t(CUDA_R_32F));
  EXPECT_EQ(get_i32(CUBLASLT_MATMUL_DESC_POINTER_MODE), int32_t(CUBLASLT_POINTER_MODE_HOST));
  EXPECT_EQ(get_i32(CUBLASLT_MATMUL_DESC_TRANSA), int32_t(CUBLAS_OP_N));
  EXPECT_EQ(get_i32(CUBLASLT_MATMUL_DESC_TRANSB), int32_t(CUBLAS_OP_N));
  EXPECT_EQ(get_i32(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE), -1);  // documented default
  EXPECT_EQ(get_i32(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE), -1);
  uint32_t epilogue = 0;
  EXPECT_EQ(cublasLtMatmulDescGetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                           sizeof(epilogue), nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(epilogue, uint32_t(CUBLASLT_EPILOGUE_DEFAULT));
  const void* bias = &epilogue;
  EXPECT_EQ(cublasLtMatmulDescGetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                           sizeof(bias), nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(bias, nullptr);
  int64_t aux_ld = -1;
  EXPECT_EQ(cublasLtMatmulDescGetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                           sizeof(aux_ld), nullptr),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(aux_ld, 0);

  // sizeInBytes 0 asks for the size; it needs sizeWritten.
  size_t written = 0;
  EXPECT_EQ(cublasLtMatmulDescGetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, nullptr, 0,
                                           &written),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(written, sizeof(int64_t));
  EXPECT_EQ(
      cublasLtMatmulDescGetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, nullptr, 0, &written),
      CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(written, sizeof(void*));
  EXPECT_EQ(
      cublasLtMatmulDescGetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, nullptr, 0, nullptr),
      CUBLAS_STATUS_INVALID_VALUE);
  // A size other than the attribute's, or no buffer, is invalid both ways.
  int32_t small = 0;
  EXPECT_EQ(cublasLtMatmulDescGetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &small,
                                           sizeof(small), &written),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulDescGetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, nullptr, 8,
                                           &written),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &small,
                                           sizeof(small)),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, nullptr, 4),
            CUBLAS_STATUS_INVALID_VALUE);
  // Round trip.
  const int64_t want_ld = 3072;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &want_ld,
                                           sizeof(want_ld)),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulDescGetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                           sizeof(aux_ld), &written),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(aux_ld, want_ld);
  // Attributes outside the emulated subset.
  const int8_t fast_accum = 1;
  EXPECT_EQ(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast_accum,
                                           sizeof(fast_accum)),
            CUBLAS_STATUS_NOT_SUPPORTED);
  int32_t transc = 0;
  EXPECT_EQ(cublasLtMatmulDescGetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSC, &transc, sizeof(transc),
                                           &written),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(cublasLtMatmulDescDestroy(op), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulDescDestroy(nullptr), CUBLAS_STATUS_SUCCESS);
}

TEST_F(EmulatedCublasLt, LayoutAndPreferenceAttributes) {
  cublasLtMatrixLayout_t layout = nullptr;
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&layout, CUDA_R_16BF, 257, 6, 320), CUBLAS_STATUS_SUCCESS);
  uint32_t type = 0;
  int32_t order = -1, batch = -1;
  uint64_t rows = 0, cols = 0;
  int64_t ld = 0;
  size_t written = 0;
  EXPECT_EQ(cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_TYPE, &type,
                                             sizeof(type), &written),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(type, uint32_t(CUDA_R_16BF));
  EXPECT_EQ(cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_ORDER, &order,
                                             sizeof(order), &written),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(order, int32_t(CUBLASLT_ORDER_COL));
  EXPECT_EQ(cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_ROWS, &rows,
                                             sizeof(rows), &written),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(rows, 257u);
  EXPECT_EQ(cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_COLS, &cols,
                                             sizeof(cols), &written),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cols, 6u);
  EXPECT_EQ(cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_LD, &ld, sizeof(ld),
                                             &written),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(ld, 320);
  EXPECT_EQ(cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch,
                                             sizeof(batch), &written),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(batch, 1);
  EXPECT_EQ(
      cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_ROWS, nullptr, 0, &written),
      CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(written, sizeof(uint64_t));
  EXPECT_EQ(cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_ROWS, &order,
                                             sizeof(order), &written),
            CUBLAS_STATUS_INVALID_VALUE);
  int64_t plane = 0;
  EXPECT_EQ(cublasLtMatrixLayoutGetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET, &plane,
                                             sizeof(plane), &written),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(cublasLtMatrixLayoutDestroy(layout), CUBLAS_STATUS_SUCCESS);

  cublasLtMatmulPreference_t pref = nullptr;
  ASSERT_EQ(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
  uint64_t workspace = 1, mask = 0;
  uint32_t align = 0;
  EXPECT_EQ(cublasLtMatmulPreferenceGetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &workspace, sizeof(workspace), &written),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(workspace, 0u);  // documented defaults
  EXPECT_EQ(cublasLtMatmulPreferenceGetAttribute(pref, CUBLASLT_MATMUL_PREF_IMPL_MASK, &mask,
                                                 sizeof(mask), &written),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(mask, ~uint64_t{0});
  for (const auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    EXPECT_EQ(cublasLtMatmulPreferenceGetAttribute(pref, attr, &align, sizeof(align), &written),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(align, 256u);
  }
  const uint32_t sixteen = 16;
  EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                 &sixteen, sizeof(sixteen)),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtMatmulPreferenceGetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                 &align, sizeof(align), &written),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(align, 16u);
  EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                 &sixteen, sizeof(sixteen)),
            CUBLAS_STATUS_INVALID_VALUE);  // uint64_t
  const uint32_t search = CUBLASLT_SEARCH_BEST_FIT;
  EXPECT_EQ(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_SEARCH_MODE, &search,
                                                 sizeof(search)),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(cublasLtMatmulPreferenceDestroy(pref), CUBLAS_STATUS_SUCCESS);
}

TEST_F(EmulatedCublasLt, LibraryFunctions) {
  EXPECT_EQ(cublasLtGetVersion(), size_t{CUBLAS_VERSION});
  EXPECT_STREQ(cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");
  EXPECT_STREQ(cublasLtGetStatusString(CUBLAS_STATUS_NOT_SUPPORTED),
               "the functionality requested is not supported");  // as check.h quotes it
  EXPECT_STREQ(cublasLtGetStatusName(CUBLAS_STATUS_SUCCESS), "CUBLAS_STATUS_SUCCESS");
  EXPECT_STREQ(cublasLtGetStatusName(CUBLAS_STATUS_INVALID_VALUE), "CUBLAS_STATUS_INVALID_VALUE");
  EXPECT_STREQ(cublasLtGetStatusName(cublasStatus_t(999)), "<unknown>");
  cublasLtHandle_t handle = nullptr;
  ASSERT_EQ(cublasLtCreate(&handle), CUBLAS_STATUS_SUCCESS);
  EXPECT_NE(handle, nullptr);
  EXPECT_EQ(cublasLtDestroy(handle), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cublasLtDestroy(nullptr), CUBLAS_STATUS_NOT_INITIALIZED);
  EXPECT_EQ(cublasLtCreate(nullptr), CUBLAS_STATUS_INVALID_VALUE);
}

}  // namespace
}  // namespace bigmac::device::cuda::emulation
