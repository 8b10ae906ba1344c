#include "core/cli/model_config.h"

#include <cstdio>
#include <set>

#include "core/cli/exit_codes.h"
#include "core/config/errors.h"
#include "core/engine/model.h"
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

// The backends the built-in layers implement: the ones this build has.
std::set<std::string> BuiltInBackends() {
  const layer::LayerRegistry& registry = layer::LayerRegistry::Global();
  std::set<std::string> backends;
  for (const std::string& name : registry.Names()) {
    for (const std::string& backend : registry.Backends(name)) {
      if (registry.Origin(name, backend) == registry::kBuiltIn) backends.insert(backend);
    }
  }
  return backends;
}

// "cpu: built-in, cuda: lib.so", or the one origin when every backend has the same.
std::string OriginsOf(const std::string& name) {
  const layer::LayerRegistry& registry = layer::LayerRegistry::Global();
  std::vector<std::string> origins;
  std::set<std::string> distinct;
  for (const std::string& backend : registry.Backends(name)) {
    origins.push_back(backend + ": " + registry.Origin(name, backend));
    distinct.insert(registry.Origin(name, backend));
  }
  return distinct.size() == 1 ? *distinct.begin() : util::Join(origins, ", ");
}

}  // namespace

std::vector<std::string> CheckLayerBackends(const config::ResolvedConfig& resolved) {
  const layer::LayerRegistry& registry = layer::LayerRegistry::Global();
  const std::string& backend = resolved.values().device().backend();
  // A backend no built-in layer implements is one this build lacks: training refuses it as not
  // implemented, while plan and --dry-run still show its layouts. The built-in types come with
  // the backend, so only the other (plugin) types are held to it then.
  const bool build_has_backend = BuiltInBackends().count(backend) > 0;
  const engine::ModelDescription model = engine::ModelOf(resolved);
  // (type, who uses it), in model order, each type once.
  std::vector<std::pair<std::string, std::string>> uses = {
      {model.embedding_type, "the model's embedding"}};
  for (const std::string& type : model.block_types) {
    uses.emplace_back(
        type, "model.layer_types (" + resolved.sources().Get("model.layer_types").ToString() + ")");
  }
  uses.emplace_back(model.head_type, "the model's head");
  std::vector<std::string> problems;
  std::set<std::string> reported;
  for (const auto& [type, used_by] : uses) {
    const std::vector<std::string> has = registry.Backends(type);
    // Unregistered types are CheckLayerTypesRegistered's problem.
    if (has.empty() || registry.Origin(type, backend) != "" || !reported.insert(type).second)
      continue;
    if (!build_has_backend && registry.Origin(type) == registry::kBuiltIn) continue;
    problems.push_back(type + " has no " + backend +
                       " implementation (has: " + util::Join(has, ", ") + "): " + used_by +
                       " uses it with device.backend=" + backend + " (" +
                       resolved.sources().Get("device.backend").ToString() + "); it comes from " +
                       OriginsOf(type) + ". Set device.backend to one it " +
                       "has, or load a plugin that registers " + type + " for " + backend);
  }
  return problems;
}

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
  std::vector<std::string> problems = CheckLayerTypesRegistered(resolved);
  for (std::string& problem : CheckLayerBackends(resolved)) problems.push_back(std::move(problem));
  if (!problems.empty()) throw config::ConfigError(std::move(problems));
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
  std::printf("%-20s %-10s %s\n", "layer type", "backends", "from");
  for (const std::string& name : registry.Names()) {
    std::printf("%-20s %-10s %s\n", name.c_str(), util::Join(registry.Backends(name), ",").c_str(),
                OriginsOf(name).c_str());
  }
  return kExitOk;
}

}  // namespace bigmac::cli
