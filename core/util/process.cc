#include "core/util/process.h"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

namespace bigmac::util {

std::string ShellQuote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

std::string HostName() {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0 || host[0] == 0) return "unknown";
  return host;
}

std::string SelfPath() {
  char self[4096];
  const ssize_t length = readlink("/proc/self/exe", self, sizeof(self) - 1);
  self[length > 0 ? length : 0] = '\0';
  return self;
}

ChildResult RunChild(const std::string& command, int deadline_seconds) {
  const std::string wrapped =
      (deadline_seconds > 0 ? "timeout -k 5 " + std::to_string(deadline_seconds) + " " : "") +
      "/bin/sh -c " + ShellQuote(command) + " 2>&1";
  const auto start = std::chrono::steady_clock::now();
  ChildResult result;
  FILE* pipe = popen(wrapped.c_str(), "r");
  char buffer[4096];
  size_t n;
  while (pipe && (n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  const int status = pipe ? pclose(pipe) : -1;
  result.exit_code = status < 0          ? -1
                     : WIFEXITED(status) ? WEXITSTATUS(status)
                                         : 128 + WTERMSIG(status);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace bigmac::util
