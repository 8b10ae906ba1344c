#ifndef BIGMAC_CORE_CONFIG_EFFECTIVE_LOG_H_
#define BIGMAC_CORE_CONFIG_EFFECTIVE_LOG_H_

#include <string>
#include <vector>

#include "core/config/resolve.h"

namespace bigmac::config {

// The seeds' effective-config log, printed by rank 0 after the merge and the partition: the merge
// order, world_size/pp/tp/dp, the batch with its formula, the split points, each stage's layer
// range, the config hash, then every key with its value and source. A user reads it to check that
// a change took effect and came from the layer they meant.
std::vector<std::string> EffectiveConfigLines(const ResolvedConfig& resolved);

}  // namespace bigmac::config

#endif  // BIGMAC_CORE_CONFIG_EFFECTIVE_LOG_H_
