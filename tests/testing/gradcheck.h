#ifndef BIGMAC_TESTS_TESTING_GRADCHECK_H_
#define BIGMAC_TESTS_TESTING_GRADCHECK_H_

// Finite-difference gradient checks in double precision, shared by the built-in layers' tests
// and the plugins' (any registered layer type).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/layer/layer.h"

namespace bigmac::testutil {

// The small model every check uses: vocab 11, hidden 8, 2 heads, 3 blocks, sequences up to 6.
layer::ModelDims GradcheckDims();
// Its llama twin: hidden 16, 4 query heads over 2 key/value heads, SwiGLU width 24, untied head
// (`tied`: tied), a RoPE base of 100 so that every pair turns visibly over 5 positions.
layer::ModelDims LlamaGradcheckDims(bool tied = false);

struct Batch {
  std::vector<int32_t> tokens;
  std::vector<int32_t> targets;
  layer::MicroBatch mb;
};

// Seeded tokens and targets, loss scale 1/(b*t).
Batch MakeBatch(int b, int t, int vocab);

// A layer of the check's model (the device outlives it).
layer::LayerSpec GradcheckSpec(const std::string& type, int layer_id, memory::DType dtype,
                               device::Device* device, bool checkpointing = false,
                               const layer::ModelDims& dims = GradcheckDims());

// Compares `analytic` with central differences of `objective` over every element of `value`
// (gtest failures for the first five mismatches).
void CheckAllElements(
    const std::string& what, memory::Tensor* value, const memory::Tensor& analytic,
    const std::function<double()>& objective, const std::function<void()>& after_change = [] {});

// Every parameter's and the input's gradient of the registered layer `type` at `layer_id`
// (kEmbeddingLayerId: no input gradient; the head's id: its loss is the objective, otherwise
// J = sum(y * R) for a seeded R), with parameters perturbed off their initial values.
void CheckLayerGradients(const std::string& type, int layer_id, bool checkpointing,
                         const layer::ModelDims& dims = GradcheckDims());

}  // namespace bigmac::testutil

#endif  // BIGMAC_TESTS_TESTING_GRADCHECK_H_
