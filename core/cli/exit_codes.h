#ifndef BIGMAC_CORE_CLI_EXIT_CODES_H_
#define BIGMAC_CORE_CLI_EXIT_CODES_H_

namespace bigmac::cli {

// Process exit codes; docs/exit_codes.md is the user-facing table. Keep both in step.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // an internal or runtime error
inline constexpr int kExitConfig =
    2;  // bad command line or configuration (same code on every rank)

}  // namespace bigmac::cli

#endif  // BIGMAC_CORE_CLI_EXIT_CODES_H_
