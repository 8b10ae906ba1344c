// Checkpoints in one process (no mpirun): the ModelState view, one verification for Load and
// Inspect, the save report, and the masters' dtype.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/checkpoint.pb.h"
#include "core/comm/pipeline_comm.h"
#include "core/config/loader.h"
#include "core/config/resolve.h"
#include "core/engine/rank_model.h"
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
    cpu = device::MakeCpuDevice(0, int64_t{1} << 30);
    engine::RankModelOptions options;
    options.dims = {cfg.model().vocab_size(), cfg.model().hidden_size(), cfg.model().num_heads(),
                    cfg.model().num_layers(), cfg.train().seq_length()};
    options.device = cpu.get();
    options.seed = seed;
    stage = std::make_unique<engine::RankModel>(options, resolved->partition, 0);
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

  std::string Save(const std::string& root, int64_t step = 1, const util::FaultPlan& faults = {}) {
    return checkpoint::Save(root, step, *resolved, stage->State(), adamw, *comm, 2, "", faults).dir;
  }
  int64_t Load(const std::string& step_dir) {
    return checkpoint::Load(step_dir, *resolved, stage->State(), adamw, *comm);
  }

  std::unique_ptr<config::ResolvedConfig> resolved;
  std::unique_ptr<device::Device> cpu;
  std::unique_ptr<engine::RankModel> stage;
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

// A checkpoint refused before any file is read (here the last file, the head's, is truncated:
// its size is checked with every other file's first) changes nothing in the model, not even the
// embedding, whose file comes first and is intact.
TEST(ModelState, ARefusedLoadLeavesTheModelAsItWas) {
  Model saved(1);
  const std::string dir = saved.Save(FreshRoot("untouched"));
  fs::resize_file(dir + "/head.bin", 100);
  Model model(2);
  const std::string before = Bytes(model.stage->TiedOwner()->value);
  EXPECT_NE(LoadError(model, dir).find("head.bin: 100 bytes, the manifest says"),
            std::string::npos);
  EXPECT_EQ(Bytes(model.stage->TiedOwner()->value), before);
  fs::remove(dir + "/head.bin");  // a missing file is found before reading too
  EXPECT_NE(LoadError(model, dir).find("head.bin: missing (cannot open)"), std::string::npos);
  EXPECT_EQ(Bytes(model.stage->TiedOwner()->value), before);
}

// ---------------------------------------------------------------- one verification

std::string InspectText(const std::string& step_dir, bool* ok) {
  std::vector<std::string> lines;
  *ok = checkpoint::Inspect(step_dir, &lines);
  std::string text;
  for (const std::string& line : lines) text += line + "\n";
  return text;
}

struct DamageCase {
  const char* name;
  std::function<void(const std::string& step_dir)> damage;
  const char* status;  // Inspect's short form
  const char* words;   // in Load's message
};

// Each damage: Load refuses with a message naming the file, and Inspect prints that same message
// after its short status.
TEST(VerifyLayerFile, InspectAndLoadReportTheSameProblemInTheSameWords) {
  Model saved(1);
  saved.Step();
  const std::string root = FreshRoot("verify");
  const std::string dir = saved.Save(root);
  auto manifest_edit = [](std::function<void(checkpoint::Manifest*)> edit) {
    return [edit](const std::string& step_dir) {
      checkpoint::Manifest manifest = ReadManifestFile(step_dir);
      edit(&manifest);
      WriteManifestFile(step_dir, manifest);
    };
  };
  auto last_tensor_of = [](checkpoint::Manifest* m, const std::string& file) {
    checkpoint::TensorEntry* last = nullptr;
    for (auto& t : *m->mutable_tensors()) {
      if (t.file() == file) last = &t;
    }
    return last;
  };
  const std::vector<DamageCase> cases = {
      {"flip",
       [](const std::string& d) {
         std::fstream f(d + "/block_0001.bin", std::ios::in | std::ios::out | std::ios::binary);
         f.seekp(40);
         f.put('\x7f');
       },
       "CHECKSUM MISMATCH", "block_0001.bin: checksum mismatch"},
      {"truncate", [](const std::string& d) { fs::resize_file(d + "/head.bin", 100); },
       "SIZE 100 != ", "head.bin: 100 bytes, the manifest says"},
      {"delete", [](const std::string& d) { fs::remove(d + "/block_0000.bin"); }, "MISSING",
       "block_0000.bin: missing (cannot open)"},
      {"tensor_crc", manifest_edit([&](checkpoint::Manifest* m) {
         checkpoint::TensorEntry* t = last_tensor_of(m, "head.bin");
         t->set_crc32(t->crc32() ^ 1);
       }),
       "BAD TENSOR", "has a checksum mismatch at offset"},
      {"tensor_dtype", manifest_edit([&](checkpoint::Manifest* m) {
         last_tensor_of(m, "embedding.bin")->set_dtype("bf16");
       }),
       "BAD TENSOR", "embedding.bin: tensor embedding/wpe#exp_avg_sq has dtype 'bf16'"},
      {"tensor_without_moment", manifest_edit([&](checkpoint::Manifest* m) {
         last_tensor_of(m, "block_0001.bin")->set_name("block 1/extra#value");
       }),
       "BAD TENSOR", "is missing from the manifest"},
  };
  for (const DamageCase& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string copy = root + "/damaged_" + c.name;
    fs::remove_all(copy);
    fs::copy(dir, copy);
    c.damage(copy);
    Model model(2);
    const std::string load_error = LoadError(model, copy);
    EXPECT_NE(load_error.find(c.words), std::string::npos) << load_error;
    bool ok = true;
    const std::string inspect = InspectText(copy, &ok);
    EXPECT_FALSE(ok) << inspect;
    EXPECT_NE(inspect.find(std::string(c.status)), std::string::npos) << inspect;
    EXPECT_NE(inspect.find(load_error), std::string::npos) << "Inspect says what Load says:\n"
                                                           << load_error << "\n"
                                                           << inspect;
  }
  bool ok = false;
  const std::string intact = InspectText(dir, &ok);
  EXPECT_TRUE(ok) << intact;
  EXPECT_NE(intact.find("all checksums verified"), std::string::npos);
}

// VerifyLayerFile checks what the model needs from the file: present, with its shape.
TEST(VerifyLayerFile, ChecksTheExpectedTensors) {
  Model saved(1);
  const std::string dir = saved.Save(FreshRoot("expected"));
  const checkpoint::Manifest manifest = ReadManifestFile(dir);
  const checkpoint::LayerTensors tensors =
      checkpoint::VerifyLayerFile(dir, manifest, layer::kEmbeddingLayerId, {});
  EXPECT_EQ(tensors.size(), 6u) << "wte and wpe, each a value and two moments";
  const std::vector<int64_t> wte = saved.stage->TiedOwner()->value.shape();
  EXPECT_NO_THROW(checkpoint::VerifyLayerFile(dir, manifest, layer::kEmbeddingLayerId,
                                              {{"embedding/wte#value", wte}}));
  try {
    checkpoint::VerifyLayerFile(dir, manifest, layer::kEmbeddingLayerId,
                                {{"embedding/wte#value", {wte[0], wte[1] + 1}}});
    FAIL();
  } catch (const checkpoint::LayerFileError& e) {
    EXPECT_EQ(e.status(), "BAD TENSOR");
    EXPECT_EQ(std::string(e.what()),
              dir + "/embedding.bin: tensor embedding/wte#value has shape [256, 16] (16384 " +
                  "bytes), the model wants f32[256, 17]");
  }
  try {
    checkpoint::VerifyLayerFile(dir, manifest, 0, {{"block 0/nothing#value", {1}}});
    FAIL();
  } catch (const checkpoint::LayerFileError& e) {
    EXPECT_EQ(std::string(e.what()),
              dir + ": tensor block 0/nothing#value is missing from the manifest");
  }
  checkpoint::Manifest without_block = manifest;
  without_block.mutable_files()->DeleteSubrange(1, 1);
  try {
    checkpoint::VerifyLayerFile(dir, without_block, without_block.files(0).layer_id() + 1, {});
    FAIL();
  } catch (const checkpoint::LayerFileError& e) {
    EXPECT_EQ(e.status(), "MISSING");
    EXPECT_NE(std::string(e.what()).find("the manifest lists no file for it"), std::string::npos);
  }
}

// ---------------------------------------------------------------- the save report

// A rank's failure reaches rank 0 inside its SaveReport, and every rank throws it.
TEST(SaveReport, CarriesAWritersErrorToEveryRank) {
  Model model(1);
  const std::string root = FreshRoot("report");
  model.Save(root, 1);
  util::FaultPlan full_disk;
  full_disk.fail_checkpoint_step = 2;
  try {
    model.Save(root, 2, full_disk);
    FAIL() << "the injected full disk must fail the save";
  } catch (const checkpoint::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "No space left on device (injected); the previous checkpoint is intact"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(root + "/step_000002"));
  EXPECT_TRUE(fs::exists(root + "/step_000001"));
}

// ---------------------------------------------------------------- the masters' dtype

TEST(MasterDType, TheManifestRecordsF32AndLoadRefusesAnythingElse) {
  Model saved(1);
  const std::string dir = saved.Save(FreshRoot("dtype"));
  checkpoint::Manifest manifest = ReadManifestFile(dir);
  EXPECT_EQ(manifest.master_dtype(), "f32");
  ASSERT_GT(manifest.tensors_size(), 0);
  for (const auto& tensor : manifest.tensors()) EXPECT_EQ(tensor.dtype(), "f32") << tensor.name();
  // Written before the field existed: f32.
  manifest.clear_master_dtype();
  WriteManifestFile(dir, manifest);
  Model model(2);
  EXPECT_EQ(LoadError(model, dir), "");
  manifest.set_master_dtype("bf16");
  WriteManifestFile(dir, manifest);
  const std::string error = LoadError(model, dir);
  EXPECT_EQ(error, dir +
                       "/manifest.pb: master_dtype 'bf16': BigMac loads only f32 master weights "
                       "and moments (precision.dtype only sets the compute copies)");
  bool ok = true;
  EXPECT_NE(InspectText(dir, &ok).find(error), std::string::npos);
  EXPECT_FALSE(ok);
}

// precision.dtype sets the compute copies, not the masters: a checkpoint saved under fp32 resumes
// under bf16, and back.
TEST(MasterDType, ADifferentPrecisionDTypeIsAccepted) {
  Model saved(1);
  saved.Step();
  const std::string dir = saved.Save(FreshRoot("precision"));
  config::Config bf16 = saved.resolved->values();
  bf16.mutable_precision()->set_dtype("bf16");
  EXPECT_NO_THROW(checkpoint::ReadManifest(dir, bf16)) << "fp32 snapshot, bf16 config";
  // The snapshot says bf16; this config fp32.
  checkpoint::Manifest manifest = ReadManifestFile(dir);
  ASSERT_EQ(manifest.config().precision().dtype(), "fp32");
  manifest.mutable_config()->mutable_precision()->set_dtype("bf16");
  WriteManifestFile(dir, manifest);
  EXPECT_NO_THROW(checkpoint::ReadManifest(dir, saved.resolved->values()))
      << "bf16 snapshot, fp32 config";
  Model model(2);
  EXPECT_EQ(LoadError(model, dir), "");
  EXPECT_EQ(Bytes(model.stage->TiedOwner()->value), Bytes(saved.stage->TiedOwner()->value));
  // The model's shape is still checked.
  config::Config wider = bf16;
  wider.mutable_model()->set_hidden_size(32);
  EXPECT_THROW(checkpoint::ReadManifest(dir, wider), checkpoint::CheckpointError);
}

}  // namespace
}  // namespace bigmac
