#include "core/layer/plugin_loader.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cctype>
#include <cstdlib>
#include <memory>

#include "core/layer/layer.h"
#include "core/util/format.h"
#include "plugins/bigmac_plugin.h"

namespace bigmac::layer {
namespace {

// What the entry point registered, and what went wrong, while it runs.
struct HostState {
  std::string path;
  std::vector<std::string> registered;
  std::vector<std::string> errors;
};

bool ValidTypeName(const char* name) {
  if (name == nullptr || *name == '\0') return false;
  for (const char* c = name; *c; ++c) {
    if (!std::isalnum(static_cast<unsigned char>(*c)) && *c != '_') return false;
  }
  return true;
}

int RegisterFromPlugin(void* host, const char* type_name, const char* backend_name,
                       bigmac_layer_factory factory) {
  auto* state = static_cast<HostState*>(host);
  if (!ValidTypeName(type_name) || factory == nullptr) {
    state->errors.push_back("registers a layer type with an invalid name or no factory: '" +
                            std::string(type_name ? type_name : "(null)") +
                            "' (names are letters, digits and '_')");
    return 1;
  }
  const std::string name = type_name;
  device::Backend parsed;
  if (backend_name == nullptr || !device::ParseBackend(backend_name, &parsed)) {
    state->errors.push_back("registers layer type '" + name + "' for backend '" +
                            std::string(backend_name ? backend_name : "(null)") +
                            "' (backends: cpu, cuda)");
    return 1;
  }
  const std::string backend = backend_name;
  auto make = [factory, name](const LayerSpec& spec) -> std::unique_ptr<Layer> {
    void* made = factory(&spec);
    if (made == nullptr) {
      throw std::runtime_error("layer type '" + name + "' (plugin) returned no layer for " +
                               LayerIdName(spec.layer_id, spec.dims.num_layers));
    }
    return std::unique_ptr<Layer>(static_cast<Layer*>(made));
  };
  try {
    LayerRegistry::Global().Register(name, backend, make, state->path);
  } catch (const std::logic_error& error) {
    state->errors.push_back(std::string("layer type '") + name + "' is already registered by " +
                            LayerRegistry::Global().Origin(name, backend) +
                            "; layer type names must be unique across bigmac and its plugins");
    return 1;
  }
  if (state->registered.empty() || state->registered.back() != name)
    state->registered.push_back(name);
  return 0;
}

void ReportFromPlugin(void* host, const char* message) {
  static_cast<HostState*>(host)->errors.push_back(message ? message : "(no message)");
}

// The path with symbolic links and ".." resolved, or `path` if it does not exist.
std::string CanonicalPath(const std::string& path) {
  char* real = realpath(path.c_str(), nullptr);
  const std::string canonical = real ? real : path;
  free(real);
  return canonical;
}

}  // namespace

std::vector<std::string> LoadPlugin(const std::string& path) {
  const std::string where = "plugin " + path;
  struct stat info;
  if (stat(path.c_str(), &info) != 0) {
    throw PluginError(where +
                      ": no such file (check --plugin / plugins: in the config; relative "
                      "paths are from the current directory)");
  }
  if (!S_ISREG(info.st_mode)) throw PluginError(where + ": not a regular file");
  const std::string canonical = CanonicalPath(path);
  if (void* already = dlopen(canonical.c_str(), RTLD_NOW | RTLD_NOLOAD)) {
    // Loaded before (the registry remembers each type's library).
    dlclose(already);
    std::vector<std::string> types;
    for (const std::string& name : LayerRegistry::Global().Names()) {
      if (CanonicalPath(LayerRegistry::Global().Origin(name)) == canonical) types.push_back(name);
    }
    return types;
  }

  // RTLD_LOCAL: a plugin's symbols do not leak into the next plugin's lookups.
  void* library = dlopen(canonical.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = dlerror();
    throw PluginError(where + ": cannot load the shared library: " + (why ? why : "unknown"));
  }
  dlerror();
  auto entry = reinterpret_cast<bigmac_plugin_entry>(dlsym(library, BIGMAC_PLUGIN_ENTRY_NAME));
  if (entry == nullptr) {
    dlclose(library);
    throw PluginError(where + ": no entry point '" BIGMAC_PLUGIN_ENTRY_NAME
                              "': not a bigmac layer plugin (define it with "
                              "BIGMAC_PLUGIN(...) from plugins/bigmac_plugin.h)");
  }
  HostState state;
  state.path = path;  // as the user wrote it, for listings and messages
  bigmac_registry registry{&state, &RegisterFromPlugin, &ReportFromPlugin};
  int status = 0;
  try {
    status = entry(BIGMAC_PLUGIN_ABI_VERSION, &registry);
  } catch (const std::exception& error) {
    state.errors.push_back(std::string("its entry point threw: ") + error.what());
    status = 1;
  }
  for (std::string& error : state.errors) {
    // An older plugin's own version check: say what changed, so its author knows what to port.
    if (error.find("built for plugin ABI version") != std::string::npos &&
        error.find("speaks version " + std::to_string(BIGMAC_PLUGIN_ABI_VERSION)) !=
            std::string::npos) {
      error += ". " BIGMAC_PLUGIN_ABI_CHANGES;
    }
  }
  if (status != 0 || !state.errors.empty()) {
    // The library stays loaded: a factory it registered before failing may still be referenced.
    throw PluginError(where + ": " +
                      (state.errors.empty() ? "the entry point failed (returned " +
                                                  std::to_string(status) + ") without saying why"
                                            : util::Join(state.errors, "; ")));
  }
  if (state.registered.empty()) throw PluginError(where + ": registers no layer types");
  return state.registered;
}

void LoadPlugins(const std::vector<std::string>& paths) {
  for (const std::string& path : paths) LoadPlugin(path);
}

}  // namespace bigmac::layer
