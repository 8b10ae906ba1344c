#include "core/cli/model_config.h"

#include <cstdio>
#include <set>

#include "core/cli/exit_codes.h"
#include "core/config/errors.h"
#include "core/layer/layer.h"
#include "core/layer/plugin_loader.h"
#include "core/util/format.h"

namespace bigmac::cli {
namespace {

std::string KnownTypesWithOrigins() {
  const layer::LayerRegistry& registry = layer::LayerRegistry::Global();
  std::vector<std::string> entries;
  for (const std::string& name : registry.Names()) {
    entries.push_back(name + " (" + registry.Origin(name) + ")");
  }
  return util::Join(entries, ", ");
}

}  // namespace

std::vector<std::string> CheckLayerTypesRegistered(const config::ResolvedConfig& resolved) {
  std::vector<std::string> problems;
  std::set<std::string> reported;
  for (const std::string& type : resolved.block_types) {
    if (layer::LayerRegistry::Global().Has(type) || !reported.insert(type).second) continue;
    problems.push_back("model.layer_types names layer type '" + type + "' (" +
                       resolved.sources().Get("model.layer_types").ToString() +
                       "), which is not registered; known: " + KnownTypesWithOrigins() +
                       ". Load the plugin that defines it with --plugin or plugins: in the config");
  }
  return problems;
}

config::ResolvedConfig LoadModelConfig(const std::string& file,
                                       const std::vector<std::string>& overrides,
                                       const std::vector<std::string>& plugins, int world_size,
                                       const std::string& world_source) {
  config::LoadedConfig loaded = config::LoadConfig(file, overrides);
  if (!plugins.empty()) {
    for (const std::string& path : plugins) loaded.values.add_plugins(path);
    // The file's (or --set's) list first, then --plugin's.
    const bool had_list = !loaded.sources.IsDefault("plugins");
    loaded.sources.Set(
        "plugins",
        config::Source::Flag(had_list ? loaded.sources.Get("plugins").ToString() + " + --plugin"
                                      : "--plugin"));
  }
  for (const std::string& path : loaded.values.plugins()) {
    try {
      layer::LoadPlugin(path);
    } catch (const layer::PluginError& error) {
      throw config::ConfigError({std::string(error.what()) + " (plugins, " +
                                 loaded.sources.Get("plugins").ToString() + ")"});
    }
  }
  config::ResolvedConfig resolved = config::Resolve(std::move(loaded), world_size, world_source);
  if (std::vector<std::string> problems = CheckLayerTypesRegistered(resolved); !problems.empty()) {
    throw config::ConfigError(std::move(problems));
  }
  return resolved;
}

int RunLayers(const std::vector<std::string>& plugins) {
  try {
    layer::LoadPlugins(plugins);
  } catch (const layer::PluginError& error) {
    std::fprintf(stderr, "bigmac: %s\n", error.what());
    return kExitConfig;
  }
  const layer::LayerRegistry& registry = layer::LayerRegistry::Global();
  std::printf("%-20s %s\n", "layer type", "from");
  for (const std::string& name : registry.Names()) {
    std::printf("%-20s %s\n", name.c_str(), registry.Origin(name).c_str());
  }
  return kExitOk;
}

}  // namespace bigmac::cli
