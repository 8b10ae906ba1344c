#ifndef BIGMAC_CORE_CHECKPOINT_INTERNAL_H_
#define BIGMAC_CORE_CHECKPOINT_INTERNAL_H_

// What the save path (saver.cc) and the load path (checkpoint.cc) share. Private to
// core/checkpoint.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/checkpoint/model_state.h"
#include "core/comm/group.h"

namespace bigmac::checkpoint::internal {

inline constexpr char kManifest[] = "manifest.pb";
inline constexpr char kLatest[] = "latest";
// The three tensors of a parameter in a layer file, in file order.
inline constexpr const char* kKinds[] = {"value", "exp_avg", "exp_avg_sq"};

// Checkpoint files are written and read in chunks of kDirectIoChunk bytes with O_DIRECT, which
// wants buffers, offsets and lengths aligned to the logical block size; kDirectIoAlign covers
// every disk in use.
inline constexpr int64_t kDirectIoAlign = 4096;
inline constexpr int64_t kDirectIoChunk = int64_t{64} << 20;

// The bytes of an f32 tensor of `shape`, or -1 if an extent is negative or the count overflows.
int64_t F32Bytes(const std::vector<int64_t>& shape);

// Checkpoints hold f32 masters: anything else in the model is refused (CheckpointError), naming
// `where` and the parameter.
void CheckMaster(const std::string& where, const ModelState& state, int layer_id,
                 const layer::Param& param);

// Runs `work` on this rank, then agrees with every rank: if any failed, every rank throws
// CheckpointError, with its own error or, where its work succeeded, `elsewhere`; `suffix` ends
// both. Collective over `world`.
void RunAndAgree(comm::Group& world, const std::function<void()>& work,
                 const std::string& elsewhere, const std::string& suffix = "");

}  // namespace bigmac::checkpoint::internal

#endif  // BIGMAC_CORE_CHECKPOINT_INTERNAL_H_
