#include "core/util/stop_signal.h"

#include <unistd.h>

#include <csignal>
#include <cstring>

namespace bigmac::util {
namespace {

volatile std::sig_atomic_t stop_signal = 0;
volatile std::sig_atomic_t stop_at_once = 0;

// Only async-signal-safe calls here: write(2) and _exit(2).
void OnStopSignal(int signal_number) {
  stop_signal = signal_number;
  if (!stop_at_once) return;
  static const char kTerm[] =
      "bigmac: SIGTERM during start-up: stopped before training; nothing was written\n";
  static const char kInt[] =
      "bigmac: SIGINT during start-up: stopped before training; nothing was written\n";
  const bool term = signal_number == SIGTERM;
  ssize_t ignored =
      write(STDERR_FILENO, term ? kTerm : kInt, term ? sizeof(kTerm) - 1 : sizeof(kInt) - 1);
  (void)ignored;
  _exit(128 + signal_number);
}

}  // namespace

void InstallStopSignalHandlers() {
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_handler = OnStopSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // blocking calls continue; the flag is read between steps
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  std::signal(SIGXFSZ, SIG_IGN);
}

void SetStopAtOnce(bool on) { stop_at_once = on ? 1 : 0; }

int StopSignalReceived() { return stop_signal; }

const char* SignalName(int signal_number) {
  switch (signal_number) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    default:
      return "a signal";
  }
}

}  // namespace bigmac::util
