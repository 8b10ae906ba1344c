// The compare verdicts on synthetic metric series.
#include "core/plan/compare.h"

#include <gtest/gtest.h>

#include <cmath>

namespace bigmac::plan {
namespace {

RunRecord Record(std::vector<double> step_ms, std::vector<double> loss, double peak_share = 0.5) {
  RunRecord r;
  r.name = "run";
  r.step_ms = std::move(step_ms);
  r.loss = std::move(loss);
  for (int rank = 0; rank < 4; ++rank) {
    RankRecord k;
    k.rank = rank;
    k.pp = rank;
    k.capacity_mib = 100;
    k.peak_mib = rank == 2 ? 100 * peak_share : 10;
    k.forward_ms = rank == 3 ? 30 : 10;
    k.backward_ms = rank == 3 ? 60 : 20;
    k.busy_ms = k.forward_ms + k.backward_ms;
    k.activation_mib = 1;
    k.parameter_mib = 5;
    r.ranks.push_back(k);
  }
  return r;
}

std::vector<double> Flat(int n, double value) { return std::vector<double>(n, value); }

TEST(Judge, AllThreeHold) {
  const Verdict v = Judge(Record(Flat(20, 100), Flat(12, 5)), Record(Flat(20, 100), Flat(12, 5.01)),
                          "spread_first");
  EXPECT_TRUE(v.feasible);
  for (const Check& c : v.checks) EXPECT_TRUE(c.pass) << c.name << ": " << c.detail;
}

TEST(Judge, MemoryNearCapacityFails) {
  const Verdict v = Judge(Record(Flat(20, 100), Flat(12, 5)),
                          Record(Flat(20, 100), Flat(12, 5), 0.93), "spread_first");
  EXPECT_FALSE(v.feasible);
  EXPECT_FALSE(v.checks[0].pass);
  EXPECT_NE(v.checks[0].detail.find("rank 2 at 93.0%"), std::string::npos) << v.checks[0].detail;
  EXPECT_TRUE(
      Judge(Record(Flat(20, 100), Flat(12, 5)), Record(Flat(20, 100), Flat(12, 5), 0.89), "x")
          .checks[0]
          .pass);
}

TEST(Judge, UpwardTrendFailsNoiseDoesNot) {
  std::vector<double> rising, noisy;
  for (int i = 0; i < 20; ++i) {
    rising.push_back(100 + 1.0 * i);  // +20 ms over 20 steps: 18% of a ~110 ms mean
    noisy.push_back(100 + (i % 2 ? 8 : -8));
  }
  EXPECT_FALSE(
      Judge(Record(Flat(20, 100), Flat(12, 5)), Record(rising, Flat(12, 5)), "x").checks[1].pass);
  EXPECT_TRUE(
      Judge(Record(Flat(20, 100), Flat(12, 5)), Record(noisy, Flat(12, 5)), "x").checks[1].pass);
  EXPECT_NEAR(Slope(rising), 1.0, 1e-12);
}

TEST(Judge, LossMustFollowTheBaseline) {
  std::vector<double> drifting = Flat(12, 5);
  drifting[6] = 5.2;  // 4% off at step 7
  const Verdict v = Judge(Record(Flat(20, 100), Flat(12, 5)), Record(Flat(20, 100), drifting), "x");
  EXPECT_FALSE(v.checks[2].pass);
  EXPECT_NE(v.checks[2].detail.find("at step 7"), std::string::npos) << v.checks[2].detail;
  std::vector<double> late = Flat(12, 5);
  late[11] = 9;  // beyond the first 10 steps: not judged
  EXPECT_TRUE(
      Judge(Record(Flat(20, 100), Flat(12, 5)), Record(Flat(20, 100), late), "x").checks[2].pass);
  std::vector<double> nan = Flat(12, 5);
  nan[3] = NAN;
  RunRecord with_nan = Record(Flat(20, 100), nan);
  with_nan.nan_steps = 1;
  EXPECT_FALSE(Judge(Record(Flat(20, 100), Flat(12, 5)), with_nan, "x").checks[2].pass);
}

TEST(Judge, NamesTheBottleneckAndTheFix) {
  const Verdict v =
      Judge(Record(Flat(20, 100), Flat(12, 5)), Record(Flat(20, 100), Flat(12, 5)), "last");
  EXPECT_NE(v.bottleneck.find(
                "pp rank 3 (world rank 3) is busy 90.0 ms per step (CPU or device time), 2.00x "
                "the mean"),
            std::string::npos)
      << v.bottleneck;
  EXPECT_NE(v.bottleneck.find("bound by parameters"), std::string::npos);
  EXPECT_NE(v.bottleneck.find("move the remainder to the first stage"), std::string::npos);
  RunRecord heavy = Record(Flat(20, 100), Flat(12, 5));
  heavy.ranks[3].activation_mib = 50;
  EXPECT_NE(Judge(heavy, heavy, "spread_first").bottleneck.find("lower train.micro_batch_size"),
            std::string::npos);
}

// Ranks that share cores stretch each other's wall-clock spans: the bottleneck follows the busy
// time (CPU or device time), not forward_ms + backward_ms.
TEST(Judge, TheBottleneckFollowsBusyTimeNotWallClock) {
  RunRecord preempted = Record(Flat(20, 100), Flat(12, 5));
  preempted.ranks[1].forward_ms = 300;  // waited for a core, computed little
  const Verdict v = Judge(preempted, preempted, "last");
  EXPECT_NE(v.bottleneck.find("pp rank 3 (world rank 3) is busy 90.0 ms per step"),
            std::string::npos)
      << v.bottleneck;
}

}  // namespace
}  // namespace bigmac::plan
