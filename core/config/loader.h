#ifndef BIGMAC_CORE_CONFIG_LOADER_H_
#define BIGMAC_CORE_CONFIG_LOADER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/config/config.pb.h"
#include "core/config/provenance.h"

namespace bigmac::config {

// Configs are a few KiB; anything this big is the wrong file (or an attack on the YAML parser).
inline constexpr uint64_t kMaxConfigBytes = 1 << 20;

// The merged configuration before validation: defaults < file < --set, with a source per key.
struct LoadedConfig {
  Config values;
  Provenance sources;
  std::string file;                    // empty when no file was given
  std::vector<std::string> overrides;  // the --set arguments, in order
};

// Environment lookup (getenv, or a map in tests): null if unset.
using LaunchEnv = std::function<const char*(const char*)>;

// Loads `file` (YAML: .yaml/.yml; text proto: .textproto/.txtpb/.pbtxt) if not empty, then applies
// each "key=value" override in order. Values in overrides are YAML, so lists read "[7,7,7,6]".
// Launch-layer keys (device.transport) are refused in both; their one writer is the launcher,
// through the variable config.proto names (BIGMAC_TRANSPORT), read from the process environment
// (or `env`) with the source "launch: VARIABLE". Throws ConfigError listing every problem found
// (unknown or misplaced keys, bad values, syntax).
LoadedConfig LoadConfig(const std::string& file, const std::vector<std::string>& overrides);
LoadedConfig LoadConfig(const std::string& file, const std::vector<std::string>& overrides,
                        const LaunchEnv& env);

// "default < configs/x.yaml < --set (2 overrides)": the merge order, printed in the [cfg] log.
std::string PrecedenceLine(const LoadedConfig& loaded);

}  // namespace bigmac::config

#endif  // BIGMAC_CORE_CONFIG_LOADER_H_
