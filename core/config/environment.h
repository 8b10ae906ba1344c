#ifndef BIGMAC_CORE_CONFIG_ENVIRONMENT_H_
#define BIGMAC_CORE_CONFIG_ENVIRONMENT_H_

#include <string>
#include <vector>

#include "core/config/loader.h"

namespace bigmac::config {

// The most OpenMP threads a rank may ask for through OMP_NUM_THREADS. More than the largest
// nodes' hardware threads only oversubscribes them; far more makes libgomp fail to create its
// threads (a crash inside libgomp, or a stall), so it is refused before any work.
inline constexpr int kMaxOmpThreads = 1024;

// The environment variables BigMac consumes that are not config keys, checked like config values
// before any command runs: one problem per bad value, naming the variable, its value and the
// rule (exit 2). Today: OMP_NUM_THREADS, a positive integer, or a comma-separated list of them
// (one per nesting level, as OpenMP allows), each at most kMaxOmpThreads.
std::vector<std::string> CheckEnvironment(const LaunchEnv& env);

}  // namespace bigmac::config

#endif  // BIGMAC_CORE_CONFIG_ENVIRONMENT_H_
