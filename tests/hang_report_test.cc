// The hang report's parts without MPI: the progress record (and reading it as another process of
// the node would), the wait-for graph's verdicts, and the mismatched schedule the fault hook
// injects (the simulator must find the same deadlock the report names).
#include "core/comm/hang_report.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "core/comm/progress.h"
#include "core/schedule/schedule.h"
#include "core/schedule/simulator.h"

namespace bigmac::comm {
namespace {

using progress::Snapshot;
using progress::WaitKind;

Snapshot Computing(int rank, int step, const std::string& action, const std::string& label,
                   double idle) {
  Snapshot s;
  s.world_rank = rank;
  s.step = step;
  s.flushes = 1;
  s.action = action;
  s.label = label;
  s.since_progress_s = idle;
  return s;
}

// Waiting for `label` (an action of the current exchange) from `peer`.
Snapshot Receiving(int rank, int step, const std::string& action, const std::string& label,
                   int peer, int tag, double waited) {
  Snapshot s = Computing(rank, step, action, label, waited);
  s.receives = {{tag, label, action}};
  s.wait = WaitKind::kReceive;
  s.wait_tag = tag;
  s.wait_peers = {peer};
  s.wait_what = label + " message";
  s.wait_expect = "f32[2, 16, 32]";
  s.waited_s = waited;
  return s;
}

RankStatus Answered(int rank, const Snapshot& record) {
  RankStatus s;
  s.rank = rank;
  s.host = "node";
  s.pid = 100 + rank;
  s.contact = rank == 0 ? RankStatus::Contact::kSelf : RankStatus::Contact::kAnswered;
  s.record = record;
  return s;
}

RankStatus Mute(int rank, RankStatus::Contact contact, const std::string& state) {
  RankStatus s;
  s.rank = rank;
  s.host = "node";
  s.pid = 100 + rank;
  s.contact = contact;
  s.contact_detail = "it accepted the connection but did not answer within 2.0 s";
  s.process_state = state;
  return s;
}

HangReport Explain(const std::vector<RankStatus>& ranks, int reporter = 0) {
  return ExplainHang(ranks, reporter, [&](int, const std::string& group) {
    std::vector<int> all;
    if (group == "world") {
      for (const RankStatus& s : ranks) all.push_back(s.rank);
    }
    return all;
  });
}

TEST(HangReport, ChainEndsAtTheRankThatMakesNoProgress) {
  // The issue's example: rank 2 waits for rank 3, which is busy in a Forward and answers.
  const HangReport report =
      Explain({Answered(0, Receiving(0, 4, "RecvGrad3@s0<r1", "RecvGrad mb3", 1, 8195, 31)),
               Answered(1, Receiving(1, 4, "RecvGrad3@s1<r2", "RecvGrad mb3", 2, 8451, 31)),
               Answered(2, Receiving(2, 4, "RecvGrad3@s2<r3", "RecvGrad mb3", 3, 8707, 31)),
               Answered(3, Computing(3, 4, "F5@s3", "Forward mb5", 30))});
  EXPECT_FALSE(report.cycle);
  EXPECT_EQ(report.culprits, std::vector<int>{3});
  EXPECT_EQ(report.summary,
            "rank 0 waits RecvGrad mb3 from rank 1; rank 1 waits RecvGrad mb3 from rank 2; rank 2 "
            "waits RecvGrad mb3 from rank 3; rank 3 is stopped in Forward mb5 of step 4 (no "
            "progress for 30.0 s; it answers, so it is busy or stuck outside the transport)");
  ASSERT_EQ(report.ranks.size(), 4u);
  EXPECT_EQ(report.ranks[2],
            "rank 2 (node, pid 102): step 4: waits RecvGrad mb3 (RecvGrad3@s2<r3) from rank 3 "
            "for 31.0 s: RecvGrad mb3 message, tag 8707, f32[2, 16, 32]");
  EXPECT_EQ(report.ranks[3],
            "rank 3 (node, pid 103): in Forward mb5 of step 4 [F5@s3], no progress for 30.0 s");
}

TEST(HangReport, ARankThatCannotAnswerIsNamedWithWhatItsNodeKnows) {
  RankStatus stopped = Mute(1, RankStatus::Contact::kNoAnswer, "T (stopped by a signal)");
  stopped.record = Computing(1, 3, "F1@s1", "Forward mb1", 7);
  stopped.record_from_node = true;
  const HangReport report = Explain(
      {Answered(0, Receiving(0, 3, "RecvGrad0@s0<r1", "RecvGrad mb0", 1, 8192, 5)), stopped});
  EXPECT_EQ(report.culprits, std::vector<int>{1});
  EXPECT_EQ(report.summary,
            "rank 0 waits RecvGrad mb0 from rank 1; rank 1 is stopped in Forward mb1 of step 3 "
            "(no progress for 7.0 s; it does not answer, and process 101 on node is T (stopped "
            "by a signal))");
  EXPECT_EQ(report.ranks[1],
            "rank 1 (node, pid 101): does not answer (it accepted the connection but did not "
            "answer within 2.0 s); process 101: T (stopped by a signal); its progress record, "
            "read on its node: in Forward mb1 of step 3 [F1@s1], no progress for 7.0 s");

  // Nothing is known but that it does not answer.
  const HangReport unknown =
      Explain({Answered(0, Receiving(0, 3, "RecvGrad0@s0<r1", "RecvGrad mb0", 1, 8192, 5)),
               Mute(1, RankStatus::Contact::kNoConnection, "")});
  EXPECT_EQ(unknown.summary,
            "rank 0 waits RecvGrad mb0 from rank 1; rank 1 is unreachable (it accepted the "
            "connection but did not answer within 2.0 s; stopped or dead?)");
}

TEST(HangReport, ADeadRankIsNamedDead) {
  RankStatus dead = Mute(1, RankStatus::Contact::kRefused, "gone");
  const HangReport report =
      Explain({Answered(0, Receiving(0, 3, "RecvGrad2@s0<r1", "RecvGrad mb2", 1, 8194, 5)), dead});
  EXPECT_EQ(report.culprits, std::vector<int>{1});
  EXPECT_EQ(report.summary,
            "rank 0 waits RecvGrad mb2 from rank 1; rank 1 is dead (process 101 on node is gone; "
            "its status port refuses connections)");
}

// Every rank of one host refuses contact while the other host's answer: a lost node, named with
// its ranks and the way to go on. One dead rank among live ones on its host is no lost node.
TEST(HangReport, AHostWithNoLiveRankIsALostNode) {
  std::vector<RankStatus> ranks = {
      Answered(0, Receiving(0, 3, "RecvGrad2@s0<r2", "RecvGrad mb2", 2, 8194, 5)),
      Answered(1, Receiving(1, 3, "RecvGrad2@s0<r3", "RecvGrad mb2", 3, 8194, 5)),
      Mute(2, RankStatus::Contact::kRefused, "gone"), Mute(3, RankStatus::Contact::kRefused, "")};
  ranks[0].host = ranks[1].host = "hostA";
  ranks[2].host = ranks[3].host = "hostB";
  const HangReport lost = Explain(ranks);
  EXPECT_EQ(lost.lost_hosts, std::vector<std::string>{"hostB"});
  EXPECT_EQ(lost.lost_hosts_line,
            "no rank on hostB (ranks 2, 3) answers: a lost node? Resume with --resume auto, "
            "excluding host hostB");
  ranks[3] = Answered(3, Receiving(3, 3, "RecvAct2@s1<r1", "RecvAct mb2", 1, 4098, 5));
  ranks[3].host = "hostB";
  EXPECT_TRUE(Explain(ranks).lost_hosts.empty());
}

TEST(HangReport, RanksWaitingOnEachOtherAreACycle) {
  const HangReport report =
      Explain({Answered(0, Receiving(0, 1, "RecvGrad0@s0<r1", "RecvGrad mb0", 1, 8192, 5)),
               Answered(1, Receiving(1, 1, "RecvAct2@s1<r0", "RecvAct mb2", 0, 258, 5))},
              /*reporter=*/1);
  EXPECT_TRUE(report.cycle);
  EXPECT_EQ(report.culprits, (std::vector<int>{1, 0}));
  EXPECT_EQ(report.summary,
            "rank 1 waits RecvAct mb2 from rank 0; rank 0 waits RecvGrad mb0 from rank 1 (a "
            "cycle: each waits for a message the other sends only later, so their action lists "
            "disagree)");
}

TEST(HangReport, ACollectiveWaitsOnTheMembersThatAreNotInIt) {
  Snapshot all_ok = Computing(0, 2, "", "losses and metrics", 5);
  all_ok.wait = WaitKind::kCollective;
  all_ok.wait_what = "agreement of all ranks";
  all_ok.wait_group = "world";
  all_ok.waited_s = 5;
  Snapshot other = all_ok;
  other.world_rank = 1;
  const HangReport report = Explain(
      {Answered(0, all_ok), Answered(1, other), Answered(2, Computing(2, 2, "", "checkpoint", 9)),
       Mute(3, RankStatus::Contact::kNoAnswer, "T (stopped by a signal)")});
  EXPECT_FALSE(report.cycle);
  // Rank 1 is in the same collective: not blamed; the mute rank comes first, then the busy one.
  EXPECT_EQ(report.culprits, (std::vector<int>{3, 2}));
  EXPECT_EQ(report.summary,
            "rank 0 waits for rank 3 in agreement of all ranks; rank 3 is unreachable (it does "
            "not answer, and process 103 on node is T (stopped by a signal); stopped or dead?); "
            "also not moving: rank(s) 2");
  EXPECT_EQ(report.ranks[0],
            "rank 0 (node, pid 100): step 2: waits in agreement of all ranks (over its world "
            "group) for 5.0 s");
}

TEST(Progress, RecordsActionsAndWaitsAndAnotherProcessCanReadThem) {
  progress::SetRank(3);
  progress::SetStep(7, 1, 2);
  progress::SetAction("SendAct3@s0>r1+RecvGrad1@s0<r1", "SendAct mb3",
                      {{8193, "RecvGrad mb1", "RecvGrad1@s0<r1"}});
  {
    const progress::WaitScope outer({WaitKind::kReceive,
                                     "RecvGrad(micro-batch 1, stage 0) gradient",
                                     "pp",
                                     "f32[2, 16, 32]",
                                     8193,
                                     {4}});
    const progress::WaitScope inner({WaitKind::kCollective, "the transport's inner wait"});
    const Snapshot s = progress::Read();
    EXPECT_EQ(s.world_rank, 3);
    EXPECT_EQ(s.pid, getpid());
    EXPECT_EQ(s.step, 7);
    EXPECT_EQ(s.flush, 1);
    EXPECT_EQ(s.flushes, 2);
    EXPECT_EQ(s.action, "SendAct3@s0>r1+RecvGrad1@s0<r1");
    ASSERT_EQ(s.receives.size(), 1u);
    EXPECT_EQ(s.receives[0].label, "RecvGrad mb1");
    EXPECT_EQ(s.wait, WaitKind::kReceive);  // the outer description is kept
    EXPECT_EQ(s.wait_what, "RecvGrad(micro-batch 1, stage 0) gradient");
    EXPECT_EQ(s.wait_peers, std::vector<int>{4});
    EXPECT_EQ(s.wait_tag, 8193);
    EXPECT_FALSE(s.torn);
    // As a rank of the same node reads it, through /proc/<pid>/fd/<memfd>.
    std::string error;
    ASSERT_GE(progress::SharedFd(), 0);
    const std::optional<Snapshot> peeked = progress::Peek(getpid(), progress::SharedFd(), &error);
    ASSERT_TRUE(peeked) << error;
    EXPECT_EQ(peeked->action, s.action);
    EXPECT_EQ(peeked->wait_what, s.wait_what);
  }
  EXPECT_EQ(progress::Read().wait, WaitKind::kNone);
  std::string error;
  EXPECT_FALSE(progress::Peek(getpid(), 0, &error));  // stdin is no progress record
  EXPECT_EQ(progress::ProcessState(getpid()).substr(0, 1), "R");
  EXPECT_EQ(progress::ProcessState(getpid(), progress::StartTime(getpid()) + 1).substr(0, 4),
            "gone");
  EXPECT_EQ(progress::ProcessState(1 << 30), "gone");
}

TEST(Progress, TheDeadlineHandlerAddsToTheMessage) {
  EXPECT_EQ(progress::OnDeadline("waited"), "");
  progress::SetDeadlineHandler([](const std::string& message) { return " after " + message; });
  EXPECT_EQ(progress::OnDeadline("waited"), " after waited");
  progress::SetDeadlineHandler(nullptr);
}

// The mismatched schedule of BIGMAC_TEST_MISMATCH_SCHEDULE deadlocks, and the simulator names the
// same pair of waits that the hang report prints in tests/mpi/hang_test.cc.
TEST(MismatchForTesting, TheSimulatorFindsTheDeadlock) {
  using schedule::Kind;
  for (Kind kind : {Kind::kGpipe, Kind::k1F1B, Kind::kZeroBubbleH1}) {
    for (int rank = 0; rank < 4; ++rank) {
      // The last stage's variant needs a stage before it that waits for a gradient early.
      if (rank == 3 && kind != Kind::k1F1B) continue;
      std::vector<std::vector<schedule::Action>> lists = schedule::BuildAllActions({kind, 4, 4, 1});
      lists[rank] = schedule::MismatchForTesting(lists[rank]);
      const schedule::SimResult r = schedule::Simulate(lists, 1, schedule::Costs{});
      EXPECT_TRUE(r.deadlock) << schedule::KindName(kind) << " rank " << rank << ": " << r.problem;
    }
  }
  std::vector<std::vector<schedule::Action>> lists =
      schedule::BuildAllActions({Kind::k1F1B, 2, 4, 1});
  lists[1] = schedule::MismatchForTesting(lists[1]);
  const schedule::SimResult r = schedule::Simulate(lists, 1, schedule::Costs{});
  ASSERT_TRUE(r.deadlock);
  EXPECT_NE(r.problem.find("RecvGrad0@s0<r1"), std::string::npos) << r.problem;
  EXPECT_NE(r.problem.find("RecvAct2@s1<r0"), std::string::npos) << r.problem;
  // Nothing to perturb on one stage.
  const std::vector<schedule::Action> alone = schedule::BuildRankActions({Kind::k1F1B, 1, 4, 1}, 0);
  EXPECT_EQ(schedule::MismatchForTesting(alone), alone);
}

}  // namespace
}  // namespace bigmac::comm
