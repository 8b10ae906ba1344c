#ifndef BIGMAC_CORE_METRICS_TIMELINE_H_
#define BIGMAC_CORE_METRICS_TIMELINE_H_

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace bigmac::metrics {

// What one rank did and when: spans for a Chrome/Perfetto trace (kept while recording is on) and
// running totals per category (always). Times come from the monotonic clock, which all ranks of
// one node share, so their spans line up in the merged trace.
class Timeline {
 public:
  using Clock = std::chrono::steady_clock;

  // Tracks (the trace's threads of a rank): the actions the rank runs one after the other, and
  // communication in flight beside them (a dp all-reduce bucket from its start to its
  // completion), which may overlap the actions.
  // On an asynchronous device (CUDA) two more: the work as the device's streams ran it, timed by
  // events (core/device/device_spans.h): the compute stream, and the transport's streams (NCCL
  // sends, receives and the dp all-reduce), whose overlap with the compute the trace shows.
  static constexpr int kActionTrack = 0;
  static constexpr int kCommTrack = 1;
  static constexpr int kDeviceComputeTrack = 2;
  static constexpr int kDeviceCommTrack = 3;

  // Categories: "forward", "backward", "backward_input", "backward_weight", "wait" (receives),
  // "send", "tied", "allreduce" (the ReduceDp action: waiting for the dp sum), "optimizer",
  // "eval"; on the communication track "dp_reduce" (a bucket in flight); on the device tracks
  // "device_compute" and "device_comm". Totals only (Add): "compute_cpu".
  void Record(const std::string& name, const std::string& category, Clock::time_point start,
              Clock::time_point end, int track = kActionTrack);
  // A message in flight (comm::MessageSpan), kept while recording and counted in no category: an
  // asynchronous span of its own (messages overlap each other and the actions). `in_compute`: its
  // end was seen by the progress run inside a computation, which the action track marks there
  // ("moved: ..."), so the trace shows a transfer that went on while the rank computed.
  void RecordMessage(const std::string& name, Clock::time_point start, Clock::time_point end,
                     bool in_compute);
  void set_recording(bool on) { recording_ = on; }
  // Adds `duration_ms` to a category's totals without a span: the forward and backward
  // computations' CPU time ("compute_cpu"), which overlaps their spans and has no place of its own
  // in the trace.
  void Add(const std::string& category, double duration_ms);

  // The calling thread's CPU time in milliseconds. The rank's thread runs every computation (and
  // its share of their parallel loops), so over a computation this is its wall-clock span less
  // the time the rank waited for a core it shares with other ranks.
  static double ThreadCpuMs();

  // Milliseconds per category since the last ResetWindow (per step) and since the start.
  const std::map<std::string, double>& window_ms() const { return window_ms_; }
  const std::map<std::string, double>& total_ms() const { return total_ms_; }
  void ResetWindow() { window_ms_.clear(); }

  // This rank's spans as trace events (a JSON array) with pid = `rank`.
  std::string TraceEvents(int rank, const std::string& process_name) const;

 private:
  struct Span {
    std::string name;
    std::string category;
    double start_us;
    double duration_us;
    int track;
    bool message = false;  // RecordMessage's
    bool in_compute = false;
  };
  bool recording_ = true;
  std::vector<Span> spans_;
  std::map<std::string, double> window_ms_;
  std::map<std::string, double> total_ms_;
};

// One Chrome/Perfetto trace from every rank's TraceEvents: one process per rank, times shifted so
// that the earliest span starts at 0.
std::string MergeTraces(const std::vector<std::string>& per_rank_events);

}  // namespace bigmac::metrics

#endif  // BIGMAC_CORE_METRICS_TIMELINE_H_
