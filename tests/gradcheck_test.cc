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

// The whole model: embedding, 3 blocks, head, with the tied token embedding (its gradient is the
// sum of the embedding's and the head's contributions).
TEST(GradCheck, WholeModelWithTiedEmbedding) {
  const std::unique_ptr<device::Device> cpu = device::MakeCpuDevice(0, int64_t{1} << 30);
  partition::PartitionSpec pspec;
  pspec.num_layers = Dims().num_layers;
  const partition::Partition partition = partition::MakePartition(pspec);
  engine::RankModelOptions options;
  options.dims = Dims();
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
