// Checkpoints in one process (no mpirun): the ModelState view, one verification for Load and
// Inspect, the save report, and the masters' dtype.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/checkpoint.pb.h"
#include "core/comm/pipeline_comm.h"
#include "core/config/loader.h"
#include "core/config/resolve.h"
#include "core/engine/stage.h"
#include "core/memory/allocator.h"
#include "core/optim/adamw.h"
#include "tests/testing/run.h"

namespace bigmac {
namespace {

namespace fs = std::filesystem;

// A 2-block model on one rank (embedding, blocks, head with the tied copy of wte).
struct Model {
  explicit Model(uint64_t seed, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> overrides = {"model.num_layers=2", "model.hidden_size=16",
                                          "model.num_heads=2", "train.seq_length=8",
                                          "data.dir=unused"};
    overrides.insert(overrides.end(), extra.begin(), extra.end());
    resolved = std::make_unique<config::ResolvedConfig>(config::Resolve(
        config::LoadConfig(testutil::Runfile("configs/tiny.yaml"), overrides), 1, "test"));
    const config::Config& cfg = resolved->values();
    allocator = std::make_unique<memory::DeviceAllocator>("cpu:0", int64_t{1} << 30);
    engine::StageOptions options;
    options.dims = {cfg.model().vocab_size(), cfg.model().hidden_size(), cfg.model().num_heads(),
                    cfg.model().num_layers(), cfg.train().seq_length()};
    options.allocator = allocator.get();
    options.seed = seed;
    stage = std::make_unique<engine::Stage>(options, resolved->partition, 0);
    comm = comm::MakeLocalPipelineComm();
  }

  std::vector<layer::Param*> Owned() {
    std::vector<layer::Param*> params;
    for (const auto& named : stage->OwnedParams()) params.push_back(named.param);
    return params;
  }

  // One optimizer step from made-up gradients, so that the moments are not zero.
  void Step() {
    adamw.InitState(Owned());
    for (layer::Param* param : Owned()) {
      float* grad = param->grad.data<float>();
      for (int64_t i = 0; i < param->grad.numel(); ++i) grad[i] = 0.01f * float((i * 7) % 13 - 6);
    }
    adamw.Step(Owned(), 1e-2, 1);
    stage->SyncTiedCopies();
  }

  std::string Save(const std::string& root, int64_t step = 1) {
    return checkpoint::Save(root, step, *resolved, stage->State(), adamw, *comm, 2).dir;
  }
  int64_t Load(const std::string& step_dir) {
    return checkpoint::Load(step_dir, *resolved, stage->State(), adamw, *comm);
  }

  std::unique_ptr<config::ResolvedConfig> resolved;
  std::unique_ptr<memory::DeviceAllocator> allocator;
  std::unique_ptr<engine::Stage> stage;
  std::unique_ptr<comm::PipelineComm> comm;
  optim::AdamW adamw{optim::AdamWOptions{}};
};

std::string Bytes(const memory::Tensor& t) {
  return std::string(reinterpret_cast<const char*>(t.data<float>()), t.bytes());
}

std::string FreshRoot(const std::string& name) {
  const std::string root = testutil::TempDir() + "/unit_" + name;
  fs::remove_all(root);
  return root;
}

checkpoint::Manifest ReadManifestFile(const std::string& step_dir) {
  checkpoint::Manifest manifest;
  std::ifstream in(step_dir + "/manifest.pb", std::ios::binary);
  EXPECT_TRUE(manifest.ParseFromIstream(&in));
  return manifest;
}

void WriteManifestFile(const std::string& step_dir, const checkpoint::Manifest& manifest) {
  std::ofstream out(step_dir + "/manifest.pb", std::ios::binary | std::ios::trunc);
  manifest.SerializeToOstream(&out);
}

std::string LoadError(Model& model, const std::string& step_dir) {
  try {
    model.Load(step_dir);
  } catch (const checkpoint::CheckpointError& e) {
    return e.what();
  }
  return "";
}

// ---------------------------------------------------------------- the ModelState view

TEST(ModelState, ListsEveryLayerAndFlagsTheTiedCopy) {
  Model model(1);
  const checkpoint::ModelState state = model.stage->State();
  EXPECT_EQ(state.num_layers, 2);
  ASSERT_EQ(state.layers.size(), 4u);
  EXPECT_EQ(state.layers.front().layer_id, layer::kEmbeddingLayerId);
  EXPECT_EQ(state.layers.back().layer_id, layer::HeadLayerId(2));
  int copies = 0;
  for (const checkpoint::LayerParams& layer : state.layers) {
    for (const layer::Param* param : layer.params) {
      if (!param->tied_copy) continue;
      ++copies;
      EXPECT_EQ(layer.layer_id, layer::HeadLayerId(2));
      EXPECT_EQ(param->tied_owner, "embedding/wte");
    }
  }
  EXPECT_EQ(copies, 1);
  EXPECT_EQ(checkpoint::ParamName(state, 1, *state.layers[2].params[0]),
            "block 1/" + state.layers[2].params[0]->name);
}

TEST(ModelState, SaveThenLoadRestoresMastersMomentsAndTheTiedCopy) {
  Model saved(1);
  saved.Step();
  const std::string dir = saved.Save(FreshRoot("roundtrip"));
  Model loaded(2);  // other initial weights
  ASSERT_NE(Bytes(loaded.stage->TiedOwner()->value), Bytes(saved.stage->TiedOwner()->value));
  EXPECT_EQ(loaded.Load(dir), 1);
  const auto a = saved.stage->OwnedParams();
  const auto b = loaded.stage->OwnedParams();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_EQ(Bytes(a[i].param->value), Bytes(b[i].param->value)) << a[i].name;
    ASSERT_NE(loaded.adamw.FirstMoment(b[i].param), nullptr);
    EXPECT_EQ(Bytes(*saved.adamw.FirstMoment(a[i].param)),
              Bytes(*loaded.adamw.FirstMoment(b[i].param)));
    EXPECT_EQ(Bytes(*saved.adamw.SecondMoment(a[i].param)),
              Bytes(*loaded.adamw.SecondMoment(b[i].param)));
  }
  EXPECT_EQ(Bytes(loaded.stage->TiedCopy()->value), Bytes(saved.stage->TiedOwner()->value))
      << "the head's copy of wte is filled from the owner's file";
}

// A bad checkpoint changes nothing in the model.
TEST(ModelState, ARefusedLoadLeavesTheModelAsItWas) {
  Model saved(1);
  const std::string dir = saved.Save(FreshRoot("untouched"));
  fs::resize_file(dir + "/head.bin", 100);
  Model model(2);
  const std::string before = Bytes(model.stage->TiedOwner()->value);
  EXPECT_NE(LoadError(model, dir), "");
  EXPECT_EQ(Bytes(model.stage->TiedOwner()->value), before);
}

}  // namespace
}  // namespace bigmac
