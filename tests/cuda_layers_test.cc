// Every CUDA GPT and llama layer against the CPU layer: the same weights (initialised on the host
// from the same seed), the same seeded random inputs, forward outputs, input gradients and every
// parameter gradient compared at stated tolerances, in fp32 and in bf16 (against the CPU's bf16
// mode). Without a GPU every case reports as skipped.
//
// Tolerances, as max |gpu - cpu| / max |cpu| over a tensor:
// - fp32: 2e-4 (cuBLASLt and the kernels sum in another order than OpenBLAS and the CPU loops).
// - bf16: 6e-2 (the GPU keeps the block's internal activations in bf16; the CPU's bf16 mode
//   computes inside a layer in fp32 and rounds only at its boundary).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/comm/cuda/cuda_probe.h"
#include "core/device/cuda/cuda_device.h"
#include "core/layer/layer.h"
#include "stages/gpt/cuda/constraints.h"

namespace bigmac {
namespace {

using layer::DType;
using layer::Tensor;

constexpr double kFp32Tolerance = 2e-4;
constexpr double kBf16Tolerance = 6e-2;

#define REQUIRE_GPU() \
  if (comm::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine"

std::vector<float> ToHost(const Tensor& tensor) {
  Tensor wide(tensor.device(), tensor.shape(), DType::kF32);
  wide.ConvertFrom(tensor);
  std::vector<float> host(wide.numel());
  wide.CopyToHost(host.data());
  return host;
}

// A tensor of `dtype` holding `values` (rounded to bf16 when dtype is bf16).
Tensor FromHost(device::Device* device, std::vector<int64_t> shape, DType dtype,
                const std::vector<float>& values) {
  Tensor wide(device, shape, DType::kF32);
  wide.CopyFromHost(values.data());
  if (dtype == DType::kF32) return wide;
  Tensor narrow(device, shape, dtype);
  narrow.ConvertFrom(wide);
  return narrow;
}

std::vector<float> Random(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(n);
  for (float& v : values) v = normal(rng);
  return values;
}

double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  double max_diff = 0, max_abs = 1e-30;
  for (size_t i = 0; i < want.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(double(got[i]) - want[i]));
    max_abs = std::max(max_abs, std::fabs(double(want[i])));
  }
  return max_diff / max_abs;
}

struct Case {
  std::string type;
  layer::ModelDims dims;
  bool bf16 = false;
  bool checkpointing = false;
  int batch = 2;
  int seq = 16;
};

// One layer on each backend, built from one spec, holding the same initial weights.
struct LayerPair {
  std::unique_ptr<device::Device> cpu_device, gpu_device;
  std::unique_ptr<layer::Layer> cpu, gpu;
  double tolerance = kFp32Tolerance;

  explicit LayerPair(const Case& c) {
    cpu_device = device::MakeCpuDevice(0, int64_t{4} << 30);
    gpu_device = device::cuda::MakeCudaDevice(0, 0);
    tolerance = c.bf16 ? kBf16Tolerance : kFp32Tolerance;
    auto ends_with = [&](const std::string& suffix) {
      return c.type.size() >= suffix.size() &&
             c.type.compare(c.type.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    const int layer_id = ends_with("_embedding") ? layer::kEmbeddingLayerId
                         : ends_with("_head")    ? layer::HeadLayerId(c.dims.num_layers)
                                                 : 0;
    for (auto [device, out] : {std::pair{cpu_device.get(), &cpu}, {gpu_device.get(), &gpu}}) {
      layer::LayerSpec spec;
      spec.type = c.type;
      spec.layer_id = layer_id;
      spec.dims = c.dims;
      spec.bf16 = c.bf16;
      spec.device = device;
      spec.activation_checkpointing = c.checkpointing;
      *out = layer::CreateLayer(spec);
      (*out)->InitParams(1234);
      for (layer::Param* param : (*out)->Params()) layer::RefreshComputeCopy(param);
    }
  }

  void ExpectClose(const Tensor& gpu_tensor, const Tensor& cpu_tensor, const std::string& what) {
    ASSERT_EQ(gpu_tensor.shape(), cpu_tensor.shape()) << what;
    const double error = RelativeError(ToHost(gpu_tensor), ToHost(cpu_tensor));
    EXPECT_LE(error, tolerance) << what << " " << gpu_tensor.ShapeString();
    ::testing::Test::RecordProperty(what, std::to_string(error));
  }

  void ExpectGradientsClose() {
    const std::vector<layer::Param*> cpu_params = cpu->Params(), gpu_params = gpu->Params();
    ASSERT_EQ(cpu_params.size(), gpu_params.size());
    for (size_t i = 0; i < cpu_params.size(); ++i) {
      ASSERT_EQ(cpu_params[i]->name, gpu_params[i]->name);
      ExpectClose(gpu_params[i]->grad, cpu_params[i]->grad, "grad " + cpu_params[i]->name);
    }
  }
};

struct Batch {
  std::vector<int32_t> tokens, targets;
  Tensor gpu_tokens, gpu_targets;
  layer::MicroBatch cpu_mb, gpu_mb;

  Batch(device::Device* gpu, const Case& c) {
    std::mt19937 rng(7);
    std::uniform_int_distribution<int32_t> token(0, c.dims.vocab_size - 1);
    const int n = c.batch * c.seq;
    for (int i = 0; i < n; ++i) tokens.push_back(token(rng));
    for (int i = 0; i < n; ++i) targets.push_back(token(rng));
    gpu_tokens = Tensor(gpu, {n}, DType::kI32);
    gpu_targets = Tensor(gpu, {n}, DType::kI32);
    gpu_tokens.CopyFromHost(tokens.data());
    gpu_targets.CopyFromHost(targets.data());
    for (layer::MicroBatch* mb : {&cpu_mb, &gpu_mb}) {
      mb->batch = c.batch;
      mb->seq = c.seq;
      mb->loss_scale = 1.0 / n;
    }
    cpu_mb.tokens = tokens.data();
    cpu_mb.targets = targets.data();
    gpu_mb.tokens = gpu_tokens.data<int32_t>();
    gpu_mb.targets = gpu_targets.data<int32_t>();
  }
};

layer::ModelDims Dims(int hidden, int heads, int vocab = 97) {
  layer::ModelDims dims;
  dims.vocab_size = vocab;
  dims.hidden_size = hidden;
  dims.num_heads = heads;
  dims.num_layers = 2;
  dims.max_seq_length = 64;
  return dims;
}

// Forward, then backward of a (batch, seq, C) -> (batch, seq, C) block with random dy.
void CompareBlock(const Case& c) {
  LayerPair pair(c);
  Batch batch(pair.gpu_device.get(), c);
  const DType act = c.bf16 ? DType::kBF16 : DType::kF32;
  const std::vector<int64_t> shape = {c.batch, c.seq, c.dims.hidden_size};
  const int64_t n = int64_t{c.batch} * c.seq * c.dims.hidden_size;
  const std::vector<float> x = Random(n, 11), dy = Random(n, 12, 0.1f);
  Tensor cpu_x = FromHost(pair.cpu_device.get(), shape, act, x);
  Tensor gpu_x = FromHost(pair.gpu_device.get(), shape, act, x);
  Tensor cpu_y, gpu_y, cpu_dx, gpu_dx;
  layer::Saved cpu_saved, gpu_saved;
  pair.cpu->Forward(batch.cpu_mb, cpu_x, &cpu_y, &cpu_saved);
  pair.gpu->Forward(batch.gpu_mb, gpu_x, &gpu_y, &gpu_saved);
  pair.ExpectClose(gpu_y, cpu_y, "y");
  Tensor cpu_dy = FromHost(pair.cpu_device.get(), shape, act, dy);
  Tensor gpu_dy = FromHost(pair.gpu_device.get(), shape, act, dy);
  pair.cpu->BackwardInput(batch.cpu_mb, cpu_dy, &cpu_dx, &cpu_saved);
  pair.gpu->BackwardInput(batch.gpu_mb, gpu_dy, &gpu_dx, &gpu_saved);
  pair.ExpectClose(gpu_dx, cpu_dx, "dx");
  pair.cpu->BackwardWeight(batch.cpu_mb, &cpu_saved);
  pair.gpu->BackwardWeight(batch.gpu_mb, &gpu_saved);
  pair.ExpectGradientsClose();
}

TEST(CudaLayers, BlockFp32MatchesCpu) {
  REQUIRE_GPU();
  CompareBlock({"gpt_block", Dims(64, 4)});
}

TEST(CudaLayers, BlockBf16WithCudnnAttentionMatchesCpuBf16) {
  REQUIRE_GPU();
  CompareBlock({"gpt_block", Dims(128, 2), /*bf16=*/true});  // head dim 64: cuDNN
}

TEST(CudaLayers, BlockBf16WithFallbackAttentionMatchesCpuBf16) {
  REQUIRE_GPU();
  CompareBlock({"gpt_block", Dims(48, 4), /*bf16=*/true});  // head dim 12: the fallback
}

TEST(CudaLayers, BlockWithActivationCheckpointingMatchesCpu) {
  REQUIRE_GPU();
  CompareBlock({"gpt_block", Dims(64, 4), false, /*checkpointing=*/true, 3, 9});
  CompareBlock({"gpt_block", Dims(128, 2), true, /*checkpointing=*/true});
}

void CompareEmbedding(const Case& c) {
  LayerPair pair(c);
  Batch batch(pair.gpu_device.get(), c);
  const DType act = c.bf16 ? DType::kBF16 : DType::kF32;
  const std::vector<int64_t> shape = {c.batch, c.seq, c.dims.hidden_size};
  Tensor none, cpu_y, gpu_y, cpu_dx, gpu_dx;
  layer::Saved cpu_saved, gpu_saved;
  pair.cpu->Forward(batch.cpu_mb, none, &cpu_y, &cpu_saved);
  pair.gpu->Forward(batch.gpu_mb, none, &gpu_y, &gpu_saved);
  pair.ExpectClose(gpu_y, cpu_y, "y");
  const std::vector<float> dy = Random(int64_t{c.batch} * c.seq * c.dims.hidden_size, 13);
  Tensor cpu_dy = FromHost(pair.cpu_device.get(), shape, act, dy);
  Tensor gpu_dy = FromHost(pair.gpu_device.get(), shape, act, dy);
  pair.cpu->BackwardInput(batch.cpu_mb, cpu_dy, &cpu_dx, &cpu_saved);
  pair.gpu->BackwardInput(batch.gpu_mb, gpu_dy, &gpu_dx, &gpu_saved);
  pair.cpu->BackwardWeight(batch.cpu_mb, &cpu_saved);
  pair.gpu->BackwardWeight(batch.gpu_mb, &gpu_saved);
  pair.ExpectGradientsClose();
}

TEST(CudaLayers, EmbeddingMatchesCpu) {
  REQUIRE_GPU();
  CompareEmbedding({"gpt_embedding", Dims(64, 4)});
  CompareEmbedding({"gpt_embedding", Dims(64, 4), /*bf16=*/true});
}

void CompareHead(const Case& c) {
  LayerPair pair(c);
  Batch batch(pair.gpu_device.get(), c);
  const DType act = c.bf16 ? DType::kBF16 : DType::kF32;
  const std::vector<int64_t> shape = {c.batch, c.seq, c.dims.hidden_size};
  const std::vector<float> x = Random(int64_t{c.batch} * c.seq * c.dims.hidden_size, 14);
  Tensor cpu_x = FromHost(pair.cpu_device.get(), shape, act, x);
  Tensor gpu_x = FromHost(pair.gpu_device.get(), shape, act, x);
  Tensor cpu_loss, gpu_loss, cpu_dx, gpu_dx, unused;
  layer::Saved cpu_saved, gpu_saved;
  pair.cpu->Forward(batch.cpu_mb, cpu_x, &cpu_loss, &cpu_saved);
  pair.gpu->Forward(batch.gpu_mb, gpu_x, &gpu_loss, &gpu_saved);
  EXPECT_NEAR(gpu_loss.Scalar(), cpu_loss.Scalar(),
              (c.bf16 ? 2e-2 : 1e-5) * std::fabs(cpu_loss.Scalar()));
  pair.cpu->BackwardInput(batch.cpu_mb, unused, &cpu_dx, &cpu_saved);
  pair.gpu->BackwardInput(batch.gpu_mb, unused, &gpu_dx, &gpu_saved);
  pair.ExpectClose(gpu_dx, cpu_dx, "dx");
  pair.cpu->BackwardWeight(batch.cpu_mb, &cpu_saved);
  pair.gpu->BackwardWeight(batch.gpu_mb, &gpu_saved);
  pair.ExpectGradientsClose();
}

TEST(CudaLayers, HeadMatchesCpuWithAPaddedVocabulary) {
  REQUIRE_GPU();
  ASSERT_EQ(stages::gpt::cuda::PaddedVocab(97), 128);
  CompareHead({"gpt_head", Dims(64, 4, 97)});
  CompareHead({"gpt_head", Dims(64, 4, 97), /*bf16=*/true});
  CompareHead({"gpt_head", Dims(64, 4, 256), /*bf16=*/true});
}

// Two identical runs give bitwise-identical outputs and gradients (no float atomics).
TEST(CudaLayers, BlockIsDeterministic) {
  REQUIRE_GPU();
  const Case c{"gpt_block", Dims(128, 2), /*bf16=*/true};
  std::vector<std::vector<float>> runs[2];
  for (auto& run : runs) {
    LayerPair pair(c);
    Batch batch(pair.gpu_device.get(), c);
    const std::vector<int64_t> shape = {c.batch, c.seq, c.dims.hidden_size};
    const int64_t n = int64_t{c.batch} * c.seq * c.dims.hidden_size;
    Tensor x = FromHost(pair.gpu_device.get(), shape, DType::kBF16, Random(n, 21));
    Tensor dy = FromHost(pair.gpu_device.get(), shape, DType::kBF16, Random(n, 22, 0.1f));
    Tensor y, dx;
    layer::Saved saved;
    pair.gpu->Forward(batch.gpu_mb, x, &y, &saved);
    pair.gpu->BackwardInput(batch.gpu_mb, dy, &dx, &saved);
    pair.gpu->BackwardWeight(batch.gpu_mb, &saved);
    run.push_back(ToHost(y));
    run.push_back(ToHost(dx));
    for (layer::Param* param : pair.gpu->Params()) run.push_back(ToHost(param->grad));
  }
  ASSERT_EQ(runs[0].size(), runs[1].size());
  for (size_t i = 0; i < runs[0].size(); ++i) EXPECT_EQ(runs[0][i], runs[1][i]) << "tensor " << i;
}

// ---------------------------------------------------------------------------------------------
// llama: RMSNorm, RoPE, grouped-query attention, SwiGLU, no biases; same tolerances.

layer::ModelDims LlamaDims(int hidden, int heads, int kv_heads, int inner, int vocab = 97,
                           bool tied = false) {
  layer::ModelDims dims = Dims(hidden, heads, vocab);
  dims.arch = layer::Arch::kLlama;
  dims.num_kv_heads = kv_heads;
  dims.intermediate_size = inner;
  dims.rope_theta = 10000.0;
  dims.rms_norm_eps = 1e-5;
  dims.tie_embeddings = tied;
  return dims;
}

TEST(CudaLayers, LlamaBlockFp32MatchesCpu) {
  REQUIRE_GPU();
  CompareBlock({"llama_block", LlamaDims(64, 4, 2, 96)});  // groups of 2, head dim 16
  CompareBlock({"llama_block", LlamaDims(48, 4, 1, 40), false, false, 3, 9});  // multi-query
  CompareBlock({"llama_block", LlamaDims(32, 2, 2, 24)});                      // multi-head
}

TEST(CudaLayers, LlamaBlockBf16WithCudnnAttentionMatchesCpuBf16) {
  REQUIRE_GPU();
  // Head dim 64: cuDNN's grouped-query SDPA where it runs (the emulated device falls back).
  CompareBlock({"llama_block", LlamaDims(256, 4, 2, 128), /*bf16=*/true});
}

TEST(CudaLayers, LlamaBlockBf16WithFallbackAttentionMatchesCpuBf16) {
  REQUIRE_GPU();
  CompareBlock({"llama_block", LlamaDims(48, 4, 2, 64), /*bf16=*/true});  // head dim 12
}

TEST(CudaLayers, LlamaBlockWithActivationCheckpointingMatchesCpu) {
  REQUIRE_GPU();
  CompareBlock({"llama_block", LlamaDims(64, 4, 2, 96), false, /*checkpointing=*/true, 3, 9});
  CompareBlock({"llama_block", LlamaDims(256, 4, 2, 128), true, /*checkpointing=*/true});
}

TEST(CudaLayers, LlamaEmbeddingMatchesCpu) {
  REQUIRE_GPU();
  CompareEmbedding({"llama_embedding", LlamaDims(64, 4, 2, 96)});
  CompareEmbedding({"llama_embedding", LlamaDims(64, 4, 2, 96), /*bf16=*/true});
}

TEST(CudaLayers, LlamaHeadMatchesCpuUntiedAndTied) {
  REQUIRE_GPU();
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    CompareHead({"llama_head", LlamaDims(64, 4, 2, 96, 97, tied)});
    CompareHead({"llama_head", LlamaDims(64, 4, 2, 96, 97, tied), /*bf16=*/true});
    CompareHead({"llama_head", LlamaDims(64, 4, 2, 96, 256, tied), /*bf16=*/true});
  }
}

}  // namespace
}  // namespace bigmac
