#ifndef BIGMAC_CORE_LAYER_PLUGIN_LOADER_H_
#define BIGMAC_CORE_LAYER_PLUGIN_LOADER_H_

#include <stdexcept>
#include <string>
#include <vector>

namespace bigmac::layer {

// A plugin library that cannot be loaded; the message names the file and the problem.
class PluginError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Loads a layer plugin (plugins/bigmac_plugin.h) with dlopen, checks its ABI version and adds its
// layer types to the registry with the library's path as their origin. Returns the types it
// added. Loading the same path twice is a no-op. The library stays loaded for the process's life
// (its factories are in it). Throws PluginError.
std::vector<std::string> LoadPlugin(const std::string& path);

// Loads each path in order; stops at the first failure (PluginError).
void LoadPlugins(const std::vector<std::string>& paths);

}  // namespace bigmac::layer

#endif  // BIGMAC_CORE_LAYER_PLUGIN_LOADER_H_
