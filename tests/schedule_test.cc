// Schedules as action lists, run against each other by the simulator.
#include "core/schedule/schedule.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "core/schedule/simulator.h"

namespace bigmac::schedule {
namespace {

struct Shape {
  int p;
  int m;
};

// Every schedule, p up to 8, m up to 32: no deadlock, every message received, each (mb, stage)
// computed exactly once forward and once backward, on the rank that owns the stage.
TEST(Simulator, EveryScheduleCompletesWithoutDeadlock) {
  for (Kind kind : {Kind::kGpipe, Kind::k1F1B, Kind::kInterleaved1F1B, Kind::kZeroBubbleH1}) {
    for (int p = 1; p <= 8; ++p) {
      for (int m = 1; m <= 32; ++m) {
        const int v = kind == Kind::kInterleaved1F1B ? 2 : 1;
        if (!CheckScheduleConstraints(kind, p, v, m).empty()) continue;
        const ScheduleSpec spec{kind, p, m, v};
        const auto lists = BuildAllActions(spec);
        const SimResult r = Simulate(lists, v, Costs{});
        ASSERT_FALSE(r.deadlock) << KindName(kind) << " p=" << p << " m=" << m << ": " << r.problem;
        ASSERT_EQ(r.problem, "") << KindName(kind) << " p=" << p << " m=" << m;
        std::map<std::pair<int, int>, int> forwards, backwards, weights;
        for (int rank = 0; rank < p; ++rank) {
          for (const Action& a : lists[rank]) {
            if (a.stage >= 0) ASSERT_EQ(a.stage % p, rank) << "stage on the wrong rank";
            if (a.op == Op::kForward) ++forwards[{a.microbatch, a.stage}];
            if (a.op == Op::kBackward || a.op == Op::kBackwardInput)
              ++backwards[{a.microbatch, a.stage}];
            if (a.op == Op::kBackward || a.op == Op::kBackwardWeight)
              ++weights[{a.microbatch, a.stage}];
          }
        }
        ASSERT_EQ(static_cast<int>(forwards.size()), m * p * v);
        for (const auto& [key, count] : forwards) ASSERT_EQ(count, 1);
        for (const auto& [key, count] : backwards) ASSERT_EQ(count, 1);
        for (const auto& [key, count] : weights) ASSERT_EQ(count, 1);
        ASSERT_EQ(backwards.size(), forwards.size());
      }
    }
  }
}

// Unit costs F = 1, B = 2 (BI = W = 1): the bubble equals the closed forms.
TEST(Simulator, BubbleMatchesTheory) {
  for (int p = 2; p <= 8; ++p) {
    for (int m = p; m <= 32; m += p) {
      const double classic = double(p - 1) / (m + p - 1);
      for (Kind kind : {Kind::kGpipe, Kind::k1F1B}) {
        const SimResult r = Simulate(BuildAllActions({kind, p, m, 1}), 1, Costs{});
        EXPECT_NEAR(r.bubble_fraction, classic, 1e-9) << KindName(kind) << " p=" << p << " m=" << m;
      }
      // Interleaving with v chunks divides the fill and drain by v (Narayanan et al. 2021).
      const SimResult inter =
          Simulate(BuildAllActions({Kind::kInterleaved1F1B, p, m, 2}), 2, Costs{});
      EXPECT_NEAR(inter.bubble_fraction, double(p - 1) / (2 * m + p - 1), 1e-9)
          << "interleaved p=" << p << " m=" << m;
      // ZB-H1 with F = BI = W: the bubble is (p-1)(F+BI-W) = p-1 units against 3m of work
      // (Qi et al. 2024), a third of 1F1B's.
      const SimResult zb = Simulate(BuildAllActions({Kind::kZeroBubbleH1, p, m, 1}), 1, Costs{});
      EXPECT_NEAR(zb.bubble_fraction, double(p - 1) / (3 * m + p - 1), 1e-9)
          << "zb_h1 p=" << p << " m=" << m;
    }
  }
}

TEST(Simulator, InFlightMicroBatches) {
  const int p = 4, m = 8;
  const SimResult gpipe = Simulate(BuildAllActions({Kind::kGpipe, p, m, 1}), 1, Costs{});
  const SimResult one = Simulate(BuildAllActions({Kind::k1F1B, p, m, 1}), 1, Costs{});
  const SimResult zb = Simulate(BuildAllActions({Kind::kZeroBubbleH1, p, m, 1}), 1, Costs{});
  EXPECT_EQ(zb.max_in_flight[0], p);
  for (int r = 0; r < p; ++r) {
    EXPECT_EQ(gpipe.max_in_flight[r], m);
    EXPECT_EQ(one.max_in_flight[r], p - r);
    EXPECT_LE(zb.max_in_flight[r], p) << "zb_h1 defers W but keeps 1F1B's peak";
  }
}

TEST(Simulator, DetectsADeadlockAndNamesTheWaiters) {
  // Two ranks that each receive before sending.
  std::vector<std::vector<Action>> lists = {
      {{Op::kRecvGrad, 0, 0, 1}, {Op::kSendAct, 0, 0, 1}},
      {{Op::kRecvAct, 0, 1, 0}, {Op::kSendGrad, 0, 1, 0}},
  };
  const SimResult r = Simulate(lists, 1, Costs{});
  EXPECT_TRUE(r.deadlock);
  EXPECT_EQ(r.problem,
            "deadlock: rank 0 waits in RecvGrad0@s0<r1 (action 0); rank 1 waits in RecvAct0@s1<r0 "
            "(action 0)");
}

TEST(Simulator, ReportsUnmatchedSends) {
  std::vector<std::vector<Action>> lists = {{{Op::kSendAct, 3, 0, 1}}, {}};
  const SimResult r = Simulate(lists, 1, Costs{});
  EXPECT_FALSE(r.deadlock);
  EXPECT_NE(r.problem.find("never received"), std::string::npos);
}

TEST(Schedule, OneFOneBListForTheLastRankAlternates) {
  const std::vector<Action> last = BuildRankActions({Kind::k1F1B, 2, 3, 1}, 1);
  std::string text;
  for (const Action& a : last) text += ShortName(a) + " ";
  EXPECT_EQ(text,
            "RecvAct0@s1<r0 F0@s1 B0@s1 SendGrad0@s1>r0 RecvAct1@s1<r0 F1@s1 B1@s1 SendGrad1@s1>r0 "
            "RecvAct2@s1<r0 F2@s1 B2@s1 SendGrad2@s1>r0 ReduceTied ReduceDp OptimizerStep ");
}

TEST(Trace, IsChromeJsonWithOneTrackPerRank) {
  const SimResult r = Simulate(BuildAllActions({Kind::k1F1B, 2, 2, 1}), 1, Costs{});
  const std::string trace = ChromeTrace(r, "1f1b");
  EXPECT_NE(trace.find("\"traceEvents\""), std::string::npos);
  EXPECT_NE(trace.find("\"rank 1\""), std::string::npos);
  EXPECT_NE(trace.find("\"F1@s1\""), std::string::npos);
  const std::string grid = FormatGrid(r, 2);
  EXPECT_EQ(grid, "rank 0 | F0 F1 .  .  B0 B0 .  B1 B1\nrank 1 | .  F0 B0 B0 F1 B1 B1 .  . \n")
      << grid;
}

}  // namespace
}  // namespace bigmac::schedule
