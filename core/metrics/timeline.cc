#include "core/metrics/timeline.h"

#include <time.h>

#include <algorithm>
#include <limits>
#include <set>

#include "nlohmann/json.hpp"

namespace bigmac::metrics {

void Timeline::Record(const std::string& name, const std::string& category, Clock::time_point start,
                      Clock::time_point end, int track) {
  const double duration_ms = std::chrono::duration<double, std::milli>(end - start).count();
  Add(category, duration_ms);
  if (!recording_) return;
  const double start_us =
      std::chrono::duration<double, std::micro>(start.time_since_epoch()).count();
  spans_.push_back({name, category, start_us, duration_ms * 1000.0, track});
}

void Timeline::Add(const std::string& category, double duration_ms) {
  window_ms_[category] += duration_ms;
  total_ms_[category] += duration_ms;
}

double Timeline::ThreadCpuMs() {
  timespec now{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return now.tv_sec * 1e3 + now.tv_nsec * 1e-6;
}

void Timeline::RecordMessage(const std::string& name, Clock::time_point start,
                             Clock::time_point end, bool in_compute) {
  if (!recording_) return;
  const double start_us =
      std::chrono::duration<double, std::micro>(start.time_since_epoch()).count();
  const double duration_us = std::chrono::duration<double, std::micro>(end - start).count();
  spans_.push_back({name, "message", start_us, duration_us, kCommTrack, true, in_compute});
}

std::string Timeline::TraceEvents(int rank, const std::string& process_name) const {
  nlohmann::json events = nlohmann::json::array();
  events.push_back(
      {{"name", "process_name"}, {"ph", "M"}, {"pid", rank}, {"args", {{"name", process_name}}}});
  events.push_back({{"name", "process_sort_index"},
                    {"ph", "M"},
                    {"pid", rank},
                    {"args", {{"sort_index", rank}}}});
  static constexpr const char* kTrackNames[] = {
      "actions", "communication", "device: compute stream", "device: communication streams"};
  std::set<int> tracks = {kActionTrack};
  for (const Span& span : spans_) tracks.insert(span.track);
  for (int track : tracks) {
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", rank},
                      {"tid", track},
                      {"args", {{"name", kTrackNames[track]}}}});
  }
  int message_id = 0;
  for (const Span& span : spans_) {
    if (span.message) {
      // An asynchronous pair: Perfetto lays overlapping messages out side by side.
      const std::string id = std::to_string(rank) + "." + std::to_string(++message_id);
      for (const char* phase : {"b", "e"}) {
        events.push_back(
            {{"name", span.name},
             {"cat", span.category},
             {"ph", phase},
             {"id", id},
             {"pid", rank},
             {"tid", span.track},
             {"ts", phase[0] == 'b' ? span.start_us : span.start_us + span.duration_us}});
      }
      if (span.in_compute) {
        events.push_back({{"name", "moved: " + span.name},
                          {"cat", span.category},
                          {"ph", "i"},
                          {"s", "t"},
                          {"pid", rank},
                          {"tid", kActionTrack},
                          {"ts", span.start_us + span.duration_us}});
      }
      continue;
    }
    events.push_back({{"name", span.name},
                      {"cat", span.category},
                      {"ph", "X"},
                      {"pid", rank},
                      {"tid", span.track},
                      {"ts", span.start_us},
                      {"dur", span.duration_us}});
  }
  return events.dump();
}

std::string MergeTraces(const std::vector<std::string>& per_rank_events) {
  nlohmann::json all = nlohmann::json::array();
  double earliest = std::numeric_limits<double>::max();
  for (const std::string& text : per_rank_events) {
    for (auto& event : nlohmann::json::parse(text)) {
      if (event.contains("ts")) earliest = std::min(earliest, event["ts"].get<double>());
      all.push_back(std::move(event));
    }
  }
  for (auto& event : all) {
    if (event.contains("ts")) event["ts"] = event["ts"].get<double>() - earliest;
  }
  return nlohmann::json{{"traceEvents", all}, {"displayTimeUnit", "ms"}}.dump();
}

}  // namespace bigmac::metrics
