#include "core/config/environment.h"

#include "core/util/format.h"

namespace bigmac::config {
namespace {

// Whether `text` is a positive decimal integer of at most `max` (no sign, no spaces; OpenMP's
// own parser is laxer, but a value it reads differently from us is worse than a refusal).
bool PositiveAtMost(const std::string& text, int max, bool* too_large) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos) return false;
  const size_t digits = text.find_first_not_of('0');
  if (digits == std::string::npos) return false;  // zero
  *too_large = text.size() - digits > 10 || std::stoll(text.substr(digits)) > max;
  return true;
}

std::string CheckOmpNumThreads(const char* value) {
  const std::string text = value;
  const std::string quoted = "OMP_NUM_THREADS='" + util::Printable(text.substr(0, 64)) +
                             (text.size() > 64 ? "...'" : "'") + " (environment)";
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string part = text.substr(start, comma - start);
    bool too_large = false;
    if (!PositiveAtMost(part, kMaxOmpThreads, &too_large)) {
      return quoted +
             ": must be a positive integer (OpenMP threads per rank), or a comma-separated list "
             "of them";
    }
    if (too_large) {
      return quoted + ": " + part + " OpenMP threads per rank is over the limit of " +
             std::to_string(kMaxOmpThreads);
    }
    if (comma == std::string::npos) return "";
    start = comma + 1;
  }
}

}  // namespace

std::vector<std::string> CheckEnvironment(const LaunchEnv& env) {
  std::vector<std::string> problems;
  // Empty is unset, as for OpenMP itself.
  if (const char* threads = env("OMP_NUM_THREADS"); threads != nullptr && *threads != '\0') {
    if (std::string problem = CheckOmpNumThreads(threads); !problem.empty())
      problems.push_back(problem);
  }
  return problems;
}

}  // namespace bigmac::config
