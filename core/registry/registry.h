#ifndef BIGMAC_CORE_REGISTRY_REGISTRY_H_
#define BIGMAC_CORE_REGISTRY_REGISTRY_H_

#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace bigmac::registry {

// Name -> factory for one kind of object (layers, ...). Filled at static-initialisation time by
// Registrar objects; the targets that hold them must be `alwayslink = True`, or the linker drops
// them from static archives and the names silently vanish (Caffe's lesson). Plugin libraries
// loaded at run time add to it through core/layer/plugin_loader.
// This is the project's only global state.
inline constexpr char kBuiltIn[] = "built-in";

template <typename Base, typename... Args>
class Registry {
 public:
  using Factory = std::function<std::unique_ptr<Base>(Args...)>;

  static Registry& Global() {
    static Registry* registry = new Registry();  // never destroyed: safe at exit
    return *registry;
  }

  // `origin` says where the factory came from ("built-in", or a plugin library's path), for
  // listings and for the duplicate error. Throws std::logic_error on a duplicate name.
  void Register(const std::string& name, Factory factory, const std::string& origin = kBuiltIn) {
    if (factories_.count(name)) {
      throw std::logic_error("duplicate registration of '" + name + "' by " + origin +
                             ": already registered by " + origins_[name]);
    }
    factories_[name] = std::move(factory);
    origins_[name] = origin;
  }

  // Where `name` came from, or "" if it is not registered.
  std::string Origin(const std::string& name) const {
    auto it = origins_.find(name);
    return it == origins_.end() ? "" : it->second;
  }

  bool Has(const std::string& name) const { return factories_.count(name) > 0; }

  // Throws std::invalid_argument listing the known names if `name` is unknown.
  std::unique_ptr<Base> Create(const std::string& name, Args... args) const {
    auto it = factories_.find(name);
    if (it == factories_.end()) {
      throw std::invalid_argument("unknown type '" + name + "'; known types: " + KnownNames());
    }
    return it->second(std::forward<Args>(args)...);
  }

  std::vector<std::string> Names() const {
    std::vector<std::string> names;
    for (const auto& entry : factories_) names.push_back(entry.first);
    return names;
  }

  std::string KnownNames() const {
    std::string text;
    for (const auto& entry : factories_) text += (text.empty() ? "" : ", ") + entry.first;
    return text.empty() ? "(none: is the plugin target alwayslink?)" : text;
  }

 private:
  std::map<std::string, Factory> factories_;
  std::map<std::string, std::string> origins_;
};

// A static instance registers a factory: `static Registrar<Layer, ...> r("name", factory);`.
template <typename Base, typename... Args>
struct Registrar {
  Registrar(const std::string& name, typename Registry<Base, Args...>::Factory factory) {
    Registry<Base, Args...>::Global().Register(name, std::move(factory));
  }
};

}  // namespace bigmac::registry

#endif  // BIGMAC_CORE_REGISTRY_REGISTRY_H_
