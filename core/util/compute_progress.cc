#include "core/util/compute_progress.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <utility>

namespace bigmac::util {
namespace {

using Clock = std::chrono::steady_clock;

std::atomic<bool> installed{false};
std::function<void()> installed_progress;  // read on `owner` only, while `installed`
std::thread::id owner;
Clock::duration interval;
Clock::time_point last;
bool running = false;  // no re-entry from inside the progress itself

}  // namespace

void SetComputeProgress(std::function<void()> progress, double interval_seconds) {
  installed.store(false, std::memory_order_release);
  installed_progress = std::move(progress);
  owner = std::this_thread::get_id();
  interval =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(interval_seconds));
  last = Clock::now();
  if (installed_progress) installed.store(true, std::memory_order_release);
}

void ComputeProgress() {
  if (!installed.load(std::memory_order_acquire)) return;
  if (std::this_thread::get_id() != owner || running) return;
  const Clock::time_point now = Clock::now();
  if (now - last < interval) return;
  running = true;
  try {
    installed_progress();
  } catch (...) {
  }
  running = false;
  last = Clock::now();
}

bool InsideComputeProgress() { return std::this_thread::get_id() == owner && running; }

}  // namespace bigmac::util
