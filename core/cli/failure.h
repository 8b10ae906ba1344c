#ifndef BIGMAC_CORE_CLI_FAILURE_H_
#define BIGMAC_CORE_CLI_FAILURE_H_

#include <string>

namespace bigmac::cli {

// A failure as the user sees it: its exit code (core/cli/exit_codes.h) and its message.
struct Failure {
  int code = 1;
  std::string message;
  bool reported = false;  // already printed (rank 0 reported for every rank): print nothing
};

// The exception in flight as a Failure: the one map from exceptions to exit codes and words
// (docs/exit_codes.md), used by main for every command and by training on every rank. Modules
// throw at their boundaries; validation returns lists of problems instead. Call from a catch
// block. `bad_alloc_hint` says what to lower when a host allocation failed.
Failure CurrentFailure(const std::string& bad_alloc_hint);

// Prints CurrentFailure's message after `prefix` ("bigmac: ", "bigmac: rank 3: ") to stderr,
// unless it was reported already, and returns its exit code. Call from a catch block.
int ReportCurrentFailure(const std::string& prefix, const std::string& bad_alloc_hint);

}  // namespace bigmac::cli

#endif  // BIGMAC_CORE_CLI_FAILURE_H_
