#include "core/metrics/timeline.h"

#include <algorithm>
#include <limits>
#include <set>

#include "nlohmann/json.hpp"

namespace bigmac::metrics {

void Timeline::Record(const std::string& name, const std::string& category, Clock::time_point start,
                      Clock::time_point end, int track) {
  const double duration_ms = std::chrono::duration<double, std::milli>(end - start).count();
  window_ms_[category] += duration_ms;
  total_ms_[category] += duration_ms;
  if (!recording_) return;
  const double start_us =
      std::chrono::duration<double, std::micro>(start.time_since_epoch()).count();
  spans_.push_back({name, category, start_us, duration_ms * 1000.0, track});
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
  for (const Span& span : spans_) {
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
