#include "core/comm/hang_report.h"

#include <algorithm>
#include <map>
#include <set>

#include "core/util/format.h"

namespace bigmac::comm {
namespace {

using progress::Snapshot;
using progress::WaitKind;
using util::Format;

bool Reachable(const RankStatus& s) {
  return (s.contact == RankStatus::Contact::kSelf || s.contact == RankStatus::Contact::kAnswered) &&
         s.record.has_value();
}

bool Waiting(const RankStatus& s) { return Reachable(s) && s.record->wait != WaitKind::kNone; }

std::string Seconds(double seconds) { return Format("%.1f s", seconds); }

// "step 3" or "step 3, flush 2 of 4".
std::string StepText(const Snapshot& r) {
  if (r.step <= 0) return "start-up";
  std::string text = Format("step %d", r.step);
  if (r.flushes > 1) text += Format(", flush %d of %d", r.flush + 1, r.flushes);
  return text;
}

// Where a rank is, with its preposition: "in Forward mb5 of step 3", "at the start of step 5",
// "in checkpoint of step 4", "in start-up".
std::string Doing(const Snapshot& r) {
  const std::string of = r.step > 0 ? " of " + StepText(r) : "";
  if (!r.label.empty()) return "in " + r.label + of;
  if (!r.action.empty()) return "in " + r.action + of;
  return r.step > 0 ? "at the start of " + StepText(r) : "in start-up";
}

// The receive of the current exchange the rank waits for, if the wait is one of them.
const progress::ExpectedReceive* Expected(const Snapshot& r) {
  if (r.wait != WaitKind::kReceive) return nullptr;
  for (const progress::ExpectedReceive& receive : r.receives) {
    if (receive.tag == r.wait_tag) return &receive;
  }
  return nullptr;
}

// "RecvGrad mb3", or the transport's description of the message.
std::string WaitLabel(const Snapshot& r) {
  if (const progress::ExpectedReceive* receive = Expected(r)) return receive->label;
  return r.wait_what;
}

std::string Ranks(const std::vector<int>& ranks) {
  std::vector<std::string> parts;
  for (int rank : ranks) parts.push_back(std::to_string(rank));
  return util::Join(parts, ", ");
}

class Graph {
 public:
  Graph(const std::vector<RankStatus>& ranks, const GroupMembers& members)
      : ranks_(ranks), members_(members) {
    for (size_t i = 0; i < ranks.size(); ++i) index_[ranks[i].rank] = i;
  }

  const RankStatus* Find(int rank) const {
    auto it = index_.find(rank);
    return it == index_.end() ? nullptr : &ranks_[it->second];
  }

  // The ranks `w` waits on, the likely culprits first.
  std::vector<int> Edges(const RankStatus& w) const {
    std::vector<int> peers;
    if (!Waiting(w)) return peers;
    const Snapshot& r = *w.record;
    if (r.wait == WaitKind::kCollective) {
      std::vector<int> group = members_ ? members_(w.rank, r.wait_group) : std::vector<int>();
      if (group.empty()) {
        for (const RankStatus& s : ranks_) group.push_back(s.rank);
      }
      for (int m : group) {
        const RankStatus* other = Find(m);
        if (m == w.rank || other == nullptr) continue;
        // A member in the same collective is not what holds it up.
        if (Waiting(*other) && other->record->wait == WaitKind::kCollective &&
            other->record->wait_group == r.wait_group && other->record->wait_what == r.wait_what)
          continue;
        peers.push_back(m);
      }
    } else {
      for (int p : r.wait_peers) {
        if (p != w.rank && Find(p) && std::find(peers.begin(), peers.end(), p) == peers.end())
          peers.push_back(p);
      }
    }
    // Mute ranks first, then those that do not wait, then those that wait in turn.
    auto order = [&](int rank) {
      const RankStatus& s = *Find(rank);
      return Reachable(s) ? (Waiting(s) ? 2 : 1) : 0;
    };
    std::stable_sort(peers.begin(), peers.end(), [&](int a, int b) { return order(a) < order(b); });
    return peers;
  }

 private:
  const std::vector<RankStatus>& ranks_;
  const GroupMembers& members_;
  std::map<int, size_t> index_;
};

// "rank 2 waits RecvGrad mb3 from rank 3".
std::string WaitPhrase(const RankStatus& w, int peer) {
  const Snapshot& r = *w.record;
  switch (r.wait) {
    case WaitKind::kReceive:
      return Format("rank %d waits %s from rank %d", w.rank, WaitLabel(r).c_str(), peer);
    case WaitKind::kSends:
      return Format("rank %d waits for rank %d to take %s", w.rank, peer, r.wait_what.c_str());
    default:
      return Format("rank %d waits for rank %d in %s", w.rank, peer, r.wait_what.c_str());
  }
}

// Why a rank the graph ends at holds the others: "rank 3 is stopped in Forward mb5 of step 4 (no
// progress for 30 s)".
std::string SinkPhrase(const RankStatus& s) {
  using Contact = RankStatus::Contact;
  const std::string process =
      Format("process %d on %s", s.pid, s.host.empty() ? "its node" : s.host.c_str());
  const bool gone = s.process_state.rfind("gone", 0) == 0 || s.process_state.rfind("Z", 0) == 0 ||
                    s.process_state.rfind("X", 0) == 0;
  if (Reachable(s)) {
    if (Waiting(s)) {
      // Waits, but on nobody the graph can blame (every other member is in the same collective).
      return Format("rank %d waits %s (%s) with no rank to blame", s.rank,
                    WaitLabel(*s.record).c_str(), Seconds(s.record->waited_s).c_str());
    }
    return Format(
        "rank %d is stopped %s (no progress for %s; it answers, so it is busy or "
        "stuck outside the transport)",
        s.rank, Doing(*s.record).c_str(), Seconds(s.record->since_progress_s).c_str());
  }
  if (gone || s.contact == Contact::kRefused) {
    std::string why = s.process_state.empty() ? "" : process + " is " + s.process_state;
    if (s.contact == Contact::kRefused)
      why += std::string(why.empty() ? "" : "; ") + "its status port refuses connections";
    return Format("rank %d is dead (%s)", s.rank, why.c_str());
  }
  std::string why = s.contact == Contact::kNoAnswer ? "it does not answer" : s.contact_detail;
  if (!s.process_state.empty()) why += ", and " + process + " is " + s.process_state;
  if (s.record) {
    const Snapshot& r = *s.record;
    if (r.wait != WaitKind::kNone) {
      return Format("rank %d is stopped while waiting %s, %s (no progress for %s; %s)", s.rank,
                    WaitLabel(r).c_str(), Doing(r).c_str(), Seconds(r.since_progress_s).c_str(),
                    why.c_str());
    }
    return Format("rank %d is stopped %s (no progress for %s; %s)", s.rank, Doing(r).c_str(),
                  Seconds(r.since_progress_s).c_str(), why.c_str());
  }
  return Format("rank %d is unreachable (%s; stopped or dead?)", s.rank, why.c_str());
}

// One line per rank: "rank 0 (vm, pid 123): step 3: waits RecvGrad mb1 (RecvGrad1@s0<r1) from
// rank 1 for 5.0 s: RecvGrad(micro-batch 1, stage 0) gradient, tag 8193, f32[2, 16, 32]".
std::string RankLine(const RankStatus& s) {
  std::string line = Format("rank %d (%s, pid %d): ", s.rank, s.host.c_str(), s.pid);
  if (!Reachable(s)) {
    line += "does not answer (" + s.contact_detail + ")";
    if (!s.process_state.empty())
      line += Format("; process %d: %s", s.pid, s.process_state.c_str());
    if (!s.record) return line;
    line += "; its progress record, read on its node: ";
  }
  const Snapshot& r = *s.record;
  const std::string action = r.action.empty() ? "" : " [" + r.action + "]";
  const std::string peers = (r.wait_peers.size() == 1 ? "rank " : "ranks ") + Ranks(r.wait_peers);
  switch (r.wait) {
    case WaitKind::kNone:
      line += Doing(r) + (r.label.empty() ? "" : action) + ", no progress for " +
              Seconds(r.since_progress_s);
      break;
    case WaitKind::kReceive: {
      const progress::ExpectedReceive* receive = Expected(r);
      line += StepText(r) + ": waits " + WaitLabel(r) +
              (receive ? " (" + receive->action + ")" : action) + " from " + peers + " for " +
              Seconds(r.waited_s) + ": " + r.wait_what;
      if (r.wait_tag >= 0) line += Format(", tag %d", r.wait_tag);
      if (!r.wait_expect.empty()) line += ", " + r.wait_expect;
      break;
    }
    case WaitKind::kSends:
      line += StepText(r) + ": waits for " + peers + " to take " + r.wait_what + action + " for " +
              Seconds(r.waited_s);
      break;
    case WaitKind::kCollective:
      line += StepText(r) + ": waits in " + r.wait_what + action +
              (r.wait_group.empty() ? "" : " (over its " + r.wait_group + " group)") + " for " +
              Seconds(r.waited_s);
      break;
  }
  if (r.torn) line += " (read while it was being written)";
  return line;
}

}  // namespace

namespace {

// The hosts on which no rank is reachable, while some rank elsewhere is; and their ranks.
void FindLostHosts(const std::vector<RankStatus>& ranks, HangReport* report) {
  std::map<std::string, std::vector<int>> silent;  // host -> its ranks, while none answers
  std::set<std::string> alive;
  for (const RankStatus& s : ranks) {
    if (s.host.empty()) continue;
    if (Reachable(s)) {
      alive.insert(s.host);
    } else {
      silent[s.host].push_back(s.rank);
    }
  }
  if (alive.empty()) return;
  std::string hosts, described;
  for (const auto& [host, host_ranks] : silent) {
    if (alive.count(host)) continue;
    report->lost_hosts.push_back(host);
    hosts += (hosts.empty() ? "" : ",") + host;
    described += std::string(described.empty() ? "" : "; ") + host + " (" +
                 (host_ranks.size() == 1 ? "rank " : "ranks ") + Ranks(host_ranks) + ")";
  }
  if (report->lost_hosts.empty()) return;
  report->lost_hosts_line = "no rank on " + described +
                            " answers: a lost node? Resume with --resume auto, excluding " +
                            (report->lost_hosts.size() == 1 ? "host " : "hosts ") + hosts;
}

}  // namespace

HangReport ExplainHang(const std::vector<RankStatus>& ranks, int reporter,
                       const GroupMembers& members) {
  HangReport report;
  for (const RankStatus& s : ranks) report.ranks.push_back(RankLine(s));
  FindLostHosts(ranks, &report);
  const Graph graph(ranks, members);
  const RankStatus* start = graph.Find(reporter);
  if (start == nullptr || !Waiting(*start)) {
    // Start from the rank that has waited longest.
    start = nullptr;
    for (const RankStatus& s : ranks) {
      if (Waiting(s) && (!start || s.record->waited_s > start->record->waited_s)) start = &s;
    }
  }
  if (start == nullptr) {
    report.summary = "no rank is waiting any more";
    return report;
  }
  // Follow the first edge until a rank that does not wait, or a rank already on the path.
  std::vector<const RankStatus*> path = {start};
  std::vector<int> next_of;
  for (;;) {
    const std::vector<int> edges = graph.Edges(*path.back());
    if (edges.empty()) break;
    const RankStatus* next = graph.Find(edges.front());
    next_of.push_back(next->rank);
    const auto seen = std::find(path.begin(), path.end(), next);
    if (seen != path.end()) {
      // A cycle: the ranks from `seen` on wait on each other.
      std::vector<std::string> phrases;
      for (auto it = seen; it != path.end(); ++it) {
        phrases.push_back(WaitPhrase(**it, next_of[it - path.begin()]));
        report.culprits.push_back((*it)->rank);
      }
      std::string lead;
      for (auto it = path.begin(); it != seen; ++it)
        lead += WaitPhrase(**it, next_of[it - path.begin()]) + "; ";
      report.cycle = true;
      report.summary = lead + util::Join(phrases, "; ") +
                       " (a cycle: each waits for a message the other sends only later, so "
                       "their action lists disagree)";
      return report;
    }
    path.push_back(next);
    if (!Waiting(*next)) break;
  }
  std::vector<std::string> phrases;
  for (size_t i = 0; i + 1 < path.size(); ++i) phrases.push_back(WaitPhrase(*path[i], next_of[i]));
  phrases.push_back(SinkPhrase(*path.back()));
  report.culprits.push_back(path.back()->rank);
  report.summary = util::Join(phrases, "; ");
  // Other ranks that hold someone up the same way.
  std::vector<int> others;
  for (const RankStatus& s : ranks) {
    for (int peer : graph.Edges(s)) {
      const RankStatus* p = graph.Find(peer);
      if (!Waiting(*p) && std::find(report.culprits.begin(), report.culprits.end(), peer) ==
                              report.culprits.end()) {
        report.culprits.push_back(peer);
        others.push_back(peer);
      }
    }
  }
  if (!others.empty()) report.summary += "; also not moving: rank(s) " + Ranks(others);
  return report;
}

}  // namespace bigmac::comm
