#ifndef BIGMAC_CORE_CHECKPOINT_OUTPUT_GUARD_H_
#define BIGMAC_CORE_CHECKPOINT_OUTPUT_GUARD_H_

#include <string>

namespace bigmac::checkpoint {

// Whether `dir` holds checkpoints: a `latest` pointer file or a step directory with a manifest.
bool HoldsCheckpoints(const std::string& dir);

// "" unless writing `path` would replace something a checkpoint names: `path` is, or lies
// inside, a step directory (one with manifest.pb), or is the `latest` pointer or a step_*
// directory of a directory that holds checkpoints. `what` names the option ("--safetensors").
std::string CheckNotInCheckpoint(const std::string& path, const std::string& what);

}  // namespace bigmac::checkpoint

#endif  // BIGMAC_CORE_CHECKPOINT_OUTPUT_GUARD_H_
