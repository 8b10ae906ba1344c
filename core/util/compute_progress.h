#ifndef BIGMAC_CORE_UTIL_COMPUTE_PROGRESS_H_
#define BIGMAC_CORE_UTIL_COMPUTE_PROGRESS_H_

#include <functional>

namespace bigmac::util {

// MPI moves a large message (a rendezvous over TCP, or shared memory without single-copy) only
// while the ranks are inside MPI calls, so a rank that computes stalls its neighbour's transfer
// (bench/NOTES.md, issue 34). Long compute loops call ComputeProgress(); the trainer installs
// the transport's non-blocking progress there.
//
// Installs `progress`, to be run by ComputeProgress() on the calling thread only (the one that
// initialised MPI: MPI_THREAD_FUNNELED), at most once every `interval_seconds`. An exception it
// throws is dropped (the next wait on the transport reports the problem). Null uninstalls.
// Call from that thread, outside any parallel region.
void SetComputeProgress(std::function<void()> progress, double interval_seconds);

// From any thread, inside or outside parallel regions: runs the installed progress when called
// on its thread and the interval has passed. Otherwise a flag test, or a thread-id compare and a
// clock read.
void ComputeProgress();

// Whether the caller runs inside the installed progress, called from a compute loop (the trace
// marks where messages moved while the rank computed).
bool InsideComputeProgress();

}  // namespace bigmac::util

#endif  // BIGMAC_CORE_UTIL_COMPUTE_PROGRESS_H_
