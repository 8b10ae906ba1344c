// Every layer's gradients, and the whole model's, against central finite differences, all in
// double precision, on seeded random inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "core/engine/stage.h"
#include "core/layer/layer.h"
#include "stages/gpt/init.h"

namespace bigmac {
namespace {

using layer::MicroBatch;
using memory::DType;
using memory::Tensor;

constexpr double kEps = 1e-5;
constexpr double kAbsTol = 1e-8;
constexpr double kRelTol = 1e-6;

layer::ModelDims Dims() {
  layer::ModelDims dims;
  dims.vocab_size = 11;
  dims.hidden_size = 8;
  dims.num_heads = 2;
  dims.num_layers = 3;
  dims.max_seq_length = 6;
  return dims;
}

struct Batch {
  std::vector<int32_t> tokens;
  std::vector<int32_t> targets;
  MicroBatch mb;
};

Batch MakeBatch(int b, int t, int vocab) {
  Batch batch;
  for (int i = 0; i < b * t; ++i) {
    batch.tokens.push_back((i * 7 + 3) % vocab);
    batch.targets.push_back((i * 5 + 1) % vocab);
  }
  batch.mb.batch = b;
  batch.mb.seq = t;
  batch.mb.tokens = batch.tokens.data();
  batch.mb.targets = batch.targets.data();
  batch.mb.loss_scale = 1.0 / (b * t);
  return batch;
}

// Compares `analytic` with central differences of `objective` over every element of `value`.
void CheckAllElements(
    const std::string& what, Tensor* value, const Tensor& analytic,
    const std::function<double()>& objective, const std::function<void()>& after_change = [] {}) {
  double* v = value->data<double>();
  const double* a = analytic.data<double>();
  int bad = 0;
  for (int64_t i = 0; i < value->numel(); ++i) {
    const double original = v[i];
    v[i] = original + kEps;
    after_change();
    const double plus = objective();
    v[i] = original - kEps;
    after_change();
    const double minus = objective();
    v[i] = original;
    after_change();
    const double numeric = (plus - minus) / (2 * kEps);
    if (std::fabs(numeric - a[i]) > kAbsTol + kRelTol * std::fabs(numeric) && ++bad <= 5) {
      ADD_FAILURE() << what << "[" << i << "]: analytic " << a[i] << " vs numeric " << numeric;
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

double Dot(const Tensor& a, const Tensor& b) {
  double sum = 0;
  for (int64_t i = 0; i < a.numel(); ++i) sum += a.data<double>()[i] * b.data<double>()[i];
  return sum;
}

// A layer of the test's small model (the allocator outlives it).
layer::LayerSpec Spec(const std::string& type, int layer_id, DType dtype,
                      memory::DeviceAllocator* allocator, bool checkpointing = false) {
  layer::LayerSpec spec;
  spec.type = type;
  spec.layer_id = layer_id;
  spec.dims = Dims();
  spec.dtype = dtype;
  spec.allocator = allocator;
  spec.activation_checkpointing = checkpointing;
  return spec;
}

// A layer checked through J = sum(y * R) (or J = loss for the head).
void CheckLayer(const std::string& type, bool checkpointing) {
  memory::DeviceAllocator allocator("cpu:0", int64_t{1} << 30);
  const layer::LayerSpec spec = Spec(type,
                                     type == "gpt_embedding" ? layer::kEmbeddingLayerId
                                     : type == "gpt_head"    ? 3
                                                             : 1,
                                     DType::kF64, &allocator, checkpointing);
  auto layer = layer::CreateLayer(spec);
  layer->InitParams(42);
  // Perturb every parameter off its initial value (LayerNorm weights start at exactly 1, ...).
  for (layer::Param* param : layer->Params()) {
    Tensor noise(&allocator, param->value.shape(), DType::kF64);
    stages::gpt::FillNormal(&noise, 0.1, 7, spec.layer_id, param->name);
    for (int64_t i = 0; i < noise.numel(); ++i)
      param->value.data<double>()[i] += noise.data<double>()[i];
  }
  Batch batch = MakeBatch(2, 5, spec.dims.vocab_size);
  const bool is_head = type == "gpt_head";
  Tensor x(&allocator, {2, 5, spec.dims.hidden_size}, DType::kF64);
  stages::gpt::FillNormal(&x, 1.0, 3, 0, "x");
  Tensor r(&allocator, {2, 5, spec.dims.hidden_size}, DType::kF64);
  stages::gpt::FillNormal(&r, 1.0, 5, 0, "r");

  auto objective = [&] {
    layer::Saved saved;
    Tensor y;
    layer->Forward(batch.mb, x, &y, &saved);
    return is_head ? y.data<double>()[0] : Dot(y, r);
  };
  layer::Saved saved;
  Tensor y;
  layer->Forward(batch.mb, x, &y, &saved);
  Tensor dx;
  layer->BackwardInput(batch.mb, r, type == "gpt_embedding" ? nullptr : &dx, &saved);
  layer->BackwardWeight(batch.mb, &saved);
  EXPECT_TRUE(saved.tensors.empty()) << "BackwardWeight releases what Forward kept";

  for (layer::Param* param : layer->Params()) {
    CheckAllElements(type + "/" + param->name, &param->value, param->grad, objective);
  }
  if (type != "gpt_embedding") CheckAllElements(type + "/input", &x, dx, objective);
}

TEST(GradCheck, Embedding) { CheckLayer("gpt_embedding", false); }
TEST(GradCheck, Block) { CheckLayer("gpt_block", false); }
TEST(GradCheck, BlockWithActivationCheckpointing) { CheckLayer("gpt_block", true); }
TEST(GradCheck, Head) { CheckLayer("gpt_head", false); }

// The whole model: embedding, 3 blocks, head, with the tied token embedding (its gradient is the
// sum of the embedding's and the head's contributions).
TEST(GradCheck, WholeModelWithTiedEmbedding) {
  memory::DeviceAllocator allocator("cpu:0", int64_t{1} << 30);
  partition::PartitionSpec pspec;
  pspec.num_layers = Dims().num_layers;
  const partition::Partition partition = partition::MakePartition(pspec);
  engine::StageOptions options;
  options.dims = Dims();
  options.dtype = DType::kF64;
  options.allocator = &allocator;
  options.seed = 11;
  engine::Stage stage(options, partition, 0);
  Batch batch = MakeBatch(2, 6, options.dims.vocab_size);
  stage.ZeroGrads();
  stage.ForwardBackward(batch.mb);
  stage.ReduceTiedGradients();
  for (const auto& named : stage.OwnedParams()) {
    CheckAllElements(
        named.name, &named.param->value, named.param->grad,
        [&] { return stage.ForwardLoss(batch.mb); }, [&] { stage.SyncTiedCopies(); });
  }
}

TEST(Registry, UnknownLayerTypeListsTheKnownOnes) {
  memory::DeviceAllocator allocator("cpu:0", 1 << 20);
  layer::LayerSpec spec;
  spec.type = "gpt_blok";
  spec.allocator = &allocator;
  try {
    layer::CreateLayer(spec);
    FAIL();
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what())
                  .find("unknown type 'gpt_blok'; known types: gpt_block, gpt_embedding, gpt_head"),
              std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace bigmac

namespace bigmac {
namespace {

// What a layer reports as its activation bytes is what its Forward keeps.
TEST(LayerReports, ActivationBytesMatchWhatForwardKeeps) {
  for (bool checkpointing : {false, true}) {
    memory::DeviceAllocator allocator("cpu:0", int64_t{1} << 30);
    const layer::LayerSpec spec = Spec("gpt_block", 0, DType::kF32, &allocator, checkpointing);
    auto block = layer::CreateLayer(spec);
    block->InitParams(1);
    Batch batch = MakeBatch(2, 6, spec.dims.vocab_size);
    Tensor x(&allocator, {2, 6, spec.dims.hidden_size}, DType::kF32);
    layer::Saved saved;
    Tensor y;
    block->Forward(batch.mb, x, &y, &saved);
    EXPECT_EQ(saved.bytes(), block->ActivationBytes(2, 6)) << "checkpointing=" << checkpointing;
    // 12 C^2 multiply-adds per token for the four matmuls, plus causal attention.
    const int64_t c = spec.dims.hidden_size;
    EXPECT_EQ(block->ForwardFlops(2, 6), 2 * 12 * 12 * c * c + 2 * 2 * 36 * c);
  }
}

// Softmax and log-sum-exp subtract the maximum: huge logits give a finite, exact loss.
TEST(Numerics, CrossEntropyIsStableForHugeLogits) {
  memory::DeviceAllocator allocator("cpu:0", int64_t{1} << 30);
  const layer::LayerSpec spec = Spec("gpt_head", 3, DType::kF32, &allocator);
  auto head = layer::CreateLayer(spec);
  head->InitParams(1);
  // Scale the output projection so that logits reach the thousands.
  for (layer::Param* param : head->Params()) {
    if (param->name != "wte") continue;
    for (int64_t i = 0; i < param->value.numel(); ++i) param->value.data<float>()[i] *= 1e5f;
  }
  Batch batch = MakeBatch(2, 6, spec.dims.vocab_size);
  Tensor x(&allocator, {2, 6, spec.dims.hidden_size}, DType::kF32);
  stages::gpt::FillNormal(&x, 1.0, 9, 0, "x");
  layer::Saved saved;
  Tensor loss;
  head->Forward(batch.mb, x, &loss, &saved);
  EXPECT_TRUE(std::isfinite(loss.data<float>()[0]));
  EXPECT_GT(loss.data<float>()[0], 10.0f) << "a confident wrong prediction costs a lot";
  Tensor dx;
  head->BackwardInput(batch.mb, loss, &dx, &saved);
  head->BackwardWeight(batch.mb, &saved);
  for (int64_t i = 0; i < dx.numel(); ++i) ASSERT_TRUE(std::isfinite(dx.data<float>()[i]));
}

}  // namespace
}  // namespace bigmac
