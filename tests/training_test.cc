// Optimizer, tied weights, determinism, recomputation, overfitting, out-of-memory and data files.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/config/loader.h"
#include "core/config/resolve.h"
#include "core/data/dataset.h"
#include "core/data/prep.h"
#include "core/data/shard.h"
#include "core/engine/rank_model.h"
#include "core/engine/trainer.h"
#include "core/optim/adamw.h"
#include "plugins/sdk/init.h"
#include "stages/cpu/blocked_gemm.h"
#include "tests/testing/run.h"

namespace bigmac {
namespace {

using memory::DType;
using memory::Tensor;

// ---------------------------------------------------------------- AdamW and the schedule

TEST(AdamW, MatchesHandComputedSteps) {
  const std::unique_ptr<device::Device> cpu = device::MakeCpuDevice(0, 1 << 20);
  layer::Param param;
  param.value = Tensor(cpu.get(), {2}, DType::kF64);
  param.grad = Tensor(cpu.get(), {2}, DType::kF64);
  param.weight_decay = true;
  param.value.data<double>()[0] = 1.0;
  param.value.data<double>()[1] = -2.0;
  optim::AdamW adamw({0.9, 0.95, 1e-8, 0.1});
  // Step 1: bias correction makes m_hat = g and v_hat = g^2, so the update is
  // lr * (sign(g) + wd * p):  1 - 0.1 * (1 + 0.1) = 0.89;  -2 - 0.1 * (-1 - 0.2) = -1.88.
  param.grad.data<double>()[0] = 0.5;
  param.grad.data<double>()[1] = -1.0;
  adamw.Step({&param}, 0.1, 1);
  EXPECT_NEAR(param.value.data<double>()[0], 0.89, 1e-8);
  EXPECT_NEAR(param.value.data<double>()[1], -1.88, 1e-8);
  // Step 2 (g = [0.25, 2], lr 0.05), worked through the formulas by hand:
  // m = [0.07, 0.11], v = [0.015, 0.2475], m_hat = m/0.19, v_hat = v/0.0975.
  param.grad.data<double>()[0] = 0.25;
  param.grad.data<double>()[1] = 2.0;
  adamw.Step({&param}, 0.05, 2);
  EXPECT_NEAR(param.value.data<double>()[0], 0.8385853497726979, 1e-12);
  EXPECT_NEAR(param.value.data<double>()[1], -1.8887686984048315, 1e-12);
  EXPECT_NEAR(adamw.FirstMoment(&param)->data<double>()[0], 0.07, 1e-15);
  EXPECT_NEAR(adamw.SecondMoment(&param)->data<double>()[1], 0.2475, 1e-15);
}

TEST(AdamW, NoDecayWithoutTheFlag) {
  const std::unique_ptr<device::Device> cpu = device::MakeCpuDevice(0, 1 << 20);
  layer::Param param;
  param.value = Tensor(cpu.get(), {1}, DType::kF64);
  param.grad = Tensor(cpu.get(), {1}, DType::kF64);
  param.value.data<double>()[0] = 3.0;  // zero gradient, no decay: nothing moves
  optim::AdamW({0.9, 0.95, 1e-8, 0.5}).Step({&param}, 0.1, 1);
  EXPECT_EQ(param.value.data<double>()[0], 3.0);
}

TEST(LearningRate, WarmupThenCosine) {
  const optim::LrSchedule s{1.0, 0.1, 10, 110};
  EXPECT_DOUBLE_EQ(optim::LearningRate(s, 0), 0.1);
  EXPECT_DOUBLE_EQ(optim::LearningRate(s, 9), 1.0);
  EXPECT_DOUBLE_EQ(optim::LearningRate(s, 10), 1.0);
  EXPECT_NEAR(optim::LearningRate(s, 60), 0.55, 1e-12);  // half way: (1 + 0.1) / 2
  EXPECT_NEAR(optim::LearningRate(s, 110), 0.1, 1e-12);
}

TEST(Clipping, GlobalNorm) {
  const std::unique_ptr<device::Device> cpu = device::MakeCpuDevice(0, 1 << 20);
  layer::Param a, b;
  a.grad = Tensor(cpu.get(), {2}, DType::kF32);
  b.grad = Tensor(cpu.get(), {1}, DType::kF32);
  a.grad.data<float>()[0] = 3;
  a.grad.data<float>()[1] = 0;
  b.grad.data<float>()[0] = 4;
  EXPECT_DOUBLE_EQ(optim::GlobalGradNorm({&a, &b}), 5.0);
}

// The clip's factor applied as AdamW reads the gradients gives the bits of scaling them first
// (what the trainer did before the two were one pass), and leaves the gradients as they were.
TEST(Clipping, ScaleInsideAdamWGivesTheBitsOfScalingFirst) {
  const std::unique_ptr<device::Device> cpu = device::MakeCpuDevice(0, 1 << 24);
  constexpr int64_t kN = 1003;  // not a whole number of vectors
  constexpr double kScale = 0.37;
  layer::Param fused, first;
  for (layer::Param* p : {&fused, &first}) {
    p->value = Tensor(cpu.get(), {kN}, DType::kF32);
    p->grad = Tensor(cpu.get(), {kN}, DType::kF32);
    for (int64_t i = 0; i < kN; ++i) {
      p->value.data<float>()[i] = std::sin(0.37 * double(i));
      p->grad.data<float>()[i] = std::cos(1.3 * double(i)) * 3;
    }
  }
  const std::vector<float> grads(fused.grad.data<float>(), fused.grad.data<float>() + kN);
  optim::AdamW fused_adamw({0.9, 0.95, 1e-8, 0.1}), first_adamw({0.9, 0.95, 1e-8, 0.1});
  for (int step = 1; step <= 3; ++step) {
    const float factor = static_cast<float>(kScale);
    for (int64_t i = 0; i < kN; ++i) first.grad.data<float>()[i] = grads[i] * factor;
    first_adamw.Step({&first}, 1e-2, step);
    fused_adamw.Step({&fused}, 1e-2, step, kScale);
  }
  EXPECT_EQ(0, std::memcmp(fused.value.raw(), first.value.raw(), kN * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(fused_adamw.SecondMoment(&fused)->raw(),
                           first_adamw.SecondMoment(&first)->raw(), kN * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(fused.grad.raw(), grads.data(), kN * sizeof(float)));
}

// ---------------------------------------------------------------- model-level properties

layer::ModelDims SmallDims() { return {32, 16, 2, 2, 8}; }

struct OneBatch {
  std::vector<int32_t> tokens, targets;
  layer::MicroBatch mb;
  OneBatch(int b, int t, int vocab) {
    for (int i = 0; i < b * t; ++i) {
      tokens.push_back((i * 13 + 5) % vocab);
      targets.push_back((i * 7 + 2) % vocab);
    }
    mb = {b, t, tokens.data(), targets.data(), 1.0 / (b * t)};
  }
};

engine::RankModel MakeStage(device::Device* device, DType dtype = DType::kF32) {
  partition::PartitionSpec spec;
  spec.num_layers = SmallDims().num_layers;
  engine::RankModelOptions options;
  options.dims = SmallDims();
  options.dtype = dtype;
  options.device = device;
  return engine::RankModel(options, partition::MakePartition(spec), 0);
}

TEST(TiedWeights, OneOwnerGradientSumsBothUsesAndCopyFollows) {
  const std::unique_ptr<device::Device> cpu = device::MakeCpuDevice(0, 1 << 28);
  engine::RankModel stage = MakeStage(cpu.get(), DType::kF64);
  layer::Param* owner = nullptr;
  layer::Param* copy = nullptr;
  for (auto& layer : stage.layers()) {
    for (layer::Param* param : layer->Params()) {
      if (param->name == "wte") (param->tied_copy ? copy : owner) = param;
    }
  }
  ASSERT_TRUE(owner && copy);
  EXPECT_EQ(copy->tied_owner, "embedding/wte");
  // The copy starts equal to the owner.
  for (int64_t i = 0; i < owner->value.numel(); ++i)
    ASSERT_EQ(owner->value.data<double>()[i], copy->value.data<double>()[i]);
  OneBatch batch(2, 8, SmallDims().vocab_size);
  stage.ZeroGrads();
  stage.ForwardBackward(batch.mb);
  const Tensor from_embedding = owner->grad.Clone();
  const Tensor from_head = copy->grad.Clone();
  stage.ReduceTiedGradients();
  for (int64_t i = 0; i < owner->grad.numel(); ++i) {
    ASSERT_EQ(owner->grad.data<double>()[i],
              from_embedding.data<double>()[i] + from_head.data<double>()[i]);
    ASSERT_EQ(copy->grad.data<double>()[i], 0.0);
  }
  // Counted once: the owned parameters skip the copy.
  const int64_t c = 16, v = 32, t = 8, l = 2;
  EXPECT_EQ(stage.OwnedParameterCount(), v * c + t * c + l * (12 * c * c + 13 * c) + 2 * c);
  for (const auto& named : stage.OwnedParams()) EXPECT_NE(named.name, "head/wte");
  // After an optimizer step on the owner, the copy follows.
  std::vector<layer::Param*> params;
  for (const auto& named : stage.OwnedParams()) params.push_back(named.param);
  optim::AdamW({}).Step(params, 0.01, 1);
  stage.SyncTiedCopies();
  for (int64_t i = 0; i < owner->value.numel(); ++i)
    ASSERT_EQ(owner->value.data<double>()[i], copy->value.data<double>()[i]);
}

TEST(Overfit, OneBatchToNearZeroLoss) {
  const std::unique_ptr<device::Device> cpu = device::MakeCpuDevice(0, 1 << 28);
  engine::RankModel stage = MakeStage(cpu.get());
  OneBatch batch(4, 8, SmallDims().vocab_size);
  std::vector<layer::Param*> params;
  for (const auto& named : stage.OwnedParams()) params.push_back(named.param);
  optim::AdamW adamw({0.9, 0.95, 1e-8, 0.0});
  double first = 0, loss = 0;
  for (int step = 1; step <= 300; ++step) {
    stage.ZeroGrads();
    loss = stage.ForwardBackward(batch.mb);
    if (step == 1) first = loss;
    stage.ReduceTiedGradients();
    adamw.Step(params, 1e-2, step);
    stage.SyncTiedCopies();
  }
  EXPECT_NEAR(first, std::log(32.0), 0.2);
  EXPECT_LT(loss, 0.02) << "from " << first;
}

TEST(NonFinite, NamesTheLayer) {
  const std::unique_ptr<device::Device> cpu = device::MakeCpuDevice(0, 1 << 28);
  engine::RankModel stage = MakeStage(cpu.get());
  OneBatch batch(2, 8, SmallDims().vocab_size);
  EXPECT_EQ(stage.FirstNonFiniteLayer(batch.mb), "");
  for (auto& layer : stage.layers()) {
    if (layer->layer_id() != 1) continue;
    layer->Params()[2]->value.data<float>()[5] = NAN;  // block 1, attn.qkv.weight
  }
  EXPECT_EQ(stage.FirstNonFiniteLayer(batch.mb), "block 1 (parameter attn.qkv.weight)");
}

// ---------------------------------------------------------------- training runs

// A small corpus of varied English-like sentences, prepared as shards once per test binary.
std::string DataDir() {
  static const std::string dir = [] {
    const std::string base = testutil::TempDir();
    std::string text;
    const char* words[] = {"the",   "pipeline",  "stage", "sends", "activations", "to",
                           "next",  "rank",      "and",   "waits", "for",         "gradients",
                           "while", "optimizer", "steps", "every", "batch"};
    uint64_t state = 12345;
    for (int i = 0; i < 40000; ++i) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      text += words[(state >> 33) % 17];
      text += (i % 11 == 10) ? ".\n" : " ";
    }
    std::ofstream(base + "/corpus.txt") << text;
    data::PrepOptions prep;
    prep.inputs = {base + "/corpus.txt"};
    prep.output = base + "/shards";
    prep.val_every = 10;
    prep.block_tokens = 1024;
    data::PrepareShards(prep);
    return base + "/shards";
  }();
  return dir;
}

config::ResolvedConfig SmallRun(std::vector<std::string> extra) {
  std::vector<std::string> sets = {"model.num_layers=2",
                                   "model.hidden_size=32",
                                   "model.num_heads=2",
                                   "model.vocab_size=256",
                                   "train.seq_length=16",
                                   "train.micro_batch_size=4",
                                   "train.gradient_accumulation_steps=2",
                                   "parallel.schedule=gpipe",
                                   "train.max_steps=6",
                                   "train.eval_batches=2",
                                   "train.log_interval=100",
                                   "data.dir=" + DataDir()};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return config::Resolve(config::LoadConfig("", sets), 1, "test");
}

engine::TrainResult Train(const config::ResolvedConfig& config) {
  return engine::TrainSingleRank(config, [](const std::string&) {});
}

TEST(Training, TwoRunsAreBitwiseIdentical) {
  const engine::TrainResult a = Train(SmallRun({}));
  const engine::TrainResult b = Train(SmallRun({}));
  ASSERT_EQ(a.train_losses.size(), 6u);
  EXPECT_EQ(a.train_losses, b.train_losses);
  EXPECT_EQ(a.final_parameters, b.final_parameters);
  EXPECT_EQ(a.val_losses, b.val_losses);
  EXPECT_NE(Train(SmallRun({"train.seed=7"})).train_losses, a.train_losses) << "the seed matters";
}

// The caching allocator: after the first step, a step allocates only sizes it freed before, so
// no buffer comes from the system (with and without recomputation, which allocates in backward).
TEST(Training, NoSystemAllocationsAfterTheFirstStep) {
  EXPECT_EQ(Train(SmallRun({})).steady_state_system_allocations, 0);
  EXPECT_EQ(
      Train(SmallRun({"train.activation_checkpointing=true"})).steady_state_system_allocations, 0);
}

TEST(Training, ActivationCheckpointingSavesMemoryAndChangesNothing) {
  const engine::TrainResult plain = Train(SmallRun({"train.seq_length=32"}));
  const engine::TrainResult recomputed =
      Train(SmallRun({"train.seq_length=32", "train.activation_checkpointing=true"}));
  EXPECT_EQ(plain.train_losses, recomputed.train_losses);
  EXPECT_EQ(plain.final_parameters, recomputed.final_parameters);
  EXPECT_LT(recomputed.peak_bytes, plain.peak_bytes);
}

// The CPU GEMM packs each weight once per flush and reuses the pack for the flush's other
// micro-batches (stages/cpu/gemm.cc): the same losses and weights as packing at every product
// (BIGMAC_CPU_WEIGHT_PACKS=off), for GPT (its tied head) and llama, over optimizer steps, and the
// packs were used.
TEST(Training, PackedWeightsChangeNothing) {
  for (const std::string arch : {"gpt", "llama"}) {
    const std::vector<std::string> sets = {"model.arch=" + arch,
                                           "train.gradient_accumulation_steps=3"};
    const int64_t before = sdk::cpu::internal::WholeBProductsRun();
    const engine::TrainResult packed = Train(SmallRun(sets));
    if (sdk::cpu::internal::BlockedSgemmSupported()) {
      EXPECT_GT(sdk::cpu::internal::WholeBProductsRun(), before) << arch << ": no pack was used";
    }
    engine::TrainResult plain;
    {
      // Unset again however this block ends, so that later tests pack.
      struct PacksOff {
        PacksOff() { setenv("BIGMAC_CPU_WEIGHT_PACKS", "off", 1); }
        ~PacksOff() { unsetenv("BIGMAC_CPU_WEIGHT_PACKS"); }
      } off;
      const int64_t off_before = sdk::cpu::internal::WholeBProductsRun();
      plain = Train(SmallRun(sets));
      EXPECT_EQ(sdk::cpu::internal::WholeBProductsRun(), off_before) << "packs used when off";
    }
    EXPECT_EQ(packed.train_losses, plain.train_losses) << arch;
    EXPECT_EQ(packed.final_parameters, plain.final_parameters) << arch;
    EXPECT_EQ(packed.val_losses, plain.val_losses) << arch;
  }
}

TEST(Training, LossFallsOnText) {
  const engine::TrainResult r =
      Train(SmallRun({"train.max_steps=60", "optim.lr=3e-3", "optim.warmup_steps=5"}));
  EXPECT_NEAR(r.train_losses.front(), std::log(256.0), 0.3);
  EXPECT_LT(r.val_losses.back().second, 3.2);
}

TEST(Training, OutOfMemoryIsCudaWorded) {
  try {
    Train(SmallRun({"device.memory_limit=64KiB"}));
    FAIL() << "trained in 64 KiB";
  } catch (const memory::OutOfMemoryError& error) {
    EXPECT_NE(std::string(error.what()).find("out of memory: tried to allocate"),
              std::string::npos);
    EXPECT_NE(std::string(error.what()).find("capacity 0.06 MiB"), std::string::npos)
        << error.what();
  }
}

// ---------------------------------------------------------------- shards and batches

std::string WriteBytes(const std::string& name, const std::string& bytes) {
  return testutil::WriteTempFile(name, bytes);
}

std::string ShardError(const std::string& path) {
  try {
    data::ReadShard(path);
  } catch (const data::DataError& error) {
    return error.what();
  }
  return "";
}

TEST(Shard, RoundTripsAndRejectsDamage) {
  const std::string dir = testutil::TempDir();
  const std::string good = dir + "/good.bin";
  data::WriteShard(good, 256, {1, 2, 255, 0});
  EXPECT_EQ(data::ReadShard(good).tokens, (std::vector<uint32_t>{1, 2, 255, 0}));
  std::ifstream in(good, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_EQ(bytes.size(), 32u + 8u);

  std::string magic = bytes;
  magic[0] = 'X';
  EXPECT_NE(ShardError(WriteBytes("magic.bin", magic)).find("magic.bin: wrong magic"),
            std::string::npos);
  EXPECT_NE(ShardError(WriteBytes("short.bin", bytes.substr(0, 38)))
                .find("short.bin: the header promises 4 tokens"),
            std::string::npos);
  EXPECT_NE(ShardError(WriteBytes("tiny.bin", bytes.substr(0, 10)))
                .find("shorter than the 32-byte shard header"),
            std::string::npos);
  std::string range = bytes;
  range[32 + 4] = static_cast<char>(0x2c);  // token 2 -> 300
  range[32 + 5] = 1;
  EXPECT_NE(ShardError(WriteBytes("range.bin", range))
                .find("range.bin: token 300 at position 2 is outside the vocabulary of 256"),
            std::string::npos);
  std::string version = bytes;
  version[4] = 9;
  EXPECT_NE(ShardError(WriteBytes("version.bin", version)).find("shard version 9 is not supported"),
            std::string::npos);
  EXPECT_NE(ShardError(dir + "/missing.bin").find("missing.bin: cannot open"), std::string::npos);
}

TEST(Dataset, BatchesDependOnlyOnTheirKey) {
  const data::TokenDataset train(DataDir(), "train");
  std::vector<int32_t> t1(4 * 16), y1(4 * 16), t2(4 * 16), y2(4 * 16);
  train.TrainBatch(1, 3, 0, 1, 4, 16, t1.data(), y1.data());
  train.TrainBatch(1, 9, 1, 0, 4, 16, t2.data(), y2.data());  // something else in between
  train.TrainBatch(1, 3, 0, 1, 4, 16, t2.data(), y2.data());
  EXPECT_EQ(t1, t2);
  EXPECT_EQ(y1, y2);
  for (int i = 0; i + 1 < 16; ++i) EXPECT_EQ(y1[i], t1[i + 1]) << "targets are the next tokens";
  train.TrainBatch(1, 3, 1, 1, 4, 16, t2.data(), y2.data());
  EXPECT_NE(t1, t2) << "another dp rank reads other samples";
}

TEST(Dataset, PrepHoldsOutAValidationSplit) {
  const data::TokenDataset train(DataDir(), "train");
  const data::TokenDataset val(DataDir(), "val");
  const double fraction = double(val.size()) / double(val.size() + train.size());
  EXPECT_NEAR(fraction, 0.1, 0.01);  // every 10th block in this test
  EXPECT_EQ(train.vocab_size(), 256u);
}

}  // namespace
}  // namespace bigmac
