#include "core/schedule/schedule.h"

#include <algorithm>
#include <cctype>
#include <deque>
#include <sstream>
#include <stdexcept>

namespace bigmac::schedule {
namespace {

struct Compute {
  Op op;
  int microbatch;
  int stage;
};

// GPipe: all forwards, then all backwards (in micro-batch order, so gradients accumulate in the
// same order on every layout).
std::vector<Compute> Gpipe(const ScheduleSpec& s, int rank) {
  std::vector<Compute> order;
  for (int mb = 0; mb < s.microbatches; ++mb) order.push_back({Op::kForward, mb, rank});
  for (int mb = 0; mb < s.microbatches; ++mb) order.push_back({Op::kBackward, mb, rank});
  return order;
}

// 1F1B (PipeDream-flush): pp-rank-1 warm-up forwards, then one forward one backward, then the
// remaining backwards. At most pp - rank micro-batches are in flight on a rank.
std::vector<Compute> OneFOneB(const ScheduleSpec& s, int rank, Op backward) {
  std::vector<Compute> order;
  const int warmup = std::min(s.pp - rank - 1, s.microbatches);
  int next_forward = 0;
  int next_backward = 0;
  for (; next_forward < warmup; ++next_forward) order.push_back({Op::kForward, next_forward, rank});
  while (next_forward < s.microbatches) {
    order.push_back({Op::kForward, next_forward++, rank});
    order.push_back({backward, next_backward++, rank});
  }
  while (next_backward < s.microbatches) order.push_back({backward, next_backward++, rank});
  return order;
}

// Interleaved 1F1B (Megatron-LM): each rank holds virtual_stages chunks; micro-batches go through
// the chunks in groups of pp. Stage of chunk c on rank r: c * pp + r.
std::vector<Compute> Interleaved(const ScheduleSpec& s, int rank) {
  const int p = s.pp;
  const int v = s.virtual_stages;
  const int total = s.microbatches * v;
  auto forward_at = [&](int k) {
    const int chunk = (k / p) % v;
    const int mb = (k / (p * v)) * p + k % p;
    return Compute{Op::kForward, mb, chunk * p + rank};
  };
  auto backward_at = [&](int k) {
    const int chunk = v - 1 - (k / p) % v;
    const int mb = (k / (p * v)) * p + k % p;
    return Compute{Op::kBackward, mb, chunk * p + rank};
  };
  const int warmup = std::min(total, (p - rank - 1) * 2 + (v - 1) * p);
  std::vector<Compute> order;
  int f = 0;
  int b = 0;
  for (; f < warmup; ++f) order.push_back(forward_at(f));
  while (f < total) {
    order.push_back(forward_at(f++));
    order.push_back(backward_at(b++));
  }
  while (b < total) order.push_back(backward_at(b++));
  return order;
}

// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism"): 1F1B with the backward split into input
// and weight gradients. Input gradients keep the 1F1B order (the critical path); each rank
// defers its weight gradients into the slots where 1F1B would idle. The slots are found by a
// unit-cost simulation of all ranks (F = B = W = 1), so the list is still a pure function of
// (pp, rank, microbatches). No rank holds more than pp micro-batches, 1F1B's peak.
// The simulation visits only ranks that can move: one that ran at `time` may run again at
// time + 1, and a rank's F (BI) is what lets the next (previous) rank's wait end then. So it costs
// O(actions), not O(ranks x time) with a map lookup in each (minutes at pp = 1024).
std::vector<std::vector<Compute>> ZeroBubbleH1(const ScheduleSpec& s) {
  const int p = s.pp;
  const int m = s.microbatches;
  std::vector<std::vector<Compute>> critical(p);
  for (int r = 0; r < p; ++r) critical[r] = OneFOneB(s, r, Op::kBackwardInput);
  std::vector<std::vector<Compute>> out(p);
  std::vector<size_t> next(p, 0);
  std::vector<std::deque<int>> pending_w(p);
  std::vector<int> live(p, 0);  // forwards whose weight gradient is still to come
  // Finish times of F and BI per (rank, mb); -1 = not done.
  std::vector<int> f_done(size_t(p) * m, -1), b_done(size_t(p) * m, -1);
  auto done_at = [m](const std::vector<int>& done, int r, int mb, int time) {
    const int t = done[size_t(r) * m + mb];
    return t >= 0 && t <= time;
  };
  std::vector<int> active(p), woken;
  for (int r = 0; r < p; ++r) active[r] = r;
  std::vector<int> woken_for(p, -1);  // the time a rank was last queued for
  int done = 0;
  const int total = p * m * 3;
  for (int time = 0; done < total; ++time) {
    if (active.empty()) throw std::logic_error("zb_h1 construction did not converge");
    woken.clear();
    auto wake = [&](int r) {
      if (r < 0 || r >= p || woken_for[r] == time + 1) return;
      woken_for[r] = time + 1;
      woken.push_back(r);
    };
    for (const int r : active) {
      bool ran = false;
      // As in the paper, the peak stays 1F1B's (pp micro-batches, reached on the first stage): a
      // forward that would hold more waits for a deferred weight gradient to free one.
      const bool at_memory_bound = live[r] >= p && !pending_w[r].empty();
      if (next[r] < critical[r].size() &&
          !(at_memory_bound && critical[r][next[r]].op == Op::kForward)) {
        const Compute c = critical[r][next[r]];
        bool ready = false;
        if (c.op == Op::kForward) {
          ready = r == 0 || done_at(f_done, r - 1, c.microbatch, time);
        } else {
          ready = r == p - 1 ? done_at(f_done, r, c.microbatch, time)
                             : done_at(b_done, r + 1, c.microbatch, time);
        }
        if (ready) {
          out[r].push_back(c);
          ++next[r];
          (c.op == Op::kForward ? f_done : b_done)[size_t(r) * m + c.microbatch] = time + 1;
          if (c.op == Op::kBackwardInput) pending_w[r].push_back(c.microbatch);
          if (c.op == Op::kForward) ++live[r];
          wake(c.op == Op::kForward ? r + 1 : r - 1);
          ran = true;
        }
      }
      if (!ran && !pending_w[r].empty()) {
        out[r].push_back({Op::kBackwardWeight, pending_w[r].front(), r});
        pending_w[r].pop_front();
        --live[r];
        ran = true;
      }
      if (ran) {
        ++done;
        wake(r);
      }
    }
    active.swap(woken);
  }
  return out;
}

std::vector<Compute> ComputeOrder(const ScheduleSpec& s, int rank) {
  switch (s.kind) {
    case Kind::kGpipe:
      return Gpipe(s, rank);
    case Kind::k1F1B:
      return OneFOneB(s, rank, Op::kBackward);
    case Kind::kInterleaved1F1B:
      return Interleaved(s, rank);
    case Kind::kZeroBubbleH1:
      return ZeroBubbleH1(s)[rank];
  }
  return {};
}

}  // namespace

const std::vector<OpInfo>& OpTable() {
  // name, short name, category, grid label, computes, per step, peer
  static const std::vector<OpInfo> kTable = {
      {Op::kForward, "Forward", "F", "forward", "F", true, false, 0},
      {Op::kBackward, "Backward", "B", "backward", "B", true, false, 0},
      {Op::kBackwardInput, "BackwardInput", "BI", "backward_input", "b", true, false, 0},
      {Op::kBackwardWeight, "BackwardWeight", "W", "backward_weight", "W", true, false, 0},
      {Op::kSendAct, "SendAct", "SendAct", "send", "", false, false, '>'},
      {Op::kRecvAct, "RecvAct", "RecvAct", "wait", "", false, false, '<'},
      {Op::kSendGrad, "SendGrad", "SendGrad", "send", "", false, false, '>'},
      {Op::kRecvGrad, "RecvGrad", "RecvGrad", "wait", "", false, false, '<'},
      {Op::kReduceTied, "ReduceTied", "ReduceTied", "tied", "", false, true, 0},
      {Op::kReduceDp, "ReduceDp", "ReduceDp", "allreduce", "", false, true, 0},
      {Op::kOptimizerStep, "OptimizerStep", "OptimizerStep", "optimizer", "", false, true, 0},
  };
  return kTable;
}

const OpInfo& Info(Op op) {
  const std::vector<OpInfo>& table = OpTable();
  const size_t index = static_cast<size_t>(op);
  if (index >= table.size() || table[index].op != op)
    throw std::logic_error("schedule: Op " + std::to_string(index) + " is not in the op table");
  return table[index];
}

std::string OpName(Op op) { return Info(op).name; }

std::string ShortName(const Action& a) {
  const OpInfo& info = Info(a.op);
  std::string text = info.short_name;
  if (a.microbatch >= 0) text += std::to_string(a.microbatch) + "@s" + std::to_string(a.stage);
  if (info.peer) text += info.peer + std::string("r") + std::to_string(a.peer);
  return text;
}

namespace {

// Reads a non-negative decimal without sign or leading zeros (ShortName's numbers) at `*pos`.
bool ReadNumber(const std::string& text, size_t* pos, int* value) {
  size_t end = *pos;
  while (end < text.size() && end - *pos < 9 && text[end] >= '0' && text[end] <= '9') ++end;
  if (end == *pos || (text[*pos] == '0' && end - *pos > 1)) return false;
  if (end < text.size() && text[end] >= '0' && text[end] <= '9') return false;  // too long
  *value = std::stoi(text.substr(*pos, end - *pos));
  *pos = end;
  return true;
}

bool Expect(const std::string& text, size_t* pos, const std::string& what) {
  if (text.compare(*pos, what.size(), what) != 0) return false;
  *pos += what.size();
  return true;
}

}  // namespace

Action ParseAction(const std::string& text) {
  auto fail = [&](const std::string& why) {
    return std::invalid_argument("'" + text + "' is not an action: " + why +
                                 " (expected e.g. F3@s1, RecvAct3@s1<r0, SendGrad3@s1>r0 or "
                                 "OptimizerStep)");
  };
  size_t pos = 0;
  while (pos < text.size() && std::isalpha(static_cast<unsigned char>(text[pos]))) ++pos;
  const std::string name = text.substr(0, pos);
  const OpInfo* info = nullptr;
  for (const OpInfo& row : OpTable()) {
    if (name == row.short_name) info = &row;
  }
  if (!info) {
    std::string known;
    for (const OpInfo& row : OpTable())
      known += (known.empty() ? "" : ", ") + std::string(row.short_name);
    throw fail("unknown op '" + name + "'; the ops are " + known);
  }
  Action action{info->op};
  if (!info->per_step) {
    if (!ReadNumber(text, &pos, &action.microbatch))
      throw fail(std::string(info->name) + " needs a micro-batch number after '" + name + "'");
    if (!Expect(text, &pos, "@s") || !ReadNumber(text, &pos, &action.stage))
      throw fail("expected '@s' and a stage number after the micro-batch");
    if (info->peer && (!Expect(text, &pos, std::string(1, info->peer) + "r") ||
                       !ReadNumber(text, &pos, &action.peer))) {
      throw fail(std::string(info->name) + " needs its peer: '" + info->peer + "r' and a rank");
    }
  }
  if (pos != text.size()) throw fail("unexpected '" + text.substr(pos) + "'");
  return action;
}

std::vector<Action> ParseActions(const std::string& text) {
  std::vector<Action> actions;
  std::istringstream words(text);
  for (std::string word; words >> word;) {
    try {
      actions.push_back(ParseAction(word));
    } catch (const std::invalid_argument& error) {
      throw std::invalid_argument("action " + std::to_string(actions.size()) + ": " + error.what());
    }
  }
  return actions;
}

namespace {

// RecvAct (but on stage 0), Forward, SendAct (but on the last stage) of one micro-batch.
void AppendForward(const ScheduleSpec& spec, int microbatch, int stage,
                   std::vector<Action>* actions) {
  const int stages = spec.pp * spec.virtual_stages;
  if (stage > 0) actions->push_back({Op::kRecvAct, microbatch, stage, (stage - 1) % spec.pp});
  actions->push_back({Op::kForward, microbatch, stage, -1});
  if (stage < stages - 1)
    actions->push_back({Op::kSendAct, microbatch, stage, (stage + 1) % spec.pp});
}

}  // namespace

namespace {

// A rank's computations with the sends and receives around them.
std::vector<Action> ToActions(const ScheduleSpec& spec, const std::vector<Compute>& order) {
  const int stages = spec.pp * spec.virtual_stages;
  auto rank_of = [&](int stage) { return stage % spec.pp; };
  std::vector<Action> actions;
  for (const Compute& c : order) {
    const bool first = c.stage == 0;
    const bool last = c.stage == stages - 1;
    switch (c.op) {
      case Op::kForward:
        AppendForward(spec, c.microbatch, c.stage, &actions);
        break;
      case Op::kBackward:
      case Op::kBackwardInput:
        if (!last) actions.push_back({Op::kRecvGrad, c.microbatch, c.stage, rank_of(c.stage + 1)});
        if (!first && c.op == Op::kBackward && spec.send_grad_before_weights) {
          actions.push_back({Op::kBackwardInput, c.microbatch, c.stage, -1});
          actions.push_back({Op::kSendGrad, c.microbatch, c.stage, rank_of(c.stage - 1)});
          actions.push_back({Op::kBackwardWeight, c.microbatch, c.stage, -1});
          break;
        }
        actions.push_back({c.op, c.microbatch, c.stage, -1});
        if (!first) actions.push_back({Op::kSendGrad, c.microbatch, c.stage, rank_of(c.stage - 1)});
        break;
      default:
        actions.push_back({c.op, c.microbatch, c.stage, -1});
    }
  }
  return actions;
}

}  // namespace

std::vector<Action> BuildRankActions(const ScheduleSpec& spec, int rank) {
  return ToActions(spec, ComputeOrder(spec, rank));
}

std::vector<Action> BuildStepTail(const ScheduleSpec&, int) {
  return {{Op::kReduceTied}, {Op::kReduceDp}, {Op::kOptimizerStep}};
}

std::vector<Action> BuildForwardOnlyActions(const ScheduleSpec& spec, int rank, int microbatch) {
  std::vector<Action> actions;
  for (int chunk = 0; chunk < spec.virtual_stages; ++chunk)
    AppendForward(spec, microbatch, chunk * spec.pp + rank, &actions);
  return actions;
}

std::vector<std::vector<Action>> BuildAllActions(const ScheduleSpec& spec) {
  // ZB-H1's lists come from one simulation of all ranks: run it once, not once per rank.
  std::vector<std::vector<Compute>> orders;
  if (spec.kind == Kind::kZeroBubbleH1) {
    orders = ZeroBubbleH1(spec);
  } else {
    for (int rank = 0; rank < spec.pp; ++rank) orders.push_back(ComputeOrder(spec, rank));
  }
  std::vector<std::vector<Action>> all;
  for (const std::vector<Compute>& order : orders) all.push_back(ToActions(spec, order));
  return all;
}

std::vector<Action> MismatchForTesting(std::vector<Action> actions) {
  auto first = [&](Op op) {
    return std::find_if(actions.begin(), actions.end(),
                        [op](const Action& a) { return a.op == op; });
  };
  if (auto receive = first(Op::kRecvGrad); receive != actions.end()) {
    std::rotate(actions.begin(), receive, receive + 1);
  } else if (auto send = first(Op::kSendGrad); send != actions.end()) {
    std::rotate(send, send + 1, actions.end());
  }
  return actions;
}

}  // namespace bigmac::schedule
