#ifndef BIGMAC_CORE_CHECKPOINT_RESUME_PREVIEW_H_
#define BIGMAC_CORE_CHECKPOINT_RESUME_PREVIEW_H_

// What a resume will do, said before it does it (`bigmac train --resume X --dry-run`): the saved
// layout against the new one, the layer files each pipeline stage will read and what is
// re-sliced, whether the data stream continues exactly, and whether the optimizer state is
// complete. Pure: it reads the manifest and the resolved config only.

#include <string>
#include <vector>

#include "core/checkpoint/checkpoint.pb.h"
#include "core/config/resolve.h"

namespace bigmac::checkpoint {

// The preview's lines for resuming `manifest` (the checkpoint in `step_dir`) under `resolved`.
std::vector<std::string> DescribeResume(const Manifest& manifest,
                                        const config::ResolvedConfig& resolved);

// How the data (data.path's blend and data.split) of `saved` differs from `now`'s: lines like
// "data.path [0.25 a, 0.75 b] -> [0.5 a, 0.5 b]"; empty when they are the same. data.dir counts
// only when either uses data.path (the one dataset's directory may move).
std::vector<std::string> BlendChanges(const config::Config& saved,
                                      const config::ResolvedConfig& now);

}  // namespace bigmac::checkpoint

#endif  // BIGMAC_CORE_CHECKPOINT_RESUME_PREVIEW_H_
