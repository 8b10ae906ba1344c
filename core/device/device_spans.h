#ifndef BIGMAC_CORE_DEVICE_DEVICE_SPANS_H_
#define BIGMAC_CORE_DEVICE_DEVICE_SPANS_H_

#include <chrono>
#include <string>
#include <vector>

#include "core/device/device.h"

namespace bigmac::device {

// Spans timed on a device's streams (Device::RecordTimedEvent), for the trace's device tracks:
// on CUDA the host's clock sees only when work was enqueued, so a layer's kernels and a
// transport's NCCL operations are timed by events on the streams they run on. Spans are added
// during a step and resolved to host times once its work has finished, against an anchor event
// recorded while the device was idle (its host time known to microseconds).
//
// One per rank; `device` must outlive it. Not thread-safe. On a device without timed events it
// is never enabled and Mark returns a null event.
class DeviceSpans {
 public:
  using Clock = std::chrono::steady_clock;
  struct Resolved {
    std::string name;
    std::string category;
    int track = 0;
    Clock::time_point start;
    Clock::time_point end;
  };

  explicit DeviceSpans(Device* device);
  ~DeviceSpans();
  DeviceSpans(const DeviceSpans&) = delete;
  DeviceSpans& operator=(const DeviceSpans&) = delete;

  // Whether spans are being recorded (the device has timed events, and the trace is recording).
  bool enabled() const { return enabled_; }
  void set_enabled(bool on);

  // A timed event on `stream` (the compute stream when omitted), owned by the caller until it is
  // passed to Add.
  Event Mark(Stream stream);
  Event Mark() { return Mark(device_->compute_stream()); }
  // A span from `start` to `end` (both from Mark); this object destroys the events.
  void Add(std::string name, std::string category, int track, Event start, Event end);

  // Waits for every span added since the last call, returns them in host time (in the order
  // added) and re-anchors.
  std::vector<Resolved> Resolve();

 private:
  struct Pending {
    std::string name;
    std::string category;
    int track;
    Event start;
    Event end;
  };
  void Anchor();
  void DestroyAll();

  Device* device_;
  bool enabled_ = false;
  Event anchor_;
  Clock::time_point anchor_time_;
  std::vector<Pending> pending_;
};

}  // namespace bigmac::device

#endif  // BIGMAC_CORE_DEVICE_DEVICE_SPANS_H_
