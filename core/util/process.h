#ifndef BIGMAC_CORE_UTIL_PROCESS_H_
#define BIGMAC_CORE_UTIL_PROCESS_H_

#include <string>

namespace bigmac::util {

// `text` as one single-quoted shell word.
std::string ShellQuote(const std::string& text);

// This machine's host name (gethostname), or "unknown".
std::string HostName();

// This program's own path (/proc/self/exe), to start it again as a child.
std::string SelfPath();

struct ChildResult {
  int exit_code = -1;  // 124 (or 137): the deadline passed
  std::string output;  // stdout and stderr together
  double seconds = 0;
};

// Runs `command` through /bin/sh; a deadline of 0 means none.
ChildResult RunChild(const std::string& command, int deadline_seconds = 0);

}  // namespace bigmac::util

#endif  // BIGMAC_CORE_UTIL_PROCESS_H_
