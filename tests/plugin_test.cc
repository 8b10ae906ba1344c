// Layer plugins: the example plugin loads, registers its type with its library as origin, and its
// gradients match finite differences; every kind of bad plugin gives an error naming the file.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>

#include "core/layer/layer.h"
#include "core/layer/plugin_loader.h"
#include "plugins/sdk/init.h"
#include "tests/testing/expect.h"
#include "tests/testing/gradcheck.h"
#include "tests/testing/run.h"

namespace bigmac {
namespace {

using testutil::ExpectContains;
using testutil::Runfile;

std::string ExamplePlugin() { return Runfile("plugins/examples/rms_swiglu/librms_swiglu.so"); }

// The message LoadPlugin throws for `path`, or "" if it loaded.
std::string LoadError(const std::string& path) {
  try {
    layer::LoadPlugin(path);
  } catch (const layer::PluginError& error) {
    return error.what();
  }
  return "";
}

TEST(Plugin, RegistersItsTypesWithTheLibraryAsOrigin) {
  const std::vector<std::string> types = layer::LoadPlugin(ExamplePlugin());
  EXPECT_EQ(types, std::vector<std::string>{"rms_swiglu_block"});
  EXPECT_EQ(layer::LayerRegistry::Global().Origin("rms_swiglu_block"), ExamplePlugin());
  EXPECT_EQ(layer::LayerRegistry::Global().Origin("gpt_block"), "built-in");
  // Loading it again (also through another spelling of the path) changes nothing.
  EXPECT_EQ(layer::LoadPlugin(ExamplePlugin()), types);
  const std::string dotted =
      ExamplePlugin().substr(0, ExamplePlugin().rfind('/')) + "/./librms_swiglu.so";
  EXPECT_EQ(layer::LoadPlugin(dotted), types);
}

// The example builds on //plugins/sdk only: it carries none of the built-in layers (their
// registrations would be a second copy of every kernel and type name in the library).
TEST(Plugin, ExampleCarriesNoBuiltInLayers) {
  std::ifstream file(ExamplePlugin(), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 0u);
  for (const char* name :
       {"gpt_block", "gpt_embedding", "gpt_head", "llama_block", "llama_embedding", "llama_head"}) {
    EXPECT_EQ(bytes.find(name), std::string::npos) << name;
  }
  EXPECT_NE(bytes.find("rms_swiglu_block"), std::string::npos);
}

TEST(Plugin, ExampleBlockGradientsMatchFiniteDifferences) {
  layer::LoadPlugin(ExamplePlugin());
  testutil::CheckLayerGradients("rms_swiglu_block", 1, false);
}

TEST(Plugin, ExampleBlockReportsWhatItKeepsAndItsFlops) {
  layer::LoadPlugin(ExamplePlugin());
  const std::unique_ptr<device::Device> cpu = device::MakeCpuDevice(0, int64_t{1} << 30);
  const layer::LayerSpec spec =
      testutil::GradcheckSpec("rms_swiglu_block", 0, memory::DType::kF32, cpu.get());
  auto block = layer::CreateLayer(spec);
  block->InitParams(1);
  testutil::Batch batch = testutil::MakeBatch(2, 6, spec.dims.vocab_size);
  memory::Tensor x(cpu.get(), {2, 6, spec.dims.hidden_size}, memory::DType::kF32);
  sdk::FillNormal(&x, 1.0, 3, 0, "x");
  layer::Saved saved;
  memory::Tensor y;
  block->Forward(batch.mb, x, &y, &saved);
  EXPECT_EQ(saved.bytes(), block->ActivationBytes(2, 6));
  EXPECT_GT(block->ForwardFlops(2, 6), 0);
  // Same parameter budget as a GELU MLP block of this width, give or take the rounding to 8.
  int64_t parameters = 0;
  for (layer::Param* param : block->Params()) parameters += param->value.numel();
  const int c = spec.dims.hidden_size;
  EXPECT_EQ(parameters, 2 * c + 4 * c * c + 3 * c * 24);  // F = round8(8*8/3) = 24
}

TEST(Plugin, ExampleBlockRefusesAnUnsupportedDtypeByName) {
  layer::LoadPlugin(ExamplePlugin());
  const std::unique_ptr<device::Device> cpu = device::MakeCpuDevice(0, int64_t{1} << 30);
  layer::LayerSpec spec =
      testutil::GradcheckSpec("rms_swiglu_block", 0, memory::DType::kI32, cpu.get());
  try {
    layer::CreateLayer(spec);
    FAIL() << "i32 accepted";
  } catch (const std::invalid_argument& error) {
    ExpectContains(error.what(), "rms_swiglu_block: CPU kernels support f32 and f64");
  }
}

TEST(BadPlugin, MissingFile) {
  const std::string error = LoadError("/nonexistent/libnothing.so");
  ExpectContains(error, "plugin /nonexistent/libnothing.so: no such file");
}

TEST(BadPlugin, NotASharedLibrary) {
  const std::string path = testutil::WriteTempFile("libtext.so", "this is not an ELF file\n");
  const std::string error = LoadError(path);
  ExpectContains(error, "plugin " + path + ": cannot load the shared library");
}

TEST(BadPlugin, NoEntryPoint) {
  const std::string path = Runfile("tests/plugins/libno_entry.so");
  const std::string error = LoadError(path);
  ExpectContains(error, "plugin " + path + ": no entry point 'bigmac_plugin_register'");
}

TEST(BadPlugin, AbiVersionMismatch) {
  const std::string path = Runfile("tests/plugins/libabi_mismatch.so");
  const std::string error = LoadError(path);
  ExpectContains(error, "plugin " + path +
                            ": built for plugin ABI version 3, but this bigmac speaks version 2");
  EXPECT_FALSE(layer::LayerRegistry::Global().Has("future_block"));
}

TEST(BadPlugin, AbiVersion1IsRefusedSayingWhatChanged) {
  const std::string path = Runfile("tests/plugins/libabi_v1.so");
  const std::string error = LoadError(path);
  ExpectContains(error, "plugin " + path +
                            ": built for plugin ABI version 1, but this bigmac speaks version 2");
  ExpectContains(error, "ABI 2 (from 1): register_layer names a backend");
  ExpectContains(error, "LayerSpec carries the device");
  EXPECT_FALSE(layer::LayerRegistry::Global().Has("old_block"));
}

TEST(BadPlugin, DuplicateLayerName) {
  const std::string path = Runfile("tests/plugins/libduplicate.so");
  const std::string error = LoadError(path);
  ExpectContains(error,
                 "plugin " + path + ": layer type 'gpt_block' is already registered by built-in");
  EXPECT_EQ(layer::LayerRegistry::Global().Origin("gpt_block"), "built-in");
}

TEST(BadPlugin, RegistersNothing) {
  const std::string path = Runfile("tests/plugins/libempty.so");
  ExpectContains(LoadError(path), "plugin " + path + ": registers no layer types");
}

}  // namespace
}  // namespace bigmac
