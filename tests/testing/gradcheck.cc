#include "tests/testing/gradcheck.h"

#include <gtest/gtest.h>

#include <cmath>

#include "plugins/sdk/init.h"

namespace bigmac::testutil {
namespace {

using memory::DType;
using memory::Tensor;

constexpr double kEps = 1e-5;
constexpr double kAbsTol = 1e-8;
constexpr double kRelTol = 1e-6;

double Dot(const Tensor& a, const Tensor& b) {
  double sum = 0;
  for (int64_t i = 0; i < a.numel(); ++i) sum += a.data<double>()[i] * b.data<double>()[i];
  return sum;
}

}  // namespace

layer::ModelDims GradcheckDims() {
  layer::ModelDims dims;
  dims.vocab_size = 11;
  dims.hidden_size = 8;
  dims.num_heads = 2;
  dims.num_layers = 3;
  dims.max_seq_length = 6;
  return dims;
}

layer::ModelDims LlamaGradcheckDims(bool tied) {
  layer::ModelDims dims = GradcheckDims();
  dims.arch = layer::Arch::kLlama;
  dims.hidden_size = 16;
  dims.num_heads = 4;
  dims.num_kv_heads = 2;
  dims.intermediate_size = 24;
  dims.rope_theta = 100;
  dims.tie_embeddings = tied;
  return dims;
}

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

layer::LayerSpec GradcheckSpec(const std::string& type, int layer_id, DType dtype,
                               device::Device* device, bool checkpointing,
                               const layer::ModelDims& dims) {
  layer::LayerSpec spec;
  spec.type = type;
  spec.layer_id = layer_id;
  spec.dims = dims;
  spec.dtype = dtype;
  spec.device = device;
  spec.activation_checkpointing = checkpointing;
  return spec;
}

void CheckAllElements(const std::string& what, Tensor* value, const Tensor& analytic,
                      const std::function<double()>& objective,
                      const std::function<void()>& after_change) {
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

void CheckLayerGradients(const std::string& type, int layer_id, bool checkpointing,
                         const layer::ModelDims& dims) {
  const std::unique_ptr<device::Device> cpu = device::MakeCpuDevice(0, int64_t{1} << 30);
  const layer::LayerSpec spec =
      GradcheckSpec(type, layer_id, DType::kF64, cpu.get(), checkpointing, dims);
  const bool is_embedding = layer_id == layer::kEmbeddingLayerId;
  const bool is_head = layer_id == layer::HeadLayerId(spec.dims.num_layers);
  auto layer = layer::CreateLayer(spec);
  layer->InitParams(42);
  // Perturb every parameter off its initial value (norm weights start at exactly 1, ...).
  for (layer::Param* param : layer->Params()) {
    Tensor noise(cpu.get(), param->value.shape(), DType::kF64);
    sdk::FillNormal(&noise, 0.1, 7, spec.layer_id, param->name);
    for (int64_t i = 0; i < noise.numel(); ++i)
      param->value.data<double>()[i] += noise.data<double>()[i];
  }
  Batch batch = MakeBatch(2, 5, spec.dims.vocab_size);
  Tensor x(cpu.get(), {2, 5, spec.dims.hidden_size}, DType::kF64);
  sdk::FillNormal(&x, 1.0, 3, 0, "x");
  Tensor r(cpu.get(), {2, 5, spec.dims.hidden_size}, DType::kF64);
  sdk::FillNormal(&r, 1.0, 5, 0, "r");

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
  layer->BackwardInput(batch.mb, r, is_embedding ? nullptr : &dx, &saved);
  layer->BackwardWeight(batch.mb, &saved);
  EXPECT_TRUE(saved.tensors.empty()) << "BackwardWeight releases what Forward kept";

  for (layer::Param* param : layer->Params()) {
    CheckAllElements(type + "/" + param->name, &param->value, param->grad, objective);
  }
  if (!is_embedding) CheckAllElements(type + "/input", &x, dx, objective);
}

}  // namespace bigmac::testutil
