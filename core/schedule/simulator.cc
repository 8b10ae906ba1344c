#include "core/schedule/simulator.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "nlohmann/json.hpp"

namespace bigmac::schedule {
namespace {

bool IsCompute(Op op) { return Info(op).computes; }

// The shortest text that reads back as `value` (what a JSON library writes).
std::string JsonNumber(double value) {
  char text[32];
  const auto [end, error] = std::to_chars(text, text + sizeof(text), value);
  return error == std::errc() ? std::string(text, end) : "0";
}

// A message key: (is_gradient, micro-batch, consumer stage, sender rank, receiver rank).
using MessageKey = std::tuple<bool, int, int, int, int>;

}  // namespace

SimResult Simulate(const std::vector<std::vector<Action>>& lists, int virtual_stages,
                   const Costs& costs) {
  const int p = static_cast<int>(lists.size());
  SimResult result;
  result.busy.assign(p, 0);
  result.max_in_flight.assign(p, 0);
  const bool bytes = !costs.stage_activation_bytes.empty();
  const int stages = static_cast<int>(costs.stage_activation_bytes.size());
  result.peak_bytes.assign(p, 0);
  result.stage_bytes_at_peak.assign(stages, 0);
  std::vector<double> held(p, 0);             // bytes per rank now
  std::vector<double> stage_held(stages, 0);  // bytes per stage now
  // A computation's change to what its stage holds.
  auto hold = [&](int r, const Action& a) {
    if (!bytes || a.stage < 0 || a.stage >= stages) return;
    const double act = costs.stage_activation_bytes[a.stage];
    const double deferred =
        costs.stage_deferred_bytes.empty() ? act : costs.stage_deferred_bytes[a.stage];
    // A candidate peak: what the rank holds now with `extra` more on the acting stage.
    auto consider = [&](double extra) {
      if (held[r] + extra <= result.peak_bytes[r]) return;
      result.peak_bytes[r] = held[r] + extra;
      for (int s = 0; s < stages; ++s) {
        if (s % p == r)  // stage s is on rank s % p
          result.stage_bytes_at_peak[s] = stage_held[s] + (s == a.stage ? extra : 0);
      }
    };
    auto transient = [&](const std::vector<double>& peaks) {
      return peaks.empty() ? 0.0 : peaks[a.stage];
    };
    if (a.op == Op::kBackward) consider(transient(costs.stage_backward_peak_bytes));
    if (a.op == Op::kBackwardInput) consider(transient(costs.stage_backward_input_peak_bytes));
    double delta = 0;
    if (a.op == Op::kForward) delta = act;
    if (a.op == Op::kBackward) delta = -act;
    if (a.op == Op::kBackwardInput) delta = deferred - act;
    if (a.op == Op::kBackwardWeight) delta = -deferred;
    held[r] += delta;
    stage_held[a.stage] += delta;
    consider(0);
  };
  std::vector<size_t> pc(p, 0);
  std::vector<double> clock(p, 0);
  std::vector<std::set<std::pair<int, int>>> live(p);  // (mb, stage) holding activations
  std::map<MessageKey, double> in_transit;             // arrival times
  const double scale = 1.0 / virtual_stages;
  auto cost = [&](const Action& a) {
    const bool per_stage = !costs.stage_forward.empty() && a.stage >= 0 &&
                           a.stage < static_cast<int>(costs.stage_forward.size());
    if (per_stage) {
      switch (a.op) {
        case Op::kForward:
          return costs.stage_forward[a.stage];
        case Op::kBackward:
          return costs.stage_backward[a.stage];
        case Op::kBackwardInput:
        case Op::kBackwardWeight:
          return costs.stage_backward[a.stage] / 2;
        default:
          return 0.0;
      }
    }
    switch (a.op) {
      case Op::kForward:
        return costs.forward * scale;
      case Op::kBackward:
        return costs.backward * scale;
      case Op::kBackwardInput:
        return costs.backward_input * scale;
      case Op::kBackwardWeight:
        return costs.backward_weight * scale;
      default:
        return 0.0;
    }
  };
  // A worklist instead of sweeps over all ranks: a rank runs until a receive finds no message,
  // then waits on that message's key until its send wakes it. Each action is visited once, so
  // the simulation is O(actions log actions) whatever the shape of the pipeline.
  std::set<int> ready;  // ranks that can move, lowest first (a deterministic order)
  for (int r = 0; r < p; ++r) ready.insert(r);
  std::map<MessageKey, int> blocked;  // a receive's key -> the rank blocked on it
  while (!ready.empty()) {
    const int r = *ready.begin();
    ready.erase(ready.begin());
    while (pc[r] < lists[r].size()) {
      const Action& a = lists[r][pc[r]];
      SimEvent event{r, a, clock[r], clock[r]};
      if (a.op == Op::kSendAct || a.op == Op::kSendGrad) {
        const bool grad = a.op == Op::kSendGrad;
        const MessageKey key{grad, a.microbatch, grad ? a.stage - 1 : a.stage + 1, r, a.peer};
        in_transit[key] = clock[r] + costs.transfer;
        if (auto waiter = blocked.find(key); waiter != blocked.end()) {
          ready.insert(waiter->second);
          blocked.erase(waiter);
        }
      } else if (a.op == Op::kRecvAct || a.op == Op::kRecvGrad) {
        const MessageKey key{a.op == Op::kRecvGrad, a.microbatch, a.stage, a.peer, r};
        auto it = in_transit.find(key);
        if (it == in_transit.end()) {
          blocked[key] = r;  // until the sender gets there
          break;
        }
        event.start = clock[r];
        clock[r] = std::max(clock[r], it->second);
        event.end = clock[r];
        in_transit.erase(it);
      } else if (IsCompute(a.op)) {
        event.end = clock[r] + cost(a);
        clock[r] = event.end;
        result.busy[r] += cost(a);
        result.makespan = std::max(result.makespan, clock[r]);
        if (a.op == Op::kForward) live[r].insert({a.microbatch, a.stage});
        if (a.op == Op::kBackward || a.op == Op::kBackwardWeight)
          live[r].erase({a.microbatch, a.stage});
        result.max_in_flight[r] =
            std::max(result.max_in_flight[r], static_cast<int>(live[r].size()));
        hold(r, a);
      }
      result.events.push_back(event);
      ++pc[r];
    }
  }
  std::string waiting;
  for (int r = 0; r < p; ++r) {
    if (pc[r] < lists[r].size()) {
      waiting += (waiting.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) +
                 " waits in " + ShortName(lists[r][pc[r]]) + " (action " + std::to_string(pc[r]) +
                 ")";
    }
  }
  if (!waiting.empty()) {
    result.deadlock = true;
    result.problem = "deadlock: " + waiting;
  } else if (!in_transit.empty()) {
    const auto& [grad, mb, stage, from, to] = in_transit.begin()->first;
    result.problem = std::to_string(in_transit.size()) + " message(s) never received, e.g. " +
                     (grad ? "gradient" : "activation") + " of micro-batch " + std::to_string(mb) +
                     " for stage " + std::to_string(stage) + " from rank " + std::to_string(from) +
                     " to rank " + std::to_string(to);
  }
  double total_busy = 0;
  for (double b : result.busy) total_busy += b;
  result.bubble_fraction = result.makespan > 0 ? 1.0 - total_busy / (p * result.makespan) : 0;
  return result;
}

DpReducePrediction PredictDpReduce(const SimResult& flush, const DpReduceCosts& costs) {
  const int p = static_cast<int>(flush.busy.size());
  if (static_cast<int>(costs.allreduce.size()) != p ||
      (!costs.tail.empty() && static_cast<int>(costs.tail.size()) != p) || costs.buckets < 1) {
    throw std::invalid_argument(
        "PredictDpReduce: one all-reduce time (and tail) per rank, and at "
        "least one bucket");
  }
  DpReducePrediction prediction;
  prediction.compute_end.assign(p, 0);
  // Per rank and stage: the last weight-gradient computation (its start and end).
  std::vector<std::map<int, std::pair<double, double>>> last_weight(p);
  for (const SimEvent& e : flush.events) {
    if (!IsCompute(e.action.op)) continue;
    prediction.compute_end[e.rank] = std::max(prediction.compute_end[e.rank], e.end);
    if (e.action.op == Op::kBackward || e.action.op == Op::kBackwardWeight)
      last_weight[e.rank][e.action.stage] = {e.start, e.end};
  }
  for (int r = 0; r < p; ++r) {
    const double tail = costs.tail.empty() ? 0 : costs.tail[r];
    const double end = prediction.compute_end[r];
    prediction.serial_end.push_back(end + costs.allreduce[r]);
    std::vector<std::pair<double, double>> spans;
    double total = 0;
    for (const auto& [stage, span] : last_weight[r]) {
      spans.push_back(span);
      total += span.second - span.first;
    }
    std::sort(spans.begin(), spans.end());
    // When a share `f` of the rank's last weight-gradient time has passed.
    auto final_at = [&](double f) {
      double left = f * total;
      for (const auto& [start, stop] : spans) {
        if (left <= stop - start) return start + left;
        left -= stop - start;
      }
      return end;
    };
    const double bucket = std::max(0.0, costs.allreduce[r] - tail) / costs.buckets;
    double done = 0;
    for (int k = 0; k < costs.buckets; ++k)
      done = std::max(done, spans.empty() ? end : final_at(double(k + 1) / costs.buckets)) + bucket;
    prediction.overlap_end.push_back(std::max(done, end) + tail);
  }
  for (int r = 0; r < p; ++r) {
    prediction.serial_makespan = std::max(prediction.serial_makespan, prediction.serial_end[r]);
    prediction.overlap_makespan = std::max(prediction.overlap_makespan, prediction.overlap_end[r]);
  }
  return prediction;
}

std::string FormatGrid(const SimResult& result, int pp) {
  // One column per smallest compute duration.
  double unit = 1e30;
  for (const SimEvent& e : result.events) {
    if (IsCompute(e.action.op) && e.end > e.start) unit = std::min(unit, e.end - e.start);
  }
  if (unit > 1e29) return "";
  const double width_units = std::round(result.makespan / unit);
  if (pp > kMaxGridRanks || width_units > kMaxGridColumns) {
    return "grid: not drawn for " + std::to_string(pp) + " ranks x " + JsonNumber(width_units) +
           " columns (at most " + std::to_string(kMaxGridRanks) + " x " +
           std::to_string(kMaxGridColumns) + "); the trace has every action\n";
  }
  const int columns = static_cast<int>(width_units);
  std::vector<std::vector<std::string>> cells(pp, std::vector<std::string>(columns, "."));
  for (const SimEvent& e : result.events) {
    if (!IsCompute(e.action.op)) continue;
    const std::string label = Info(e.action.op).grid_label + std::to_string(e.action.microbatch);
    for (int c = static_cast<int>(std::lround(e.start / unit));
         c < std::lround(e.end / unit) && c < columns; ++c) {
      cells[e.rank][c] = label;
    }
  }
  size_t width = 1;
  for (const auto& row : cells) {
    for (const std::string& cell : row) width = std::max(width, cell.size());
  }
  std::string text;
  for (int r = 0; r < pp; ++r) {
    text += "rank " + std::to_string(r) + " |";
    for (const std::string& cell : cells[r])
      text += " " + cell + std::string(width - cell.size(), ' ');
    text += "\n";
  }
  return text;
}

void WriteChromeTrace(const SimResult& result, const std::string& title, std::ostream& out) {
  // Written event by event: a JSON tree of a million events would take gigabytes.
  const int ranks = static_cast<int>(result.busy.size());
  out << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  out << "{\"args\":{\"name\":" << nlohmann::json(title).dump()
      << "},\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0}";
  for (int r = 0; r < ranks; ++r) {
    out << ",\n{\"args\":{\"name\":\"rank " << r
        << "\"},\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":" << r << "}";
  }
  for (const SimEvent& e : result.events) {
    if (e.end <= e.start && !IsCompute(e.action.op)) continue;
    out << ",\n{\"args\":{\"microbatch\":" << e.action.microbatch << ",\"stage\":" << e.action.stage
        << "},\"cat\":\"" << OpName(e.action.op)
        << "\",\"dur\":" << JsonNumber((e.end - e.start) * 1000.0) << ",\"name\":\""
        << ShortName(e.action) << "\",\"ph\":\"X\",\"pid\":0,\"tid\":" << e.rank
        << ",\"ts\":" << JsonNumber(e.start * 1000.0) << "}";
  }
  out << "\n]}\n";
}

std::string ChromeTrace(const SimResult& result, const std::string& title) {
  std::ostringstream out;
  WriteChromeTrace(result, title, out);
  return out.str();
}

}  // namespace bigmac::schedule
