#ifndef BIGMAC_PLUGINS_BIGMAC_PLUGIN_H_
#define BIGMAC_PLUGINS_BIGMAC_PLUGIN_H_

// The layer-plugin ABI: what a shared library exports so that `bigmac --plugin lib.so` (or
// `plugins:` in the config) adds layer types to the registry. docs/plugins.md has a worked example.
//
// The entry point and the registry handle are plain C, so the host can check the ABI version
// before it trusts anything else in the library. The layers themselves are C++ objects derived
// from bigmac::layer::Layer (core/layer/layer.h): a plugin must be built against the headers of
// the same ABI version, with the same compiler family and C++ standard library as bigmac.
// BIGMAC_PLUGIN_ABI_VERSION changes whenever this file, Layer, LayerSpec, Param, Tensor or the
// allocator change in a way a compiled plugin would notice.

#include <stdint.h>

#ifndef BIGMAC_PLUGIN_ABI_VERSION
#define BIGMAC_PLUGIN_ABI_VERSION 2
#endif

// What changed from each version to the next, for the message that refuses an older plugin.
#define BIGMAC_PLUGIN_ABI_CHANGES                                                             \
  "ABI 2 (from 1): register_layer names a backend (\"cpu\" or \"cuda\"); LayerSpec carries "  \
  "the device (spec.device: allocator, stream, library handles) instead of an allocator and " \
  "a bf16 flag (precision.dtype=bf16: bf16 activations); Param has a bf16 compute copy; "     \
  "tensor operations are calls into the host's device; plugins build against plugins/ "       \
  "headers only (docs/plugins.md)"

// The exported entry point's name, as dlsym looks it up.
#define BIGMAC_PLUGIN_ENTRY_NAME "bigmac_plugin_register"

#ifdef __cplusplus
extern "C" {
#endif

// Builds a layer from a `const bigmac::layer::LayerSpec*` and returns a new
// `bigmac::layer::Layer*` the host takes ownership of. It may throw std::exception (for example
// for an unsupported dtype); the host reports the message with the layer_id. The spec's device
// (`spec->device`) is the host's: on CUDA its compute_stream(), blas_handle() and dnn_handle()
// are the opaque cudaStream_t, cublasLtHandle_t and cudnnHandle_t the layer must use, and every
// tensor, token and target pointer the layer sees is a device pointer valid in stream order.
typedef void* (*bigmac_layer_factory)(const void* layer_spec);

// The registry handle the host passes to the entry point. Valid only during the call.
typedef struct bigmac_registry {
  void* host;  // opaque
  // Registers the `backend` ("cpu" or "cuda") implementation of layer type `type_name` (letters,
  // digits, '_'). Returns 0, or non-zero if the (name, backend) is taken or malformed; the host
  // then reports why and refuses the plugin.
  int (*register_layer)(void* host, const char* type_name, const char* backend,
                        bigmac_layer_factory factory);
  // A message the host prints if the entry point returns non-zero.
  void (*report_error)(void* host, const char* message);
} bigmac_registry;

// The one symbol a plugin exports. `host_abi_version` is the host's BIGMAC_PLUGIN_ABI_VERSION; a
// plugin built for another version must return non-zero without touching `registry`'s other
// fields beyond report_error. Returns 0 on success.
typedef int (*bigmac_plugin_entry)(uint32_t host_abi_version, bigmac_registry* registry);

#ifdef __cplusplus
}  // extern "C"

#include <string>

#include "core/layer/layer.h"

namespace bigmac::plugin {

// The factory of a Layer subclass constructed from a LayerSpec.
template <typename LayerClass>
void* Factory(const void* layer_spec) {
  return static_cast<layer::Layer*>(
      new LayerClass(*static_cast<const layer::LayerSpec*>(layer_spec)));
}

// The factory of a class template over float and double, picked by the spec's dtype.
template <template <typename> class LayerClass>
void* DTypeFactory(const void* layer_spec) {
  return layer::MakeForDType<LayerClass>(*static_cast<const layer::LayerSpec*>(layer_spec))
      .release();
}

// Registers a factory as `type_name` for `backend`; false if the host refused it (the host says
// why).
inline bool RegisterLayer(bigmac_registry* registry, const char* type_name, const char* backend,
                          bigmac_layer_factory factory) {
  return registry->register_layer(registry->host, type_name, backend, factory) == 0;
}

}  // namespace bigmac::plugin

// Defines the entry point: checks the ABI version, then calls `register_function`, a
// `bool (bigmac_registry*)` that registers the plugin's layers.
#define BIGMAC_PLUGIN(register_function)                                                \
  extern "C" __attribute__((visibility("default"))) int bigmac_plugin_register(         \
      uint32_t host_abi_version, bigmac_registry* registry) {                           \
    if (host_abi_version != BIGMAC_PLUGIN_ABI_VERSION) {                                \
      const std::string message =                                                       \
          "built for plugin ABI version " + std::to_string(BIGMAC_PLUGIN_ABI_VERSION) + \
          ", but this bigmac speaks version " + std::to_string(host_abi_version) +      \
          ": rebuild the plugin against this bigmac's headers";                         \
      registry->report_error(registry->host, message.c_str());                          \
      return 1;                                                                         \
    }                                                                                   \
    return register_function(registry) ? 0 : 1;                                         \
  }
#endif  // __cplusplus

#endif  // BIGMAC_PLUGINS_BIGMAC_PLUGIN_H_
