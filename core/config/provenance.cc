#include "core/config/provenance.h"

namespace bigmac::config {

std::string Source::ToString() const {
  switch (kind) {
    case Kind::kDefault:
      return "default";
    case Kind::kFile:
      return file + ":" + std::to_string(line);
    case Kind::kOverride:
      return detail.empty() ? "--set" : detail;
    case Kind::kDerived:
      return detail.empty() ? "derived" : "derived: " + detail;
    case Kind::kLaunch:
      return detail.empty() ? "launch" : "launch: " + detail;
  }
  return "unknown";
}

const Source& Provenance::Get(const std::string& key) const {
  static const Source kDefault;
  auto it = sources_.find(key);
  return it == sources_.end() ? kDefault : it->second;
}

}  // namespace bigmac::config
