#ifndef BIGMAC_CLI_MODEL_CONFIG_H_
#define BIGMAC_CLI_MODEL_CONFIG_H_

#include <string>
#include <vector>

#include "core/config/resolve.h"

namespace bigmac::cli {

// The start-up path every command that builds a model shares: load the config and its overrides,
// append the --plugin libraries to `plugins`, load every plugin, resolve against `world_size`,
// and check that every layer type is registered, for device.backend. Throws config::ConfigError
// with every problem (a plugin that cannot be loaded is one).
config::ResolvedConfig LoadModelConfig(const std::string& file,
                                       const std::vector<std::string>& overrides,
                                       const std::vector<std::string>& plugins, int world_size,
                                       const std::string& world_source);

// Problems with the registered layer types of `resolved` (unknown names, with what is known).
std::vector<std::string> CheckLayerTypesRegistered(const config::ResolvedConfig& resolved);

// Problems with the backends of `resolved`'s layer types: every type the model builds (its
// embedding, the blocks of model.layer_types, its head) needs an implementation for
// device.backend ("rms_swiglu_block has no cuda implementation (has: cpu): ..."). A backend that
// no built-in layer implements is one this build lacks (training refuses it; plan and --dry-run
// show its layouts): then only the plugin types are checked. Unregistered types are skipped.
std::vector<std::string> CheckLayerBackends(const config::ResolvedConfig& resolved);

// `bigmac layers`: every registered layer type, its backends and the library it came from.
int RunLayers(const std::vector<std::string>& plugins);

}  // namespace bigmac::cli

#endif  // BIGMAC_CLI_MODEL_CONFIG_H_
