// The cuBLASLt GEMMs (stages/cuda/gemm.h).
//
// Without a GPU: the descriptors, layouts and preferences gemm.cc builds for every layer GEMM (fp32
// and bf16, every epilogue) are created and read back, and compared with the plan (gemm_plan.h,
// itself executed against the CPU kernels by gemm_plan_test) and with hand-derived numbers; and
// gemm.cc's argument checks run (they throw before touching a device).
//
// With a GPU: MatmulForward (with and without bias, with gelu_pre, padded ld_out),
// MatmulBackwardInput and MatmulBackwardWeight (beta = 1 into prefilled dw and dbias) against the
// CPU kernels, fused and forced unfused. Tolerances, |gpu - cpu| <= tol * max|cpu|: fp32 1e-4
// (cuBLAS sums in another order; no TF32, which a dedicated test would catch exactly); bf16 inputs
// are rounded to bf16 on both sides, bf16 outputs 1e-2, fp32 outputs from bf16 inputs (dw,
// dbias) 1e-3. Skipped, never passed, where there is no CUDA device.

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/comm/cuda/cuda_probe.h"
#include "core/device/cuda/context.h"
#include "core/memory/dtype.h"
#include "plugins/sdk/cpu_kernels.h"
#include "stages/cuda/gemm.h"
#include "stages/cuda/gemm_descriptors.h"
#include "stages/cuda/gemm_plan.h"
#include "stages/cuda/gemm_stats.h"

namespace bigmac::stages::cuda {
namespace {

namespace cpu = ::bigmac::sdk::cpu;
using device::DeviceError;
using device::cuda::CudaContext;
using memory::DType;

// ---------------------------------------------------------------- descriptors (no GPU needed)

template <typename T>
T DescAttr(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attribute) {
  T value{};
  size_t written = 0;
  EXPECT_EQ(cublasLtMatmulDescGetAttribute(desc, attribute, &value, sizeof(value), &written),
            CUBLAS_STATUS_SUCCESS)
      << "attribute " << attribute;
  EXPECT_EQ(written, sizeof(value)) << "attribute " << attribute;
  return value;
}

template <typename T>
T LayoutAttr(cublasLtMatrixLayout_t layout, cublasLtMatrixLayoutAttribute_t attribute) {
  T value{};
  size_t written = 0;
  EXPECT_EQ(cublasLtMatrixLayoutGetAttribute(layout, attribute, &value, sizeof(value), &written),
            CUBLAS_STATUS_SUCCESS)
      << "attribute " << attribute;
  EXPECT_EQ(written, sizeof(value)) << "attribute " << attribute;
  return value;
}

template <typename T>
T PrefAttr(cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attribute) {
  T value{};
  size_t written = 0;
  EXPECT_EQ(cublasLtMatmulPreferenceGetAttribute(pref, attribute, &value, sizeof(value), &written),
            CUBLAS_STATUS_SUCCESS)
      << "attribute " << attribute;
  EXPECT_EQ(written, sizeof(value)) << "attribute " << attribute;
  return value;
}

struct Layout {
  cudaDataType_t type;
  uint64_t rows, cols;
  int64_t ld;
};

void ExpectLayout(cublasLtMatrixLayout_t layout, const Layout& want, const char* name) {
  SCOPED_TRACE(name);
  EXPECT_EQ(LayoutAttr<uint32_t>(layout, CUBLASLT_MATRIX_LAYOUT_TYPE), uint32_t(want.type));
  EXPECT_EQ(LayoutAttr<int32_t>(layout, CUBLASLT_MATRIX_LAYOUT_ORDER), int32_t(CUBLASLT_ORDER_COL));
  EXPECT_EQ(LayoutAttr<uint64_t>(layout, CUBLASLT_MATRIX_LAYOUT_ROWS), want.rows);
  EXPECT_EQ(LayoutAttr<uint64_t>(layout, CUBLASLT_MATRIX_LAYOUT_COLS), want.cols);
  EXPECT_EQ(LayoutAttr<int64_t>(layout, CUBLASLT_MATRIX_LAYOUT_LD), want.ld);
  EXPECT_EQ(LayoutAttr<int32_t>(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT), 1);
}

cudaDataType_t Cuda(DType dtype) { return dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F; }

// Builds the descriptors of `plan` with `epilogue` as gemm.cc does and checks every attribute
// against the plan.
void CheckDescriptors(const LayerGemm& plan, Epilogue epilogue, GemmKind kind, DType dtype) {
  SCOPED_TRACE(testing::Message() << GemmKindName(kind) << " " << memory::DTypeName(dtype) << " "
                                  << Describe(plan.gemm) << " epilogue " << EpilogueName(epilogue));
  const GemmTypes types = TypesFor(kind, dtype);
  const MatmulDescriptors d = BuildDescriptors(plan, epilogue, types, "descriptor test");
  const void* bias = reinterpret_cast<const void*>(uintptr_t{0x7f0000001000});
  void* aux = reinterpret_cast<void*>(uintptr_t{0x7f0000002000});
  SetEpiloguePointers(d, epilogue, bias, aux, "descriptor test");
  const ColumnMajorGemm& g = plan.gemm;

  EXPECT_EQ(DescAttr<int32_t>(d.op, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE),
            int32_t(CUBLAS_COMPUTE_32F));  // never CUBLAS_COMPUTE_32F_FAST_TF32
  EXPECT_EQ(DescAttr<int32_t>(d.op, CUBLASLT_MATMUL_DESC_SCALE_TYPE), int32_t(CUDA_R_32F));
  EXPECT_EQ(DescAttr<int32_t>(d.op, CUBLASLT_MATMUL_DESC_POINTER_MODE),
            int32_t(CUBLASLT_POINTER_MODE_HOST));
  EXPECT_EQ(DescAttr<int32_t>(d.op, CUBLASLT_MATMUL_DESC_TRANSA),
            int32_t(g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N));
  EXPECT_EQ(DescAttr<int32_t>(d.op, CUBLASLT_MATMUL_DESC_TRANSB),
            int32_t(g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N));
  EXPECT_EQ(DescAttr<uint32_t>(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE),
            uint32_t(LtEpilogue(epilogue)));
  if (HasBias(epilogue)) {
    EXPECT_EQ(DescAttr<int32_t>(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE), int32_t(Cuda(dtype)));
    EXPECT_EQ(DescAttr<const void*>(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER), bias);
  } else {
    EXPECT_EQ(DescAttr<const void*>(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER), nullptr);
  }
  if (HasGelu(epilogue)) {
    EXPECT_EQ(DescAttr<int64_t>(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD), plan.aux_ld);
    EXPECT_EQ(DescAttr<int64_t>(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD) % 8, 0);
    EXPECT_GE(DescAttr<int64_t>(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD), g.m);
    // Left at the default (D's type): never set to anything else.
    const int32_t aux_type = DescAttr<int32_t>(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE);
    EXPECT_TRUE(aux_type == -1 || aux_type == 0 || aux_type == int32_t(Cuda(dtype))) << aux_type;
    EXPECT_EQ(DescAttr<void*>(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER), aux);
  } else {
    EXPECT_EQ(DescAttr<void*>(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER), nullptr);
  }
  const cudaDataType_t cd = kind == GemmKind::kBackwardWeight ? CUDA_R_32F : Cuda(dtype);
  ExpectLayout(d.a, {Cuda(dtype), uint64_t(g.a_rows), uint64_t(g.a_cols), g.lda}, "A");
  ExpectLayout(d.b, {Cuda(dtype), uint64_t(g.b_rows), uint64_t(g.b_cols), g.ldb}, "B");
  ExpectLayout(d.c, {cd, uint64_t(g.m), uint64_t(g.n), g.ldc}, "C/D");
}

struct Shape {
  int n, c, oc;
  int64_t ld;
};

const Shape kDescriptorShapes[] = {
    {7, 13, 5, 0},
    {33, 17, 9, 0},
    {6, 24, 257, 320},
    {1024, 768, 3072, 0},
    {1024, 768, 50257, 50304},
};

TEST(GemmDescriptors, EveryLayerGemmMatchesItsPlan) {
  int built = 0;
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const Shape& s : kDescriptorShapes) {
      for (int bias = 0; bias < 2; ++bias) {
        for (int gelu = 0; gelu < 2; ++gelu) {
          const LayerGemm plan = ForwardPlan(s.n, s.c, s.oc, s.ld, bias, gelu);
          // Every form gemm.cc may run for this plan: the asked one and each fallback.
          std::vector<Epilogue> forms = {Epilogue::kNone};
          if (bias) forms.push_back(Epilogue::kBias);
          if (gelu && plan.gelu_aux_ld_ok) forms.push_back(plan.epilogue);
          for (const Epilogue e : forms) {
            CheckDescriptors(plan, e, GemmKind::kForward, dtype);
            ++built;
          }
        }
      }
      CheckDescriptors(BackwardInputPlan(s.n, s.c, s.oc, s.ld), Epilogue::kNone,
                       GemmKind::kBackwardInput, dtype);
      CheckDescriptors(BackwardWeightPlan(s.n, s.c, s.oc, s.ld), Epilogue::kNone,
                       GemmKind::kBackwardWeight, dtype);
      built += 2;
    }
  }
  // Per dtype and shape: forward 1 + 2 + 1 + 2 forms, +2 where aux_ld is a multiple of 8 (oc =
  // 3072 only), and the two backward GEMMs.
  EXPECT_EQ(built, 2 * (5 * (6 + 2) + 2));
}

// The same numbers derived by hand, so the plan and the builder cannot agree on a wrong answer.
TEST(GemmDescriptors, HandDerivedLayouts) {
  {  // out(7,5) = inp(7,13) @ w(5,13)^T: D^T(5,7) = w^T... as column-major: A = w (13,5)^T.
    const MatmulDescriptors d =
        BuildDescriptors(ForwardPlan(7, 13, 5, 0, true, false), Epilogue::kBias,
                         TypesFor(GemmKind::kForward, DType::kBF16), "test");
    EXPECT_EQ(DescAttr<int32_t>(d.op, CUBLASLT_MATMUL_DESC_TRANSA), int32_t(CUBLAS_OP_T));
    EXPECT_EQ(DescAttr<int32_t>(d.op, CUBLASLT_MATMUL_DESC_TRANSB), int32_t(CUBLAS_OP_N));
    EXPECT_EQ(DescAttr<uint32_t>(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE),
              uint32_t(CUBLASLT_EPILOGUE_BIAS));
    ExpectLayout(d.a, {CUDA_R_16BF, 13, 5, 13}, "w");
    ExpectLayout(d.b, {CUDA_R_16BF, 13, 7, 13}, "inp");
    ExpectLayout(d.c, {CUDA_R_16BF, 5, 7, 5}, "out");
  }
  {  // padded logits: out(6, 257; ld 320) = inp(6, 24) @ wte(257, 24)^T
    const MatmulDescriptors d =
        BuildDescriptors(ForwardPlan(6, 24, 257, 320, false, false), Epilogue::kNone,
                         TypesFor(GemmKind::kForward, DType::kF32), "test");
    ExpectLayout(d.a, {CUDA_R_32F, 24, 257, 24}, "wte");
    ExpectLayout(d.b, {CUDA_R_32F, 24, 6, 24}, "inp");
    ExpectLayout(d.c, {CUDA_R_32F, 257, 6, 320}, "logits");
  }
  {  // dinp(6,24) = dlogits(6,257; ld 320) @ wte(257,24)
    const MatmulDescriptors d =
        BuildDescriptors(BackwardInputPlan(6, 24, 257, 320), Epilogue::kNone,
                         TypesFor(GemmKind::kBackwardInput, DType::kBF16), "test");
    EXPECT_EQ(DescAttr<int32_t>(d.op, CUBLASLT_MATMUL_DESC_TRANSA), int32_t(CUBLAS_OP_N));
    EXPECT_EQ(DescAttr<int32_t>(d.op, CUBLASLT_MATMUL_DESC_TRANSB), int32_t(CUBLAS_OP_N));
    ExpectLayout(d.a, {CUDA_R_16BF, 24, 257, 24}, "wte");
    ExpectLayout(d.b, {CUDA_R_16BF, 257, 6, 320}, "dlogits");
    ExpectLayout(d.c, {CUDA_R_16BF, 24, 6, 24}, "dinp");
  }
  {  // dwte(257,24) += dlogits(6,257; ld 320)^T @ inp(6,24), fp32 out from bf16 in
    const MatmulDescriptors d =
        BuildDescriptors(BackwardWeightPlan(6, 24, 257, 320), Epilogue::kNone,
                         TypesFor(GemmKind::kBackwardWeight, DType::kBF16), "test");
    EXPECT_EQ(DescAttr<int32_t>(d.op, CUBLASLT_MATMUL_DESC_TRANSA), int32_t(CUBLAS_OP_N));
    EXPECT_EQ(DescAttr<int32_t>(d.op, CUBLASLT_MATMUL_DESC_TRANSB), int32_t(CUBLAS_OP_T));
    ExpectLayout(d.a, {CUDA_R_16BF, 24, 6, 24}, "inp");
    ExpectLayout(d.b, {CUDA_R_16BF, 257, 6, 320}, "dlogits");
    ExpectLayout(d.c, {CUDA_R_32F, 24, 257, 24}, "dwte");
  }
  {  // the MLP fc with GELU: aux = gelu_pre (N, 3072), ld 3072
    const MatmulDescriptors d =
        BuildDescriptors(ForwardPlan(1024, 768, 3072, 0, true, true), Epilogue::kGeluAuxBias,
                         TypesFor(GemmKind::kForward, DType::kBF16), "test");
    EXPECT_EQ(DescAttr<uint32_t>(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE),
              uint32_t(CUBLASLT_EPILOGUE_GELU_AUX_BIAS));
    EXPECT_EQ(DescAttr<int64_t>(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD), 3072);
    ExpectLayout(d.c, {CUDA_R_16BF, 3072, 1024, 3072}, "out");
  }
}

TEST(GemmDescriptors, RejectsEpiloguesThePlanDoesNotAllow) {
  const GemmTypes f32 = TypesFor(GemmKind::kForward, DType::kF32);
  EXPECT_THROW(BuildDescriptors(BackwardInputPlan(7, 13, 5, 0), Epilogue::kBias, f32, "t"),
               DeviceError);
  EXPECT_THROW(BuildDescriptors(ForwardPlan(7, 13, 5, 0, false, false), Epilogue::kBias, f32, "t"),
               DeviceError);
  // oc = 5: aux_ld 5 is not a multiple of 8.
  EXPECT_THROW(
      BuildDescriptors(ForwardPlan(7, 13, 5, 0, true, true), Epilogue::kGeluAuxBias, f32, "t"),
      DeviceError);
  EXPECT_THROW(
      BuildDescriptors(ForwardPlan(8, 16, 40, 0, false, true), Epilogue::kGeluAuxBias, f32, "t"),
      DeviceError);
  EXPECT_NO_THROW(
      BuildDescriptors(ForwardPlan(8, 16, 40, 0, false, true), Epilogue::kGeluAux, f32, "t"));
  EXPECT_THROW(BuildDescriptors(ForwardPlan(8, 16, 40, 0, false, false), Epilogue::kNone,
                                {DType::kF64, DType::kF64}, "t"),
               DeviceError);
}

TEST(GemmDescriptors, TypesAndPreferences) {
  EXPECT_EQ(CudaDataType(DType::kF32, "t"), CUDA_R_32F);
  EXPECT_EQ(CudaDataType(DType::kBF16, "t"), CUDA_R_16BF);
  EXPECT_THROW(CudaDataType(DType::kF64, "t"), DeviceError);
  EXPECT_THROW(CudaDataType(DType::kI32, "t"), DeviceError);
  EXPECT_EQ(TypesFor(GemmKind::kForward, DType::kBF16).cd, DType::kBF16);
  EXPECT_EQ(TypesFor(GemmKind::kBackwardInput, DType::kBF16).cd, DType::kBF16);
  EXPECT_EQ(TypesFor(GemmKind::kBackwardWeight, DType::kBF16).ab, DType::kBF16);
  EXPECT_EQ(TypesFor(GemmKind::kBackwardWeight, DType::kBF16).cd, DType::kF32);

  Alignments al;
  al.a = 256;
  al.b = 16;
  al.c = 4;
  const uint64_t workspace = uint64_t(device::cuda::kBlasWorkspaceBytes);
  const MatmulPreference f32 =
      BuildPreference(al, TypesFor(GemmKind::kForward, DType::kF32), workspace, "t");
  EXPECT_EQ(PrefAttr<uint64_t>(f32.pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES),
            uint64_t{32} << 20);
  EXPECT_EQ(PrefAttr<uint32_t>(f32.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES), 256u);
  EXPECT_EQ(PrefAttr<uint32_t>(f32.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES), 16u);
  EXPECT_EQ(PrefAttr<uint32_t>(f32.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES), 4u);
  EXPECT_EQ(PrefAttr<uint32_t>(f32.pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES), 4u);
  const uint64_t mask = PrefAttr<uint64_t>(f32.pref, CUBLASLT_MATMUL_PREF_IMPL_MASK);
  EXPECT_EQ(mask & CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_TF32, 0u);  // no TF32 for fp32
  EXPECT_EQ(mask & CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_16BF, 0u);
  EXPECT_NE(mask & CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_32F, 0u);
  EXPECT_NE(mask & CUBLASLT_NUMERICAL_IMPL_FLAGS_FMA, 0u);

  const MatmulPreference bf16 =
      BuildPreference(al, TypesFor(GemmKind::kForward, DType::kBF16), workspace, "t");
  EXPECT_NE(PrefAttr<uint64_t>(bf16.pref, CUBLASLT_MATMUL_PREF_IMPL_MASK) &
                CUBLASLT_NUMERICAL_IMPL_FLAGS_INPUT_16BF,
            0u);
}

// gemm.cc checks its arguments before it touches the device (the context is never read here).
TEST(GemmArguments, BadDtypeAndShapeAreDeviceErrors) {
  const device::cuda::CallSite site{nullptr, "fc forward, on test"};
  float dummy[8] = {};
  try {
    MatmulForward(site, DType::kF64, dummy, dummy, dummy, nullptr, 1, 1, 1);
    FAIL() << "expected a DeviceError";
  } catch (const DeviceError& error) {
    EXPECT_NE(std::string(error.what()).find("f64"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("fc forward"), std::string::npos) << error.what();
  }
  try {
    MatmulBackwardInput(site, DType::kF32, dummy, dummy, dummy, 7, 13, 5, /*ld_dout=*/4);
    FAIL() << "expected a DeviceError";
  } catch (const DeviceError& error) {
    EXPECT_NE(std::string(error.what()).find("ld_dout=4"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("fc forward"), std::string::npos) << error.what();
  }
  EXPECT_THROW(MatmulBackwardWeight(site, DType::kI32, dummy, nullptr, dummy, dummy, 1, 1, 1),
               DeviceError);
  // An empty batch is nothing to do.
  EXPECT_NO_THROW(MatmulForward(site, DType::kF32, dummy, dummy, dummy, nullptr, 0, 13, 5));
}

// ---------------------------------------------------------------- on a GPU

constexpr double kF32Tol = 1e-4;
constexpr double kBf16Tol = 1e-2;
constexpr double kBf16InF32OutTol = 1e-3;
// Exactly representable in bf16 (1234.5 was not: it read back as 1232, and every bf16 case with
// padding failed; the emulated device found it).
constexpr float kSentinel = 1232.0f;

std::vector<float> Random(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> magnitude(0.1f, 1.0f);
  std::vector<float> values(count);
  for (float& v : values) v = (rng() & 1 ? 1.0f : -1.0f) * magnitude(rng);
  return values;
}

// The values the GPU sees: rounded to bf16 for bf16.
std::vector<float> AsSeen(DType dtype, std::vector<float> values) {
  if (dtype == DType::kBF16) {
    for (float& v : values) v = memory::ToFloat(memory::ToBFloat16(v));
  }
  return values;
}

void Check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
  }
}

// Device memory holding `values` as `dtype`.
class DeviceBuffer {
 public:
  DeviceBuffer(DType dtype, const std::vector<float>& values)
      : dtype_(dtype), count_(values.size()) {
    const size_t bytes = count_ * memory::DTypeSize(dtype);
    Check(cudaMalloc(&ptr_, std::max<size_t>(bytes, 256)), "cudaMalloc");
    if (dtype == DType::kBF16) {
      std::vector<memory::BFloat16> host(count_);
      for (size_t i = 0; i < count_; ++i) host[i] = memory::ToBFloat16(values[i]);
      Check(cudaMemcpy(ptr_, host.data(), bytes, cudaMemcpyHostToDevice), "upload");
    } else {
      Check(cudaMemcpy(ptr_, values.data(), bytes, cudaMemcpyHostToDevice), "upload");
    }
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(ptr_); }

  void* get() const { return ptr_; }
  float* f32() const { return static_cast<float*>(ptr_); }
  std::vector<float> Download() const {
    Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    std::vector<float> values(count_);
    if (dtype_ == DType::kBF16) {
      std::vector<memory::BFloat16> host(count_);
      Check(cudaMemcpy(host.data(), ptr_, count_ * 2, cudaMemcpyDeviceToHost), "download");
      for (size_t i = 0; i < count_; ++i) values[i] = memory::ToFloat(host[i]);
    } else {
      Check(cudaMemcpy(values.data(), ptr_, count_ * 4, cudaMemcpyDeviceToHost), "download");
    }
    return values;
  }

 private:
  DType dtype_;
  size_t count_;
  void* ptr_ = nullptr;
};

double MaxAbs(const std::vector<float>& values) {
  double max = 0;
  for (float v : values) max = std::max(max, std::fabs(double(v)));
  return max;
}

// max |got - want| over (rows, cols), got with row stride ld_got, want compact.
double MaxDiff(const std::vector<float>& got, int64_t ld_got, const std::vector<float>& want,
               int64_t rows, int64_t cols) {
  double diff = 0;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      diff = std::max(diff, std::fabs(double(got[i * ld_got + j]) - double(want[i * cols + j])));
    }
  }
  return diff;
}

bool PaddingUntouched(const std::vector<float>& values, int64_t rows, int64_t cols, int64_t ld) {
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = cols; j < ld; ++j) {
      if (values[i * ld + j] != kSentinel) return false;
    }
  }
  return true;
}

double Tol(DType dtype) { return dtype == DType::kBF16 ? kBf16Tol : kF32Tol; }

class CudaGemm : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (comm::cuda::DeviceCount() == 0) return;
    try {
      context_ = new CudaContext;
      context_->ordinal = 0;
      context_->label = "cuda_gemm_test (cuda:0)";
      Check(cudaSetDevice(0), "cudaSetDevice");
      Check(cudaStreamCreate(&context_->stream), "cudaStreamCreate");
      const cublasStatus_t status = cublasLtCreate(&context_->blas_lt);
      if (status != CUBLAS_STATUS_SUCCESS) {
        throw std::runtime_error(std::string("cublasLtCreate: ") + cublasLtGetStatusName(status));
      }
      Check(cudaMalloc(&context_->blas_workspace, device::cuda::kBlasWorkspaceBytes), "workspace");
      Check(cudaMalloc(&context_->reduce_scratch, device::cuda::kReduceScratchBytes), "scratch");
      cudaDeviceProp prop{};
      Check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
      context_->multiprocessors = prop.multiProcessorCount;
      context_->compute_capability = prop.major * 10 + prop.minor;
    } catch (const std::exception& error) {
      setup_error_ = error.what();
    }
  }
  static void TearDownTestSuite() {
    if (!context_) return;
    cudaFree(context_->reduce_scratch);
    cudaFree(context_->blas_workspace);
    if (context_->blas_lt) cublasLtDestroy(context_->blas_lt);
    if (context_->stream) cudaStreamDestroy(context_->stream);
    delete context_;
    context_ = nullptr;
  }
  void SetUp() override {
    if (comm::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    ASSERT_TRUE(setup_error_.empty()) << "test context: " << setup_error_;
    SetEpilogueFusion(true);
  }
  void TearDown() override { SetEpilogueFusion(true); }

  device::cuda::CallSite Site(const std::string& what) const {
    return device::cuda::SiteOf(*context_, what);
  }

  static CudaContext* context_;
  static std::string setup_error_;
};

CudaContext* CudaGemm::context_ = nullptr;
std::string CudaGemm::setup_error_;

const Shape kGpuShapes[] = {
    {7, 13, 5, 0},   {33, 17, 9, 0},   {7, 13, 5, 8},       {6, 24, 257, 320},
    {16, 64, 40, 0}, {64, 128, 96, 0}, {256, 768, 2304, 0},
};

struct ForwardResult {
  double out_diff, out_max, pre_diff, pre_max;
  bool padding_ok;
};

ForwardResult RunForward(const device::cuda::CallSite& site, DType dtype, const Shape& s,
                         bool with_bias, bool with_gelu) {
  const int64_t ld = s.ld == 0 ? s.oc : s.ld;
  const std::vector<float> inp = AsSeen(dtype, Random(size_t(s.n) * s.c, 1));
  const std::vector<float> w = AsSeen(dtype, Random(size_t(s.oc) * s.c, 2));
  const std::vector<float> bias = AsSeen(dtype, Random(s.oc, 3));
  std::vector<float> pre(size_t(s.n) * s.oc);
  cpu::MatmulForward(pre.data(), inp.data(), w.data(), with_bias ? bias.data() : nullptr, s.n, s.c,
                     s.oc);
  std::vector<float> want = pre;
  if (with_gelu) cpu::GeluForward(want.data(), pre.data(), int64_t(want.size()));

  const DeviceBuffer d_inp(dtype, inp), d_w(dtype, w), d_bias(dtype, bias);
  const DeviceBuffer d_out(dtype, std::vector<float>(size_t(s.n) * ld, kSentinel));
  const DeviceBuffer d_pre(dtype, std::vector<float>(size_t(s.n) * s.oc, kSentinel));
  MatmulForward(site, dtype, d_out.get(), d_inp.get(), d_w.get(),
                with_bias ? d_bias.get() : nullptr, s.n, s.c, s.oc, s.ld,
                with_gelu ? d_pre.get() : nullptr);
  const std::vector<float> out = d_out.Download();
  ForwardResult r{};
  r.out_diff = MaxDiff(out, ld, want, s.n, s.oc);
  r.out_max = MaxAbs(want);
  r.padding_ok = PaddingUntouched(out, s.n, s.oc, ld);
  if (with_gelu) {
    r.pre_diff = MaxDiff(d_pre.Download(), s.oc, pre, s.n, s.oc);
    r.pre_max = MaxAbs(pre);
  }
  return r;
}

TEST_F(CudaGemm, ForwardMatchesCpu) {
  for (const bool fusion : {true, false}) {
    SetEpilogueFusion(fusion);
    for (const DType dtype : {DType::kF32, DType::kBF16}) {
      for (const Shape& s : kGpuShapes) {
        for (int bias = 0; bias < 2; ++bias) {
          for (int gelu = 0; gelu < 2; ++gelu) {
            SCOPED_TRACE(testing::Message()
                         << memory::DTypeName(dtype) << " n=" << s.n << " c=" << s.c
                         << " oc=" << s.oc << " ld_out=" << s.ld << " bias=" << bias
                         << " gelu=" << gelu << " fusion=" << fusion);
            const ForwardResult r = RunForward(Site("forward test"), dtype, s, bias, gelu);
            EXPECT_LE(r.out_diff, Tol(dtype) * r.out_max);
            EXPECT_TRUE(r.padding_ok);
            if (gelu) {
              EXPECT_LE(r.pre_diff, Tol(dtype) * r.pre_max);
            }
          }
        }
      }
    }
  }
}

// The fused forms do run where they are allowed (bf16 MLP-like shapes on Hopper), and the
// unfused path runs when fusion is off.
TEST_F(CudaGemm, FusedEpiloguesAreUsedWhereAllowed) {
  const Shape s{64, 128, 96, 0};
  GemmStats before = GetGemmStats();
  RunForward(Site("fused test"), DType::kBF16, s, true, true);
  GemmStats after = GetGemmStats();
  const int gelu_bias = static_cast<int>(Epilogue::kGeluAuxBias);
  const int bias = static_cast<int>(Epilogue::kBias);
  EXPECT_EQ(after.calls_by_epilogue[gelu_bias] - before.calls_by_epilogue[gelu_bias], 1)
      << "bf16 GELU_AUX_BIAS was not served (the fallback ran)";
  before = after;
  RunForward(Site("fused test"), DType::kBF16, s, true, false);
  after = GetGemmStats();
  EXPECT_EQ(after.calls_by_epilogue[bias] - before.calls_by_epilogue[bias], 1);
  // fp32: reported, not required.
  before = after;
  RunForward(Site("fused test"), DType::kF32, s, true, true);
  after = GetGemmStats();
  std::printf(
      "fp32 GELU_AUX_BIAS fused: %s; heuristic queries %lld, misses %lld\n",
      after.calls_by_epilogue[gelu_bias] > before.calls_by_epilogue[gelu_bias] ? "yes" : "no",
      static_cast<long long>(after.heuristic_queries),
      static_cast<long long>(after.heuristic_misses));
  SetEpilogueFusion(false);
  before = GetGemmStats();
  RunForward(Site("unfused test"), DType::kBF16, s, true, true);
  after = GetGemmStats();
  const int none = static_cast<int>(Epilogue::kNone);
  EXPECT_EQ(after.calls_by_epilogue[none] - before.calls_by_epilogue[none], 1);
}

TEST_F(CudaGemm, BackwardInputMatchesCpu) {
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const Shape& s : kGpuShapes) {
      SCOPED_TRACE(testing::Message() << memory::DTypeName(dtype) << " n=" << s.n << " c=" << s.c
                                      << " oc=" << s.oc << " ld_dout=" << s.ld);
      const int64_t ld = s.ld == 0 ? s.oc : s.ld;
      const std::vector<float> dout_padded = AsSeen(dtype, Random(size_t(s.n) * ld, 4));
      std::vector<float> dout(size_t(s.n) * s.oc);
      for (int i = 0; i < s.n; ++i) {
        std::copy_n(dout_padded.begin() + i * ld, s.oc, dout.begin() + i * s.oc);
      }
      const std::vector<float> w = AsSeen(dtype, Random(size_t(s.oc) * s.c, 5));
      std::vector<float> want(size_t(s.n) * s.c);
      cpu::MatmulBackwardInput(want.data(), dout.data(), w.data(), s.n, s.c, s.oc);
      const DeviceBuffer d_dout(dtype, dout_padded), d_w(dtype, w);
      const DeviceBuffer d_dinp(dtype, std::vector<float>(want.size(), kSentinel));
      MatmulBackwardInput(Site("backward input test"), dtype, d_dinp.get(), d_dout.get(), d_w.get(),
                          s.n, s.c, s.oc, s.ld);
      EXPECT_LE(MaxDiff(d_dinp.Download(), s.c, want, s.n, s.c), Tol(dtype) * MaxAbs(want));
    }
  }
}

TEST_F(CudaGemm, BackwardWeightAccumulatesLikeCpu) {
  for (const DType dtype : {DType::kF32, DType::kBF16}) {
    for (const Shape& s : kGpuShapes) {
      for (int with_bias = 0; with_bias < 2; ++with_bias) {
        SCOPED_TRACE(testing::Message()
                     << memory::DTypeName(dtype) << " n=" << s.n << " c=" << s.c << " oc=" << s.oc
                     << " ld_dout=" << s.ld << " dbias=" << with_bias);
        const int64_t ld = s.ld == 0 ? s.oc : s.ld;
        const std::vector<float> dout_padded = AsSeen(dtype, Random(size_t(s.n) * ld, 6));
        std::vector<float> dout(size_t(s.n) * s.oc);
        for (int i = 0; i < s.n; ++i) {
          std::copy_n(dout_padded.begin() + i * ld, s.oc, dout.begin() + i * s.oc);
        }
        const std::vector<float> inp = AsSeen(dtype, Random(size_t(s.n) * s.c, 7));
        const std::vector<float> dw0 = Random(size_t(s.oc) * s.c, 8);  // fp32 master gradients
        const std::vector<float> db0 = Random(s.oc, 9);
        std::vector<float> want_dw = dw0, want_db = db0;
        cpu::MatmulBackwardWeight(want_dw.data(), with_bias ? want_db.data() : nullptr, dout.data(),
                                  inp.data(), s.n, s.c, s.oc);
        const DeviceBuffer d_dout(dtype, dout_padded), d_inp(dtype, inp);
        const DeviceBuffer d_dw(DType::kF32, dw0), d_db(DType::kF32, db0);
        MatmulBackwardWeight(Site("backward weight test"), dtype, d_dw.f32(),
                             with_bias ? d_db.f32() : nullptr, d_dout.get(), d_inp.get(), s.n, s.c,
                             s.oc, s.ld);
        const double tol = dtype == DType::kBF16 ? kBf16InF32OutTol : kF32Tol;
        EXPECT_LE(MaxDiff(d_dw.Download(), s.c, want_dw, s.oc, s.c), tol * MaxAbs(want_dw));
        const std::vector<float> db = d_db.Download();
        if (with_bias) {
          EXPECT_LE(MaxDiff(db, s.oc, want_db, 1, s.oc), tol * MaxAbs(want_db));
        } else {
          EXPECT_EQ(db, db0);  // untouched
        }
      }
    }
  }
}

// fp32 stays fp32: inputs 1 + 2^-20 (TF32 keeps 10 mantissa bits, so it would read 1) times 1,
// summed over k = 64, is exactly 64 * (1 + 2^-20) in fp32 arithmetic.
TEST_F(CudaGemm, Fp32HasNoTf32) {
  const int n = 16, c = 64, oc = 32;
  const float x = 1.0f + std::ldexp(1.0f, -20);
  const DeviceBuffer d_inp(DType::kF32, std::vector<float>(size_t(n) * c, x));
  const DeviceBuffer d_w(DType::kF32, std::vector<float>(size_t(oc) * c, 1.0f));
  const DeviceBuffer d_out(DType::kF32, std::vector<float>(size_t(n) * oc, kSentinel));
  MatmulForward(Site("tf32 test"), DType::kF32, d_out.get(), d_inp.get(), d_w.get(), nullptr, n, c,
                oc);
  const float want = float(c) * x;
  ASSERT_NE(want, float(c));
  for (float v : d_out.Download()) ASSERT_EQ(v, want);
}

// A second call with the same shape reuses the cached descriptors and algorithm.
TEST_F(CudaGemm, DescriptorsAreCachedPerShape) {
  const Shape s{33, 17, 9, 0};
  RunForward(Site("cache test"), DType::kF32, s, true, false);
  const GemmStats before = GetGemmStats();
  RunForward(Site("cache test"), DType::kF32, s, true, false);
  EXPECT_EQ(GetGemmStats().heuristic_queries, before.heuristic_queries);
}

}  // namespace
}  // namespace bigmac::stages::cuda
