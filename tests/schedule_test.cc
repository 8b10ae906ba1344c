// Schedules as action lists, run against each other by the simulator.
#include "core/schedule/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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
      // Each stage's input gradient sent before its weight gradients: the fill is (p-1) F as
      // before, the drain (p-1) BI instead of (p-1) B.
      const double early = 2.0 * (p - 1) / (3 * m + 2 * (p - 1));
      for (Kind kind : {Kind::kGpipe, Kind::k1F1B}) {
        const SimResult whole = Simulate(BuildAllActions({kind, p, m, 1, false}), 1, Costs{});
        EXPECT_NEAR(whole.bubble_fraction, classic, 1e-9)
            << KindName(kind) << " p=" << p << " m=" << m;
        const SimResult r = Simulate(BuildAllActions({kind, p, m, 1}), 1, Costs{});
        EXPECT_NEAR(r.bubble_fraction, early, 1e-9) << KindName(kind) << " p=" << p << " m=" << m;
      }
      // Interleaving with v chunks divides the fill and drain by v (Narayanan et al. 2021).
      const SimResult inter =
          Simulate(BuildAllActions({Kind::kInterleaved1F1B, p, m, 2, false}), 2, Costs{});
      EXPECT_NEAR(inter.bubble_fraction, double(p - 1) / (2 * m + p - 1), 1e-9)
          << "interleaved p=" << p << " m=" << m;
      const SimResult inter_early =
          Simulate(BuildAllActions({Kind::kInterleaved1F1B, p, m, 2}), 2, Costs{});
      EXPECT_NEAR(inter_early.bubble_fraction, double(p - 1) / (3 * m + p - 1), 1e-9)
          << "interleaved, early gradients, p=" << p << " m=" << m;
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

// With bytes per stage, the simulation gives each rank's peak and what each stage held then: under
// 1f1b rank r's peak is (p - r) micro-batches of activations; under zb_h1 a micro-batch between
// BackwardInput and BackwardWeight holds its deferred bytes instead, so a larger deferred size
// raises the peak; interleaved chunks are counted one by one, and a rank's stages sum to its peak.
TEST(Simulator, PeakBytesPerRankAndStage) {
  const int p = 4, m = 8;
  Costs costs;
  costs.stage_activation_bytes.assign(p, 100);
  costs.stage_deferred_bytes.assign(p, 100);
  const SimResult one = Simulate(BuildAllActions({Kind::k1F1B, p, m, 1, false}), 1, costs);
  for (int r = 0; r < p; ++r) {
    EXPECT_EQ(one.peak_bytes[r], 100.0 * (p - r)) << "rank " << r;
    EXPECT_EQ(one.stage_bytes_at_peak[r], one.peak_bytes[r]);
  }
  const SimResult zb_same = Simulate(BuildAllActions({Kind::kZeroBubbleH1, p, m, 1}), 1, costs);
  costs.stage_deferred_bytes.assign(p, 150);
  const SimResult zb = Simulate(BuildAllActions({Kind::kZeroBubbleH1, p, m, 1}), 1, costs);
  for (int r = 0; r < p; ++r) {
    EXPECT_EQ(zb_same.peak_bytes[r], 100.0 * zb_same.max_in_flight[r]) << "rank " << r;
    EXPECT_GT(zb.peak_bytes[r], zb_same.peak_bytes[r]) << "rank " << r;
    EXPECT_LE(zb.peak_bytes[r], 150.0 * zb.max_in_flight[r]) << "rank " << r;
  }
  // A backward's transient peak counts while it runs: under 1f1b it comes on top of the (p - r)
  // micro-batches held before rank r's first backward.
  Costs transient;
  transient.stage_activation_bytes.assign(p, 100);
  transient.stage_backward_peak_bytes.assign(p, 30);
  const SimResult with = Simulate(BuildAllActions({Kind::k1F1B, p, m, 1, false}), 1, transient);
  for (int r = 0; r < p; ++r) {
    EXPECT_EQ(with.peak_bytes[r], 100.0 * (p - r) + 30) << "rank " << r;
    EXPECT_EQ(with.stage_bytes_at_peak[r], with.peak_bytes[r]);
  }
  transient.stage_deferred_bytes.assign(p, 100);
  transient.stage_backward_input_peak_bytes.assign(p, 40);
  const SimResult zb_with = Simulate(BuildAllActions({Kind::kZeroBubbleH1, p, m, 1}), 1, transient);
  for (int r = 0; r < p; ++r)
    EXPECT_EQ(zb_with.peak_bytes[r], zb_same.peak_bytes[r] + 40) << "rank " << r;
  const int v = 2;
  Costs chunks;
  for (int s = 0; s < p * v; ++s) {
    chunks.stage_activation_bytes.push_back(s < p ? 10 : 1000);  // the second chunks are heavy
  }
  const SimResult interleaved =
      Simulate(BuildAllActions({Kind::kInterleaved1F1B, p, m, v}), v, chunks);
  for (int r = 0; r < p; ++r) {
    const double first = interleaved.stage_bytes_at_peak[r];
    const double second = interleaved.stage_bytes_at_peak[r + p];
    EXPECT_EQ(first + second, interleaved.peak_bytes[r]) << "rank " << r;
    EXPECT_EQ(std::fmod(first, 10), 0);
    EXPECT_EQ(std::fmod(second, 1000), 0);
    EXPECT_LE(second / 1000 + first / 10, interleaved.max_in_flight[r]) << "rank " << r;
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
  auto text_of = [](const ScheduleSpec& spec, int rank) {
    std::vector<Action> list = BuildRankActions(spec, rank);
    for (const Action& a : BuildStepTail(spec, rank)) list.push_back(a);
    std::string text;
    for (const Action& a : list) text += ShortName(a) + " ";
    return text;
  };
  // The gradient leaves between the input and the weight gradients...
  EXPECT_EQ(text_of({Kind::k1F1B, 2, 3, 1}, 1),
            "RecvAct0@s1<r0 F0@s1 BI0@s1 SendGrad0@s1>r0 W0@s1 RecvAct1@s1<r0 F1@s1 BI1@s1 "
            "SendGrad1@s1>r0 W1@s1 RecvAct2@s1<r0 F2@s1 BI2@s1 SendGrad2@s1>r0 W2@s1 ReduceTied "
            "ReduceDp OptimizerStep ");
  // ...while the first stage, which sends none, keeps its backward whole.
  EXPECT_EQ(text_of({Kind::k1F1B, 2, 2, 1}, 0),
            "F0@s0 SendAct0@s0>r1 F1@s0 SendAct1@s0>r1 RecvGrad0@s0<r1 B0@s0 RecvGrad1@s0<r1 "
            "B1@s0 ReduceTied ReduceDp OptimizerStep ");
  EXPECT_EQ(text_of({Kind::k1F1B, 2, 3, 1, /*send_grad_before_weights=*/false}, 1),
            "RecvAct0@s1<r0 F0@s1 B0@s1 SendGrad0@s1>r0 RecvAct1@s1<r0 F1@s1 B1@s1 SendGrad1@s1>r0 "
            "RecvAct2@s1<r0 F2@s1 B2@s1 SendGrad2@s1>r0 ReduceTied ReduceDp OptimizerStep ");
}

// Every kind, several pp/m/v: the specs that pass CheckScheduleConstraints.
std::vector<ScheduleSpec> SomeSpecs() {
  std::vector<ScheduleSpec> specs;
  for (Kind kind : {Kind::kGpipe, Kind::k1F1B, Kind::kInterleaved1F1B, Kind::kZeroBubbleH1}) {
    for (int p : {1, 2, 3, 4, 8}) {
      for (int m : {1, 2, 3, 4, 8, 12}) {
        for (int v : {1, 2, 3}) {
          if (v > 1 && kind != Kind::kInterleaved1F1B) continue;
          if (CheckScheduleConstraints(kind, p, v, m).empty()) specs.push_back({kind, p, m, v});
        }
      }
    }
  }
  return specs;
}

std::string Describe(const ScheduleSpec& s) {
  return KindName(s.kind) + " p=" + std::to_string(s.pp) + " m=" + std::to_string(s.microbatches) +
         " v=" + std::to_string(s.virtual_stages);
}

TEST(OpTable, OneRowPerOpInTheEnumsOrder) {
  const std::vector<OpInfo>& table = OpTable();
  ASSERT_EQ(table.size(), 11u);
  std::set<std::string> names, short_names;
  for (size_t i = 0; i < table.size(); ++i) {
    EXPECT_EQ(static_cast<size_t>(table[i].op), i);
    names.insert(table[i].name);
    short_names.insert(table[i].short_name);
  }
  EXPECT_EQ(names.size(), table.size());
  EXPECT_EQ(short_names.size(), table.size());
  EXPECT_EQ(OpName(Op::kBackwardInput), "BackwardInput");
  EXPECT_EQ(std::string(Info(Op::kBackwardInput).short_name), "BI");
  EXPECT_EQ(std::string(Info(Op::kRecvGrad).category), "wait");
  EXPECT_EQ(std::string(Info(Op::kSendAct).category), "send");
  EXPECT_EQ(std::string(Info(Op::kReduceDp).category), "allreduce");
  EXPECT_TRUE(Info(Op::kBackwardWeight).computes);
  EXPECT_FALSE(Info(Op::kSendGrad).computes);
  EXPECT_TRUE(Info(Op::kOptimizerStep).per_step);
  EXPECT_FALSE(Info(Op::kForward).per_step);
}

// ShortName -> ParseAction gives the action back, and ParseAction -> ShortName the text.
TEST(ParseAction, EveryActionOfEveryScheduleRoundTrips) {
  int checked = 0;
  for (const ScheduleSpec& spec : SomeSpecs()) {
    for (int rank = 0; rank < spec.pp; ++rank) {
      std::vector<Action> all = BuildRankActions(spec, rank);
      for (const Action& a : BuildStepTail(spec, rank)) all.push_back(a);
      for (const Action& a : BuildForwardOnlyActions(spec, rank, 5)) all.push_back(a);
      std::string text;
      for (const Action& a : all) {
        const std::string name = ShortName(a);
        ASSERT_EQ(ParseAction(name), a) << name << " in " << Describe(spec);
        ASSERT_EQ(ShortName(ParseAction(name)), name);
        text += name + " ";
        ++checked;
      }
      ASSERT_EQ(ParseActions(text), all) << Describe(spec) << " rank " << rank;
    }
  }
  EXPECT_GT(checked, 10000);
  EXPECT_EQ(ParseActions("F0@s0 SendAct0@s0>r1  BI12@s7\tOptimizerStep"),
            (std::vector<Action>{{Op::kForward, 0, 0, -1},
                                 {Op::kSendAct, 0, 0, 1},
                                 {Op::kBackwardInput, 12, 7, -1},
                                 {Op::kOptimizerStep, -1, -1, -1}}));
  EXPECT_TRUE(ParseActions("  ").empty());
}

TEST(ParseAction, RefusesMalformedText) {
  for (const char* bad : {"",
                          "X3@s1",
                          "f3@s1",
                          "F",
                          "F3",
                          "F3@",
                          "F3@s",
                          "F3s1",
                          "F3@s1<r0",
                          "F-1@s0",
                          "F+1@s0",
                          "F01@s0",
                          "F3@s01",
                          "F3@s1 ",
                          " F3@s1",
                          "RecvAct3@s1",
                          "RecvAct3@s1>r0",
                          "RecvAct3@s1<r",
                          "SendGrad3@s1<r0",
                          "SendAct3@s1>r0x",
                          "OptimizerStep0@s0",
                          "ReduceDp ",
                          "F99999999999@s0",
                          "F3@s1\n",
                          "B3@r1",
                          "BIW3@s0",
                          "F3@s1@s2"}) {
    EXPECT_THROW(ParseAction(bad), std::invalid_argument) << "'" << bad << "'";
  }
  try {
    ParseAction("Q3@s1");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(
        std::string(e.what()),
        "'Q3@s1' is not an action: unknown op 'Q'; the ops are F, B, BI, W, SendAct, RecvAct, "
        "SendGrad, RecvGrad, ReduceTied, ReduceDp, OptimizerStep (expected e.g. F3@s1, "
        "RecvAct3@s1<r0, SendGrad3@s1>r0 or OptimizerStep)");
  }
  try {
    ParseActions("F0@s0 SendAct0@s0 OptimizerStep");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("action 1: 'SendAct0@s0' is not an action: SendAct needs "
                                          "its peer",
                                          0),
              0u)
        << e.what();
  }
}

// One flush per list, the per-step tail apart: no per-step action in a flush, only those in the
// tail.
TEST(Schedule, AFlushHoldsNoPerStepActionAndTheTailOnlyThose) {
  for (const ScheduleSpec& spec : SomeSpecs()) {
    for (int rank = 0; rank < spec.pp; ++rank) {
      for (const Action& a : BuildRankActions(spec, rank))
        ASSERT_FALSE(Info(a.op).per_step) << ShortName(a) << " in " << Describe(spec);
      std::string tail;
      for (const Action& a : BuildStepTail(spec, rank)) tail += ShortName(a) + " ";
      ASSERT_EQ(tail, "ReduceTied ReduceDp OptimizerStep ");
    }
  }
}

// Evaluation: one micro-batch forward through every stage, interleaved chunks included; the
// simulator finds no deadlock and every message received.
TEST(ForwardOnly, EveryLayoutRunsWithoutDeadlock) {
  for (const ScheduleSpec& spec : SomeSpecs()) {
    std::vector<std::vector<Action>> lists;
    for (int rank = 0; rank < spec.pp; ++rank)
      lists.push_back(BuildForwardOnlyActions(spec, rank, 3));
    const SimResult r = Simulate(lists, spec.virtual_stages, Costs{});
    ASSERT_FALSE(r.deadlock) << Describe(spec) << ": " << r.problem;
    ASSERT_EQ(r.problem, "") << Describe(spec);
    std::vector<int> forwards;
    for (const SimEvent& e : r.events) {
      ASSERT_NE(e.action.op, Op::kBackward);
      ASSERT_EQ(e.action.microbatch, 3);
      if (e.action.op == Op::kForward) forwards.push_back(e.action.stage);
    }
    std::sort(forwards.begin(), forwards.end());
    std::vector<int> every(spec.pp * spec.virtual_stages);
    for (size_t s = 0; s < every.size(); ++s) every[s] = static_cast<int>(s);
    ASSERT_EQ(forwards, every) << "each stage once: " << Describe(spec);
    // The simulated forward of the whole model is sequential: makespan = stages x F / v.
    EXPECT_NEAR(r.makespan, double(spec.pp), 1e-9) << Describe(spec);
  }
  std::string text;
  for (const Action& a : BuildForwardOnlyActions({Kind::kInterleaved1F1B, 2, 2, 2}, 1))
    text += ShortName(a) + " ";
  EXPECT_EQ(text, "RecvAct0@s1<r0 F0@s1 SendAct0@s1>r0 RecvAct0@s3<r0 F0@s3 ");
}

TEST(Trace, IsChromeJsonWithOneTrackPerRank) {
  const SimResult r = Simulate(BuildAllActions({Kind::k1F1B, 2, 2, 1, false}), 1, Costs{});
  const std::string trace = ChromeTrace(r, "1f1b");
  EXPECT_NE(trace.find("\"traceEvents\""), std::string::npos);
  EXPECT_NE(trace.find("\"rank 1\""), std::string::npos);
  EXPECT_NE(trace.find("\"F1@s1\""), std::string::npos);
  const std::string grid = FormatGrid(r, 2);
  EXPECT_EQ(grid, "rank 0 | F0 F1 .  .  B0 B0 .  B1 B1\nrank 1 | .  F0 B0 B0 F1 B1 B1 .  . \n")
      << grid;
  // The gradient sent before the weight gradients: rank 0 starts each backward a unit earlier,
  // and the flush ends after 8 units instead of 9.
  const std::string early =
      FormatGrid(Simulate(BuildAllActions({Kind::k1F1B, 2, 2, 1}), 1, Costs{}), 2);
  EXPECT_EQ(early, "rank 0 | F0 F1 .  B0 B0 .  B1 B1\nrank 1 | .  F0 b0 W0 F1 b1 W1 . \n") << early;
}

// The dp all-reduce after the flush: serial, it follows each rank's last computation; overlapped,
// bucket k starts once (k + 1) / buckets of the rank's last backward has run and the bucket before
// it is done; a tail (the tied weight) waits for the flush's end.
TEST(Simulator, PredictsTheDataParallelAllReduceSerialAndOverlapped) {
  // gpipe, p = 1, m = 2, unit costs: F0 [0,1] F1 [1,2] B0 [2,4] B1 [4,6].
  const SimResult one = Simulate(BuildAllActions({Kind::kGpipe, 1, 2, 1}), 1, Costs{});
  DpReducePrediction p = PredictDpReduce(one, {{2.0}, {}, 2});
  EXPECT_DOUBLE_EQ(p.compute_end[0], 6);
  EXPECT_DOUBLE_EQ(p.serial_end[0], 8);
  EXPECT_DOUBLE_EQ(p.overlap_end[0], 7);  // buckets final at 5 and 6, one unit each
  p = PredictDpReduce(one, {{2.0}, {}, 4});
  EXPECT_DOUBLE_EQ(p.overlap_end[0], 6.5);  // final at 4.5 .. 6: only the last half bucket shows
  p = PredictDpReduce(one, {{2.0}, {0.5}, 2});
  EXPECT_DOUBLE_EQ(p.overlap_end[0], 7.25);  // 0.75 each at 5 and 6, then the tail at 6.75
  EXPECT_DOUBLE_EQ(p.serial_end[0], 8);
  // 1f1b, p = 2, m = 2: rank 0's B1 is [7,9], rank 1's [5,7] (the grid of the Trace test).
  const SimResult two = Simulate(BuildAllActions({Kind::k1F1B, 2, 2, 1, false}), 1, Costs{});
  p = PredictDpReduce(two, {{3.0, 3.0}, {}, 3});
  EXPECT_DOUBLE_EQ(p.serial_end[1], 10);
  EXPECT_NEAR(p.overlap_end[1], 8 + 2.0 / 3, 1e-12);
  EXPECT_DOUBLE_EQ(p.serial_makespan, 12);
  EXPECT_NEAR(p.overlap_makespan, 10 + 2.0 / 3, 1e-12);
  EXPECT_THROW(PredictDpReduce(two, {{3.0}, {}, 3}), std::invalid_argument);
}

// Issue 33, class 10: the largest schedule `bigmac schedule` accepts (pp = 1024, 1024
// micro-batches) is built and simulated action by action, each rank's list holding exactly its
// computations and the messages around them. (The quadratic builder took minutes and gigabytes.)
TEST(Schedule, TheLargestAcceptedScheduleHasTheExpectedActionCounts) {
  for (const Kind kind : {Kind::k1F1B, Kind::kZeroBubbleH1}) {
    const int p = 1024, m = 1024;
    const std::vector<std::vector<Action>> all = BuildAllActions({kind, p, m, 1});
    ASSERT_EQ(all.size(), size_t(p));
    size_t total = 0;
    for (int r = 0; r < p; ++r) {
      // BI and W on every stage that sends a gradient (all but the first), or under ZB-H1.
      const int computes = kind == Kind::kZeroBubbleH1 || r > 0 ? 3 : 2;
      std::map<Op, int> count;
      for (const Action& a : all[r]) ++count[a.op];
      const int neighbours = (r > 0) + (r < p - 1);
      EXPECT_EQ(all[r].size(), size_t(m) * (computes + 2 * neighbours)) << "rank " << r;
      EXPECT_EQ(count[Op::kForward], m);
      EXPECT_EQ(count[Op::kRecvAct], r > 0 ? m : 0);
      EXPECT_EQ(count[Op::kSendGrad], r > 0 ? m : 0);
      total += all[r].size();
    }
    const SimResult result = Simulate(all, 1, Costs{});
    EXPECT_FALSE(result.deadlock) << result.problem;
    EXPECT_EQ(result.events.size(), total);
  }
}

// The zb_h1 construction as it was first written (every rank at every unit of time), kept as the
// reference the fast one must match exactly on small pipelines.
std::vector<std::vector<std::pair<Op, int>>> ReferenceZeroBubble(int p, int m) {
  std::vector<std::vector<std::pair<Op, int>>> critical(p), out(p);
  for (int r = 0; r < p; ++r) {
    const int warmup = std::min(p - r - 1, m);
    int f = 0, b = 0;
    for (; f < warmup; ++f) critical[r].push_back({Op::kForward, f});
    while (f < m) {
      critical[r].push_back({Op::kForward, f++});
      critical[r].push_back({Op::kBackwardInput, b++});
    }
    while (b < m) critical[r].push_back({Op::kBackwardInput, b++});
  }
  std::vector<size_t> next(p, 0);
  std::vector<std::vector<int>> pending(p);
  std::vector<int> live(p, 0);
  std::map<std::pair<int, int>, int> f_done, b_done;
  int done = 0;
  for (int time = 0; done < p * m * 3; ++time) {
    for (int r = 0; r < p; ++r) {
      bool ran = false;
      const bool bound = live[r] >= p && !pending[r].empty();
      if (next[r] < critical[r].size() && !(bound && critical[r][next[r]].first == Op::kForward)) {
        const auto [op, mb] = critical[r][next[r]];
        auto at = [&](std::map<std::pair<int, int>, int>& done_map, int rank) {
          return done_map.count({mb, rank}) && done_map[{mb, rank}] <= time;
        };
        const bool ready = op == Op::kForward ? r == 0 || at(f_done, r - 1)
                                              : (r == p - 1 ? at(f_done, r) : at(b_done, r + 1));
        if (ready) {
          out[r].push_back({op, mb});
          ++next[r];
          (op == Op::kForward ? f_done : b_done)[{mb, r}] = time + 1;
          if (op == Op::kBackwardInput) pending[r].push_back(mb);
          if (op == Op::kForward) ++live[r];
          ran = true;
        }
      }
      if (!ran && !pending[r].empty()) {
        out[r].push_back({Op::kBackwardWeight, pending[r].front()});
        pending[r].erase(pending[r].begin());
        --live[r];
        ran = true;
      }
      if (ran) ++done;
    }
  }
  return out;
}

TEST(Schedule, ZeroBubbleMatchesTheReferenceConstruction) {
  for (int p : {1, 2, 3, 4, 7, 8}) {
    for (int m : {p, p + 1, 2 * p, 3 * p + 2, 16}) {
      if (m < p) continue;
      const auto reference = ReferenceZeroBubble(p, m);
      const std::vector<std::vector<Action>> all = BuildAllActions({Kind::kZeroBubbleH1, p, m, 1});
      for (int r = 0; r < p; ++r) {
        std::vector<std::pair<Op, int>> computes;
        for (const Action& a : all[r]) {
          if (Info(a.op).computes) computes.push_back({a.op, a.microbatch});
        }
        EXPECT_EQ(computes, reference[r]) << "pp=" << p << " m=" << m << " rank " << r;
        EXPECT_EQ(BuildRankActions({Kind::kZeroBubbleH1, p, m, 1}, r), all[r]);
      }
    }
  }
}

TEST(Trace, TheGridOfAHugePipelineIsOneLineAndTheTraceHasEveryAction) {
  const SimResult result = Simulate(BuildAllActions({Kind::k1F1B, 65, 65, 1}), 1, Costs{});
  EXPECT_EQ(FormatGrid(result, 65),
            "grid: not drawn for 65 ranks x 323 columns (at most 64 x 1024); the trace has every "
            "action\n");  // 3m + 2(p-1) units: the drain is (p-1) BI
  const std::string trace = ChromeTrace(result, "1f1b");
  auto count = [&trace](const std::string& text) {
    size_t n = 0;
    for (size_t at = trace.find(text); at != std::string::npos; at = trace.find(text, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("\"cat\":\"Forward\""), size_t(65) * 65);
  EXPECT_EQ(count("\"cat\":\"Backward\""), size_t(65));  // the first stage sends no gradient
  EXPECT_EQ(count("\"cat\":\"BackwardInput\""), size_t(64) * 65);
  EXPECT_EQ(count("\"cat\":\"BackwardWeight\""), size_t(64) * 65);
}

}  // namespace
}  // namespace bigmac::schedule
