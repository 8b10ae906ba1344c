#ifndef BIGMAC_CORE_REGISTRY_REGISTRY_H_
#define BIGMAC_CORE_REGISTRY_REGISTRY_H_

#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace bigmac::registry {

// (name, backend) -> factory for one kind of object (layers, ...). A model config names types
// only; the backend (device.backend: "cpu", "cuda") picks the implementation. Filled at
// static-initialisation time by Registrar objects; the targets that hold them must be
// `alwayslink = True`, or the linker drops them from static archives and the names silently
// vanish (Caffe's lesson). Plugin libraries loaded at run time add to it through
// core/layer/plugin_loader. This is the project's only global state.
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
  // listings and for the duplicate error. Throws std::logic_error on a duplicate (name, backend).
  void Register(const std::string& name, const std::string& backend, Factory factory,
                const std::string& origin = kBuiltIn) {
    const Key key{name, backend};
    if (factories_.count(key)) {
      throw std::logic_error("duplicate registration of '" + name + "' (backend " + backend +
                             ") by " + origin + ": already registered by " + origins_[key]);
    }
    factories_[key] = std::move(factory);
    origins_[key] = origin;
  }

  // Where (`name`, `backend`) came from, or "" if it is not registered.
  std::string Origin(const std::string& name, const std::string& backend) const {
    auto it = origins_.find({name, backend});
    return it == origins_.end() ? "" : it->second;
  }

  // Where `name` came from, for any backend (one library registers all of a type's backends),
  // or "".
  std::string Origin(const std::string& name) const {
    const std::vector<std::string> backends = Backends(name);
    return backends.empty() ? "" : Origin(name, backends.front());
  }

  // Whether `name` is registered for any backend.
  bool Has(const std::string& name) const { return !Backends(name).empty(); }

  // The backends `name` is registered for, sorted.
  std::vector<std::string> Backends(const std::string& name) const {
    std::vector<std::string> backends;
    for (const auto& entry : factories_) {
      if (entry.first.first == name) backends.push_back(entry.first.second);
    }
    return backends;
  }

  // Throws std::invalid_argument listing the known names if `name` is unknown, or naming the
  // backends it has if it has no `backend` implementation.
  std::unique_ptr<Base> Create(const std::string& name, const std::string& backend,
                               Args... args) const {
    auto it = factories_.find({name, backend});
    if (it == factories_.end()) {
      const std::vector<std::string> has = Backends(name);
      if (has.empty())
        throw std::invalid_argument("unknown type '" + name + "'; known types: " + KnownNames());
      std::string list;
      for (const std::string& b : has) list += (list.empty() ? "" : ", ") + b;
      throw std::invalid_argument(name + " has no " + backend + " implementation (has: " + list +
                                  ")");
    }
    return it->second(std::forward<Args>(args)...);
  }

  // Registered names, each once, sorted.
  std::vector<std::string> Names() const {
    std::vector<std::string> names;
    for (const auto& entry : factories_) {
      if (names.empty() || names.back() != entry.first.first) names.push_back(entry.first.first);
    }
    return names;
  }

  std::string KnownNames() const {
    std::string text;
    for (const std::string& name : Names()) text += (text.empty() ? "" : ", ") + name;
    return text.empty() ? "(none: is the plugin target alwayslink?)" : text;
  }

 private:
  using Key = std::pair<std::string, std::string>;  // (name, backend)
  std::map<Key, Factory> factories_;
  std::map<Key, std::string> origins_;
};

// A static instance registers a factory:
// `static Registrar<Layer, ...> r("name", "cpu", factory);`.
template <typename Base, typename... Args>
struct Registrar {
  Registrar(const std::string& name, const std::string& backend,
            typename Registry<Base, Args...>::Factory factory) {
    Registry<Base, Args...>::Global().Register(name, backend, std::move(factory));
  }
};

}  // namespace bigmac::registry

#endif  // BIGMAC_CORE_REGISTRY_REGISTRY_H_
