// Device spans: events timed on a fake asynchronous device (its clock set by the test) resolve to
// host times with the device's durations and offsets, every event is destroyed, and the trace
// shows them on the device tracks. A device without timed events records nothing.
#include "core/device/device_spans.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <set>
#include <string>

#include "core/metrics/timeline.h"

namespace bigmac::device {
namespace {

// Work "runs" at the test's clock: an event keeps the fake time it was recorded at.
class FakeTimedDevice : public Device {
 public:
  FakeTimedDevice() : Device("fake:0", int64_t{1} << 20) {}
  ~FakeTimedDevice() override = default;

  double now_ms = 100;  // the device's clock
  int synchronizations = 0;
  std::set<double*> live;

  Backend backend() const override { return Backend::kCpu; }
  void Memset(void*, int64_t) override {}
  void CopyHostToDevice(void*, const void*, int64_t) override {}
  void CopyDeviceToHost(void*, const void*, int64_t) override {}
  void CopyDeviceToDevice(void*, const void*, int64_t) override {}
  Stream compute_stream() override { return {this}; }
  Event RecordEvent(Stream) override { return RecordTimedEvent({}); }
  void WaitEvent(Stream, Event) override {}
  void DestroyEvent(Event event) override {
    auto* time = static_cast<double*>(event.handle);
    ASSERT_EQ(live.erase(time), 1u) << "an event destroyed twice or never recorded";
    delete time;
  }
  void Synchronize() override { ++synchronizations; }
  bool has_timed_events() const override { return true; }
  Event RecordTimedEvent(Stream) override {
    auto* time = new double(now_ms);
    live.insert(time);
    return {time};
  }
  double ElapsedMs(Event start, Event end) override {
    EXPECT_TRUE(live.count(static_cast<double*>(start.handle)));
    EXPECT_TRUE(live.count(static_cast<double*>(end.handle)));
    return *static_cast<double*>(end.handle) - *static_cast<double*>(start.handle);
  }
  void Convert(void*, DType, const void*, DType, int64_t) override {}
  void AddInto(void*, const void*, DType, int64_t) override {}
  void Scale(void*, DType, int64_t, double) override {}
  double SumSquares(const void*, DType, int64_t) override { return 0; }
  bool AllFinite(const void*, DType, int64_t) override { return true; }
  void AdamWUpdate(const AdamWArgs&) override {}
};

double Ms(DeviceSpans::Clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

TEST(DeviceSpans, ResolvesDeviceTimesAgainstTheAnchor) {
  FakeTimedDevice fake;
  {
    DeviceSpans spans(&fake);
    const auto before = DeviceSpans::Clock::now();
    spans.set_enabled(true);
    const auto after = DeviceSpans::Clock::now();
    ASSERT_TRUE(spans.enabled());
    EXPECT_EQ(fake.synchronizations, 1);  // the anchor is taken with the device idle
    // The device ran ahead of the host: its work starts 5 ms after the anchor.
    fake.now_ms = 105;
    const Event f_start = spans.Mark();
    fake.now_ms = 107.5;
    const Event f_end = spans.Mark();
    spans.Add("F0@s0", "device_compute", metrics::Timeline::kDeviceComputeTrack, f_start, f_end);
    const Event c_start = spans.Mark(Stream{nullptr});
    fake.now_ms = 111.25;
    spans.Add("SendAct0@s0>r1", "device_comm", metrics::Timeline::kDeviceCommTrack, c_start,
              spans.Mark(Stream{nullptr}));
    const std::vector<DeviceSpans::Resolved> resolved = spans.Resolve();
    ASSERT_EQ(resolved.size(), 2u);
    EXPECT_EQ(resolved[0].name, "F0@s0");
    EXPECT_EQ(resolved[0].track, metrics::Timeline::kDeviceComputeTrack);
    EXPECT_NEAR(Ms(resolved[0].end - resolved[0].start), 2.5, 1e-3);
    EXPECT_NEAR(Ms(resolved[1].start - resolved[0].start), 2.5, 1e-3);
    EXPECT_NEAR(Ms(resolved[1].end - resolved[1].start), 3.75, 1e-3);
    // The anchor's host time lies between the calls around set_enabled: offsets from it hold.
    EXPECT_GE(Ms(resolved[0].start - before), 5.0 - 1e-3);
    EXPECT_LE(Ms(resolved[0].start - after), 5.0 + 1e-3);
    // Only the new anchor is left; the next window starts from it.
    EXPECT_EQ(fake.live.size(), 1u);
    EXPECT_TRUE(spans.Resolve().empty());

    // The trace shows them on the device tracks, and the per-category totals have them.
    metrics::Timeline timeline;
    for (const DeviceSpans::Resolved& span : resolved)
      timeline.Record(span.name, span.category, span.start, span.end, span.track);
    const std::string trace = timeline.TraceEvents(0, "rank 0");
    EXPECT_NE(trace.find("device: compute stream"), std::string::npos) << trace;
    EXPECT_NE(trace.find("device: communication streams"), std::string::npos) << trace;
    EXPECT_NEAR(timeline.window_ms().at("device_compute"), 2.5, 1e-3);
    EXPECT_NEAR(timeline.window_ms().at("device_comm"), 3.75, 1e-3);

    // Disabled (a step past train.trace_steps): nothing is marked; the anchor goes at Resolve.
    spans.set_enabled(false);
    EXPECT_EQ(spans.Mark().handle, nullptr);
    spans.Add("F1@s0", "device_compute", 2, spans.Mark(), spans.Mark());
    EXPECT_TRUE(spans.Resolve().empty());
    EXPECT_TRUE(fake.live.empty());
    spans.set_enabled(true);  // a new anchor
    EXPECT_EQ(fake.live.size(), 1u);
    spans.Add("F2@s0", "device_compute", 2, spans.Mark(), spans.Mark());
  }
  EXPECT_TRUE(fake.live.empty()) << "the destructor leaves events behind";
}

TEST(DeviceSpans, NothingOnADeviceWithoutTimedEvents) {
  std::unique_ptr<Device> cpu = MakeCpuDevice(0, int64_t{1} << 20);
  DeviceSpans spans(cpu.get());
  spans.set_enabled(true);
  EXPECT_FALSE(spans.enabled());
  EXPECT_EQ(spans.Mark().handle, nullptr);
  spans.Add("F0@s0", "device_compute", 2, spans.Mark(), spans.Mark());
  EXPECT_TRUE(spans.Resolve().empty());
}

}  // namespace
}  // namespace bigmac::device
