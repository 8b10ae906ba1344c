#include "core/device/device_spans.h"

#include <utility>

namespace bigmac::device {

DeviceSpans::DeviceSpans(Device* device) : device_(device) {}

DeviceSpans::~DeviceSpans() {
  try {
    DestroyAll();
  } catch (...) {
    // A failing device at exit: its events go with it.
  }
}

void DeviceSpans::set_enabled(bool on) {
  on = on && device_->has_timed_events();
  if (on && !enabled_ && anchor_.handle == nullptr) Anchor();
  enabled_ = on;
}

Event DeviceSpans::Mark(Stream stream) {
  if (!enabled_) return {};
  return device_->RecordTimedEvent(stream);
}

void DeviceSpans::Add(std::string name, std::string category, int track, Event start, Event end) {
  if (start.handle == nullptr || end.handle == nullptr) {
    if (start.handle) device_->DestroyEvent(start);
    if (end.handle) device_->DestroyEvent(end);
    return;
  }
  pending_.push_back({std::move(name), std::move(category), track, start, end});
}

std::vector<DeviceSpans::Resolved> DeviceSpans::Resolve() {
  std::vector<Resolved> resolved;
  if (anchor_.handle == nullptr) return resolved;
  auto at = [&](Event event) {
    const std::chrono::duration<double, std::milli> since(device_->ElapsedMs(anchor_, event));
    return anchor_time_ + std::chrono::duration_cast<Clock::duration>(since);
  };
  for (const Pending& p : pending_) {
    const Clock::time_point end = at(p.end);  // waits for the span's end first
    resolved.push_back({p.name, p.category, p.track, at(p.start), end});
  }
  DestroyAll();
  if (enabled_) Anchor();
  return resolved;
}

void DeviceSpans::Anchor() {
  // With the compute stream idle, the anchor fires as it is recorded: its host time is now.
  device_->Synchronize();
  anchor_time_ = Clock::now();
  anchor_ = device_->RecordTimedEvent(device_->compute_stream());
}

void DeviceSpans::DestroyAll() {
  for (const Pending& p : pending_) {
    device_->DestroyEvent(p.start);
    device_->DestroyEvent(p.end);
  }
  pending_.clear();
  if (anchor_.handle) device_->DestroyEvent(anchor_);
  anchor_ = {};
}

}  // namespace bigmac::device
