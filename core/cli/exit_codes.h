#ifndef BIGMAC_CORE_CLI_EXIT_CODES_H_
#define BIGMAC_CORE_CLI_EXIT_CODES_H_

namespace bigmac::cli {

// Process exit codes; docs/exit_codes.md is the user-facing table. Keep both in step.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;      // an internal or runtime error
inline constexpr int kExitConfig = 2;       // bad command line or configuration (every rank)
inline constexpr int kExitOutOfMemory = 3;  // memory::OutOfMemoryError: over the device's capacity
inline constexpr int kExitNumerical = 4;    // engine::NumericalError: NaN/Inf loss or gradient
inline constexpr int kExitBadData = 5;      // data::DataError: a data file that cannot be used
inline constexpr int kExitTimeout = 6;      // comm::DeadlineError: a wait on another rank timed out
inline constexpr int kExitCheckpoint = 7;   // checkpoint::CheckpointError: unusable or unwritable
inline constexpr int kExitOutput = 8;       // an output location that cannot be used (any command)
inline constexpr int kExitDevice = 9;  // device::DeviceError: a CUDA/cuBLAS/cuDNN/NCCL call failed
// SIGTERM/SIGINT stopped training after a step before train.max_steps, and a checkpoint of that
// step was committed: the run is unfinished and resumable; the sbatch scripts requeue on it.
inline constexpr int kExitStopped = 10;
// A stop signal during start-up: 128 + the signal (143 SIGTERM, 130 SIGINT), util::SetStopAtOnce.

}  // namespace bigmac::cli

#endif  // BIGMAC_CORE_CLI_EXIT_CODES_H_
