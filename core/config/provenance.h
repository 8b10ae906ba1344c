#ifndef BIGMAC_CORE_CONFIG_PROVENANCE_H_
#define BIGMAC_CORE_CONFIG_PROVENANCE_H_

#include <map>
#include <string>

namespace bigmac::config {

// Where an effective value came from. Later sources win: default < file < --set.
struct Source {
  enum class Kind { kDefault, kFile, kOverride, kDerived, kLaunch };
  Kind kind = Kind::kDefault;
  std::string file;    // kFile: the config file
  int line = 0;        // kFile: 1-based line
  std::string detail;  // kDerived: the formula; kLaunch: where the launcher told us; kOverride:
                       // the flag, if not --set

  static Source Default() { return {}; }
  static Source File(std::string file, int line) {
    return {Kind::kFile, std::move(file), line, ""};
  }
  static Source Override() { return {Kind::kOverride, "", 0, ""}; }
  // A command-line flag other than --set (`flag` is how it is printed, e.g. "--plugin").
  static Source Flag(std::string flag) { return {Kind::kOverride, "", 0, std::move(flag)}; }
  static Source Derived(std::string formula) { return {Kind::kDerived, "", 0, std::move(formula)}; }
  static Source Launch(std::string what) { return {Kind::kLaunch, "", 0, std::move(what)}; }

  // "default", "configs/x.yaml:7", "--set", "derived: ...", "launch: ...".
  std::string ToString() const;
};

// Source per dotted key ("parallel.pp_size"). Keys absent from the map hold their default.
class Provenance {
 public:
  void Set(const std::string& key, Source source) { sources_[key] = std::move(source); }
  const Source& Get(const std::string& key) const;
  bool IsDefault(const std::string& key) const { return !sources_.count(key); }

 private:
  std::map<std::string, Source> sources_;
};

}  // namespace bigmac::config

#endif  // BIGMAC_CORE_CONFIG_PROVENANCE_H_
