#ifndef BIGMAC_CORE_ENGINE_TRAINER_H_
#define BIGMAC_CORE_ENGINE_TRAINER_H_

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/comm/pipeline_comm.h"
#include "core/config/resolve.h"
#include "core/device/device.h"
#include "core/util/fault_plan.h"

namespace bigmac::engine {

// A non-finite loss or gradient; the message names the step and the layer.
class NumericalError : public std::runtime_error {
 public:
  explicit NumericalError(const std::string& message, bool reported = false)
      : std::runtime_error(message), reported_(reported) {}
  // Already printed (by rank 0, for the whole pipeline) before the ranks stopped.
  bool reported() const { return reported_; }

 private:
  bool reported_;
};

struct TrainOptions {
  // The device the CLI chose for this rank (it outlives the call). Null: a CPU device with
  // device.memory_limit, or the host's memory shared by `ranks_on_node`.
  device::Device* device = nullptr;
  int ranks_on_node = 1;  // shares the host's memory when device.memory_limit is unset
  std::string dump_dir;   // if set: final weights per layer_id and per-step losses, to compare runs
  std::string resume;     // "auto", a checkpoint step directory or root, or "" (start fresh)
  std::function<void(const std::string&)> log = [](const std::string&) {};  // called on rank 0
  util::FaultPlan faults;  // what the reliability tests inject (nothing by default)
};

struct TrainResult {
  std::vector<double> train_losses;                // per step, mean per token (rank 0)
  std::vector<std::pair<int, double>> val_losses;  // (step, mean per token) (rank 0)
  std::vector<double> final_parameters;            // this rank's owned parameters, flattened
  int64_t peak_bytes = 0;                          // this rank's allocator peak
  int64_t checkpoint_buffer_bytes =
      0;                        // host memory of the checkpoint snapshot (checkpoint/saver.h)
  int max_in_flight = 0;        // most (micro-batch, stage) activations kept
  int64_t parameter_count = 0;  // this rank's owned parameters
  int skipped_steps = 0;        // updates skipped for non-finite gradients (train.nan_policy=skip)
  int stopped_at_step = -1;     // the step after which SIGTERM/SIGINT stopped training, or -1
  bool stop_checkpointed = false;  // that stop committed a checkpoint of its step
  // Buffers the allocator had to get from the system after the first step (0: steady state).
  int64_t steady_state_system_allocations = 0;
  // Activation and gradient bytes this rank sent to its pipeline neighbours per step (the last
  // step), as counted by the transport.
  int64_t activation_bytes_per_step = 0;
  // Run outputs (metrics.jsonl, events, trace.json, --dump) that could not be written whole after
  // start-up, each naming the file and the OS's reason: the run trains on and exits 8.
  std::vector<std::string> output_failures;
};

// Trains with the configured schedule on this rank's stages: for each optimizer step,
// gradient_accumulation_steps / num_microbatches flushes of the rank's action list, then the
// per-step tail: the tied gradient to its owner, the data-parallel all-reduce, global-norm
// clipping (each parameter counted once), AdamW with warm-up and cosine decay, and the updated
// tied weight back to its consumer. precision.dtype=bf16 keeps fp32 masters, gradients and
// moments, computes from bf16 copies and sends bf16 activations. Rank 0 logs the progress line
// (loss from the last stage) and validation losses.
// Saves checkpoints every checkpoint.interval steps and at the end when checkpoint.dir is set, and
// resumes from options.resume. Throws memory::OutOfMemoryError, data::DataError, NumericalError,
// comm::DeadlineError, comm::TransportError, checkpoint::CheckpointError.
TrainResult Train(const config::ResolvedConfig& config, comm::PipelineComm& comm,
                  const TrainOptions& options);

// One rank, no MPI.
TrainResult TrainSingleRank(const config::ResolvedConfig& config,
                            const std::function<void(const std::string&)>& log);

}  // namespace bigmac::engine

#endif  // BIGMAC_CORE_ENGINE_TRAINER_H_
