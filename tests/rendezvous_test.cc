// The schedules under the NCCL transport's semantics (docs/transport.md), which the simulator's
// buffered sends do not model. NCCL operations are rendezvous: one runs only when its group and
// its partner's group are both at the head of their streams' queues (operations on one
// communicator are serialized), and a pair's k-th send meets its k-th receive, which must be the
// same message. The host enqueues the executor's exchanges (a neighbour's adjacent actions) as it
// reaches them and waits for what it receives, not for what it sends.
//
// Two layouts of communicators and streams are run:
//   kPerLink (the transport's): one communicator and stream per direction of each pipeline link;
//     every operation is on the queue of its (sender, receiver) pair. Every schedule finishes.
//   kOneStream: one communicator and stream per rank, an exchange one group. interleaved_1f1b
//     deadlocks: a group that receives also holds a send whose receive is queued behind another
//     group on the peer. This is why the transport is laid out per link.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "core/schedule/constraints.h"
#include "core/schedule/schedule.h"

namespace bigmac::schedule {
namespace {

// A message: (gradient?, receiving stage, micro-batch), as the executor tags them.
using Message = std::tuple<bool, int, int>;

struct Exchange {
  std::vector<std::pair<int, Message>> sends;     // (peer, message)
  std::vector<std::pair<int, Message>> receives;  // (peer, message)
};

// A rank's exchanges in order, grouped as Executor::Run does (computations take no time here).
std::vector<Exchange> Exchanges(const std::vector<Action>& actions) {
  std::vector<Exchange> result;
  for (size_t i = 0; i < actions.size();) {
    if (Info(actions[i].op).peer == 0) {
      ++i;
      continue;
    }
    Exchange exchange;
    size_t end = i;
    while (end < actions.size() && Info(actions[end].op).peer != 0 &&
           actions[end].peer == actions[i].peer) {
      const Action& a = actions[end];
      switch (a.op) {
        case Op::kSendAct:
          exchange.sends.push_back({a.peer, {false, a.stage + 1, a.microbatch}});
          break;
        case Op::kSendGrad:
          exchange.sends.push_back({a.peer, {true, a.stage - 1, a.microbatch}});
          break;
        case Op::kRecvAct:
          exchange.receives.push_back({a.peer, {false, a.stage, a.microbatch}});
          break;
        default:
          exchange.receives.push_back({a.peer, {true, a.stage, a.microbatch}});
          break;
      }
      ++end;
    }
    result.push_back(exchange);
    i = end;
  }
  return result;
}

enum class Layout { kPerLink, kOneStream };

struct OpRef {
  bool send;
  int peer;
  int index;  // position in the pair's sending order
};

struct Group {
  std::vector<OpRef> ops;
  bool waited = false;  // the host waits for it (it receives)
};

// "" if every rank finishes with every pair's messages matched in order; otherwise who is stuck
// where, or which message NCCL would pair with another.
std::string RunUnderRendezvous(const std::vector<std::vector<Action>>& lists,
                               Layout layout = Layout::kPerLink) {
  const int p = static_cast<int>(lists.size());
  std::vector<std::vector<Exchange>> program(p);
  for (int r = 0; r < p; ++r) program[r] = Exchanges(lists[r]);
  using Pair = std::pair<int, int>;  // (sender, receiver)
  // Per pair: the messages sent and received so far, in order, and which operations have run.
  std::map<Pair, std::vector<Message>> sent, received;
  std::map<Pair, std::vector<bool>> ran;
  // A queue: (rank, pair) per link, or (rank, (-1, -1)) for the rank's one stream.
  using Queue = std::pair<int, Pair>;
  auto queue_of = [&](int rank, const OpRef& op) {
    if (layout == Layout::kOneStream) return Queue{rank, {-1, -1}};
    return Queue{rank, op.send ? Pair{rank, op.peer} : Pair{op.peer, rank}};
  };
  std::map<Queue, std::deque<Group>> queues;
  std::vector<size_t> at(p, 0);    // the host's next exchange
  std::vector<int> waiting(p, 0);  // groups the host waits for
  auto pair_of = [](int rank, const OpRef& op) {
    return op.send ? Pair{rank, op.peer} : Pair{op.peer, rank};
  };
  std::string problems;
  bool moved = true;
  while (moved) {
    moved = false;
    for (int r = 0; r < p; ++r) {
      if (waiting[r] > 0 || at[r] >= program[r].size()) continue;
      const Exchange& e = program[r][at[r]++];
      std::vector<OpRef> ops;
      for (const auto& [peer, m] : e.sends) {
        ops.push_back({true, peer, static_cast<int>(sent[{r, peer}].size())});
        sent[{r, peer}].push_back(m);
      }
      for (const auto& [peer, m] : e.receives) {
        ops.push_back({false, peer, static_cast<int>(received[{peer, r}].size())});
        received[{peer, r}].push_back(m);
      }
      for (const OpRef& op : ops) {
        const Pair pair = pair_of(r, op);
        if (ran[pair].size() <= static_cast<size_t>(op.index)) ran[pair].resize(op.index + 1);
      }
      if (layout == Layout::kOneStream) {
        if (!ops.empty()) queues[queue_of(r, ops.front())].push_back({ops, !e.receives.empty()});
        waiting[r] += e.receives.empty() ? 0 : 1;
      } else {
        for (const OpRef& op : ops) {
          queues[queue_of(r, op)].push_back({{op}, !op.send});
          waiting[r] += op.send ? 0 : 1;
        }
      }
      moved = true;
    }
    // An operation runs when its group and its partner's are at the heads of their queues.
    auto at_head = [&](int rank, const OpRef& op) {
      const auto it = queues.find(queue_of(rank, op));
      if (it == queues.end() || it->second.empty()) return false;
      for (const OpRef& other : it->second.front().ops) {
        if (other.send == op.send && other.peer == op.peer && other.index == op.index) return true;
      }
      return false;
    };
    for (auto& [queue, groups] : queues) {
      if (groups.empty()) continue;
      const int r = queue.first;
      for (const OpRef& op : groups.front().ops) {
        const Pair pair = pair_of(r, op);
        if (ran[pair][op.index] || !at_head(op.peer, {!op.send, r, op.index})) continue;
        ran[pair][op.index] = true;
        moved = true;
        if (sent[pair][op.index] != received[pair][op.index]) {
          problems += " rank " + std::to_string(pair.first) + " -> " + std::to_string(pair.second) +
                      " message " + std::to_string(op.index) + " is received as another one;";
        }
      }
    }
    for (auto& [queue, groups] : queues) {
      if (groups.empty()) continue;
      const int r = queue.first;
      bool complete = true;
      for (const OpRef& op : groups.front().ops)
        complete = complete && ran[pair_of(r, op)][op.index];
      if (!complete) continue;
      if (groups.front().waited) --waiting[r];
      groups.pop_front();
      moved = true;
    }
  }
  for (int r = 0; r < p; ++r) {
    size_t queued = 0;
    for (const auto& [queue, groups] : queues) {
      if (queue.first == r) queued += groups.size();
    }
    if (at[r] < program[r].size() || queued > 0) {
      problems += " rank " + std::to_string(r) + " stuck at exchange " + std::to_string(at[r]) +
                  "/" + std::to_string(program[r].size()) + " with " + std::to_string(queued) +
                  " operation group(s) queued;";
    }
  }
  return problems;
}

TEST(Rendezvous, EveryScheduleFinishesWithNcclSemantics) {
  int checked = 0;
  for (Kind kind : {Kind::kGpipe, Kind::k1F1B, Kind::kInterleaved1F1B, Kind::kZeroBubbleH1}) {
    for (int pp : {2, 3, 4, 8}) {
      for (int v : {1, 2, 3}) {
        for (int m : {1, pp, pp + 1, 2 * pp, 3 * pp}) {
          if (!CheckScheduleConstraints(kind, pp, v, m).empty()) continue;
          const ScheduleSpec spec{kind, pp, m, v};
          const std::string stuck = RunUnderRendezvous(BuildAllActions(spec));
          EXPECT_EQ(stuck, "") << KindName(kind) << " pp=" << pp << " v=" << v << " m=" << m;
          std::vector<std::vector<Action>> forward;
          for (int r = 0; r < pp; ++r) forward.push_back(BuildForwardOnlyActions(spec, r, 0));
          EXPECT_EQ(RunUnderRendezvous(forward), "") << "evaluation, " << KindName(kind);
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 20);
}

// The model itself. Two ranks that each send and later receive, in separate exchanges: with one
// stream per rank, each send waits for a receive queued behind the other's send (MPI's buffered
// sends would not); per link, or in one exchange each, they finish.
TEST(Rendezvous, TheModelCatchesSendsThatNeedBuffering) {
  const std::vector<std::vector<Action>> apart = {
      ParseActions("F0@s0 SendAct0@s0>r1 F0@s0 RecvGrad0@s0<r1"),
      ParseActions("F0@s1 SendGrad0@s1>r0 F0@s1 RecvAct0@s1<r0")};
  EXPECT_NE(RunUnderRendezvous(apart, Layout::kOneStream), "");
  EXPECT_EQ(RunUnderRendezvous(apart, Layout::kPerLink), "");
  EXPECT_EQ(RunUnderRendezvous({ParseActions("F0@s0 SendAct0@s0>r1 RecvGrad0@s0<r1"),
                                ParseActions("F0@s1 SendGrad0@s1>r0 RecvAct0@s1<r0")},
                               Layout::kOneStream),
            "");
  // Receiving a pair's messages in another order than they were sent is caught.
  EXPECT_NE(RunUnderRendezvous({ParseActions("SendAct0@s0>r1 SendAct1@s0>r1"),
                                ParseActions("RecvAct1@s1<r0 RecvAct0@s1<r0")}),
            "");
  // One stream per rank deadlocks interleaved 1F1B (the reason for the per-link layout).
  EXPECT_NE(
      RunUnderRendezvous(BuildAllActions({Kind::kInterleaved1F1B, 2, 4, 2}), Layout::kOneStream),
      "");
}

}  // namespace
}  // namespace bigmac::schedule
