#ifndef BIGMAC_CORE_UTIL_STOP_SIGNAL_H_
#define BIGMAC_CORE_UTIL_STOP_SIGNAL_H_

namespace bigmac::util {

// SIGTERM and SIGINT (what Slurm sends before a time limit or on scancel, and Ctrl-C) ask the
// trainer to stop at the next step boundary, after an optional final checkpoint, instead of
// dying mid-write. A signal handler can only talk through a global flag; this is the one place
// that holds it. Install also ignores SIGXFSZ, so that a file-size limit makes writes fail with
// EFBIG (reported, previous checkpoint kept) instead of killing the process.
void InstallStopSignalHandlers();

// The signal number that asked to stop (SIGTERM, SIGINT), or 0.
int StopSignalReceived();

// "SIGTERM", "SIGINT", ...
const char* SignalName(int signal_number);

}  // namespace bigmac::util

#endif  // BIGMAC_CORE_UTIL_STOP_SIGNAL_H_
