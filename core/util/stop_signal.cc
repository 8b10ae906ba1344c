#include "core/util/stop_signal.h"

#include <csignal>
#include <cstring>

namespace bigmac::util {
namespace {

volatile std::sig_atomic_t stop_signal = 0;

void OnStopSignal(int signal_number) { stop_signal = signal_number; }

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
