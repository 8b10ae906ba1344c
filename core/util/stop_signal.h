#ifndef BIGMAC_CORE_UTIL_STOP_SIGNAL_H_
#define BIGMAC_CORE_UTIL_STOP_SIGNAL_H_

namespace bigmac::util {

// SIGTERM and SIGINT (what Slurm sends before a time limit or on scancel, and Ctrl-C) ask the
// trainer to stop at the next step boundary, after an optional final checkpoint, instead of
// dying mid-write. A signal handler can only talk through a global flag; this is the one place
// that holds it. Install also ignores SIGXFSZ, so that a file-size limit makes writes fail with
// EFBIG (reported, previous checkpoint kept) instead of killing the process.
void InstallStopSignalHandlers();

// Before the first step there is no step boundary to stop at and nothing to save: while `on` is
// true (from InstallStopSignalHandlers until the trainer starts), a stop signal ends the process
// at once with "bigmac: SIGTERM during start-up: stopped before training; nothing was written"
// and exit code 128 + the signal (143, 130), as the shell reports a process the signal killed.
void SetStopAtOnce(bool on);

// The signal number that asked to stop (SIGTERM, SIGINT), or 0.
int StopSignalReceived();

// "SIGTERM", "SIGINT", ...
const char* SignalName(int signal_number);

}  // namespace bigmac::util

#endif  // BIGMAC_CORE_UTIL_STOP_SIGNAL_H_
