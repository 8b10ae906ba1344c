#ifndef BIGMAC_CORE_CHECKPOINT_SAVER_H_
#define BIGMAC_CORE_CHECKPOINT_SAVER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "core/checkpoint/checkpoint.h"

namespace bigmac::checkpoint {

// One save: where, which step, and what the manifest records. `config` is the trainer's and
// outlives the save.
struct SaveRequest {
  std::string root;
  int64_t step = 0;
  const config::ResolvedConfig* config = nullptr;
  int keep_last = 3;
  std::string tokenizer;  // rank 0's, recorded in the manifest
  util::FaultPlan faults;
  std::optional<DataPosition> data;  // rank 0's position in the data after `step` steps
};

// Saves checkpoints (docs/checkpoint.md) in phases, so that the writing can overlap training
// (checkpoint.async):
//   Start   collective: this rank's share of the step's layer files is copied into one host
//           buffer the saver keeps from save to save (tp slices gathered first; ZeRO-1 slices of
//           the moments as pieces of their file): the snapshot, all a step waits for. On a GPU
//           the copies are queued on the device's copy stream (Device::copy_stream) into pinned
//           memory, so the step waits only for queueing them, and GuardState orders the next
//           write of the state after them. The buffer is then written and fsynced into a
//           temporary directory, on a background thread when asynchronous, before Start returns
//           otherwise; the writing starts when the copies have landed.
//   Poll    collective, once per step while a save is in flight: if every rank's files are
//           durable, commits.
//   Finish  collective: waits for this rank's files, then commits.
//   commit  every rank's report gathered on rank 0 (the CRC-32s of the pieces it wrote, combined
//           there, so no file is read back); the manifest written, the directory renamed into
//           place, then `latest`; older checkpoints pruned. A failure anywhere throws
//           CheckpointError on every rank and leaves the previous checkpoints and `latest` as they
//           were.
// At most one save is in flight: Start finishes the one before it first. The background thread
// touches only the buffer and the files, never a communicator or the model; of the device, it
// only waits for the snapshot's copies (Device::WaitEventOnHost).
class Saver {
 public:
  explicit Saver(bool async);
  // Waits for a write in flight. A save not committed is abandoned, as a crash would leave it:
  // its temporary directory stays until that step is saved again, and `latest` is unchanged.
  ~Saver();
  Saver(const Saver&) = delete;
  Saver& operator=(const Saver&) = delete;

  // Collective. Snapshots `state` (its master values) and `adamw` (the moments); neither is read
  // after Start returns. Returns the stats of the save it finished first, if one was in flight.
  std::optional<SaveStats> Start(const SaveRequest& request, const ModelState& state,
                                 const optim::AdamW& adamw, comm::PipelineComm& comm);
  std::optional<SaveStats> Poll(comm::PipelineComm& comm);
  // Nothing if no save is in flight.
  std::optional<SaveStats> Finish(comm::PipelineComm& comm);

  // Collective, before the first step. Sizes the snapshot buffer and touches every byte of it by
  // taking a snapshot that is then dropped: fresh host memory is slow to touch the first time
  // (and pinning it is slow on CUDA), and that cost belongs to start-up, not to the first save's
  // step. Nothing is written. Returns the seconds it took.
  double Prepare(const ModelState& state, const optim::AdamW& adamw, comm::PipelineComm& comm);

  // Call before anything writes the parameters' values or the moments again after a Start (the
  // next optimizer step): the device's compute stream waits for the snapshot's copies, without
  // blocking the host. Nothing to do on the CPU, or once the copies are known to have landed.
  void GuardState();

  bool in_flight() const;
  // The snapshot buffer's bytes, held from Prepare or the first save to the saver's end (pinned
  // host memory on CUDA, outside the device allocator).
  int64_t buffer_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace bigmac::checkpoint

#endif  // BIGMAC_CORE_CHECKPOINT_SAVER_H_
