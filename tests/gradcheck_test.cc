// Every layer's gradients, and the whole model's, against central finite differences, all in
// double precision, on seeded random inputs.
#include "tests/testing/gradcheck.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "core/engine/rank_model.h"
#include "core/layer/layer.h"
#include "plugins/sdk/init.h"

namespace bigmac {
namespace {

using layer::MicroBatch;
using memory::DType;
using memory::Tensor;

using testutil::Batch;
using testutil::CheckAllElements;
using testutil::CheckLayerGradients;
using testutil::MakeBatch;

layer::ModelDims Dims() { return testutil::GradcheckDims(); }

TEST(GradCheck, Embedding) {
  CheckLayerGradients("gpt_embedding", layer::kEmbeddingLayerId, false);
}
TEST(GradCheck, Block) { CheckLayerGradients("gpt_block", 1, false); }
TEST(GradCheck, BlockWithActivationCheckpointing) { CheckLayerGradients("gpt_block", 1, true); }
TEST(GradCheck, Head) { CheckLayerGradients("gpt_head", 3, false); }

// Llama: RMSNorm, RoPE, grouped-query attention (4 query heads over 2 key/value heads), SwiGLU.
TEST(GradCheck, LlamaEmbedding) {
  CheckLayerGradients("llama_embedding", layer::kEmbeddingLayerId, false,
                      testutil::LlamaGradcheckDims());
}
TEST(GradCheck, LlamaBlock) {
  CheckLayerGradients("llama_block", 1, false, testutil::LlamaGradcheckDims());
}
TEST(GradCheck, LlamaBlockWithActivationCheckpointing) {
  CheckLayerGradients("llama_block", 1, true, testutil::LlamaGradcheckDims());
}
TEST(GradCheck, LlamaBlockMultiQuery) {
  layer::ModelDims dims = testutil::LlamaGradcheckDims();
  dims.num_kv_heads = 1;
  CheckLayerGradients("llama_block", 1, false, dims);
}
TEST(GradCheck, LlamaHead) {
  CheckLayerGradients("llama_head", 3, false, testutil::LlamaGradcheckDims());
}

// The whole model: embedding, 3 blocks, head; with a tied token embedding its gradient is the sum
// of the embedding's and the head's contributions.
void CheckWholeModel(const layer::ModelDims& dims) {
  const std::unique_ptr<device::Device> cpu = device::MakeCpuDevice(0, int64_t{1} << 30);
  partition::PartitionSpec pspec;
  pspec.num_layers = dims.num_layers;
  const partition::Partition partition = partition::MakePartition(pspec);
  engine::RankModelOptions options;
  options.dims = dims;
  options.dtype = DType::kF64;
  options.device = cpu.get();
  options.seed = 11;
  engine::RankModel stage(options, partition, 0);
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

TEST(GradCheck, WholeModelWithTiedEmbedding) { CheckWholeModel(Dims()); }
// The whole llama model at GPT's check size (hidden 8, 2 query heads sharing 1 key/value head,
// SwiGLU 8 wide): a whole-model check costs two forwards per parameter.
layer::ModelDims SmallLlama(bool tied) {
  layer::ModelDims dims = testutil::LlamaGradcheckDims(tied);
  dims.hidden_size = 8;
  dims.num_heads = 2;
  dims.num_kv_heads = 1;
  dims.intermediate_size = 8;
  return dims;
}
TEST(GradCheck, WholeLlamaModelUntied) { CheckWholeModel(SmallLlama(false)); }
TEST(GradCheck, WholeLlamaModelTied) { CheckWholeModel(SmallLlama(true)); }

TEST(Registry, UnknownLayerTypeListsTheKnownOnes) {
  const std::unique_ptr<device::Device> cpu = device::MakeCpuDevice(0, 1 << 20);
  layer::LayerSpec spec;
  spec.type = "gpt_blok";
  spec.device = cpu.get();
  try {
    layer::CreateLayer(spec);
    FAIL();
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what())
                  .find("unknown type 'gpt_blok'; known types: gpt_block, gpt_embedding, gpt_head, "
                        "llama_block, llama_embedding, llama_head"),
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
    const std::unique_ptr<device::Device> cpu = device::MakeCpuDevice(0, int64_t{1} << 30);
    const layer::LayerSpec spec =
        testutil::GradcheckSpec("gpt_block", 0, DType::kF32, cpu.get(), checkpointing);
    auto block = layer::CreateLayer(spec);
    block->InitParams(1);
    Batch batch = MakeBatch(2, 6, spec.dims.vocab_size);
    Tensor x(cpu.get(), {2, 6, spec.dims.hidden_size}, DType::kF32);
    layer::Saved saved;
    Tensor y;
    block->Forward(batch.mb, x, &y, &saved);
    EXPECT_EQ(saved.bytes(), block->ActivationBytes(2, 6)) << "checkpointing=" << checkpointing;
    // 12 C^2 multiply-adds per token for the four matmuls, plus causal attention.
    const int64_t c = spec.dims.hidden_size;
    EXPECT_EQ(block->ForwardFlops(2, 6), 2 * 12 * 12 * c * c + 2 * 2 * 36 * c);
  }
}

TEST(LayerReports, LlamaActivationBytesMatchWhatForwardKeeps) {
  for (bool checkpointing : {false, true}) {
    const std::unique_ptr<device::Device> cpu = device::MakeCpuDevice(0, int64_t{1} << 30);
    const layer::ModelDims dims = testutil::LlamaGradcheckDims();
    const layer::LayerSpec spec =
        testutil::GradcheckSpec("llama_block", 0, DType::kF32, cpu.get(), checkpointing, dims);
    auto block = layer::CreateLayer(spec);
    block->InitParams(1);
    Batch batch = MakeBatch(2, 6, dims.vocab_size);
    Tensor x(cpu.get(), {2, 6, dims.hidden_size}, DType::kF32);
    layer::Saved saved;
    Tensor y;
    block->Forward(batch.mb, x, &y, &saved);
    EXPECT_EQ(saved.bytes(), block->ActivationBytes(2, 6)) << "checkpointing=" << checkpointing;
    // q and o C^2, k and v C * kv_width, gate, up and down C * I multiply-adds per token, plus
    // causal attention.
    const int64_t c = dims.hidden_size, kv_width = 2 * (c / 4), inner = dims.intermediate_size;
    EXPECT_EQ(block->ForwardFlops(2, 6),
              2 * 12 * (2 * c * c + 2 * c * kv_width + 3 * c * inner) + 2 * 2 * 36 * c);
  }
}

// Softmax and log-sum-exp subtract the maximum: huge logits give a finite, exact loss.
TEST(Numerics, CrossEntropyIsStableForHugeLogits) {
  const std::unique_ptr<device::Device> cpu = device::MakeCpuDevice(0, int64_t{1} << 30);
  const layer::LayerSpec spec = testutil::GradcheckSpec("gpt_head", 3, DType::kF32, cpu.get());
  auto head = layer::CreateLayer(spec);
  head->InitParams(1);
  // Scale the output projection so that logits reach the thousands.
  for (layer::Param* param : head->Params()) {
    if (param->name != "wte") continue;
    for (int64_t i = 0; i < param->value.numel(); ++i) param->value.data<float>()[i] *= 1e5f;
  }
  Batch batch = MakeBatch(2, 6, spec.dims.vocab_size);
  Tensor x(cpu.get(), {2, 6, spec.dims.hidden_size}, DType::kF32);
  sdk::FillNormal(&x, 1.0, 9, 0, "x");
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
